"""Where a method lies against the static-ensemble frontier, with paired bootstrap intervals.

The frontier is the static sweep ``static:W`` plus exact SD (w = 1), each a point (acceptance, quality) over the
same examples and seeds. Acceptance falls as w grows, so the points ordered by acceptance trace quality as a
function of acceptance, Q(a). A method at (a, q) is compared two ways:

- quality at equal acceptance: Δq = q − Q(a), defined while a lies inside the sweep's acceptance range;
- acceptance at equal quality: Δa = a − A(q), with A(q) the highest acceptance at which Q still reaches q,
  defined while q lies inside Q's range.

Q is the least-squares non-increasing fit of the points' quality against their acceptance (pool adjacent
violators), linear between points: sampled qualities are noisy, and a frontier's quality cannot rise with
acceptance.

The frontier of every zero-training rule (``envelope=True``; static, exact, cascades, lossy, token-class: rules a
head is set beside and can start as) is their upper envelope instead: a mixture of two rules (one or the other per
prompt) reaches any point on the segment between them, and a rule is worth running at any acceptance below its own,
so Q(a) is the upper concave hull of the points, flat at its highest quality below that point's acceptance. The
envelope of noisy points is biased upward, which makes "beyond it" the harder verdict.

Intervals resample the examples (the same draw for every method, so the comparison stays paired) and recompute
every point. The verdict reads Δq's interval: beyond the frontier when it lies above 0, inside when below, on it
otherwise.

:func:`compare_to_baseline` compares two methods directly on the examples they share (a learned head against the
hand-made token-class rule): the paired differences in quality and in acceptance, with the same intervals.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence

__all__ = [
    "compare_to_baseline",
    "compare_to_frontier",
    "fitted_frontier",
    "frontier_methods",
    "method_label",
    "zero_training_methods",
]


# The rules a learned head is set beside: they need no training, and a head can start as either kind.
BASELINE_RULE_PREFIXES = ("token-class:", "cascade-")


def method_label(record: dict) -> str:
    """A record's method, with its head for ``diversed`` (``diversed@org/head-gsm8k``): heads are compared apart."""
    return f"{record['method']}@{record['head']}" if record.get("head") else record["method"]


def unfinished_methods(records: Sequence[dict]) -> dict[tuple, int]:
    """(temperature, N, method label) -> examples so far, for each method whose sampler examples are not rows
    0..n-1. The sampler records a sequence when it ends, so a method caught mid-run holds its short completions
    first; one holding a prefix of the rows (a 50-row extra beside 150-row methods) is complete."""
    rows: dict[tuple, set[int]] = defaultdict(set)
    for r in records:
        if r.get("engine") == "sampler":
            rows[(r["temperature"], r["N"], method_label(r))].add(int(r["example_index"]))
    return {key: len(done) for key, done in rows.items() if done != set(range(len(done)))}


def frontier_methods(methods: Sequence[str]) -> list[str]:
    """The methods that make the frontier: every ``static:W`` and ``exact`` (w = 1)."""
    return [m for m in methods if m == "exact" or m.startswith("static:")]


ZERO_TRAINING_PREFIXES = ("static:", "cascade-", "lossy:", "token-class:")


def zero_training_methods(methods: Sequence[str]) -> list[str]:
    """The rules that need no training: ``exact`` and every static, cascade, lossy and token-class rule."""
    return [m for m in methods if m == "exact" or m.startswith(ZERO_TRAINING_PREFIXES)]


def _interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Piecewise-linear y(x) through points sorted by x; None outside [xs[0], xs[-1]]."""
    if not xs or x < xs[0] - 1e-12 or x > xs[-1] + 1e-12:
        return None
    for i in range(1, len(xs)):
        if x <= xs[i] + 1e-12:
            span = xs[i] - xs[i - 1]
            t = 0.0 if span <= 0 else (x - xs[i - 1]) / span
            return ys[i - 1] + min(max(t, 0.0), 1.0) * (ys[i] - ys[i - 1])
    return ys[-1]


def _decreasing_fit(values: Sequence[float]) -> list[float]:
    """Least-squares non-increasing fit of ``values`` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [s / c for s, c in blocks for _ in range(int(c))]


def fitted_frontier(
    points: Sequence[tuple[float, float]], *, envelope: bool = False
) -> tuple[list[float], list[float]]:  # fmt: skip
    """The frontier the verdicts read, from (acceptance, quality) points: acceptances sorted, and the least-squares
    non-increasing fit of quality along them, or with ``envelope`` the vertices of the non-increasing upper concave
    hull (both linear between the acceptances returned)."""
    points = sorted(points)
    if not envelope:
        return [a for a, _ in points], _decreasing_fit([q for _, q in points])
    hull: list[tuple[float, float]] = []
    for a, q in points:  # upper hull, left to right: drop a vertex under the chord of its neighbours
        while len(hull) >= 2 and _cross(hull[-2], hull[-1], (a, q)) >= 0:
            hull.pop()
        if hull and a - hull[-1][0] <= 1e-12:
            if q <= hull[-1][1]:
                continue
            hull.pop()
        hull.append((a, q))
    top = max(range(len(hull)), key=lambda i: (hull[i][1], hull[i][0]))
    kept = hull[top:]
    if points[0][0] < kept[0][0]:
        kept.insert(0, (points[0][0], kept[0][1]))
    return [a for a, _ in kept], [q for _, q in kept]


def _cross(o: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def _acceptance_at(quality: float, accs: Sequence[float], fitted: Sequence[float]) -> float | None:
    """The highest acceptance at which the non-increasing fit still reaches ``quality`` (flat stretches, common
    with 0/1 rewards, count at their high-acceptance end); None outside the fit's range."""
    eps = 1e-9
    if quality > fitted[0] + eps or quality < fitted[-1] - eps:
        return None
    j = max(i for i, f in enumerate(fitted) if f >= quality - eps)
    if j == len(fitted) - 1 or fitted[j] - fitted[j + 1] <= eps:
        return accs[j]
    t = (fitted[j] - quality) / (fitted[j] - fitted[j + 1])
    return accs[j] + t * (accs[j + 1] - accs[j])


def _point(records: dict[int, dict], sample: Sequence[int], scale: float) -> tuple[float, float] | None:
    drafted = sum(records[i]["drafted"] for i in sample)
    if drafted <= 0:
        return None
    accepted = sum(records[i]["accepted"] for i in sample)
    return accepted / drafted, scale * sum(records[i]["quality"] for i in sample) / len(sample)


def _deltas(by_method, frontier, method, sample, scale, envelope=False):
    points = [p for m in frontier if (p := _point(by_method[m], sample, scale)) is not None]
    own = _point(by_method[method], sample, scale)
    if own is None or len(points) < 2:
        return None, None, own, None, None
    accs, fitted = fitted_frontier(points, envelope=envelope)  # quality against rising acceptance
    q_front = _interp(own[0], accs, fitted)
    a_front = _acceptance_at(own[1], accs, fitted)
    dq = None if q_front is None else own[1] - q_front
    da = None if a_front is None else own[0] - a_front
    return dq, da, own, q_front, a_front


def _interval(values: list[float]) -> list[float] | None:
    if len(values) < 20:
        return None
    values = sorted(values)
    return [values[int(0.025 * len(values))], values[int(0.975 * len(values)) - 1]]


def _by_method(records: Sequence[dict]) -> dict[str, dict[int, dict]]:
    by_method: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in records:
        if r.get("engine") == "sampler" and r.get("drafted") is not None and r.get("quality") is not None:
            by_method[method_label(r)][r["example_index"]] = r
    return by_method


def compare_to_baseline(
    records: Sequence[dict], method: str, baseline: str, *, resamples: int = 2000, seed: int = 0
) -> dict | None:  # fmt: skip
    """``method`` minus ``baseline`` (both :func:`method_label`) on the examples both have: Δ quality and
    Δ acceptance (pooled accepted / drafted) with paired bootstrap intervals. None when they share no example."""
    by_method = _by_method(records)
    if method not in by_method or baseline not in by_method:
        return None
    common = sorted(set(by_method[method]) & set(by_method[baseline]))
    if not common:
        return None
    scale = 1.0 if by_method[method][common[0]].get("metric") == "rouge2" else 100.0

    def gaps(sample: Sequence[int]) -> tuple[float, float] | None:
        own, base = _point(by_method[method], sample, scale), _point(by_method[baseline], sample, scale)
        if own is None or base is None:
            return None
        return own[1] - base[1], own[0] - base[0]

    own, base = _point(by_method[method], common, scale), _point(by_method[baseline], common, scale)
    if own is None or base is None:
        return None
    rng = random.Random(seed)
    drawn = [g for _ in range(resamples) if (g := gaps([rng.choice(common) for _ in common])) is not None]
    return {
        "method": method,
        "baseline": baseline,
        "n": len(common),
        "acceptance": own[0],
        "quality": own[1],
        "baseline_acceptance": base[0],
        "baseline_quality": base[1],
        "quality_gap": own[1] - base[1],
        "quality_gap_ci": _interval([g[0] for g in drawn]),
        "acceptance_gap": own[0] - base[0],
        "acceptance_gap_ci": _interval([g[1] for g in drawn]),
    }


def compare_to_frontier(
    records: Sequence[dict],
    method: str,
    *,
    frontier: Sequence[str] | None = None,
    envelope: bool = False,
    resamples: int = 2000,
    seed: int = 0,
) -> dict | None:
    """``method`` (a :func:`method_label`) against the frontier on the examples every frontier method and ``method``
    share.

    ``records``: sampler records of one task, temperature, N and max_new_tokens (``hf-diversed bench`` lines);
    ``frontier``: its methods (default: the static sweep and exact); ``envelope``: their upper envelope rather than
    the fit (the module). Returns None when the frontier has fewer than two methods or they share no example with
    ``method``.
    """
    by_method = _by_method(records)
    frontier = frontier_methods(sorted(by_method)) if frontier is None else [m for m in frontier if m in by_method]
    if method not in by_method or len([m for m in frontier if m != method]) < 2:
        return None
    frontier = [m for m in frontier if m != method]
    common = sorted(set.intersection(*(set(by_method[m]) for m in [*frontier, method])))
    if not common:
        return None
    scale = 1.0 if by_method[method][common[0]].get("metric") == "rouge2" else 100.0
    dq, da, own, q_front, a_front = _deltas(by_method, frontier, method, common, scale, envelope)
    rng = random.Random(seed)
    dqs, das = [], []
    for _ in range(resamples):
        sample = [rng.choice(common) for _ in common]
        b_dq, b_da, *_ = _deltas(by_method, frontier, method, sample, scale, envelope)
        if b_dq is not None:
            dqs.append(b_dq)
        if b_da is not None:
            das.append(b_da)
    dq_ci, da_ci = _interval(dqs), _interval(das)
    if dq is None:
        verdict = "outside the sweep's acceptance range"
    elif dq_ci is None:
        verdict = "undetermined"
    else:
        verdict = "beyond the frontier" if dq_ci[0] > 0 else "inside the frontier" if dq_ci[1] < 0 else "on it"
    return {
        "method": method,
        "frontier": frontier,
        "n": len(common),
        "acceptance": own[0],
        "quality": own[1],
        "frontier_quality": q_front,
        "quality_gap": dq,
        "quality_gap_ci": dq_ci,
        "quality_gap_defined": len(dqs) / resamples,
        "frontier_acceptance": a_front,
        "acceptance_gap": da,
        "acceptance_gap_ci": da_ci,
        "acceptance_gap_defined": len(das) / resamples,
        "verdict": verdict,
    }
