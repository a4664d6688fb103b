"""Ship a finished head as the package's bundled head for its task, its model card carrying the run's numbers.

    python training/ship_head.py --run docs/training/gsm8k-full/lambda-0.1 --table1 docs/table1/gsm8k \\
        -- --config training/recipes/gsm8k-full.yaml --acceptance_coef 0.1 \\
        --output_dir docs/training/gsm8k-full/lambda-0.1

Arguments after ``--`` are the run's ``training/train.py`` arguments: the card states that command and every
setting it resolves to. The card's Evaluation section holds the run's held-out evaluations (first and last, from
``log_history.jsonl``) and, with ``--table1``, the head's rows of the Table 1 run (records that name the head by
``--run``'s path): its quality with an interval, acceptance, tokens per round and mean w beside the target alone,
the draft alone, the hand-made token-class rules and the speculative cascades; where it lies against the static
frontier; and the head minus each rule, paired. Writes config.json (the pair named by Hub ids), model.safetensors
and README.md into the bundled head's folder (``hf_diversed/modeling/heads/<name>/``, or ``--dest``);
``hf-diversed heads`` seeds and pushes it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path

from hf_diversed.evaluation.bench.frontier import (
    BASELINE_RULE_PREFIXES,
    compare_to_baseline,
    compare_to_frontier,
    method_label,
    unfinished_methods,
)
from hf_diversed.evaluation.bench.plan import load_records
from hf_diversed.evaluation.bench.runs import invocation_of, load_runs
from hf_diversed.evaluation.bench.summary import summarize_records
from hf_diversed.evaluation.real_models import SPECS, provenance
from hf_diversed.modeling.model_card import render_head_card, weights_sentence
from hf_diversed.modeling.pretrained import PRETRAINED_HEADS
from hf_diversed.trainer.curves import load_history
from hf_diversed.trainer.diversed_trainer import training_section

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train import parse_config  # noqa: E402

EVAL_KEYS = ("reward", "acceptance_rate", "mean_w", "tokens_per_round", "cut_fraction")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ci(value: float | None, interval, spec: str = ".1f", sign: str = "") -> str:
    if value is None:
        return "-"
    text = f"{value:{sign}{spec}}"
    return text if not interval else f"{text} [{interval[0]:{sign}{spec}}, {interval[1]:{sign}{spec}}]"


def held_out_section(run: Path, config) -> list[str]:
    """The first and last held-out evaluations of the run's ``log_history.jsonl``."""
    evals = sorted((e for e in load_history(run / "log_history.jsonl") if e.get("split") == "eval"),
                   key=lambda e: e["step"])  # a resumed run logs steps again: the later line wins  # fmt: skip
    if not evals:
        return ["Not evaluated during training (eval_steps = 0)."]
    first, last = evals[0], evals[-1]
    keys = [k for k in EVAL_KEYS if k in first or k in last]
    rows = [
        f"Held out during training: {config.num_eval_prompts} prompts of `{config.eval_split}`, temperature "
        f"{config.temperature:g}, N = {config.num_assistant_tokens}, {config.max_new_tokens} new tokens, the same "
        "seeds at every evaluation.",
        "",
        "| head | step | " + " | ".join(keys) + " |",
        "|---|---|" + "---|" * len(keys),
    ]
    start = f"start: `{config.init_head}`" if config.init_head else f"untrained (w = {config.init_weight:g})"
    for label, entry in ((start, first), ("trained", last)):
        cells = ["-" if entry.get(k) is None else f"{entry[k]:.3f}" for k in keys]
        rows.append(f"| {label} | {entry['step']} | " + " | ".join(cells) + " |")
    return rows


def table1_section(table1: Path, head_key: str) -> list[str]:
    """The head's rows of a Table 1 run, against the target alone, the draft alone, the rules and the frontier."""
    records = [r for r in load_records(table1 / "results.jsonl") if r.get("engine") == "sampler"]
    label = f"diversed@{head_key}"
    mine = [r for r in records if method_label(r) == label]
    if not mine:
        raise SystemExit(f"{table1}/results.jsonl has no records of the head {head_key!r}: pass --run as the bench "
                         "named it (the path relative to the directory the bench ran in).")  # fmt: skip
    settings = {k: mine[0][k] for k in ("temperature", "N", "max_new_tokens")}
    group = [r for r in records if all(r[k] == v for k, v in settings.items())]
    rules = sorted({method_label(r) for r in group if r["method"].startswith(BASELINE_RULE_PREFIXES)})
    shown = ["exact", "static:0", label, *rules]
    rows = {method_label(r): r for r in summarize_records([r for r in group if method_label(r) in shown])}
    names = {"exact": "target alone (exact SD's law)", "static:0": "draft alone (static w = 0)", label: "this head"}
    metric = mine[0].get("metric", "quality")
    lines = [
        f"Table 1 run on the real pair (`{table1}`; `docs/results.md` has every method): "
        f"T = {settings['temperature']:g}, N = {settings['N']}, {settings['max_new_tokens']} new tokens, {metric}; "
        "the same examples and seeds for every method.",
        "",
        "| method | n | quality ×100 [95% CI] | Δ vs target [95% CI] | acceptance | tokens/round | mean w |",
        "|---|---|---|---|---|---|---|",
    ]
    for method in shown:
        row = rows.get(method)
        if row is None:
            continue
        lines.append(
            f"| {names.get(method, method)} | {row['n']} | {_ci(row['quality'], row['quality_ci'])} | "
            f"{_ci(row['paired_diff'], row['paired_diff_ci'], sign='+')} | {_pct(row['acceptance_rate'])} | "
            f"{row['mean_accepted_per_round']:.2f} | {row['mean_weight']:.2f} |"
        )
    frontier = compare_to_frontier(group, label)
    if frontier is not None:
        lines += [
            "",
            f"- Against the static frontier ({', '.join(frontier['frontier'])}; exact SD as w = 1), on the "
            f"{frontier['n']} examples the head and every frontier method finished: Δ quality at the head's acceptance "
            f"{_ci(frontier['quality_gap'], frontier['quality_gap_ci'], sign='+')}: **{frontier['verdict']}**.",
        ]
    for rule in rules:
        c = compare_to_baseline(group, label, rule)
        if c is not None:
            lines.append(
                f"- Head minus `{rule}` on {c['n']} shared examples: acceptance "
                f"{_ci(100 * c['acceptance_gap'], [100 * x for x in c['acceptance_gap_ci'] or []], sign='+')} points, "
                f"quality {_ci(c['quality_gap'], c['quality_gap_ci'], sign='+')}."
            )
    partial = sorted(label for (_, _, label) in unfinished_methods(group) if label in shown)
    if partial:
        lines += [
            "",
            f"The run is in progress: {', '.join(partial)} hold examples beyond a prefix of the rows (short "
            "completions are recorded first); the frontier comparison uses only shared examples.",
        ]
    return lines


def speed_section(timed: Path, head_key: str) -> list[str]:
    """The head's real batch-1 speed from a Table 1 timing run (``<table1>-timed``), beside the target alone, exact
    SD and the speculative cascades timed with it; nothing when the run did not time the head."""
    loop = [r for r in load_records(timed / "results.jsonl") if r.get("engine", "loop") == "loop"]
    label = f"diversed@{head_key}"
    rows = {method_label(r): r for r in summarize_records(loop) if r.get("tokens_per_s")}
    if label not in rows or "ar" not in rows:
        return []
    head, ar = rows[label], rows["ar"]
    runs = load_runs(timed)
    sittings = {invocation_of(runs, r) for r in loop if method_label(r) in ("ar", label)}
    threads = sorted({str(runs[i].get("threads")) for i in sittings if i is not None})
    shown = [("target alone", ar), ("exact SD", rows.get("exact")), ("this head", head)]
    shown += [(m, r) for m, r in sorted(rows.items()) if m.startswith("cascade-")]
    lines = [
        f"Real speed (`{timed}`): the batch-1 loop on the first {head['n_timed']} examples, "
        f"{head['max_new_tokens']} new tokens, T = {head['temperature']:g}, N = {head['N']}, dtype {head['dtype']}, "
        f"CPU {', '.join(sorted({str(r.get('cpu_capability')) for r in loop}))}"
        + (f", {'/'.join(threads)} threads." if threads else "."),
        "",
        "| method | tokens/s | speedup over the target alone |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {r['tokens_per_s']:.2f} | {r['speedup']:.2f}× |" for name, r in shown if r is not None]
    if len(sittings) > 1:
        lines += ["", f"The head and the target alone were timed over {len(sittings)} invocations of the run (a "
                      "resumed run): their ratio may compare different sittings of the machine."]  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True, help="the finished run's folder (the final head)")
    parser.add_argument("--table1", type=Path, default=None, help="a Table 1 output folder with the head's records")
    parser.add_argument("--dest", type=Path, default=None, help="default: the bundled head's folder for the task")
    args = parser.parse_args(argv[:split])
    train_args = argv[split + 1 :]
    if not train_args:
        parser.error("give the run's training/train.py arguments after `--` (e.g. -- --config recipe.yaml ...)")
    config = parse_config(train_args)
    head_config = json.loads((args.run / "config.json").read_text())
    task = head_config.get("task") or config.task
    bundled = next((h for h in PRETRAINED_HEADS if h.task == task), None)
    if bundled is None and args.dest is None:
        raise SystemExit(f"no bundled head for task {task!r}: pass --dest.")
    dest = args.dest or bundled.folder
    repo_id = bundled.repo_id if bundled else dest.name
    # the built-in names of the real pair become their Hub ids; other names (Hub ids, paths) are kept
    target, draft = (SPECS[m].hub_id if m in SPECS else m for m in (config.target, config.draft))
    # which weights it trained on: the run's own record, else (runs before it was recorded) the GGUF copies that the
    # built-in names load
    weights = head_config.get("training_weights") or {
        role: provenance(SPECS[m], wheels=False) if m in SPECS else None
        for role, m in (("target", config.target), ("draft", config.draft))
    }

    training = "```bash\npython training/train.py " + shlex.join(train_args) + "\n```\n\n" + training_section(config)
    evaluation = held_out_section(args.run, config)
    if args.table1 is not None:
        head_key = args.run.as_posix().rstrip("/")
        evaluation += [""] + table1_section(args.table1, head_key)
        speed = speed_section(args.table1.with_name(args.table1.name + "-timed"), head_key)
        evaluation += [""] + speed if speed else []
    card = render_head_card(repo_id=repo_id, target_model=target, draft_model=draft,
                            vocab_size=head_config.get("vocab_size"), task=task,
                            weights=weights_sentence(weights), training=training,
                            evaluation="\n".join(evaluation),
                            verification=head_config.get("verification", "mixture"))  # fmt: skip
    head_config.update(target_model=target, draft_model=draft, task=task, training_weights=weights)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(head_config, indent=2, sort_keys=True) + "\n")
    shutil.copy2(args.run / "model.safetensors", dest / "model.safetensors")
    (dest / "README.md").write_text(card)
    print(f"{repo_id}: wrote {dest}/config.json, model.safetensors, README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
