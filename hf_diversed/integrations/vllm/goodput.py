"""How many tokens to draft at a step of a served batch: the goodput model (pure maths, no vLLM import).

A request whose drafted positions are each accepted with probability a (independently; the first rejection ends
the block; the bonus or resampled token always comes) emits, in a step that verifies k drafted tokens,

    E(a, k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)    tokens (E(a, 0) = 1: a plain decoding step).

An engine step costs time linear in its work, fitted from the engine's own measured steps:

    seconds = c0 + c_target * T + c_pass * P + c_draft * D

with T the target's tokens (each request's last token plus the drafts it verifies), P the draft model's forward
passes and D the tokens those passes run. vLLM's draft-model method, proposing K tokens a request, runs a first
pass over the step's tokens plus one slot a request, then K - 1 passes of one token a request; at K = 0 vLLM still
runs the first pass (keeping the draft's cache in step) unless the draft is skipped and catches up later.

The policy maximises goodput, the batch's expected tokens per second: K = argmax_K sum_i E(a_i, K) / seconds(B, K),
then a request keeps its j-th drafted token only while a_i^j, the expected tokens it adds, is worth the target
time it costs (a_i^j >= c_target * goodput).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch


def expected_tokens(a: float, k: int) -> float:
    """E(a, k) = (1 - a^(k+1)) / (1 - a): the expected tokens a step emits for one request verifying k drafts."""
    if k < 0:
        raise ValueError(f"a request drafts k >= 0 tokens, got k={k}.")
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"an acceptance is a probability, got {a}.")
    if a == 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def acceptance_estimate(accepted: int, rejections: int, prior: float, strength: float = 8.0) -> float:
    """The per-position acceptance a, from a request's record: ``accepted`` drafted tokens kept and ``rejections``
    blocks ended by a rejection. Under i.i.d. positions its likelihood is a^accepted (1 - a)^rejections, so with a
    Beta(strength * prior, strength * (1 - prior)) prior the posterior mean is
    (accepted + strength * prior) / (accepted + rejections + strength)."""
    return (accepted + strength * prior) / (accepted + rejections + strength)


@dataclass(frozen=True)
class StepWork:
    """What one engine step computes: the target's tokens, the draft's forward passes and the draft's tokens."""

    target_tokens: int
    draft_passes: int
    draft_tokens: int

    @classmethod
    def steady(cls, batch: int, k: int, *, draft_runs: bool = True) -> StepWork:
        """A step of ``batch`` requests that verifies k drafts each and proposes k more (vLLM's draft-model
        method); with k = 0 the draft runs its first pass unless ``draft_runs`` is False (the draft skipped)."""
        target = batch * (1 + k)
        if k == 0 and not draft_runs:
            return cls(target, 0, 0)
        passes = max(k, 1)
        return cls(target, passes, target + batch + (passes - 1) * batch)


@dataclass(frozen=True)
class StepCosts:
    """seconds = c0 + c_target * T + c_pass * P + c_draft * D, every coefficient >= 0 (see the module)."""

    c0: float
    c_target: float
    c_pass: float
    c_draft: float

    def seconds(self, work: StepWork) -> float:
        return self.c0 + self.c_target * work.target_tokens + self.c_pass * work.draft_passes + (
            self.c_draft * work.draft_tokens
        )

    @classmethod
    def fit(cls, steps: Iterable[tuple[StepWork, float]]) -> StepCosts:
        """Least squares with non-negative coefficients (active set: a negative one is dropped and the rest
        refitted), over measured (work, seconds) pairs; the steps must vary in their draft passes and tokens."""
        rows, seconds = [], []
        for work, s in steps:
            rows.append([1.0, work.target_tokens, work.draft_passes, work.draft_tokens])
            seconds.append(s)
        if len(rows) < 4:
            raise ValueError(f"fitting step costs needs at least 4 measured steps, got {len(rows)}.")
        x = torch.tensor(rows, dtype=torch.float64)
        y = torch.tensor(seconds, dtype=torch.float64)
        active = list(range(4))
        coef = torch.zeros(4, dtype=torch.float64)
        while active:
            solution = torch.linalg.lstsq(x[:, active], y.unsqueeze(1)).solution.squeeze(1)
            if bool((solution >= 0).all()):
                coef[active] = solution
                break
            active.pop(int(solution.argmin()))
        return cls(*(float(c) for c in coef))

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def from_json(cls, path: str | Path) -> StepCosts:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        missing = {"c0", "c_target", "c_pass", "c_draft"} - set(data)
        if missing:
            raise ValueError(f"{path} is not a step-cost file (no {', '.join(sorted(missing))}): write it with "
                             "StepCosts.to_json, or calibrate again.")  # fmt: skip
        return cls(**{key: float(data[key]) for key in ("c0", "c_target", "c_pass", "c_draft")})


def goodput(acceptances: Sequence[float], k: int, costs: StepCosts, *, draft_runs: bool = True) -> float:
    """Expected tokens per second of a steady step where every request of the batch drafts k tokens."""
    work = StepWork.steady(len(acceptances), k, draft_runs=draft_runs)
    return sum(expected_tokens(a, k) for a in acceptances) / costs.seconds(work)


def best_draft_length(
    acceptances: Sequence[float], costs: StepCosts, max_k: int, *, draft_runs_at_zero: bool = True
) -> int:
    """K in 0..max_k with the highest goodput for a batch with these per-request acceptances (the smaller K on a
    tie); ``draft_runs_at_zero`` is whether a step that drafts nothing still runs the draft's first pass."""
    if not acceptances:
        return 0
    best_k, best = 0, goodput(acceptances, 0, costs, draft_runs=draft_runs_at_zero)
    for k in range(1, max_k + 1):
        value = goodput(acceptances, k, costs)
        if value > best * (1 + 1e-9):
            best_k, best = k, value
    return best_k


def drafts_to_verify(a: float, k: int, costs: StepCosts, step_goodput: float) -> int:
    """How many of a request's k drafted tokens to verify: its j-th adds a^j expected tokens for c_target seconds
    of the target, so keep it while a^j >= c_target * step_goodput (the step's tokens per second)."""
    threshold = costs.c_target * step_goodput
    kept = 0
    while kept < k and a ** (kept + 1) >= threshold:
        kept += 1
    return kept


def batch_size_schedule(acceptance: float, costs: StepCosts, max_k: int, max_batch: int) -> list[list[int]]:
    """The choice for a batch of requests that all accept with ``acceptance``, written as vLLM's
    ``num_speculative_tokens_per_batch_size`` ([[first batch size, last batch size, K], ...], ranges merged), for
    vLLM's own mechanism, whose K = 0 still runs the draft's first pass."""
    if max_batch < 1 or max_k < 1:
        raise ValueError(f"a schedule needs max_batch >= 1 and max_k >= 1, got {max_batch} and {max_k}.")
    schedule: list[list[int]] = []
    for batch in range(1, max_batch + 1):
        k = best_draft_length([acceptance] * batch, costs, max_k)
        if schedule and schedule[-1][2] == k:
            schedule[-1][1] = batch
        else:
            schedule.append([batch, batch, k])
    return schedule


