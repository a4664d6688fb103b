"""Writing a summary: ``summary.json``, ``results.md`` and the quality-vs-speed plots."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ..weights import records_weights
from .config import MARKDOWN_FILE, PLOT_ACCEPTANCE_FILE, PLOT_FILE, SCHEMA_VERSION, SUMMARY_FILE
from .plan import _clean
from .runs import format_runs, summarize_runs
from .summary import summarize_records


def _str(value) -> str:
    return "-" if value is None else str(value)


ASSUMPTIONS = (
    "Analytic speedup (Leviathan et al. 2023) = (1 - a^(N+1)) / ((1 - a)(N c + v)), with a = the measured "
    "acceptance rate (accepted/drafted, pooled), N = draft length, c = draft/target seconds per token of each "
    "model alone (plain greedy generate, same run), v = target forward on N+1 tokens / on 1 token (measured; "
    "'v=1' assumes verification costs one decode step). It assumes i.i.d. acceptance and ignores drafting/"
    "verification overheads (e.g. the DIVERSED head); it is exact SD's model and only indicative for relaxed rules."
)


def summarize(records: Sequence[dict], out_dir: str | os.PathLike, *, command: str | None = None,
              costs: dict | None = None, config: dict | None = None,
              runs: Sequence[dict] | None = None, run_records: Sequence[dict] | None = None) -> dict:  # fmt: skip
    """Write ``summary.json``, ``results.md`` and the quality/speed plots for ``records``; return the summary.

    ``runs``: the run log's lines (:func:`~.runs.load_runs`), summarized as wall-clock time and throughput from
    ``run_records`` (default ``records``): every record of the folder, as each logged invocation wrote its own."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = summarize_records(records, costs)
    summary = {
        "schema": SCHEMA_VERSION,
        "command": command,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "num_records": len(records),
        "protocol": (
            "Spec-Bench: batch size 1, all methods on the same machine in the same run; speedup = tokens/s "
            "over autoregressive (ar) tokens/s on the same task and temperature; acceptance = accepted/drafted "
            "(pooled); accepted/round counts the bonus token (pooled)."
        ),
        "assumptions": ASSUMPTIONS,
        "config": config,
        "cpu_capabilities": sorted({str(r.get("cpu_capability")) for r in records if r.get("cpu_capability")}),
        "weights": records_weights(records),
        "costs": costs or {},
        "runs": summarize_runs(runs or [], records if run_records is None else run_records),
        "rows": rows,
    }
    _write_summary(_clean(summary), out_dir / SUMMARY_FILE)
    write_markdown(summary, out_dir / MARKDOWN_FILE)
    try:
        from ..plotting import plot_quality_speed

        plot_quality_speed(rows, out_dir / PLOT_FILE, x="speedup")
        plot_quality_speed(rows, out_dir / PLOT_ACCEPTANCE_FILE, x="acceptance_rate")
    except ImportError as err:  # pragma: no cover - matplotlib is in the bench extra
        print(f"warning: no plots ({err}); pip install 'hf-diversed[bench]'", file=sys.stderr)
    return summary


def _write_summary(summary: dict, path: Path) -> None:
    # A rebuild from the same records keeps the file as it was, so re-running a report does not touch it.
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        previous = None
    text = json.dumps(summary, indent=2) + "\n"
    if isinstance(previous, dict) and {**previous, "generated_at": summary["generated_at"]} == json.loads(text):
        return
    path.write_text(text, encoding="utf-8")


def _fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:{spec}}{suffix}"


def format_quality(row: dict) -> str:
    """A summary row's quality ×100 with its 95% interval: ``31.2 [19.9, 45.3]`` (``-`` when absent)."""
    text = _fmt(row.get("quality"), ".1f")
    if row.get("quality") is not None and row.get("quality_ci"):
        text += f" [{row['quality_ci'][0]:.1f}, {row['quality_ci'][1]:.1f}]"
    return text


def format_paired_diff(row: dict) -> str:
    """A summary row's paired difference to the target alone with its 95% interval: ``+2.0 [-4.1, +8.2]``."""
    if row.get("paired_diff") is None:
        return "-"
    text = f"{row['paired_diff']:+.1f}"
    if row.get("paired_diff_ci"):
        text += f" [{row['paired_diff_ci'][0]:+.1f}, {row['paired_diff_ci'][1]:+.1f}]"
    return text


def _short(model: str | None) -> str:
    if not model:
        return "-"
    return Path(model).name if os.path.isabs(model) else model  # local dirs: their name; Hub ids stay whole


def write_markdown(summary: dict, path: str | os.PathLike) -> None:
    """The summary as Markdown: the command, then one table (one row per task/temperature/method/N)."""
    rows = summary["rows"]
    lines = ["# hf-diversed bench", ""]
    if summary.get("command"):
        lines += ["```", summary["command"], "```", ""]
    fields = ("target", "draft", "head", "max_new_tokens", "dtype", "seed", "split")
    vary = {f: len({str(r.get(f)) for r in rows if r.get(f) is not None}) > 1 for f in fields}
    fixed = []
    for f in ("target", "draft", "head", "lora_draft", "split", "max_new_tokens", "dtype", "seed"):
        values = {str(r.get(f)) for r in rows if r.get(f) is not None}
        if len(values) == 1 and not vary.get(f):
            value = values.pop()
            fixed.append(f"{f}: `{_short(value) if f in ('target', 'draft', 'head', 'lora_draft') else value}`")
    if summary.get("weights"):
        fixed.append(f"weights: {summary['weights']}")
    if fixed:
        lines += ["; ".join(fixed), ""]
    extra_cols = [f for f in fields if vary[f]]
    header = ["task", "T", *extra_cols, "method", "N", "n", "quality (×100) [95% CI]", "Δ vs target [95% CI]",
              "acceptance", "per position",
              "accepted/round", "mean w", "mean TV", "cut at max", "n timed", "tok/s", "speedup",
              "τ model (v=1)", "i.i.d. model (v=1)"]  # fmt: skip
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    any_fewer = False

    def pct(x):
        return _fmt(None if x is None else 100 * x, ".1f", "%")

    def model(a, b):
        return "-" if b is None else f"{_fmt(a, '.2f', '×')} ({_fmt(b, '.2f', '×')})"

    for r in rows:
        speed = _fmt(r["speedup"], ".2f", "×")
        if r["method"] != "ar" and r["speedup"] is not None and r["n_ar"] != r["n_timed"]:
            speed += f" (ar n={r['n_ar']}; matched {_fmt(r['speedup_matched'], '.2f', '×')})"
            any_fewer = True
        quality, diff = format_quality(r), format_paired_diff(r)
        if r.get("quality_from", "").startswith("sampler (exact"):
            quality += " ᵉ"
        elif r.get("quality_from") == "loop":
            quality += " ˡ"
        cells = [r["task"], f"{r['temperature']:g}", *[_short(_str(r.get(c))) for c in extra_cols], r["method"],
                 _fmt(r["N"], "d"), str(r["n"]), quality, diff, pct(r["acceptance_rate"]),
                 pct(r.get("verified_acceptance_rate")), _fmt(r["mean_accepted_per_round"], ".2f"),
                 _fmt(r["mean_weight"], ".2f"), _fmt(r.get("mean_tv"), ".3f"),
                 _fmt(100 * r["truncated_rate"], ".0f", "%"),
                 str(r.get("n_timed", r["n"])), _fmt(r["tokens_per_s"], ".2f"), speed,
                 model(r.get("tau_speedup"), r.get("tau_speedup_v1")),
                 model(r.get("analytic_speedup"), r.get("analytic_speedup_v1"))]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    capabilities = sorted({str(c) for c in summary.get("cpu_capabilities") or [] if c})
    lines += [
        "",
        "Engines. Quality, acceptance, per-position acceptance, accepted/round, mean w, mean TV and cut at max come "
        "from the batched law-exact sampler (`hf_diversed.generation.batched`) over the `n` examples: its sequences "
        "have the real loop's law. `n timed`, tok/s and speedup come from the real batch-1 loop on the first examples "
        "(Spec-Bench protocol). ᵉ: the target alone has exact SD's law, so its quality is exact SD's sampled "
        "quality. ˡ: from the real loop (records without a sampler run)."
        + (f" CPU: {', '.join(capabilities)}." if capabilities else ""),
        "",
        "Speedup: tokens/s of the method / tokens/s of `ar` on the same task and temperature (pooled: total "
        "tokens / total seconds)."
        + (
            " Where `ar` was timed on fewer examples than the method, the cell says so and gives "
            "the speedup on the examples both ran ('matched')."
            if any_fewer
            else ""
        ),
        "Acceptance: accepted / drafted tokens (drafts thrown away after a rejection count as drafted, the "
        "Spec-Bench figure); per position: accepted / verified. Accepted/round counts the bonus (correction) "
        "token. Quality: task metric ×100 (ROUGE-2 F1 is already ×100) with a 95% interval (Wilson for 0/1 "
        "rewards, bootstrap for ROUGE). Δ vs target: paired difference to exact SD's sampled quality (the target's "
        "law) on the same examples and seeds, with a bootstrap 95% interval. Cut at max: share of completions that "
        "reached --max-new-tokens.",
        "",
        "Speed models, with measured v (and v = 1 in parentheses): τ model = τ / (N·c + v) with τ the measured "
        f"accepted/round; i.i.d. model: {summary.get('assumptions', '')}",
    ]
    costs = summary.get("costs") or {}
    if costs:
        lines += ["", "| target \\| draft \\| dtype | target s/token | draft s/token | c | v by N |"]
        lines += ["|---|---|---|---|---|"]
        for key, cost in costs.items():
            v = ", ".join(f"N={n}: {_fmt(x, '.2f')}" for n, x in (cost.get("v") or {}).items())
            name = " \\| ".join(_short(part.strip()) for part in key.split("|"))
            t_cost, d_cost = cost.get("target_seconds_per_token"), cost.get("draft_seconds_per_token")
            c = _fmt(cost.get("c"), ".3f")
            lines.append(f"| {name} | {_fmt(t_cost, '.4f')} | {_fmt(d_cost, '.4f')} | {c} | {v} |")
    if summary.get("runs"):
        lines += ["", *format_runs(summary["runs"])]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
