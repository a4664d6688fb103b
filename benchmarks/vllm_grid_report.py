"""The load grid's verdict (benchmarks/vllm_load_grid.sh): per task and concurrency, each rule at fixed N, with the
draft-length policy and with vLLM's best hand schedule, as multiples of the target alone of the same sitting.

    python benchmarks/vllm_grid_report.py docs/vllm/load-grid   # the tables, also in docs/vllm/load-grid/results.md

A hand schedule sched:CUT:K drafts K while at most CUT requests are in flight. At concurrency c a phase never has
more than c in flight, so every CUT >= c is one configuration there: fixed N = K for K = N, and for K < N the phase
the grid ran at the smallest CUT >= c. The best schedule is the (CUT, K) of the grid's rule (GRID_RULE) with the
highest geometric mean of x target alone over the task's concurrencies, chosen on ``--choose-on`` (GSM8K) and read
for every rule and task where its phases ran. The goal (docs/vllm.md): with the policy, each rule at every
concurrency >= 0.97x max(target alone, fixed N, the best hand schedule), >= 1.5x the target alone at one request and
>= 1.0x at 32.

A policy phase timed again beside a target alone of its own (a pair in a subdirectory of ``root/<dir>/``, e.g.
``gsm8k-c8-beside/exact/``, both phases from one sitting) is read against that target alone instead, the mean where
there are several pairs: the machine's pace drifts over the hour a concurrency's invocation takes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _alone(phases: list[dict]) -> dict[tuple[str, int, str], float]:
    """(task, c, sitting) -> the target alone's tok/s."""
    return {(p["task"], p["concurrency"], p["sitting"]): p["tokens_per_s"] for p in phases if p["method"] == "ar"}


def load_phases(root: Path) -> list[dict]:
    """Every phase of every ``<task>-c<c>`` directory under ``root``."""
    return [phase for path in sorted(root.glob("*/phases.jsonl")) for phase in _read(path)]


def ratios(phases: list[dict]) -> dict[tuple[str, int, str], dict]:
    """(task, c, method) -> the phase with ``alone`` (the target alone's tok/s in its sitting) and ``ratio`` (its
    tok/s over that); the last phase where one was timed in two sittings."""
    base = _alone(phases)
    out = {}
    for p in phases:
        paired = base.get((p["task"], p["concurrency"], p["sitting"]))
        if paired is not None:
            out[(p["task"], p["concurrency"], p["method"])] = {
                **p,
                "ratio": p["tokens_per_s"] / paired,
                "alone": paired,
            }
    return out


def beside_ratios(root: Path) -> dict[tuple[str, int, str], float]:
    """(task, c, method) -> the mean over ``root/*/*/`` pairs of a phase's tok/s over the target alone of its own
    directory and sitting (a directory without that target alone pairs nothing)."""
    pairs: dict[tuple[str, int, str], list[float]] = {}
    for path in sorted(root.glob("*/*/phases.jsonl")):
        phases = _read(path)
        alone = _alone(phases)
        for p in phases:
            paired = alone.get((p["task"], p["concurrency"], p["sitting"]))
            if p["method"] != "ar" and paired is not None:
                pairs.setdefault((p["task"], p["concurrency"], p["method"]), []).append(p["tokens_per_s"] / paired)
    return {key: sum(values) / len(values) for key, values in pairs.items()}


def schedule_ratio(table: dict, task: str, c: int, rule: str, cut: int, k: int, cuts: list[int], num_draft: int):
    """x target alone of ``rule@sched:cut:k`` at ``c``, from the phase that runs that configuration there."""
    if cut >= c:
        if k == num_draft:
            method = rule
        else:
            same = min(x for x in cuts if x >= c)
            method = f"{rule}@sched:{same}:{k}"
    else:
        method = f"{rule}@sched:{cut}:{k}"
    phase = table.get((task, c, method))
    return None if phase is None else phase["ratio"]


def schedules_in(phases: list[dict]) -> tuple[list[int], list[int]]:
    cuts, ks = set(), set()
    for p in phases:
        if "@sched:" in p["method"]:
            _, cut, k = p["method"].split("@", 1)[1].split(":")
            cuts.add(int(cut))
            ks.add(int(k))
    return sorted(cuts), sorted(ks)


def best_schedule(table, task: str, rule: str, loads: list[int], cuts, ks, num_draft: int):
    """The (CUT, K) with the highest geometric mean of x target alone over ``loads``, where every load has it."""
    best, best_value = None, -math.inf
    for cut in cuts:
        for k in sorted(set(ks) | {num_draft}):
            values = [schedule_ratio(table, task, c, rule, cut, k, cuts, num_draft) for c in loads]
            if not values or any(v is None for v in values):
                continue
            value = sum(math.log(v) for v in values) / len(values)
            if value > best_value:
                best, best_value = (cut, k), value
    return best


def report(root: Path, choose_on: str, grid_rule: str) -> str:
    phases = load_phases(root)
    if not phases:
        raise SystemExit(f"{root} holds no phases: run benchmarks/vllm_load_grid.sh first.")
    table = ratios(phases)
    beside = beside_ratios(root)
    tasks = list(dict.fromkeys(p["task"] for p in phases))
    rules = list(dict.fromkeys(p["method"].split("@")[0] for p in phases if p["method"] != "ar"))
    cuts, ks = schedules_in(phases)
    num_draft = phases[0]["num_draft"]
    loads_on = sorted({c for (t, c, m) in table if t == choose_on and m == "ar"})
    chosen = best_schedule(table, choose_on, grid_rule, loads_on, cuts, ks, num_draft) if cuts else None
    lines = [
        f"Best hand schedule, chosen on {choose_on} with {grid_rule} over {loads_on} in flight: "
        + (f"sched:{chosen[0]}:{chosen[1]} (K = {chosen[1]} up to {chosen[0]} in flight, none beyond)." if chosen
           else "none yet (its phases have not all run)."),
        "",
        "| task | in flight | target alone tok/s | rule | fixed N | with the policy (acceptance; from drafts) | "
        "the policy beside a target alone of its own | best schedule | policy / max(alone, fixed, schedule) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for task in tasks:
        for c in sorted({c for (t, c, m) in table if t == task}):
            for rule in rules:
                fixed = table.get((task, c, rule))
                policy = table.get((task, c, f"{rule}@policy"))
                sched = schedule_ratio(table, task, c, rule, *chosen, cuts, num_draft) if chosen else None
                if fixed is None and policy is None:
                    continue
                best_other = max([1.0] + [x for x in (fixed and fixed["ratio"], sched) if x])
                near = beside.get((task, c, f"{rule}@policy"))
                mine = near if near is not None else policy and policy["ratio"]
                verdict = "-" if mine is None else f"{mine / best_other:.2f}"
                shown = (
                    "-"
                    if policy is None
                    else (f"{policy['ratio']:.2f}× ({_pct(policy['acceptance'])}; {_pct(policy['from_drafts'])})")
                )
                fixed_shown = "-" if fixed is None else f"{fixed['ratio']:.2f}×"
                sched_shown = "-" if sched is None else f"{sched:.2f}×"
                near_shown = "-" if near is None else f"{near:.2f}×"
                lines.append(f"| {task} | {c} | {(policy or fixed)['alone']:.2f} | {rule} | {fixed_shown} | {shown} | "
                             f"{near_shown} | {sched_shown} | {verdict} |")  # fmt: skip
    lines += ["", "Each × pairs a phase with the target alone of its own sitting and concurrency; the policy beside a "
              "target alone of its own: the mean over pairs timed one after the other (benchmarks/vllm_load_grid.sh, "
              "BESIDE), which the last column reads where it has one. The goal: the last column ≥ 0.97 at every row, "
              "the policy ≥ 1.5× at one request and ≥ 1.0× at 32."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", default="docs/vllm/load-grid")
    parser.add_argument("--choose-on", default="gsm8k", help="the task whose phases choose the hand schedule")
    parser.add_argument("--grid-rule", default="cascade-opt:0.1", help="the rule the schedule grid ran with")
    args = parser.parse_args(argv)
    root = Path(args.root)
    text = report(root, args.choose_on, args.grid_rule)
    (root / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
