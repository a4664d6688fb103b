"""``hf-diversed bench``: Spec-Bench-style speed / acceptance / quality benchmark of decoding methods.

The command line (``hf-diversed bench``) over :func:`hf_diversed.evaluation.bench.run_bench`: its options, the
:class:`~hf_diversed.evaluation.bench.BenchConfig` they build, and the exit codes."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from ..evaluation.bench import (
    DEFAULT_TASKS,
    LORA_METHOD,
    MARKDOWN_FILE,
    METHOD_FORMS,
    PLOT_FILE,
    SUMMARY_FILE,
    BenchConfig,
    BenchError,
    expand_methods,
    run_bench,
)
from ..evaluation.bench.config import _split_list


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``bench`` subcommand's options to ``parser``."""
    from ..evaluation.real_models import DRAFT_NAME, TARGET_NAME
    from ..evaluation.weights import WEIGHTS, WEIGHTS_HELP

    parser.description = __doc__.split("\n\n")[0] if __doc__ else None
    add = parser.add_argument
    add(
        "--target",
        default=TARGET_NAME,
        help="target model: Hub id, local path, or a GGUF copy's name (default: "
        "%(default)s, the GGUF copy the project's results were measured on)",
    )
    add("--draft", default=DRAFT_NAME, help="draft model sharing the target's tokenizer")
    add("--weights", default=None, choices=WEIGHTS, help=WEIGHTS_HELP)
    add("--tasks", default=",".join(DEFAULT_TASKS), help="comma list of tasks (default: %(default)s)")
    add("--split", default="test", help="dataset split (default: %(default)s)")
    add("--data-dir", default=None, help="folder with <task>/<split>.jsonl (default: $HF_DIVERSED_DATA_DIR or "
                                         "../shared/data where present, else the Hugging Face Hub)")  # fmt: skip
    add("--ids", default=None, metavar="FILE", help="only the rows with these ids, in this order (one id per line, "
                                                    "e.g. docs/table1/cnndm/ids.txt: Table 1's rows)")  # fmt: skip
    add(
        "--methods",
        default=None,
        help=f"comma list of methods: {METHOD_FORMS} (default: ar,exact, + diversed "
        "with --head; ar is always added, exact+lora-draft whenever --lora-draft is given)",
    )
    add("--static-sweep", default=None, metavar="W,W,...", help="add static:W for each W, e.g. 0.1,0.3,0.5,0.7,0.9")
    add("--lossy-sweep", default=None, metavar="L,L,...", help="add lossy:L for each L")
    add("--cascade-sweep", default=None, metavar="V:A,...", help="add cascade-V:A for each, e.g. opt:0.1,opt:0.3")
    add(
        "--head",
        action="append",
        default=None,
        metavar="HEAD",
        help="DIVERSED head (Hub id or directory) for method 'diversed'; repeat it to run several heads side by side",
    )
    add("--lora-draft", default=None, metavar="PATH", help=f"PEFT adapter for the draft; adds method {LORA_METHOD}")
    add("--num-assistant-tokens", default="5", metavar="N[,N...]", help="draft length N (e.g. 3,5,7; default 5)")
    add("--temperature", default="1", metavar="T[,T...]", help="0 = greedy, 1 = plain sampling (default 1)")
    add("--max-new-tokens", type=int, default=128)
    add("--num-examples", type=int, default=20, help="first K rows of each task (default %(default)s)")
    add("--timed-examples", type=int, default=10, help="first K rows also timed with the real batch-1 loop, per "
                                                         "method (default %(default)s; 0: no timing)")  # fmt: skip
    add("--ar-examples", type=int, default=None, help="rows timed for the ar baseline (default: --timed-examples)")
    add("--batch-size", type=int, default=32, help="rows the batched sampler decodes together (default %(default)s)")
    add("--seed", type=int, default=0, help="example i samples with seed + i, the same for every method")
    add("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
        help="auto: bfloat16 where the CPU has AVX512-BF16/AMX (or on CUDA), else float32")  # fmt: skip
    add("--threads", type=int, default=None, help="torch threads (default: all cores)")
    add("--output-dir", default="bench_out", help="results.jsonl, summary.json, results.md, plots")
    add("--summarize-only", action="store_true", help="only rebuild the summary from --output-dir/results.jsonl")
    add("--no-warmup", action="store_true", help="skip the untimed warm-up generation of each method")
    add("--no-costs", action="store_true", help="skip measuring c and v (analytic speedup)")
    add("--remeasure-costs", action="store_true", help="measure c and v again (on an idle machine) and replace "
                                                        "this pair's entry in costs.json")  # fmt: skip
    add("-q", "--quiet", action="store_true", help="no progress output")
    return parser


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Build (and validate) a :class:`BenchConfig` from parsed ``bench`` arguments."""
    methods = expand_methods(
        args.methods, static_sweep=args.static_sweep, lossy_sweep=args.lossy_sweep,
        cascade_sweep=args.cascade_sweep, heads=args.head, lora_draft=args.lora_draft,
    )  # fmt: skip
    command = getattr(args, "command_line", None) or shlex.join(["hf-diversed", *sys.argv[1:]])
    return BenchConfig(
        target=args.target, draft=args.draft, weights=args.weights, tasks=tuple(_split_list(args.tasks)),
        split=args.split,
        methods=methods, heads=tuple(args.head or ()), lora_draft=args.lora_draft,
        num_assistant_tokens=args.num_assistant_tokens, temperatures=args.temperature,
        max_new_tokens=args.max_new_tokens, num_examples=args.num_examples, ar_examples=args.ar_examples,
        timed_examples=min(args.timed_examples, args.num_examples), batch_size=args.batch_size,
        seed=args.seed, dtype=args.dtype, threads=args.threads, output_dir=args.output_dir,
        data_dir=args.data_dir, ids=read_ids(args.ids) if args.ids else None,
        summarize_only=args.summarize_only, warmup=not args.no_warmup,
        measure_costs=not args.no_costs,
        remeasure_costs=args.remeasure_costs, progress=not args.quiet, command=command,
    )  # fmt: skip


def read_ids(path: str) -> tuple[str, ...]:
    """Row ids from a text file: one per line; blank lines and ``#`` comments are skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise BenchError(
            f"cannot read --ids {path!r}: {err.strerror or err}; pass a file with one row id per line."
        ) from None
    return tuple(line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip())


def run(args: argparse.Namespace) -> int:
    """Execute ``hf-diversed bench`` from parsed arguments; return the exit code."""
    from ..evaluation.real_models import RealModelError

    try:
        config = config_from_args(args)
        summary = run_bench(config)
    except (BenchError, RealModelError) as err:
        print(f"hf-diversed bench: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume (finished generations are kept).", file=sys.stderr)
        return 130
    if summary is None:  # another process of a data-parallel run: the main process reports
        return 0
    out = Path(config.output_dir)
    if not args.quiet:
        print((out / MARKDOWN_FILE).read_text(encoding="utf-8"))
    written = ", ".join(str(out / name) for name in (SUMMARY_FILE, MARKDOWN_FILE, PLOT_FILE))
    print(f"{summary['num_records']} records summarized: {written}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``hf-diversed bench [options]`` with ``argv`` the options (``sys.argv[1:]`` by default)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = add_arguments(argparse.ArgumentParser(prog="hf-diversed bench")).parse_args(argv)
    args.command_line = shlex.join(["hf-diversed", "bench", *argv])
    return run(args)
