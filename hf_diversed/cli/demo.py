"""``hf-diversed demo``: generate on the real pair and compare decoding methods side by side.

The options; :func:`hf_diversed.evaluation.demo.run` runs the demo."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``demo`` subcommand's options to ``parser``."""
    from ..evaluation.real_models import DRAFT_NAME, SPECS, TARGET_NAME
    from ..evaluation.weights import WEIGHTS, WEIGHTS_HELP

    parser.add_argument("--target", default=SPECS[TARGET_NAME].hub_id, help="target model: Hub id or local path")
    parser.add_argument("--draft", default=SPECS[DRAFT_NAME].hub_id, help="draft model sharing the target's tokenizer")
    parser.add_argument("--weights", default=None, choices=WEIGHTS, help=WEIGHTS_HELP)
    parser.add_argument(
        "--head",
        default=None,
        help="DIVERSED head (Hub id or path); default: the bundled pretrained head of --task, else a fresh w=0.5 head",
    )
    parser.add_argument("--task", default="gsm8k", help="task whose test prompt is used (gsm8k and mbpp ship with it)")
    parser.add_argument("--example", type=int, default=0, help="which test row of --task (default: the first)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    parser.add_argument("--num-assistant-tokens", type=int, default=5, help="draft length N")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                        help="auto: bfloat16 where the CPU has AVX512-BF16/AMX (or on CUDA), else float32")  # fmt: skip
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--seed", type=int, default=0)
    return parser
