"""Regenerate docs/results.md (the paper's Table 1 on the real pair) from the committed bench records.

Reads ``docs/table1/<task>/results.jsonl`` (and ``costs.json``), written by the resumable runs

    hf-diversed bench --tasks gsm8k --methods exact,lossy:0.5,cascade-opt:0.1 --static-sweep 0.1,0.3,0.5,0.7,0.9 \
        --temperature 1 --num-examples 150 --max-new-tokens 512 --num-assistant-tokens 5 --timed-examples 0 \
        --batch-size 32 --threads 2 --output-dir docs/table1/gsm8k

summarizes them with ``hf_diversed.evaluation.bench`` (quality with 95% intervals, paired differences to the target
alone, acceptance, tokens per round, mean w, the speed models), rewrites each run's ``results.md`` and plots, and
writes ``docs/results.md``. No model is loaded.

    python benchmarks/table1_report.py
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from hf_diversed.evaluation import bench
from hf_diversed.evaluation.bench.config import LORA_METHOD
from hf_diversed.evaluation.bench.costs import costs_key, pair_costs
from hf_diversed.evaluation.bench.frontier import (
    BASELINE_RULE_PREFIXES,
    compare_to_baseline,
    compare_to_frontier,
    frontier_methods,
    method_label,
    unfinished_methods,
    zero_training_methods,
)
from hf_diversed.evaluation.bench.report import format_paired_diff, format_quality
from hf_diversed.evaluation.bench.runs import format_runs, invocation_of, load_runs
from hf_diversed.evaluation.bench.summary import summarize_records
from hf_diversed.evaluation.weights import records_weights

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("gsm8k", "mbpp", "humaneval", "cnndm", "xsum")
LORA_TASKS = ("gsm8k", "mbpp", "cnndm")  # the tasks whose Table 1 adds SD with a LoRA-distilled draft
TIMED_EXAMPLES = 10  # each method's examples in a task's timing run (benchmarks/table1_timed.sh)
DRAFT_LENGTH_TASKS = ("gsm8k", "mbpp", "cnndm")  # N = 3, 5, 7 (benchmarks/draft_length.sh)
# The paper's Figure 2, the T = 0 frontier (benchmarks/figure2_cnndm.sh): its task, stories and static weights.
FIGURE2 = ("cnndm", 100, 7)
LORA_SUFFIX = LORA_METHOD.removeprefix("exact")  # "+lora-draft": a rule run with the bench's --lora-draft
# The paper's Table 1 (Llama-3.1-8B target / Llama-3.2-1B draft, N = 5, T = 1): SD and DIVERSED acceptance,
# quality SD -> DIVERSED (docs: shared/docs/method.md).
PAPER = {
    "gsm8k": ("44.6%", "72.6%", "67 → 67 (exact match)"),
    "mbpp": ("26.3%", "85.0%", "53 → 53 (pass@1)"),
    "cnndm": ("21.6%", "70.0%", "9.46 → 12.11 (ROUGE-2)"),
    "xsum": ("20.4%", "70.5%", "7.09 → 7.23 (ROUGE-2)"),
}


def _shown(path: Path) -> str:
    """``path`` relative to the repository where it lies inside it (the committed records), else as given."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def _model(speedup, speedup_v1) -> str:
    if speedup is None:  # no v measured at this N: the v = 1 model alone, where there is one
        return "-" if speedup_v1 is None else f"- ({speedup_v1:.2f}×)"
    return f"{speedup:.2f}× ({_num(speedup_v1)}×)"


def _gap(value, interval, defined: float, spec: str, scale: float = 1.0) -> str:
    if value is None:
        return "-"
    text = f"{scale * value:+{spec}}"
    if interval:
        text += f" [{scale * interval[0]:+{spec}}, {scale * interval[1]:+{spec}}]"
    if defined < 0.95:
        text += f" (defined in {100 * defined:.0f}% of resamples)"
    return text


def _sampler_groups(records: list[dict]) -> list[tuple[tuple, list[dict]]]:
    """The sampler records grouped by (temperature, N, max_new_tokens), in that order."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        if r.get("engine") == "sampler":
            groups.setdefault((r["temperature"], r["N"], r["max_new_tokens"]), []).append(r)
    return sorted(groups.items())


def frontier_section(records: list[dict]) -> list[str]:
    """Every method outside the static sweep against the sweep's frontier (per temperature, N, length)."""
    lines = []
    for (temperature, n, length), group in _sampler_groups(records):
        labels = {method_label(r) for r in group}
        # a fine-tuned draft under exact SD has the target's law: it is compared with the base draft instead
        methods = sorted(m for m in labels - set(frontier_methods(labels)) if not m.endswith(LORA_SUFFIX))
        compared = [c for m in methods if (c := compare_to_frontier(group, m)) is not None]
        if not compared:
            continue
        lines += [
            "",
            f"Against the static frontier (T = {temperature:g}, N = {n}, {length} tokens; frontier: "
            f"{', '.join(compared[0]['frontier'])}, exact SD as w = 1). Each comparison uses the examples every "
            "method shares; intervals are paired bootstrap intervals (2,000 resamples of the examples).",
            "",
            "| method | n | acceptance | quality | frontier quality at this acceptance | Δ quality | frontier "
            "acceptance at this quality | Δ acceptance (points) | verdict |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for c in compared:
            lines.append(
                f"| {c['method']} | {c['n']} | {_pct(c['acceptance'])} | {c['quality']:.1f} | "
                f"{_num(c['frontier_quality'], '.1f')} | "
                f"{_gap(c['quality_gap'], c['quality_gap_ci'], c['quality_gap_defined'], '.1f')} | "
                f"{_pct(c['frontier_acceptance'])} | "
                f"{_gap(c['acceptance_gap'], c['acceptance_gap_ci'], c['acceptance_gap_defined'], '.1f', 100)} | "
                f"{c['verdict']} |"
            )
    if lines:
        lines += [
            "",
            "Frontier quality: the least-squares non-increasing fit of the sweep's quality against its acceptance, "
            "linear between points; frontier acceptance: the highest acceptance at which that fit reaches the "
            "method's quality. Verdict from the Δ quality interval (beyond: above 0; inside: below 0; on it: "
            "contains 0). `-`: outside the sweep's range (no static point reaches that acceptance or quality).",
        ]
    return lines


def zero_training_section(records: list[dict]) -> list[str]:
    """Every learned head against the upper envelope of every zero-training rule run on all its examples (static,
    exact, cascades, lossy, token-class), and against the target (exact SD's quality): is its quality loss at its
    acceptance within noise of 0?"""
    lines = []
    for (temperature, n, length), group in _sampler_groups(records):
        rows: dict[str, set] = {}
        for r in group:
            rows.setdefault(method_label(r), set()).add(r["example_index"])
        heads = sorted(m for m in rows if m.startswith("diversed"))
        table = []
        for head in heads:
            rules = [m for m in zero_training_methods(sorted(rows)) if rows[head] <= rows[m]]
            c = compare_to_frontier(group, head, frontier=rules, envelope=True)
            target = compare_to_baseline(group, head, "exact") if "exact" in rows else None
            if c is None:
                continue
            ci = target["quality_gap_ci"] if target is not None else None
            kept = ci is not None and ci[0] <= 0 <= ci[1]  # the target's quality is within noise of the head's
            table.append(
                f"| {head} | {c['n']} | {len(c['frontier'])} | {_pct(c['acceptance'])} | {c['quality']:.1f} | "
                f"{_num(c['frontier_quality'], '.1f')} | "
                f"{_gap(c['quality_gap'], c['quality_gap_ci'], c['quality_gap_defined'], '.1f')} | "
                f"{_pct(c['frontier_acceptance'])} | "
                f"{_gap(c['acceptance_gap'], c['acceptance_gap_ci'], c['acceptance_gap_defined'], '.1f', 100)} | "
                f"{c['verdict']} | "
                + ("-" if target is None else _gap(target["quality_gap"], target["quality_gap_ci"], 1.0, ".1f"))
                + f" | {'yes' if kept and c['acceptance'] >= 0.85 else 'no'} |"
            )
        if table:
            lines += [
                "",
                f"Against every zero-training rule (T = {temperature:g}, N = {n}, {length} tokens): the upper "
                "envelope of every static, exact, cascade, lossy and token-class point run on all the head's "
                "examples (a mixture of two rules reaches the segment between them), and against the target "
                "(exact SD's quality, paired). Paired bootstrap intervals, 2,000 resamples.",
                "",
                "| head | n | rules | acceptance | quality | envelope quality at this acceptance | Δ quality | "
                "envelope acceptance at this quality | Δ acceptance (points) | verdict | Δ quality vs the target | "
                "≥ 85% and the target's quality within its interval |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|",
                *table,
            ]
    return lines


def _paired_section(records: list[dict], pairs, intro: str, names: list[str], columns: list[str]) -> list[str]:
    """One table per (temperature, N, length): each (method, baseline) from ``pairs(labels)``, method minus
    baseline on the examples both have (:func:`compare_to_baseline`). ``names``: the leading columns (the method,
    and the baseline where ``len(names) == 2``); ``columns``: the acceptance and quality headers after n."""
    lines = []
    for (temperature, n, length), group in _sampler_groups(records):
        labels = sorted({method_label(r) for r in group})
        compared = [c for m, b in pairs(labels) if (c := compare_to_baseline(group, m, b)) is not None]
        if not compared:
            continue
        header = [*names, "n", *columns]
        lines += [
            "",
            intro.format(temperature=temperature, n=n, length=length),
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
        ]
        for c in compared:
            acceptance_gap = _gap(c["acceptance_gap"], c["acceptance_gap_ci"], 1.0, ".1f", 100)
            quality_gap = _gap(c["quality_gap"], c["quality_gap_ci"], 1.0, ".1f")
            cells = [c["method"], c["baseline"]][: len(names)]
            cells += [str(c["n"]), _pct(c["acceptance"]), _pct(c["baseline_acceptance"]), acceptance_gap,
                      f"{c['quality']:.1f}", f"{c['baseline_quality']:.1f}", quality_gap]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def draft_section(records: list[dict]) -> list[str]:
    """Each method run with the LoRA-distilled draft (``<rule>+lora-draft``) against the same rule with the base
    draft, paired on the examples both have."""

    def pairs(labels):
        return [
            (m, base) for m in labels if m.endswith(LORA_SUFFIX) and (base := m.removesuffix(LORA_SUFFIX)) in labels
        ]

    return _paired_section(
        records,
        pairs,
        "The LoRA-distilled draft against the base draft (T = {temperature:g}, N = {n}, {length} tokens): the same "
        "rule on the examples both have, paired bootstrap intervals (2,000 resamples). Under exact SD both have the "
        "target's law, so only acceptance can differ beyond noise.",
        ["method"],
        [
            "acceptance (tuned draft)",
            "acceptance (base draft)",
            "Δ acceptance (points)",
            "quality (tuned)",
            "quality (base)",
            "Δ quality",
        ],  # fmt: skip
    )


def baseline_section(records: list[dict]) -> list[str]:
    """Every learned head (``diversed@...``) against each rule needing no training run beside it (the token-class
    rules and the speculative cascades, which a head can start as), paired."""

    def pairs(labels):
        heads = [m for m in labels if m.startswith("diversed")]
        return [(h, b) for h in heads for b in labels if b.startswith(BASELINE_RULE_PREFIXES)]

    return _paired_section(
        records,
        pairs,
        "Learned heads against the rules that need no training, the hand-made token-class rules and the "
        "speculative cascades (T = {temperature:g}, N = {n}, {length} tokens): "
        "head minus rule on the examples both have, paired bootstrap intervals (2,000 resamples).",
        ["head", "rule"],
        ["head acceptance", "rule acceptance", "Δ acceptance (points)", "head quality", "rule quality", "Δ quality"],
    )


def draft_length_section(
    records: list[dict], timed: dict[tuple, dict], costs: dict, timed_lines: list[str] | None = None
) -> list[str]:
    """Each rule run at several draft lengths N (T = 1), on the examples every N of it shares: acceptance, tokens per
    round τ, the verification cost v(N), the τ model τ / (N·c + v(N)) and the real speedup, and the fastest N by real
    speed (by the τ model where not every N was timed). ``timed_lines`` say how the real speed was timed, where it
    comes from a timing run of its own."""
    sampled: dict[str, dict[int, list[dict]]] = {}
    for r in records:
        if r.get("engine") == "sampler" and r["temperature"] == 1.0 and r.get("N"):
            sampled.setdefault(method_label(r), {}).setdefault(r["N"], []).append(r)
    lines, fastest = [], []
    for method, by_n in sorted(sampled.items()):
        if len(by_n) < 2:
            continue
        shared = set.intersection(*({r["example_index"] for r in recs} for recs in by_n.values()))
        rows = summarize_records([r for recs in by_n.values() for r in recs if r["example_index"] in shared], costs)
        speeds = {}
        for r in sorted(rows, key=lambda r: r["N"]):
            cost = costs.get(costs_key(r["target"], r.get("draft") or r["target"], r["dtype"])) or {}
            t = timed.get((1.0, method, r["N"]))
            real = None if t is None else (t.get("speedup_matched") or t["speedup"])
            speeds[r["N"]] = (real, r.get("tau_speedup"))
            lines.append(
                f"| {method} | {r['N']} | {r['n']} | {_pct(r['acceptance_rate'])} | "
                f"{_num(r['mean_accepted_per_round'])} | {_num((cost.get('v') or {}).get(str(r['N'])))} | "
                f"{_model(r.get('tau_speedup'), r.get('tau_speedup_v1'))} | "
                + ("-" if real is None else f"{real:.2f}× ({t.get('n_timed')})")
                + " |"
            )
        real = {n: x for n, (x, _) in speeds.items() if x is not None}
        model = {n: x for n, (_, x) in speeds.items() if x is not None}
        if len(real) == len(speeds):
            best = max(real, key=real.get)
            fastest.append(f"{method} at N = {best} ({real[best]:.2f}×)")
        elif model:
            best = max(model, key=model.get)
            fastest.append(f"{method} at N = {best} by the τ model ({model[best]:.2f}×; not every N timed)")
    if not lines:
        return []
    return [
        "",
        "Draft length (T = 1): each rule at every N it was run with, on the examples all its N share. τ model: "
        "τ / (N·c + v(N)) with c and v(N) measured beside the real timing (in parentheses v = 1); real: the batch-1 "
        "loop's tokens/s over the target alone's on the timed examples (`-` where that N was not timed).",
        "",
        "| method | N | n | acceptance | tokens/round τ | v(N) | τ model (v=1) | real speedup (n timed) |",
        "|---|---|---|---|---|---|---|---|",
        *lines,
        "",
        f"Fastest: {'; '.join(fastest)}.",
        *(["", *timed_lines] if timed_lines else []),
    ]


DRAFT_TIMED_SUFFIX = "-draft-timed"  # <task>-draft-timed: N = 3, 5, 7 timed in one run (draft_length.sh)
GREEDY_TIMED_SUFFIX = "-greedy-timed"  # <task>-greedy-timed: the T = 0 frontier's timing run (figure2_cnndm.sh)
GREEDY_PLOT_FILE = "frontier_greedy.png"


def greedy_frontier_section(task: str, out_dir: Path) -> list[str]:
    """The paper's Figure 2 for ``task``: at T = 0, quality against the batch-1 loop's real time per token (its timing
    run ``<task>-greedy-timed``, every method in one run) and against acceptance (the sampler's records), the static
    sweep as the frontier and every other method a point; the target alone is exact SD's quality at its own speed.
    A table of both and a two-panel plot (``frontier_greedy.png`` beside the records). Empty unless the T = 0
    records hold a static sweep of four weights or more."""
    groups = [(key, g) for key, g in _sampler_groups(bench.load_records(out_dir / bench.RESULTS_FILE)) if key[0] == 0]
    lines: list[str] = []
    timed, timed_lines, _ = timed_section(out_dir.parent / f"{task}{GREEDY_TIMED_SUFFIX}", v1_columns=False)
    ar = timed.get((0.0, "ar", None))
    from hf_diversed.evaluation.plotting import plot_quality_frontiers

    for (_, n, length), group in groups:
        rows = summarize_records(group)
        if sum(r["method"].startswith("static:") for r in rows) < 4:
            continue
        exact = next((r for r in rows if r["method"] == "exact"), None)
        if exact is not None and ar is not None:  # greedy exact SD emits the target's tokens
            rows.insert(0, {**exact, "method": "ar", "acceptance_rate": None, "mean_weight": None})
        body = []
        for r in rows:
            t = ar if r["method"] == "ar" else timed.get((0.0, method_label(r), n))
            r["seconds_per_token"] = 1.0 / t["tokens_per_s"] if t and t.get("tokens_per_s") else None
            speedup = None if t is None else t.get("speedup_matched") or t["speedup"]
            speed = "- | -" if t is None else f"{1000 * r['seconds_per_token']:.1f} ({t['n_timed']}) | {speedup:.2f}×"
            diff = "-" if r["method"] in ("ar", "exact") else format_paired_diff(r)
            body.append(
                f"| {method_label(r)} | {r['n']} | {format_quality(r)} | {diff} | {_pct(r['acceptance_rate'])} | "
                f"{_num(r['mean_weight'])} | {speed} |"
            )
        plot = plot_quality_frontiers(rows, out_dir / GREEDY_PLOT_FILE)
        lines += [
            "",
            f"Time–quality frontier at T = 0 (the paper's Figure 2; N = {n}, {length} new tokens): the sampler's "
            "greedy completions give quality and acceptance; the real time per token of the batch-1 loop comes from "
            "the timing run below (ms per token over the timed examples; speedup over the target alone on the same "
            "examples). Greedy exact SD emits the target's own tokens, so the target alone has its quality (in "
            "exact arithmetic; bf16 parts them at near-ties: [rules.md](rules.md#limits)).",
            "",
            "| method | n | quality ×100 [95% CI] | Δ vs target [95% CI] | acceptance | mean w | "
            "ms/token (n timed) | real speedup |",
            "|---|---|---|---|---|---|---|---|",
            *body,
        ]
        if timed_lines:
            lines += ["", *timed_lines]
        else:
            lines += [
                "",
                f"Real time per token: not yet timed (`{_shown(out_dir.parent)}/{task}{GREEDY_TIMED_SUFFIX}`).",
            ]
        if plot is not None:
            lines += ["", f"![quality vs real time per token and vs acceptance, T = 0]"
                      f"({os.path.relpath(plot, ROOT / 'docs')})"]  # fmt: skip
    return lines


def _with_timing_costs(
    costs: dict, timing_costs: dict, pair: tuple, dtypes: Iterable[str]
) -> tuple[tuple | None, dict]:
    """``costs`` with the pair's c and v under each of the records' ``dtypes`` replaced by a timing run's, whatever
    its dtype: the speed models predict the real timing (which may run on a later machine than the sampler's
    records), with one c and v(N) for every row. Returns (the timing run's (dtype, costs) or None, the merged
    costs)."""
    dtypes = sorted(set(dtypes))
    measured = pair_costs(timing_costs, *pair, dtypes[0])
    return measured, {**costs, **({costs_key(*pair, d): measured[1] for d in dtypes} if measured else {})}


def _costs(out_dir: Path) -> dict:
    return json.loads((out_dir / "costs.json").read_text()) if (out_dir / "costs.json").is_file() else {}


def _previous_summary(out_dir: Path) -> dict:
    """The folder's ``summary.json`` as last written (by the bench or this report): a rebuild keeps its command and
    the bench's configuration."""
    path = out_dir / bench.SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def timed_section(timed_dir: Path, *, v1_columns: bool = True) -> tuple[dict[tuple, dict], list[str], dict]:
    """The real batch-1 loop's speed from a task's timing run (``<task>-timed``): its summary rows with a speedup,
    by (temperature, method with its head, N); a line saying how it was timed (and reading the v = 1 columns of the
    table it follows, where it has them); its costs (measured in the same run)."""
    records = bench.load_records(timed_dir / bench.RESULTS_FILE)
    loop = [r for r in records if r.get("engine", "loop") == "loop"]
    if not loop:
        return {}, [], {}
    previous = _previous_summary(timed_dir)
    runs = load_runs(timed_dir)
    # A run stopped before its summary still logged its command when it started.
    command = previous.get("command") or (runs[-1].get("command") if runs else None)
    costs = _costs(timed_dir)
    summary = bench.summarize(
        records, timed_dir, command=command, costs=costs, config=previous.get("config"), runs=runs
    )
    rows = {(r["temperature"], method_label(r), r["N"]): r for r in summary["rows"] if r.get("speedup") is not None}
    ar = next((r for r in summary["rows"] if r["method"] == "ar" and r.get("tokens_per_s")), None)
    counts = sorted({r["n_timed"] for r in summary["rows"] if r.get("n_timed")})
    examples = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]} (a run stopped part-way)"
    sittings = sorted({invocation_of(runs, r) for r in loop} - {None})
    when = (
        "every method in one run"
        if len(sittings) <= 1
        else f"timed in {len(sittings)} invocations (started {', '.join(runs[i]['started'] for i in sittings)}: "
        "a speedup between methods timed in different invocations compares two sittings of the machine)"
    )
    line = (
        f"Real speed: the batch-1 loop on the first {examples} examples at "
        f"{', '.join(sorted({str(r['max_new_tokens']) for r in loop}))} new tokens, {when}, "
        f"dtype {', '.join(sorted({str(r['dtype']) for r in loop}))}, CPU "
        f"{', '.join(sorted({str(r.get('cpu_capability')) for r in loop}))} "
        f"(`{_shown(timed_dir)}`: `{command}`)"
        + (f"; the target alone ran at {ar['tokens_per_s']:.2f} tok/s" if ar else "")
        + ". Where a speedup is below 1×, speculative decoding is slower than the target alone on this CPU"
        + (
            "; the v = 1 columns show what it would reach with a verification as cheap as one decode step."
            if v1_columns
            else "."
        )
    )
    return rows, [line], costs


def outstanding(root: Path, timed_examples: int = TIMED_EXAMPLES) -> list[str]:
    """What Table 1 still lacks under ``root``, per task of the paper's table: its records, methods caught mid-run,
    SD with the LoRA-distilled draft (``LORA_TASKS``), the task's own learned head, and a real-speed timing run with
    ``timed_examples`` examples of every method."""
    missing = []
    for task in PAPER:
        records = bench.load_records(root / task / bench.RESULTS_FILE)
        if not records:
            missing.append(f"{task}: every record")
            continue
        if partial := unfinished_methods(records):
            missing.append(f"{task}: {len(partial)} methods mid-run")
        if task in LORA_TASKS and not any(r["method"] == LORA_METHOD for r in records):
            missing.append(f"{task}: SD with the LoRA-distilled draft")
        if task not in {_trained_on(head) for head in {r["head"] for r in records if r["method"] == "diversed"}}:
            missing.append(f"{task}: a head trained on it")
        missing += _timing_gap(
            root / f"{task}-timed", f"{task}: the real-speed timing run", f"{task}: the timing run", timed_examples
        )
        if task in DRAFT_LENGTH_TASKS:
            lengths = {r["N"] for r in records if r.get("engine") == "sampler" and r["temperature"] == 1}
            if not {3, 7} <= lengths:
                missing.append(f"{task}: draft lengths 3 and 7")
            name = f"{task}: the draft lengths' timing run"
            missing += _timing_gap(root / f"{task}{DRAFT_TIMED_SUFFIX}", name, name, timed_examples)
        if task == FIGURE2[0]:
            missing += _figure2_outstanding(root, records, timed_examples)
    return missing


def _loop_records(timed_dir: Path) -> list[dict]:
    """A timing run's batch-1 loop records (none where the run has not started)."""
    return [r for r in bench.load_records(timed_dir / bench.RESULTS_FILE) if r.get("engine", "loop") == "loop"]


def _timing_gap(timed_dir: Path, absent: str, partial: str, timed_examples: int) -> list[str]:
    """``[absent]`` where a timing run has not started, ``[partial + ", at k of n examples"]`` while some (method, N)
    of it has timed fewer than ``timed_examples`` examples, else nothing."""
    timed = Counter((method_label(r), r["N"]) for r in _loop_records(timed_dir))
    if not timed:
        return [absent]
    least = min(timed.values())
    return [f"{partial}, at {least} of {timed_examples} examples"] if least < timed_examples else []


def _figure2_outstanding(root: Path, records: list[dict], timed_examples: int = TIMED_EXAMPLES) -> list[str]:
    """What the T = 0 frontier lacks: static weights short of ``FIGURE2``'s stories, and a timing run with
    ``timed_examples`` stories of every method."""
    task, stories, weights = FIGURE2
    greedy = Counter(method_label(r) for r in records if r.get("engine") == "sampler" and r["temperature"] == 0)
    full = sum(m.startswith("static:") and k >= stories for m, k in greedy.items())
    missing = (
        [] if full >= weights else [f"{task}: the T = 0 frontier, {full} of {weights} weights on {stories} stories"]
    )
    name = f"{task}: the T = 0 frontier's timing run"
    return missing + _timing_gap(root / f"{task}{GREEDY_TIMED_SUFFIX}", name, name, timed_examples)


def _in_progress(records: list[dict]) -> str:
    """A warning while a method's examples are not yet rows 0..n-1 (:func:`unfinished_methods`): short completions
    (more often right on GSM8K) come in first, so a method caught mid-run looks better than it is."""
    partial = unfinished_methods(records)
    methods = {(r["temperature"], r["N"], method_label(r)) for r in records if r.get("engine") == "sampler"}
    if not partial:
        return ""
    return (
        f" **In progress:** {len(partial)} of {len(methods)} methods hold examples beyond a prefix of the rows "
        f"({min(partial.values())}–{max(partial.values())} examples), and short completions are recorded first, so "
        "such a method's row (and any pairing over the examples it has) leans towards the problems it answered "
        "briefly; until the run completes, compare methods in the frontier comparison below, which uses only the "
        "examples every method has finished."
    )


def task_section(task: str, out_dir: Path) -> list[str]:
    records = bench.load_records(out_dir / bench.RESULTS_FILE)
    if not records:
        return [f"## {task}", "", "No records yet.", ""]
    timed, timed_lines, timed_costs = timed_section(out_dir.parent / f"{task}-timed")
    first = records[0]
    pair = (first["target"], first.get("draft") or first["target"])
    dtypes = {r["dtype"] for r in records}
    beside_timing, costs = _with_timing_costs(_costs(out_dir), timed_costs, pair, dtypes)
    previous = _previous_summary(out_dir)
    summary = bench.summarize(
        records, out_dir, command=previous.get("command"), costs=costs, config=previous.get("config"),
        runs=load_runs(out_dir),
    )  # fmt: skip
    rows = [r for r in summary["rows"] if r["method"] != "ar"]
    capabilities = ", ".join(summary.get("cpu_capabilities") or []) or "unknown"
    lines = [
        f"## {task}",
        "",
        f"{len(records)} records in `{_shown(out_dir)}/results.jsonl`; CPU {capabilities}; dtype "
        f"{', '.join(sorted({str(r['dtype']) for r in records}))}; max new tokens "
        f"{', '.join(sorted({str(r['max_new_tokens']) for r in records}))}; weights {records_weights(records)}. "
        "Quality and acceptance come from the "
        "batched law-exact sampler; exact SD has the target's law, so its row is the target alone's quality."
        + _in_progress(records),
        "",
        "| T | method | N | n | quality ×100 [95% CI] | Δ vs target [95% CI] | acceptance | per position | "
        "tokens/round τ | mean w | cut at max | τ model (v=1) | i.i.d. model (v=1) | real speedup (n timed) | "
        "real / τ model |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    slower = []  # the timed methods slower than the target alone on this CPU
    for r in rows:
        tau = _model(r.get("tau_speedup"), r.get("tau_speedup_v1"))
        iid = _model(r.get("analytic_speedup"), r.get("analytic_speedup_v1"))
        t = timed.get((r["temperature"], method_label(r), r["N"])) or (r if r.get("speedup") is not None else None)
        # On the examples the target alone was timed on too, so a run stopped part-way still compares like with like.
        real_speedup = None if t is None else (t.get("speedup_matched") or t["speedup"])
        real = "-" if t is None else f"{real_speedup:.2f}× ({t.get('n_timed')})"
        ratio = f"{real_speedup / r['tau_speedup']:.2f}" if t is not None and r.get("tau_speedup") else "-"
        if real_speedup is not None and real_speedup < 1:
            slower.append(f"{method_label(r)} at T = {r['temperature']:g} ({real_speedup:.2f}×; τ model with v = 1: "
                          f"{_num(r.get('tau_speedup_v1'))}×)")  # fmt: skip
        lines.append(
            f"| {r['temperature']:g} | {method_label(r)} | {_num(r['N'], 'd')} | {r['n']} | {format_quality(r)} | "
            f"{format_paired_diff(r)} | "
            f"{_pct(r['acceptance_rate'])} | {_pct(r.get('verified_acceptance_rate'))} | "
            f"{_num(r['mean_accepted_per_round'])} | {_num(r['mean_weight'])} | {100 * r['truncated_rate']:.0f}% | "
            f"{tau} | {iid} | {real} | {ratio} |"
        )
    cost = costs.get(costs_key(*pair, first["dtype"]))
    if cost:
        where = f"beside the real timing ({beside_timing[0]})" if beside_timing else "in the run"
        lines += [
            "",
            f"Costs measured {where}: target "
            f"{cost['target_seconds_per_token']:.3f} s/token, draft "
            f"{cost['draft_seconds_per_token']:.3f} s/token (c = {cost['c']:.3f}), v = "
            + ", ".join(f"{v:.2f} (N = {n})" for n, v in (cost.get("v") or {}).items() if v)
            + ". τ model: speedup = τ / (N·c + v) from the measured tokens per round τ (in parentheses v = 1, a "
            "verification as cheap as one decode step; `-` before it at an N whose v was not measured here). i.i.d. "
            "model: (1 − α^(N+1)) / ((1 − α)(N·c + v)) from the "
            "acceptance α, which under-predicts because acceptance is bursty. Real speedup: tokens/s of the real "
            "batch-1 loop over the target alone's on the timed examples (`-` where none were timed yet).",
        ]
    if timed_lines:
        lines += ["", *timed_lines]
        lines[-1] += (
            f" Slower than the target alone on this CPU: {'; '.join(slower)}."
            if slower
            else " Every timed method ran faster than the target alone on this CPU."
        )
    pilot = out_dir.parent / f"{task}-pilot" / "README.md"
    if pilot.is_file():
        lines += [
            "",
            f"The second lenience and α, and Chow's and Diff's α, were picked by a 20-row pilot: `{_shown(pilot)}`.",
        ]
    if summary.get("runs"):
        lines += ["", *format_runs(summary["runs"])]
    lines += frontier_section(records)
    # The draft lengths' own timing run (benchmarks/draft_length.sh: N = 3, 5, 7 side by side) where there is one.
    length_timed, length_lines, length_costs = timed_section(out_dir.parent / f"{task}{DRAFT_TIMED_SUFFIX}")
    if length_timed:
        _, length_costs = _with_timing_costs(costs, length_costs, pair, dtypes)
        lines += draft_length_section(records, length_timed, length_costs, length_lines)
    else:
        lines += draft_length_section(records, timed, costs)
    lines += greedy_frontier_section(task, out_dir)
    lines += draft_section(records)
    lines += baseline_section(records)
    lines += zero_training_section(records)
    plot = os.path.relpath(out_dir / bench.PLOT_ACCEPTANCE_FILE, ROOT / "docs")  # results.md lives in docs/
    lines += ["", f"![quality vs acceptance]({plot})", ""]
    if task in PAPER:
        sd, ours, quality = PAPER[task]
        exact = next((r for r in rows if r["method"] == "exact" and r["temperature"] == 1.0 and r["N"] == 5), None)
        lines += [
            "Beside the paper's Table 1 (a different pair: Llama-3.1-8B / Llama-3.2-1B, N = 5, T = 1):",
            "",
            "| | SD acceptance | DIVERSED acceptance | quality SD → DIVERSED |",
            "|---|---|---|---|",
            f"| paper | {sd} | {ours} | {quality} |",
        ]
        heads = [r for r in rows if r["method"] == "diversed" and r["temperature"] == 1.0 and r["N"] == 5
                 and _trained_on(r["head"]) in (task, "-")]  # a head of another task: the cross-task table  # fmt: skip
        sd_cell = _pct(exact["acceptance_rate"]) if exact else "-"
        sd_quality = format_quality(exact) if exact else "-"
        for head in heads or [None]:
            name = f"this pair, head `{head['head']}`" if head else "this pair"
            ours_cell = _pct(head["acceptance_rate"]) if head else "(heads: a later run)"
            ours_quality = format_quality(head) if head else "-"
            lines.append(f"| {name} | {sd_cell} | {ours_cell} | {sd_quality} → {ours_quality} |")
        lines.append("")
    return lines


def _trained_on(head: str) -> str:
    """The task a head was trained for, from its config.json (a path in the repository or the working directory)."""
    for base in (ROOT, Path.cwd()):
        config = base / head / "config.json"
        if config.is_file():
            return json.loads(config.read_text()).get("task") or "-"
    return "-"


def cross_task_section(root: Path) -> list[str]:
    """Every learned head on every task it was run on (the paper's cross-task table): at T = 1 on the rows it shares
    with the target alone, its quality, the paired difference to the target alone, its acceptance, and where it lies
    against that task's static frontier."""
    rows = []
    for task in TASKS:
        records = bench.load_records(root / task / bench.RESULTS_FILE) if (root / task).is_dir() else []
        for (temperature, n, length), group in _sampler_groups(records):
            if temperature != 1.0:
                continue
            summary = {method_label(r): r for r in summarize_records(group)}
            for label in sorted(m for m in summary if m.startswith("diversed@")):
                head, row = label.removeprefix("diversed@"), summary[label]
                c = compare_to_frontier(group, label)
                verdict = "-" if c is None else (
                    f"{_gap(c['quality_gap'], c['quality_gap_ci'], c['quality_gap_defined'], '.1f')} "
                    f"({c['n']} shared): {c['verdict']}"
                )  # fmt: skip
                rows.append((TASKS.index(task), head, n, length,
                    f"| `{head}` | {_trained_on(head)} | {task} | {n} | {length} | {row['n']} | "
                    f"{format_quality(row)} | {format_paired_diff(row)} | {_pct(row['acceptance_rate'])} | "
                    f"{_num(row['mean_weight'])} | {verdict} |"
                ))  # fmt: skip
    if not rows:
        return []
    return [
        "## Heads across tasks",
        "",
        "Every learned head on every task it was run on, at T = 1 (the paper's cross-task table: a head on a "
        "task it was not trained for is off the diagonal). Δ vs target: paired, on the examples both have. Against "
        "the static frontier: Δ quality at the head's acceptance with its paired bootstrap interval, on the examples "
        "the head and every static point share.",
        "",
        "| head | trained on | evaluated on | N | tokens | n | quality ×100 [95% CI] | Δ vs target [95% CI] | "
        "acceptance | mean w | against the static frontier |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *(line for *_, line in sorted(rows)),  # per task, each head's draft lengths together
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=str(ROOT / "docs" / "table1"))
    parser.add_argument("--output", default=str(ROOT / "docs" / "results.md"))
    args = parser.parse_args()
    root = Path(args.root).resolve()
    missing = outstanding(root)
    lines = [
        "# Results on the real pair: the paper's Table 1" + (" (in progress)" if missing else ""),
        "",
        "Target Qwen2.5-Coder-1.5B-Instruct, draft Qwen2.5-Coder-0.5B-Instruct, both as their GGUF Q4_K_M copies "
        "(4-bit quantized, dequantized to float32; the weights each section ran on are named in it): every number "
        "here is on those copies, not on the original weights, which have not been measured. Generated by "
        f"`python benchmarks/table1_report.py` on {time.strftime('%Y-%m-%d')} from the records under "
        "`docs/table1/`; each task's command is in its `results.md`. Runs resume where they stopped. Real-loop "
        "speed at batch 1 comes from each task's timing run (`bash benchmarks/table1_timed.sh <task>` into "
        "`docs/table1/<task>-timed`, every method side by side on one machine), which may run on another machine "
        "and dtype than the sampler's records; each section says which. Draft lengths 3 and 7: `bash "
        "benchmarks/draft_length.sh <task>` (timed in `<task>-draft-timed`); the T = 0 time–quality frontier (the "
        "paper's Figure 2): `bash benchmarks/figure2_cnndm.sh`. Why verification costs what it does on "
        "these CPUs: `docs/overhead.md`; the sampler's throughput: `docs/sampler.md`.",
        "",
        *([f"Still to come: {'; '.join(missing)}.", ""] if missing else []),
    ]
    for task in TASKS:
        if (root / task).is_dir():
            lines += task_section(task, root / task)
    lines += cross_task_section(root)
    Path(args.output).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
