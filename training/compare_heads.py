"""Two heads (or any two methods) on the same Table 1 rows, paired: Δ quality and Δ acceptance with bootstrap
intervals (hf_diversed.evaluation.bench.frontier.compare_to_baseline), and each one's mean w with its interval.

    python training/compare_heads.py docs/table1/gsm8k docs/training/gsm8k-full/trainer-opt0.1-lambda-0.01 \\
        docs/training/gsm8k-full/opt0.1-lambda-0.01

A head is named by its directory as the bench recorded it (``--head``); a rule by its method (``cascade-opt:0.1``).
Only records at ``--temperature`` (default 1) and ``--num-assistant-tokens`` (default 5), with the first method's max
new tokens and dtype, are compared.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_diversed.evaluation.bench.frontier import compare_to_baseline, method_label  # noqa: E402


def _label(name: str) -> str:
    return name if ":" in name or name in ("exact", "ar", "draft") else f"diversed@{name.rstrip('/')}"


def mean_w(records: list[dict], label: str, rows: list[int], resamples: int = 2000, seed: int = 0):
    """Mean w over the rows' verified positions (pooled), with a bootstrap interval over rows."""
    by_row = {r["example_index"]: r for r in records if method_label(r) == label}
    picked = [by_row[i] for i in rows if by_row[i].get("weight_sum") is not None]
    if not picked:
        return None, None

    def pooled(sample):
        return sum(r["weight_sum"] for r in sample) / max(sum(r["verified"] for r in sample), 1)

    rng = random.Random(seed)
    draws = sorted(pooled([rng.choice(picked) for _ in picked]) for _ in range(resamples))
    return pooled(picked), [draws[int(0.025 * resamples)], draws[int(0.975 * resamples) - 1]]


def compare(records: list[dict], first: str, second: str) -> dict:
    """The paired comparison of ``first`` against ``second`` (labels), with both mean w."""
    result = compare_to_baseline(records, first, second)
    if result is None:
        raise ValueError(f"{first} and {second} share no Table 1 row: bench both on the same rows first.")
    rows = sorted({r["example_index"] for r in records if method_label(r) == first}
                  & {r["example_index"] for r in records if method_label(r) == second})  # fmt: skip
    for key, label in (("mean_w", first), ("baseline_mean_w", second)):
        result[key], result[f"{key}_ci"] = mean_w(records, label, rows)
    return result


def _fmt(value, ci, scale=1.0, spec="+.1f"):
    inner = "" if ci is None else f" [{format(scale * ci[0], spec)}, {format(scale * ci[1], spec)}]"
    return format(scale * value, spec) + inner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", type=Path, help="a Table 1 directory (holding results.jsonl)")
    parser.add_argument("first", help="a head's directory as benched, or a method")
    parser.add_argument("second", help="the head or method it is compared against")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--num-assistant-tokens", type=int, default=5)
    args = parser.parse_args(argv)
    path = args.records / "results.jsonl"
    if not path.is_file():
        parser.error(f"{path} does not exist: pass a Table 1 directory (hf-diversed bench --output-dir).")
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    first, second = _label(args.first), _label(args.second)
    records = [r for r in lines if r.get("N") == args.num_assistant_tokens and r["temperature"] == args.temperature]
    settings = {(r["max_new_tokens"], r["dtype"]) for r in records if method_label(r) == first}
    records = [r for r in records if (r["max_new_tokens"], r["dtype"]) in settings]
    try:
        c = compare(records, first, second)
    except ValueError as error:
        parser.error(str(error))
    print("| method | rows | quality | acceptance | mean w [95% CI] |\n|---|---|---|---|---|")
    print(f"| {first} | {c['n']} | {c['quality']:.1f} | {100 * c['acceptance']:.1f}% | "
          f"{_fmt(c['mean_w'], c['mean_w_ci'], spec='.3f')} |")  # fmt: skip
    print(f"| {second} | {c['n']} | {c['baseline_quality']:.1f} | {100 * c['baseline_acceptance']:.1f}% | "
          f"{_fmt(c['baseline_mean_w'], c['baseline_mean_w_ci'], spec='.3f')} |")  # fmt: skip
    print(f"\nfirst − second, paired over {c['n']} rows: quality {_fmt(c['quality_gap'], c['quality_gap_ci'])} "
          f"points, acceptance {_fmt(c['acceptance_gap'], c['acceptance_gap_ci'], 100)} points")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
