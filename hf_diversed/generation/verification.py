"""Verification rules for speculative decoding: pure tensor maths, torch only (TV from ``modeling.distances``).

Notation (the paper's): ``p`` target distribution, ``q`` draft distribution, both after the logits
processors; ``x`` a drafted token; ``gamma`` the number of drafted tokens; ``pi`` a rule's verification
target. Shapes: draft tokens ``(B, gamma)``, draft logits ``(B, gamma, V)``, target logits
``(B, gamma + 1, V)`` (the last row predicts the bonus token).

Sampling (every rule but lossy SD): accept ``x`` with probability ``min(1, pi(x) / q(x))``; at the first
rejection resample from ``norm(max(0, pi - q))`` (``p`` if that is all zero); after a fully accepted draft
take the bonus token from ``p``. For a mixture ``pi = w * p + (1 - w) * q`` the ratio is
``1 - w + w * p(x) / q(x)`` and ``max(0, pi - q) = w * max(0, p - q)``, so the residual is the exact-SD one.
Greedy: accept ``x`` iff ``x = argmax pi``; the correction token is ``argmax pi``; the bonus ``argmax p``.

Randomness is drawn from ``generator`` (``None``: torch's global stream, in the same order and shapes as
transformers' ``_speculative_sampling``, so exact SD and the static ensemble reproduce its tokens).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from ..modeling.distances import total_variation

__all__ = [
    "Diversed",
    "DiversedLossy",
    "ExactSD",
    "LossySD",
    "SpecCascade",
    "StaticEnsemble",
    "TOKEN_CLASSES",
    "TokenClassEnsemble",
    "lenience_overlap",
    "Verdict",
    "VerificationRule",
    "parse_rule",
    "rule_for_head",
    "parse_token_class_spec",
]


@dataclass
class Verdict:
    """Outcome of verifying one draft block.

    ``tokens[b, :num_accepted[b] + 1]`` is what sequence ``b`` appends: the accepted drafts, then the
    correction token (first rejection) or the bonus token (all accepted). ``weight`` is the mixture
    weight used per drafted position (1 for rules that are not mixtures); ``tv`` is TV(p_t, q_t).
    """

    tokens: torch.Tensor  # (B, gamma + 1)
    num_accepted: torch.Tensor  # (B,)
    weight: torch.Tensor  # (B, gamma)
    tv: torch.Tensor  # (B, gamma)


def _leading_true(accepted: torch.Tensor) -> torch.Tensor:
    """Length of the all-True prefix of each row: ``(B, gamma) -> (B,)``."""
    return (~accepted).cumsum(-1).eq(0).sum(-1)


def _gather_token_probs(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (B, gamma)


def _row_at(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[b, index[b]]`` for ``x`` of shape (B, L, V): ``(B, V)``."""
    return x.gather(1, index.view(-1, 1, 1).expand(-1, 1, x.shape[-1])).squeeze(1)


def _assemble(draft_tokens: torch.Tensor, num_accepted: torch.Tensor, next_token: torch.Tensor) -> torch.Tensor:
    tokens = torch.cat([draft_tokens, draft_tokens.new_zeros(draft_tokens.shape[0], 1)], dim=1)  # (B, gamma + 1)
    return tokens.scatter(1, num_accepted.unsqueeze(1), next_token.view(-1, 1))


def _sample_next(
    p: torch.Tensor,
    residual: torch.Tensor,
    num_accepted: torch.Tensor,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Sample the token after the accepted prefix.

    ``residual`` is ``(B, gamma, V)``, unnormalised. Row ``n = num_accepted`` of it is used when ``n < gamma``
    (falling back to ``p_n`` when it sums to zero); the bonus row ``p_gamma`` otherwise.
    """
    gamma = residual.shape[1]
    p_n = _row_at(p, num_accepted)  # (B, V)
    if gamma == 0:
        return torch.multinomial(p_n, 1, generator=generator).squeeze(1)
    res_n = _row_at(residual, num_accepted.clamp(max=gamma - 1))  # (B, V)
    mass = res_n.sum(-1, keepdim=True)
    usable = (mass > torch.finfo(mass.dtype).tiny) & (num_accepted < gamma).unsqueeze(1)
    dist = torch.where(usable, res_n / mass.clamp_min(torch.finfo(mass.dtype).tiny), p_n)
    return torch.multinomial(dist, 1, generator=generator).squeeze(1)


class VerificationRule:
    """A verification rule: per-position weights, acceptance ratio, residual and greedy targets.

    Subclasses state their acceptance probability, residual and output law. ``verify`` is shared: it
    runs the sequential accept/resample procedure of speculative decoding with the rule's pieces.
    """

    name: str = "rule"
    needs_head: bool = False

    def weights(self, p: torch.Tensor, q: torch.Tensor, head_weight: torch.Tensor | None) -> torch.Tensor:
        """Mixture weight w_t per drafted position, ``(B, gamma)``; ``p`` holds only the drafted rows."""
        return torch.ones(q.shape[:2], dtype=q.dtype, device=q.device)

    def acceptance_ratio(self, p_x: torch.Tensor, q_x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x ~ q is accepted with probability min(1, ratio)."""
        return 1.0 - w + w * (p_x / q_x)

    def residual(self, p: torch.Tensor, q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Unnormalised resampling distribution after a rejection (``p``, ``q``: ``(B, gamma, V)``)."""
        return (p - q).clamp_min(0)

    def exact_target(self, p: torch.Tensor, q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The unnormalised t with which *exact* verification runs this rule: accepting x ~ q with min(1, t(x)/q(x))
        and resampling from norm(max(0, t - q)) are this rule's acceptance and residual (``(..., V)`` in and out).

        For the mixture rules t = nu = w p + (1 - w) q: min(1, nu/q) = min(1, 1 - w + w p/q) and
        max(0, nu - q) = w max(0, p - q). An engine that verifies exactly (vLLM) runs any rule when handed t.
        """
        w = w.unsqueeze(-1)
        return w * p + (1.0 - w) * q

    def acceptance_probability(self, p: torch.Tensor, q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Closed form E_{x~q}[min(1, ratio(x))] per position, ``(B, gamma)``."""
        return self._accepted_mass(p, q, w).sum(-1)

    def _accepted_mass(self, p, q, w):
        """q(y) * min(1, ratio(y)), zero where q(y) = 0: ``(B, gamma, V)``."""
        ratio = self.acceptance_ratio(p, q, w.unsqueeze(-1)).clamp(max=1.0)
        return torch.where(q > 0, q * ratio, torch.zeros_like(q))

    def output_law(self, p: torch.Tensor, q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Closed-form law of the token a position emits: q(y) min(1, ratio(y)) + (1 - beta) norm(residual)(y).

        beta is :meth:`acceptance_probability`; an all-zero residual falls back to p, as ``verify`` does.
        """
        accept = self._accepted_mass(p, q, w)  # (B, gamma, V)
        residual = self.residual(p, q, w)
        mass = residual.sum(-1, keepdim=True)
        resample = torch.where(mass > torch.finfo(mass.dtype).tiny, residual / mass.clamp_min(1e-38), p)
        return accept + (1.0 - accept.sum(-1, keepdim=True)) * resample

    def greedy_targets(self, p, q, w, target_logits) -> torch.Tensor:
        """Greedy: the token each drafted position must equal, ``(B, gamma)``: argmax of pi = w p + (1 - w) q."""
        w = w.unsqueeze(-1)
        return (w * p + (1.0 - w) * q).argmax(-1)  # (B, gamma)

    def greedy_accept(self, draft_tokens, p, q, w, target_logits) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy verdict per drafted position: (accepted (B, gamma) bool, correction tokens (B, gamma))."""
        targets = self.greedy_targets(p, q, w, target_logits)
        return draft_tokens == targets, targets

    def verify(
        self,
        draft_tokens: torch.Tensor,
        draft_logits: torch.Tensor,
        target_logits: torch.Tensor,
        *,
        do_sample: bool,
        head_weight: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Verdict:
        """Verify a drafted block.

        Shapes: draft tokens (B, gamma), draft logits (B, gamma, V), target logits (B, gamma + 1, V).
        """
        gamma = draft_tokens.shape[1]
        p = target_logits.softmax(-1)  # (B, gamma + 1, V)
        q = draft_logits.softmax(-1)  # (B, gamma, V)
        p_draft = p[:, :gamma]
        w = self.weights(p_draft, q, head_weight).to(p.dtype)  # (B, gamma)
        tv = total_variation(p_draft, q)
        if do_sample:
            ratio = self.acceptance_ratio(
                _gather_token_probs(p_draft, draft_tokens), _gather_token_probs(q, draft_tokens), w
            )
            accepted = torch.rand(ratio.shape, generator=generator, dtype=ratio.dtype, device=ratio.device) <= ratio
            num_accepted = _leading_true(accepted)
            next_token = _sample_next(p, self.residual(p_draft, q, w), num_accepted, generator)
        else:
            accepted, corrections = self.greedy_accept(draft_tokens, p_draft, q, w, target_logits)
            num_accepted = _leading_true(accepted)
            bonus = target_logits[:, gamma].argmax(-1, keepdim=True)
            next_token = torch.cat([corrections, bonus], 1).gather(1, num_accepted.unsqueeze(1)).squeeze(1)
        return Verdict(_assemble(draft_tokens, num_accepted, next_token), num_accepted, w, tv)

    def spec(self) -> str:
        """Compact string form, accepted back by :func:`parse_rule`."""
        return self.name


class _MixtureRule(VerificationRule):
    """pi_t = w_t * p_t + (1 - w_t) * q_t with a rule-specific weight w_t in [0, 1].

    Acceptance probability of a drafted x ~ q_t: min(1, 1 - w_t + w_t * p_t(x) / q_t(x)), in expectation
    1 - w_t * TV(p_t, q_t). Residual: norm(max(0, p_t - q_t)). Output law per position: exactly pi_t.
    Greedy: accept iff x = argmax pi_t, correction argmax pi_t, bonus argmax p.
    """


@dataclass(frozen=True)
class ExactSD(_MixtureRule):
    """Exact speculative decoding (Leviathan et al. 2023): pi = p, i.e. w = 1.

    Acceptance min(1, p(x)/q(x)), in expectation 1 - TV(p, q); residual norm(max(0, p - q)); output law p.
    Greedy: accept iff x = argmax p. Token-for-token identical to transformers' assisted generation.
    """

    name = "exact"

    def weights(self, p, q, head_weight):
        return torch.ones(q.shape[:2], dtype=q.dtype, device=q.device)

    def greedy_targets(self, p, q, w, target_logits):
        return target_logits[:, : q.shape[1]].argmax(-1)


@dataclass(frozen=True)
class StaticEnsemble(_MixtureRule):
    """Static ensemble: pi = nu = w * p + (1 - w) * q with one constant w in [0, 1] (w = 1 is exact SD).

    Acceptance 1 - w * TV(p, q) in expectation; residual norm(max(0, p - q)); output law nu; bias
    TV(nu, p) = (1 - w) * TV(p, q). Identical to transformers' ``assistant_ensemble_weight=w``.
    """

    weight: float = 0.5
    name = "static"

    def __post_init__(self):
        _check_unit_interval("StaticEnsemble weight w", self.weight, "StaticEnsemble(0.5)")

    def weights(self, p, q, head_weight):
        return torch.full(q.shape[:2], self.weight, dtype=q.dtype, device=q.device)

    # Python-float expressions, as transformers writes them, so tokens match its ensemble bit for bit.
    def acceptance_ratio(self, p_x, q_x, w):
        return 1.0 - self.weight + self.weight * (p_x / q_x)

    def greedy_targets(self, p, q, w, target_logits):
        return (self.weight * p + (1.0 - self.weight) * q).argmax(-1)

    def spec(self) -> str:
        return f"static:{self.weight:g}"


@dataclass(frozen=True)
class Diversed(_MixtureRule):
    """DIVERSED: nu_t = w_t * p_t + (1 - w_t) * q_t with w_t = head(h_draft_t, h_target_t) per position.

    The head sees only the context (the hidden states that predict token t, never the drafted token),
    so the acceptance is 1 - w_t * TV(p_t, q_t) in expectation and the output law is exactly nu_t.
    """

    name = "diversed"
    needs_head = True

    def weights(self, p, q, head_weight):
        if head_weight is None:
            raise ValueError(
                "The DIVERSED rule needs per-position weights from an ensemble head; pass `diversed_head=`."
            )
        return head_weight


def _has_digit(text: str) -> bool:
    return any(ch.isdigit() for ch in text)


# Named token classes for ``TokenClassEnsemble.from_tokenizer`` and ``"token-class:NAME:W"`` specs: a predicate
# on a token's decoded text.
TOKEN_CLASSES = {"digits": _has_digit}


@dataclass(frozen=True)
class TokenClassEnsemble(_MixtureRule):
    """Exact verification where a token of a class is likely next, a static ensemble with weight w elsewhere.

    w_t = 1 if argmax p_t or argmax q_t is in the class S (a set of token ids), else w. The weight depends on
    the context only (both models' most likely next tokens), never on the drafted token, so this is a mixture
    rule like DIVERSED with a hand-made head: acceptance 1 - w_t TV(p_t, q_t) in expectation, residual
    norm(max(0, p_t - q_t)), output law nu_t = w_t p_t + (1 - w_t) q_t. With S = the tokens containing a digit
    and w = 0, GSM8K answers keep the target's numbers while everything else is the draft's.
    Greedy: accept iff x = argmax nu_t.
    """

    token_ids: frozenset = frozenset()
    weight: float = 0.0
    label: str = "ids"
    name = "token-class"

    def __post_init__(self):
        _check_unit_interval("TokenClassEnsemble weight w", self.weight, "TokenClassEnsemble(ids, 0.0)")
        ids = frozenset(int(i) for i in self.token_ids)
        if not ids:
            raise ValueError(
                "TokenClassEnsemble needs a non-empty set of token ids; build it with "
                'TokenClassEnsemble.from_tokenizer(tokenizer, "digits", weight) or pass token_ids=...'
            )
        object.__setattr__(self, "token_ids", ids)

    @classmethod
    def from_tokenizer(cls, tokenizer, token_class: str = "digits", weight: float = 0.0) -> TokenClassEnsemble:
        """The class ``token_class`` (a name in :data:`TOKEN_CLASSES` or a predicate on a token's text)."""
        predicate = TOKEN_CLASSES.get(token_class) if isinstance(token_class, str) else token_class
        if predicate is None:
            raise ValueError(
                f"Unknown token class {token_class!r}; use one of {', '.join(TOKEN_CLASSES)} or pass a predicate "
                "str -> bool on a token's decoded text."
            )
        ids = [i for i in range(len(tokenizer)) if predicate(tokenizer.decode([i]))]
        label = token_class if isinstance(token_class, str) else getattr(token_class, "__name__", "custom")
        return cls(frozenset(ids), weight, label)

    def weights(self, p, q, head_weight):
        return self.weights_from_top(p.argmax(-1), q.argmax(-1)).to(p.dtype)

    def weights_from_top(self, top_p: torch.Tensor, top_q: torch.Tensor) -> torch.Tensor:
        """w from both models' most likely tokens (ids, any shape): 1 where either is in the class, else w."""
        ids = self._ids_on(top_p.device)
        in_class = torch.isin(top_p, ids) | torch.isin(top_q, ids)
        return torch.where(in_class, 1.0, self.weight).float()

    def _ids_on(self, device: torch.device) -> torch.Tensor:
        """The class's ids as a tensor on ``device``, built once per device (a copy per call would sync a GPU)."""
        cache = self.__dict__.setdefault("_ids_by_device", {})
        if device not in cache:
            cache[device] = torch.tensor(sorted(self.token_ids), device=device)
        return cache[device]

    def spec(self) -> str:
        return f"token-class:{self.label}:{self.weight:g}"


_CASCADE_RULES = ("chow", "diff", "opt")


@dataclass(frozen=True)
class SpecCascade(_MixtureRule):
    """Speculative cascades (Narasimhan et al., ICLR 2025): defer to the target where the draft is unsure.

    Deferral delta_t in {0, 1} with lenience alpha: Chow delta = [max q < 1 - alpha];
    Diff delta = [max q < max p - alpha]; OPT delta = [max q < max p - alpha * TV(p, q)].
    pi = (1 - delta) * q + delta * p: a mixture with w = delta, so where delta = 0 every draft is accepted
    and where delta = 1 verification is exact. Output law per position: pi_t.
    """

    rule: str = "opt"
    alpha: float = 0.1
    name = "cascade"

    def __post_init__(self):
        if self.rule not in _CASCADE_RULES:
            raise ValueError(f"Unknown SpecCascade rule {self.rule!r}; use one of {', '.join(_CASCADE_RULES)}.")
        _check_unit_interval("SpecCascade alpha", self.alpha, 'SpecCascade("opt", 0.1)')

    def weights(self, p, q, head_weight):
        return self.weights_from_stats(p.amax(-1), q.amax(-1), total_variation(p, q)).to(q.dtype)

    def weights_from_stats(self, max_p: torch.Tensor, max_q: torch.Tensor, tv: torch.Tensor) -> torch.Tensor:
        """delta from max p, max q and TV(p, q) (any shape; what rollout traces record per position)."""
        if self.rule == "chow":
            defer = max_q < 1.0 - self.alpha
        elif self.rule == "diff":
            defer = max_q < max_p - self.alpha
        else:
            defer = max_q < max_p - self.alpha * tv
        return defer.float()

    def greedy_targets(self, p, q, w, target_logits):
        return torch.where(w.bool(), target_logits[:, : q.shape[1]].argmax(-1), q.argmax(-1))

    def spec(self) -> str:
        return f"cascade-{self.rule}:{self.alpha:g}"


@dataclass(frozen=True)
class LossySD(VerificationRule):
    """Lossy speculative decoding with lenience l in (0, 1] (Leviathan et al. 2023, appendix).

    Sampling: accept x with min(1, p(x) / (l * q(x))); residual norm(max(0, p - l * q)). Output law:
    P(y) = min(q(y), p(y)/l) + (1 - beta) * norm(max(0, p - l q))(y), beta = sum_v min(q(v), p(v)/l) = S(l) / l with
    S(l) = sum_v min(p(v), l q(v)); l = 1 is exact SD. Greedy: accept iff p(x) >= l * max p; correction argmax p;
    bonus argmax p.
    """

    lenience: float = 0.5
    name = "lossy"

    def __post_init__(self):
        if not (
            isinstance(self.lenience, (int, float)) and 0.0 < self.lenience <= 1.0 and math.isfinite(self.lenience)
        ):
            raise ValueError(f"LossySD lenience l must be in (0, 1], got {self.lenience!r}. Pass e.g. LossySD(0.5).")

    def lenience_at(self, w: torch.Tensor) -> torch.Tensor | float:
        """l_t per position given the rule's weights ``w``: the constant l (a lenience head: its output)."""
        return self.lenience

    def acceptance_ratio(self, p_x, q_x, w):
        return p_x / (self.lenience_at(w) * q_x)

    def residual(self, p, q, w):
        return (p - _per_token(self.lenience_at(w)) * q).clamp_min(0)

    def exact_target(self, p, q, w):
        """t = p / l: min(1, t/q) = min(1, p / (l q)) and max(0, t - q) = max(0, p - l q) / l."""
        return p / _per_token(self.lenience_at(w))

    def greedy_accept(self, draft_tokens, p, q, w, target_logits):
        accepted = _gather_token_probs(p, draft_tokens) >= self.lenience_at(w) * p.amax(-1)
        return accepted, target_logits[:, : q.shape[1]].argmax(-1)

    def spec(self) -> str:
        return f"lossy:{self.lenience:g}"


def _per_token(lenience: torch.Tensor | float) -> torch.Tensor | float:
    """A per-position lenience (..., ) broadcast over the vocabulary (..., 1); a constant as it is."""
    return lenience.unsqueeze(-1) if isinstance(lenience, torch.Tensor) else lenience


def lenience_overlap(p: torch.Tensor, q: torch.Tensor, lenience: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """S(l) = sum_v min(p(v), l q(v)) and its slope dS/dl = sum_{v: l q(v) < p(v)} q(v), per position: ``p``, ``q``
    (..., V), ``lenience`` (...,) -> two (...,). Lossy SD at l accepts with probability S(l) / l, and its residual
    max(0, p - l q) has mass 1 - S(l); S is concave in l, S(1) = 1 - TV(p, q)."""
    scaled = lenience.unsqueeze(-1) * q
    return torch.minimum(p, scaled).sum(-1), torch.where(scaled < p, q, torch.zeros_like(q)).sum(-1)


LENIENCE_FLOOR = 1e-3  # a lenience head's smallest l_t: p(x) / (l q(x)) stays finite


@dataclass(frozen=True)
class DiversedLossy(LossySD):
    """DIVERSED with a lenience head: lossy SD whose lenience l_t = head(h_draft_t, h_target_t) is set per position
    (clamped to [LENIENCE_FLOOR, 1]).

    Accept x ~ q_t with min(1, p_t(x) / (l_t q_t(x))); residual norm(max(0, p_t - l_t q_t)). Unlike a mixture
    nu_t, which passes a token the target gives no mass with probability 1 - w_t, this never accepts one with
    p_t(x) = 0 and always accepts one with p_t(x) >= l_t q_t(x). The head sees only the context, so the output law
    at t is :meth:`LossySD.output_law` at l_t; l_t = 1 is exact SD.
    """

    lenience: float = 1.0  # unused: l_t comes from the head
    name = "diversed-lossy"
    needs_head = True

    def weights(self, p, q, head_weight):
        if head_weight is None:
            raise ValueError(
                "The DIVERSED lenience rule needs per-position lenience from a head; pass `diversed_head=`."
            )
        return head_weight.clamp(LENIENCE_FLOOR, 1.0)

    def lenience_at(self, w):
        return w

    def spec(self) -> str:
        return self.name


def _check_unit_interval(what: str, value: float, example: str) -> None:
    if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0 and math.isfinite(value)):
        raise ValueError(f"{what} must be in [0, 1], got {value!r}. Pass e.g. {example}.")


_SPEC = re.compile(r"^(?P<name>[a-z]+)(?:-(?P<variant>[a-z]+))?(?::(?P<value>[^:]+))?$")
RULE_SPECS = (
    "exact", "diversed", "diversed-lossy", "static:W", "lossy:L", "cascade-chow:A", "cascade-diff:A", "cascade-opt:A",
    "token-class:CLASS:W",
)  # fmt: skip
_TOKEN_CLASS_SPEC = re.compile(r"^token-class:(?P<label>[a-z_]+)(?::(?P<value>[^:]+))?$")


def parse_token_class_spec(spec: str) -> tuple[str, float] | None:
    """``"token-class:CLASS:W"`` -> (CLASS, W) (W defaults to 0), checked; None for any other spec."""
    match = _TOKEN_CLASS_SPEC.match(spec.strip().lower())
    if match is None:
        return None
    label, value = match["label"], match["value"]
    if label not in TOKEN_CLASSES:
        raise ValueError(f"Rule {spec!r}: unknown token class {label!r}; use one of {', '.join(TOKEN_CLASSES)}.")
    try:
        weight = float(value) if value is not None else 0.0
    except ValueError:
        raise ValueError(f"Rule {spec!r} has a non-numeric weight {value!r}; e.g. token-class:{label}:0.") from None
    _check_unit_interval(f"Rule {spec!r}: the weight", weight, f"token-class:{label}:0")
    return label, weight


def parse_rule(spec: str | VerificationRule, tokenizer=None) -> VerificationRule:
    """Turn ``"exact"``, ``"diversed"``, ``"static:0.5"``, ``"lossy:0.7"``, ``"cascade-opt:0.1"`` or
    ``"token-class:digits:0"`` (needs ``tokenizer``, whose vocabulary defines the class) into a rule.

    A :class:`VerificationRule` instance is returned unchanged.
    """
    if isinstance(spec, VerificationRule):
        return spec
    if not isinstance(spec, str):
        raise ValueError(
            f"`diversed_verifier` expects a rule name or a VerificationRule, got {type(spec).__name__}. "
            f'Pass e.g. diversed_verifier="static:0.5" or hf_diversed.StaticEnsemble(0.5).'
        )
    hint = f"Valid forms: {', '.join(RULE_SPECS)}."
    token_class = parse_token_class_spec(spec)
    if token_class is not None:
        label, weight = token_class
        if tokenizer is None:
            raise ValueError(
                f"Rule {spec!r} needs the tokenizer to find the {label!r} tokens: pass tokenizer=... to generate "
                f'(or build hf_diversed.TokenClassEnsemble.from_tokenizer(tokenizer, "{label}", {weight:g})).'
            )
        return TokenClassEnsemble.from_tokenizer(tokenizer, label, weight)
    match = _SPEC.match(spec.strip().lower())
    if match is None:
        raise ValueError(f"Unknown verification rule {spec!r}. {hint}")
    name, variant, value = match["name"], match["variant"], match["value"]
    try:
        number = float(value) if value is not None else None
    except ValueError:
        raise ValueError(f"Rule {spec!r} has a non-numeric parameter {value!r}. {hint}") from None
    if name in ("exact", "diversed") and variant is None and number is None:
        return ExactSD() if name == "exact" else Diversed()
    if name == "diversed" and variant == "lossy" and number is None:
        return DiversedLossy()
    if name == "static" and variant is None and number is not None:
        return StaticEnsemble(number)
    if name == "lossy" and variant is None and number is not None:
        return LossySD(number)
    if name == "cascade" and number is not None:
        return SpecCascade(variant or "opt", number)
    raise ValueError(f"Unknown verification rule {spec!r}. {hint}")


def rule_for_head(rule: VerificationRule, verification: str) -> VerificationRule:
    """The rule that runs with a head whose output sets ``verification`` (``"mixture"``: w_t, DIVERSED;
    ``"lenience"``: l_t, :class:`DiversedLossy`). A rule that needs no head is returned as it is; "diversed" means the
    head's own rule; "diversed-lossy" with a mixture head is refused."""
    if not rule.needs_head:
        return rule
    if isinstance(rule, DiversedLossy) and verification != "lenience":
        raise ValueError(
            "Rule 'diversed-lossy' needs a lenience head (config.verification='lenience'), but this head sets the "
            "mixture weight; use diversed_verifier='diversed' (or drop it) with this head."
        )
    own = _HEAD_RULES["lenience" if verification == "lenience" else "mixture"]
    return rule if type(rule) is type(own) else own  # the same object for equal rows: engines group rows by it


_HEAD_RULES = {"mixture": Diversed(), "lenience": DiversedLossy()}


def parse_token_class_rule(spec: str, tokenizer) -> TokenClassEnsemble:
    """:func:`parse_rule` where only a token-class rule makes sense (the head diagnostics compare a head with one)."""
    rule = parse_rule(spec, tokenizer=tokenizer)
    if not isinstance(rule, TokenClassEnsemble):
        raise ValueError(f"Expected a token-class rule such as 'token-class:digits:0', got {spec!r}.")
    return rule
