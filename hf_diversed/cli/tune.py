"""``hf-diversed tune``: the fastest zero-training rule within a quality budget, for a target, a draft and a task.

The command line over :func:`hf_diversed.evaluation.tune.run_tune`: sweep the rules on calibration rows with the
batched sampler, choose, confirm on held-out rows, write ``tune.json`` and ``frontier.png``."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..evaluation.tune import CRITERION, FRONTIER_PLOT, TUNE_FILE, TuneConfig, parse_rows, run_tune


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``tune`` subcommand's options to ``parser``."""
    from ..evaluation.real_models import DRAFT_NAME, TARGET_NAME
    from ..evaluation.tasks import REWARDS, TASKS
    from ..evaluation.weights import WEIGHTS, WEIGHTS_HELP

    parser.description = __doc__.split("\n\n")[0] if __doc__ else None
    add = parser.add_argument
    add("--task", required=True, help=f"a built-in task ({', '.join(TASKS)}) or a JSONL file of prompts "
                                      "(\"prompt\" or \"messages\" per line, with the reward's fields)")  # fmt: skip
    add("--reward", default=None, help=f"a JSONL task's reward: {REWARDS} (reading the fields answer, answer, "
                                       "reference, tests, every other)")  # fmt: skip
    add("--target", default=TARGET_NAME, help="target model: Hub id, local path or GGUF copy (default %(default)s)")
    add("--draft", default=DRAFT_NAME, help="draft model sharing the target's tokenizer (default %(default)s)")
    add("--weights", default=None, choices=WEIGHTS, help=WEIGHTS_HELP)
    criterion = CRITERION.replace("%", "%%")
    add("--max-drop", type=float, default=1.0, metavar="POINTS",
        help=f"quality budget in points (×100; ROUGE points): {criterion} (default %(default)s)")  # fmt: skip
    add("--split", default="test", help="the split both row ranges index (default %(default)s)")
    add("--calibration-rows", default="0:60", metavar="START:STOP", help="rows the sweep runs on (default %(default)s)")
    add("--heldout-rows", default="60:120", metavar="START:STOP", help="rows the choice is confirmed on "
                                                                        "(default %(default)s)")  # fmt: skip
    add("--static", default="0.1,0.3,0.5,0.7,0.9", metavar="W,...", help="static:W rules (default %(default)s)")
    add("--cascade", default="opt:0.1", metavar="V:A,...", help="cascade-V:A rules, V in chow, diff, opt "
                                                               "(default %(default)s)")  # fmt: skip
    add("--lossy", default="0.5", metavar="L,...", help="lossy:L rules (default %(default)s)")
    add("--token-class", default=None, metavar="CLASS:W,...", help="token-class rules (default: digits:0,digits:0.3 "
        "where answers are numbers: gsm8k, --reward number; else none; '' for none)")  # fmt: skip
    add("--head", action="append", default=None, metavar="HEAD", help="a DIVERSED head to sweep too (repeatable)")
    add("--num-assistant-tokens", type=int, default=5, metavar="N", help="draft length N (default %(default)s)")
    add("--temperature", type=float, default=1.0, help="sampling temperature, 0 = greedy (default %(default)s)")
    add("--max-new-tokens", type=int, default=512)
    add("--batch-size", type=int, default=32, help="rows the batched sampler decodes together (default %(default)s)")
    add("--seed", type=int, default=0, help="row i samples with seed + i, the same for every rule")
    add("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    add("--threads", type=int, default=None, help="torch threads (default: all cores)")
    add("--data-dir", default=None, help="folder with <task>/<split>.jsonl (built-in tasks)")
    add("--records-from", action="append", default=None, metavar="RESULTS_JSONL",
        help="copy the records of an earlier bench run that match this run exactly (task, split, row, rule, T, N, "
             "max new tokens, models, dtype, seed) instead of generating them (repeatable)")  # fmt: skip
    add("--output-dir", default="tune_out", help="calibration/ and heldout/ records, tune.json, frontier.png")
    add("-q", "--quiet", action="store_true", help="no progress output")
    return parser


def config_from_args(args: argparse.Namespace) -> TuneConfig:
    command = getattr(args, "command_line", None) or shlex.join(["hf-diversed", *sys.argv[1:]])
    return TuneConfig(
        task=args.task, reward=args.reward, target=args.target, draft=args.draft, weights=args.weights,
        split=args.split, calibration_rows=parse_rows(args.calibration_rows, "--calibration-rows"),
        heldout_rows=parse_rows(args.heldout_rows, "--heldout-rows"), max_drop=args.max_drop, static=args.static,
        cascade=args.cascade, lossy=args.lossy, token_class=args.token_class, heads=tuple(args.head or ()),
        num_assistant_tokens=args.num_assistant_tokens, temperature=args.temperature,
        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, seed=args.seed, dtype=args.dtype,
        threads=args.threads, data_dir=args.data_dir, records_from=tuple(args.records_from or ()),
        output_dir=args.output_dir, progress=not args.quiet, command=command,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Execute ``hf-diversed tune``; user errors propagate to :func:`hf_diversed.cli.main.main` (one line)."""
    try:
        result = run_tune(config_from_args(args))
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume (finished generations are kept).", file=sys.stderr)
        return 130
    out = Path(args.output_dir)
    held = result["heldout"]
    print(f"chosen: {result['rule'] if not result['head'] else 'diversed head ' + result['head']} "
          f"({result['message']})")  # fmt: skip
    print(f"held-out: {held['verdict']}")
    print(f"use it: {result['usage']['generate']}")
    print(f"  vLLM: {result['usage']['vllm']} (server default: {result['usage']['vllm_server_default']})")
    print(f"speed (batch 1, against the target alone; on an idle machine): {result['speed_command']}")
    print(f"written: {out / TUNE_FILE}, {out / FRONTIER_PLOT}")
    return 0
