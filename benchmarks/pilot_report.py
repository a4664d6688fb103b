"""A pilot's methods beside a Table 1 run's on the same rows: how the second lenience and α were picked.

Table 1 asks for a second lenience, a second SpecCascade α, and Chow and Diff at one α each, with values chosen by
a 20-row pilot so that the points land inside the static sweep's range. This prints, for the first K rows (the
pilot's), every method of the pilot and of the Table 1 run sorted by acceptance (accepted / drafted), with the
quality (a count with its Wilson interval for 0/1 rewards; for ROUGE-2, recorded in points, the mean with a
bootstrap interval) and mean w. On 20 rows the quality intervals span ±20 points, so the pick
rests on acceptance: a value whose acceptance lies between the static points' is inside the frontier's range.

    python benchmarks/pilot_report.py --pilot docs/table1/gsm8k-pilot --table docs/table1/gsm8k
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from hf_diversed.evaluation import bench
from hf_diversed.evaluation.bench.summary import bootstrap_interval, wilson_interval


def pilot_rows(pilot: list[dict], table: list[dict], rows: int) -> list[dict]:
    """One row per (source, method, T) over the examples with index < ``rows``, sorted by acceptance, highest first."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for source, records in (("pilot", pilot), ("table", table)):
        for r in records:
            if r.get("engine", "sampler") == "sampler" and r["example_index"] < rows:
                groups[source, r["method"], r["temperature"], r["dtype"]].append(r)
    out = []
    for (source, method, temperature, dtype), rs in groups.items():
        drafted = sum(r["drafted"] for r in rs)
        scores = [r["quality"] for r in rs]
        binary = all(q in (0.0, 1.0) for q in scores)
        if binary:
            low, high = (100 * x for x in wilson_interval(sum(scores), len(scores)))
        else:
            low, high = bootstrap_interval(scores) or (float("nan"), float("nan"))
        out.append(
            {
                "source": source,
                "method": method,
                "temperature": temperature,
                "dtype": dtype,
                "n": len(rs),
                "quality": sum(scores),
                "binary": binary,
                "interval": (low, high),
                "acceptance": sum(r["accepted"] for r in rs) / drafted if drafted else float("nan"),
                "mean_w": sum(r["weight_sum"] for r in rs) / max(1, sum(r["verified"] for r in rs)),
            }
        )
    return sorted(out, key=lambda row: (row["temperature"], -row["acceptance"]))


def _quality(row: dict) -> str:
    """``7/20`` for 0/1 rewards, else the mean (ROUGE-2, recorded in points)."""
    return f"{row['quality']:g}/{row['n']}" if row["binary"] else f"{row['quality'] / row['n']:.2f}"


def format_rows(rows: list[dict]) -> list[str]:
    lines = [
        "| T | method | from | dtype | n | quality [95% CI] | acceptance | mean w |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        low, high = r["interval"]
        lines.append(
            f"| {r['temperature']:g} | {r['method']} | {r['source']} | {r['dtype']} | {r['n']} | "
            f"{_quality(r)} [{low:.{0 if r['binary'] else 2}f}, {high:.{0 if r['binary'] else 2}f}] | "
            f"{100 * r['acceptance']:.1f}% | {r['mean_w']:.2f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pilot", type=Path, required=True, help="the pilot's bench output directory")
    parser.add_argument("--table", type=Path, required=True, help="the Table 1 run's output directory")
    parser.add_argument("--rows", type=int, default=None, help="first K rows (default: the pilot's)")
    args = parser.parse_args(argv)
    pilot = bench.load_records(args.pilot / bench.RESULTS_FILE)
    if not pilot:
        raise SystemExit(f"No records in {args.pilot / bench.RESULTS_FILE}: run the pilot first (see its command).")
    rows = args.rows if args.rows is not None else 1 + max(r["example_index"] for r in pilot)
    table = bench.load_records(args.table / bench.RESULTS_FILE)
    print(f"First {rows} rows; pilot `{args.pilot}`, Table 1 run `{args.table}`.\n")
    print("\n".join(format_rows(pilot_rows(pilot, table, rows))))


if __name__ == "__main__":
    main()
