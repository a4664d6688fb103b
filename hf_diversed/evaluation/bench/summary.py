"""Pooling the records into summary rows: quality with 95% intervals, acceptance, speedup and the speed models."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from .config import DEFAULT_TASKS, LORA_METHOD
from .costs import analytic_speedup, costs_key, tau_speedup


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """95% Wilson score interval of a proportion (0/1 rewards): robust near 0 and 1 and for small n."""
    if n <= 0:
        return None
    phat = successes / n
    center = (phat + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, center - half), min(1.0, center + half)


def bootstrap_interval(values: Sequence[float], *, resamples: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """95% percentile bootstrap interval of a mean (deterministic: a fixed seed)."""
    import random

    if len(values) < 2:
        return None
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _std(xs: list[float]) -> float | None:
    return statistics.stdev(xs) if len(xs) > 1 else None


def _finite(xs: Iterable[Any]) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(float(x))]


GROUP_FIELDS = ("task", "split", "temperature", "target", "max_new_tokens", "dtype", "seed",
                "method", "N", "draft", "head", "lora_draft")  # fmt: skip
AR_FIELDS = GROUP_FIELDS[:7]


def summarize_records(records: Sequence[dict], costs: dict | None = None) -> list[dict]:
    """Pool records per (task, temperature, method, N, models, settings) into summary rows.

    Pooled: acceptance = Σaccepted / Σdrafted, accepted/round = (Σaccepted + Σrounds) / Σrounds, tokens/s =
    Σtokens / Σseconds, mean w = Σweight / Σverified. Speedup = tokens/s / tokens/s of ``ar`` in the same
    (task, split, temperature, target, max_new_tokens, dtype, seed), also on the examples both ran
    (``speedup_matched``). Quality is the task metric x100 (ROUGE-2 already is) with its standard error.
    """
    costs = costs or {}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in records:
        groups[tuple(record.get(k) for k in GROUP_FIELDS)].append(record)
    method_at = GROUP_FIELDS.index("method")

    def loop(recs):
        return [r for r in recs if r.get("engine", "loop") == "loop"]

    ar_groups = {key[: len(AR_FIELDS)]: loop(recs) for key, recs in groups.items() if key[method_at] == "ar"}
    # The target alone has exact SD's law: its quality is exact SD's sampled quality (same examples and seeds).
    exact_all: dict[tuple, list[dict]] = defaultdict(list)
    for key, recs in groups.items():
        if key[method_at] == "exact":
            exact_all[key[: len(AR_FIELDS)]] += [r for r in recs if r.get("engine") == "sampler"]

    def exact_records(ar_key: tuple, n: int | None) -> list[dict]:
        """Exact SD's sampled records at draft length n (the smallest N sampled when n is None or absent)."""
        recs = exact_all.get(ar_key, [])
        ns = sorted({r["N"] for r in recs})
        use = n if n in ns else (ns[0] if ns else None)
        return [r for r in recs if r["N"] == use]

    rows = []
    for key, recs in groups.items():
        recs = sorted(recs, key=lambda r: r["example_index"])
        row = dict(zip(GROUP_FIELDS, key, strict=True))
        timed = loop(recs)
        sampled = [r for r in recs if r.get("engine") == "sampler"]
        if row["method"] == "ar" and exact_records(key[: len(AR_FIELDS)], None):
            sampled, row["quality_from"] = exact_records(key[: len(AR_FIELDS)], None), "sampler (exact SD: same law)"
        else:
            row["quality_from"] = "sampler" if sampled else "loop"
        measured = sampled or timed  # quality and acceptance: the full sample where the sampler ran
        scale = 1.0 if recs[0].get("metric") == "rouge2" else 100.0
        tokens = sum(r["new_tokens"] for r in timed)
        seconds = sum(r["seconds"] or 0.0 for r in timed)
        tps = tokens / seconds if seconds > 0 else None
        quality = _finite(r.get("quality") for r in measured)
        per_tps = _finite(r.get("tokens_per_s") for r in timed)
        row.update(
            n=len(measured), n_timed=len(timed), metric=recs[0].get("metric"), new_tokens=tokens, seconds=seconds,
            tokens_per_s=tps, tokens_per_s_std=_std(per_tps),
            quality=None if not quality else _mean(quality) * scale,
            quality_stderr=None if len(quality) < 2 else _std(quality) * scale / math.sqrt(len(quality)),
            truncated_rate=sum(r["new_tokens"] >= r["max_new_tokens"] for r in measured) / len(measured),
        )  # fmt: skip
        interval = None
        if quality and all(q in (0.0, 1.0) for q in quality):
            interval = wilson_interval(sum(quality), len(quality))
        elif quality:
            interval = bootstrap_interval(quality)
        row["quality_ci"] = None if interval is None else [interval[0] * scale, interval[1] * scale]
        # Paired difference to the target alone (exact SD's sampled law): same examples, same seeds.
        row["paired_diff"] = row["paired_diff_ci"] = None
        reference = {r["example_index"]: r.get("quality") for r in exact_records(key[: len(AR_FIELDS)], row["N"])}
        if row["method"] not in ("ar", "exact") and sampled and reference:
            diffs = [
                (r["quality"] - reference[r["example_index"]]) * scale
                for r in sampled
                if r["example_index"] in reference and r.get("quality") is not None
                and reference[r["example_index"]] is not None
            ]  # fmt: skip
            if diffs:
                row["paired_diff"] = _mean(diffs)
                ci = bootstrap_interval(diffs)
                row["paired_diff_ci"] = None if ci is None else list(ci)
                row["paired_n"] = len(diffs)
        own = [r for r in recs if r.get("engine") == "sampler"] or timed
        with_stats = [r for r in own if r.get("drafted") is not None]
        if with_stats:
            drafted = sum(r["drafted"] for r in with_stats)
            accepted = sum(r["accepted"] for r in with_stats)
            rounds = sum(r["rounds"] for r in with_stats)
            verified = sum(r.get("verified") or 0 for r in with_stats)
            weight = sum(r.get("weight_sum") or 0.0 for r in with_stats)
            tv = sum((r.get("mean_tv") or 0.0) * (r.get("verified") or 0) for r in with_stats)
            row.update(
                drafted=drafted, accepted=accepted, rounds=rounds,
                acceptance_rate=accepted / drafted if drafted else None,
                verified_acceptance_rate=accepted / verified if verified else None,
                acceptance_std=_std(_finite(r.get("acceptance_rate") for r in with_stats)),
                mean_accepted_per_round=(accepted + rounds) / rounds if rounds else None,
                mean_weight=weight / verified if verified else None,
                mean_tv=tv / verified if verified else None,
            )  # fmt: skip
        else:
            row.update(drafted=None, accepted=None, rounds=None, acceptance_rate=None, acceptance_std=None,
                       verified_acceptance_rate=None, mean_accepted_per_round=None, mean_weight=None,
                       mean_tv=None)  # fmt: skip

        ar = ar_groups.get(key[: len(AR_FIELDS)])
        row["n_ar"] = len(ar) if ar else 0
        row["speedup"] = row["speedup_matched"] = None
        if ar and tps:
            ar_tokens, ar_seconds = sum(r["new_tokens"] for r in ar), sum(r["seconds"] for r in ar)
            if ar_seconds > 0 and ar_tokens > 0:
                row["ar_tokens_per_s"] = ar_tokens / ar_seconds
                row["speedup"] = tps / row["ar_tokens_per_s"]
            ar_by_index = {r["example_index"]: r for r in ar}
            common = [r for r in timed if r["example_index"] in ar_by_index]
            m_tok, m_sec = sum(r["new_tokens"] for r in common), sum(r["seconds"] for r in common)
            a_tok = sum(ar_by_index[r["example_index"]]["new_tokens"] for r in common)
            a_sec = sum(ar_by_index[r["example_index"]]["seconds"] for r in common)
            if common and m_sec > 0 and a_sec > 0 and a_tok > 0:
                row["speedup_matched"] = (m_tok / m_sec) / (a_tok / a_sec)

        cost = costs.get(costs_key(row["target"], row["draft"], row["dtype"])) if row["draft"] else None
        row["analytic_speedup"] = row["analytic_speedup_v1"] = row["c"] = row["v"] = None
        row["tau_speedup"] = row["tau_speedup_v1"] = None
        if cost and row["acceptance_rate"] is not None and row["N"]:
            v = (cost.get("v") or {}).get(str(row["N"]))
            c, tau = cost.get("c"), row["mean_accepted_per_round"]
            row.update(c=c, v=v)
            row["analytic_speedup_v1"] = analytic_speedup(row["acceptance_rate"], row["N"], c, 1.0)
            row["tau_speedup_v1"] = tau_speedup(tau, row["N"], c, 1.0)
            if v is not None:
                row["analytic_speedup"] = analytic_speedup(row["acceptance_rate"], row["N"], c, v)
                row["tau_speedup"] = tau_speedup(tau, row["N"], c, v)
        rows.append(row)

    order = {name: i for i, name in enumerate(DEFAULT_TASKS)}

    def sort_key(row):
        method = row["method"]
        family = method.split(":")[0]
        return (
            order.get(row["task"], 99), row["task"], row["temperature"], str(row["target"]), row["max_new_tokens"],
            _FAMILY_ORDER.index(family) if family in _FAMILY_ORDER else len(_FAMILY_ORDER), family, _num(method),
            str(row["draft"]), str(row["head"]), row["N"] or 0,  # each rule's draft lengths together
        )  # fmt: skip

    return sorted(rows, key=sort_key)


_FAMILY_ORDER = ("ar", "native-exact", "native-static", "exact", LORA_METHOD, "static", "lossy", "cascade-chow",
                 "cascade-diff", "cascade-opt", "diversed")  # fmt: skip


def _num(method: str) -> float:
    try:
        return float(method.rsplit(":", 1)[1]) if ":" in method else 0.0
    except ValueError:
        return 0.0
