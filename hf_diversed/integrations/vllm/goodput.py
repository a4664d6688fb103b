"""How many tokens to draft at a step of a served batch: the goodput model (pure maths, no vLLM import).

A request whose drafted positions are each accepted with probability a (independently; the first rejection ends
the block; the bonus or resampled token always comes) emits, in a step that verifies k drafted tokens,

    E(a, k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)    tokens (E(a, 0) = 1: a plain decoding step).

An engine step's seconds, fitted from the engine's own measured steps:

    seconds = c0 + c_target * max(T, k_target) + sum over the draft's passes of (c_pass + c_draft * max(n_p, k_draft))

with T the target's tokens (each request's last token plus the drafts it verifies) and n_p the tokens of the draft's
p-th forward pass. A forward over fewer tokens than its knee k costs what one over k does: small batches are bound by
reading the weights, not by arithmetic. A steady step of B requests drafting K each (the steps the policy chooses
between) is then scaled by r(B, K), the median of its measured seconds over the model's where the calibration ran that
step at least 3 times (linear in B between measured batches, 1 where K was never measured): the fitted form ranks K
within a few per cent, and at some batch sizes the engine departs from any smooth form (here 4 requests decode faster
than 1). vLLM's draft-model method, proposing K tokens a request, runs a first pass over
the step's tokens plus one slot a request, then K - 1 passes of one token a request; at K = 0 vLLM still runs the
first pass (keeping the draft's cache in step) unless the draft is skipped, and then a catch-up pass over the tokens
it missed runs when it drafts again.

The policy maximises goodput, the batch's expected tokens per second: K = argmax_K sum_i E(a_i, K) / seconds(B, K),
then a request keeps its j-th drafted token only while a_i^j, the expected tokens it adds, is worth the target
time it costs (a_i^j >= c_target * goodput). A catch-up pass is a transition's cost, not a steady step's: after
steps with the draft skipped, drafting again is worth its catch-up over the M tokens the draft missed only if the
batch's remaining tokens R, held at the steady goodputs, take less time drafted than plain by more than that pass
costs: R (1 / G_0 - 1 / G_K) > c_pass + c_draft * max(M, k_draft). And it waits before paying (ski rental): a
batch that dips below its size for a step or two (a request ends and the next has yet to arrive) is back before the
catch-up would pay, so the policy first spends, step by step, what staying plain loses against drafting,
B (1 / G_0 - 1 / G_K) seconds a step, and catches up once that adds up to the catch-up pass's cost. Waiting then costs
at most one catch-up, and a dip shorter than that never pays for one.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
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
    """What one engine step computes: the target's tokens and the tokens of each of the draft's forward passes
    (``batch``: its requests, where known)."""

    target_tokens: int
    draft_passes: tuple[int, ...] = ()
    batch: int | None = None

    def steady_k(self) -> int | None:
        """K where this is a steady step of its batch (every request verifies K drafts and proposes K more, the
        draft skipped at K = 0), else None."""
        if not self.batch or self.target_tokens % self.batch:
            return None
        k = self.target_tokens // self.batch - 1
        return k if self == StepWork.steady(self.batch, k, draft_runs=k > 0) else None

    @classmethod
    def steady(cls, batch: int, k: int, *, draft_runs: bool = True) -> StepWork:
        """A step of ``batch`` requests that verifies k drafts each and proposes k more (vLLM's draft-model
        method); with k = 0 the draft runs its first pass unless ``draft_runs`` is False (the draft skipped)."""
        target = batch * (1 + k)
        if k == 0 and not draft_runs:
            return cls(target, batch=batch)
        return cls(target, (target + batch,) + (batch,) * (max(k, 1) - 1), batch=batch)


KNEES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # the knees a fit tries
MIN_STEADY = 3  # measured steps of one (batch, K) that set its ratio


@dataclass(frozen=True)
class StepCosts:
    """seconds = c0 + c_target * max(T, k_target) + sum_p (c_pass + c_draft * max(n_p, k_draft)) (see the module)."""

    c0: float
    c_target: float
    c_pass: float
    c_draft: float
    k_target: int = 1
    k_draft: int = 1
    steady_ratios: tuple[tuple[int, int, float], ...] = ()  # (B, K, r(B, K)) where measured

    def seconds(self, work: StepWork) -> float:
        draft = sum(self.draft_pass(n) for n in work.draft_passes)
        return self.c0 + self.c_target * max(work.target_tokens, self.k_target) + draft

    def steady_seconds(self, batch: int, k: int, *, draft_runs: bool = True) -> float:
        """The seconds of a steady step of ``batch`` requests drafting k each: the model's, times r(B, K)."""
        seconds = self.seconds(StepWork.steady(batch, k, draft_runs=draft_runs))
        return seconds if k == 0 and draft_runs else seconds * self.ratio(batch, k)

    def ratio(self, batch: int, k: int) -> float:
        """r(B, K): measured over modelled seconds of the steady step, linear in B between measured batches, the
        nearest one's beyond them, 1 where K was never measured."""
        points = self._ratio_points.get(k)
        if not points:
            return 1.0
        below = [p for p in points if p[0] <= batch]
        above = [p for p in points if p[0] >= batch]
        if not below or not above:
            return (below or above)[-1 if below else 0][1]
        (b0, r0), (b1, r1) = below[-1], above[0]
        return r0 if b1 == b0 else r0 + (r1 - r0) * (batch - b0) / (b1 - b0)

    @functools.cached_property
    def _ratio_points(self) -> dict[int, list[tuple[int, float]]]:
        """K -> its measured (B, r(B, K)) sorted by B: read at every step the policy chooses, so sorted once."""
        points: dict[int, list[tuple[int, float]]] = {}
        for b, k, r in sorted(self.steady_ratios):
            points.setdefault(k, []).append((b, r))
        return points

    def draft_pass(self, tokens: int) -> float:
        """c_pass + c_draft * max(n, k_draft): one forward pass of the draft over n tokens."""
        return self.c_pass + self.c_draft * max(tokens, self.k_draft)

    @classmethod
    def fit(cls, steps: Iterable[tuple[StepWork, float]]) -> StepCosts:
        """Least squares on relative errors (each step weighted by 1 / its seconds), every coefficient >= 0
        (active set: a negative one is dropped and the rest refitted), for each pair of knees in ``KNEES``; the
        pair with the smallest mean relative error wins. The steps must vary in their draft passes and tokens."""
        steps = list(steps)
        if len(steps) < 4:
            raise ValueError(f"fitting step costs needs at least 4 measured steps, got {len(steps)}.")
        y = torch.tensor([s for _, s in steps], dtype=torch.float64)
        weight = 1.0 / y
        best: tuple[float, StepCosts] | None = None
        for k_target in KNEES:
            for k_draft in KNEES:
                rows = [[1.0, max(w.target_tokens, k_target), len(w.draft_passes),
                         sum(max(n, k_draft) for n in w.draft_passes)] for w, _ in steps]  # fmt: skip
                coef = _nonnegative_least_squares(torch.tensor(rows, dtype=torch.float64) * weight[:, None], y * weight)
                costs = cls(*(float(c) for c in coef), k_target=k_target, k_draft=k_draft)
                error = sum(abs(costs.seconds(w) - s) / s for w, s in steps) / len(steps)
                if best is None or error < best[0] - 1e-12:
                    best = (error, costs)
        return best[1].with_steady_ratios(steps)

    def with_steady_ratios(self, steps: Iterable[tuple[StepWork, float]]) -> StepCosts:
        """These costs with r(B, K) = median measured / modelled seconds of each steady (B, K) measured at least
        ``MIN_STEADY`` times (steps whose batch is unknown are not steady steps)."""
        measured: dict[tuple[int, int], list[float]] = {}
        for work, seconds in steps:
            k = work.steady_k()
            if k is not None:
                measured.setdefault((work.batch, k), []).append(seconds / self.seconds(work))
        ratios = tuple((b, k, float(torch.tensor(r).median())) for (b, k), r in sorted(measured.items())
                       if len(r) >= MIN_STEADY)  # fmt: skip
        return replace(self, steady_ratios=ratios)

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def from_json(cls, path: str | Path) -> StepCosts:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")), str(path))

    @classmethod
    def from_dict(cls, data: dict, where: str = "step_costs") -> StepCosts:
        missing = {"c0", "c_target", "c_pass", "c_draft"} - set(data)
        if missing:
            raise ValueError(f"{where} is not a step-cost file (no {', '.join(sorted(missing))}): write it with "
                             "python -m hf_diversed.integrations.vllm.calibrate.")  # fmt: skip
        ratios = tuple((int(b), int(k), float(r)) for b, k, r in data.get("steady_ratios", ()))
        return cls(*(float(data[key]) for key in ("c0", "c_target", "c_pass", "c_draft")),
                   k_target=int(data.get("k_target", 1)), k_draft=int(data.get("k_draft", 1)),
                   steady_ratios=ratios)  # fmt: skip


def _nonnegative_least_squares(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    active = list(range(x.shape[1]))
    coef = torch.zeros(x.shape[1], dtype=torch.float64)
    while active:
        solution = torch.linalg.lstsq(x[:, active], y.unsqueeze(1)).solution.squeeze(1)
        if bool((solution >= 0).all()):
            coef[active] = solution
            break
        active.pop(int(solution.argmin()))
    return coef


def goodput(acceptances: Sequence[float], k: int, costs: StepCosts, *, draft_runs: bool = True) -> float:
    """Expected tokens per second of a steady step where every request of the batch drafts k tokens."""
    seconds = costs.steady_seconds(len(acceptances), k, draft_runs=draft_runs)
    return sum(expected_tokens(a, k) for a in acceptances) / seconds


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


def worth_catching_up(
    acceptances: Sequence[float], k: int, costs: StepCosts, remaining_tokens: int, missed_tokens: int
) -> bool:
    """Whether a batch whose draft was skipped should draft k tokens again: its ``remaining_tokens`` R save
    R (1 / G_0 - 1 / G_k) seconds drafted (G: the steady goodputs, the draft skipped at K = 0), against the catch-up
    pass over the ``missed_tokens`` M its draft has not run, c_pass + c_draft * max(M, k_draft)."""
    if missed_tokens <= 0 or k == 0:
        return True
    return remaining_tokens * _saved_per_token(acceptances, k, costs) > costs.draft_pass(missed_tokens)


def _saved_per_token(acceptances: Sequence[float], k: int, costs: StepCosts) -> float:
    """1 / G_0 - 1 / G_k: the seconds a token takes plain (the draft skipped) over what it takes drafting k."""
    return 1.0 / goodput(acceptances, 0, costs, draft_runs=False) - 1.0 / goodput(acceptances, k, costs)


def skipping_cost(acceptances: Sequence[float], k: int, costs: StepCosts) -> float:
    """Seconds a plain step of this batch (the draft skipped) loses against drafting k: its B tokens take
    B / G_0 seconds plain and B / G_k drafted (steady goodputs), so B (1 / G_0 - 1 / G_k); 0 where k does not pay."""
    return max(len(acceptances) * _saved_per_token(acceptances, k, costs), 0.0)


def drafts_to_verify(a: float, k: int, costs: StepCosts, step_goodput: float) -> int:
    """How many of a request's k drafted tokens to verify: its j-th adds a^j expected tokens for c_target seconds
    of the target (above its knee), so keep it while a^j >= c_target * step_goodput (the step's tokens per second)."""
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
