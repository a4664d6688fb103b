"""Per-call statistics of relaxed speculative decoding."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DiversedStats:
    """Raw verification counts of one ``generate`` call (before EOS / max-length crops).

    A round drafts ``gamma`` tokens, accepts a prefix of ``n`` of them and emits ``n + 1`` tokens (the
    correction or bonus token). "Verified" positions are those whose verdict was decided: the accepted
    drafts plus the first rejected one.
    """

    num_drafted: int = 0
    num_accepted: int = 0
    num_rounds: int = 0
    num_verified: int = 0
    weight_sum: float = 0.0
    tv_sum: float = 0.0
    accepted_per_round: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        """num_accepted / num_drafted (NaN when nothing was drafted)."""
        return self.num_accepted / self.num_drafted if self.num_drafted else float("nan")

    @property
    def verified_acceptance_rate(self) -> float:
        """num_accepted / num_verified: per verified position (drafts after a rejection are not verified)."""
        return self.num_accepted / self.num_verified if self.num_verified else float("nan")

    @property
    def mean_weight(self) -> float:
        """Mean mixture weight w over verified positions (1 for exact SD)."""
        return self.weight_sum / self.num_verified if self.num_verified else float("nan")

    @property
    def mean_tv(self) -> float:
        """Mean TV(p_t, q_t) over verified positions."""
        return self.tv_sum / self.num_verified if self.num_verified else float("nan")

    @property
    def mean_accepted_per_round(self) -> float:
        """Tokens emitted per target forward, counting the bonus/correction token: (accepted + rounds) / rounds."""
        return (self.num_accepted + self.num_rounds) / self.num_rounds if self.num_rounds else float("nan")

    def record_round(self, num_drafted: int, num_accepted: int, weight_sum: float, tv_sum: float) -> None:
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted
        self.num_rounds += 1
        self.num_verified += min(num_accepted + 1, num_drafted)
        self.weight_sum += weight_sum
        self.tv_sum += tv_sum
        self.accepted_per_round.append(num_accepted)

    def to_dict(self) -> dict:
        return {
            "num_drafted": self.num_drafted,
            "num_accepted": self.num_accepted,
            "num_rounds": self.num_rounds,
            "acceptance_rate": self.acceptance_rate,
            "verified_acceptance_rate": self.verified_acceptance_rate,
            "mean_accepted_per_round": self.mean_accepted_per_round,
            "mean_weight": self.mean_weight,
            "mean_tv": self.mean_tv,
        }
