"""``hf-diversed heads``: list the bundled pretrained heads, seed them into the local Hugging Face cache, export or
push their complete repositories (:mod:`hf_diversed.modeling.pretrained`)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from ..modeling.pretrained import HEADS_DIR, available_heads, seed_pretrained_heads


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of ``hf-diversed heads``."""
    parser.description = "List the bundled pretrained heads and seed them into the local Hugging Face cache."
    parser.add_argument("--cache-dir", default=None, help="hub cache to seed (default: that of $HF_HOME)")
    parser.add_argument("--no-seed", action="store_true", help="only list the heads")
    parser.add_argument("--export", metavar="DIR", help="also write each complete repository to DIR/<name>")
    parser.add_argument("--push", action="store_true", help="also upload each repository to its Hub id (needs a token)")
    return parser


def run(args: argparse.Namespace) -> int:
    """``hf-diversed heads``: seed (unless --no-seed) and print repo id, task and location of each head."""
    heads = available_heads()
    if not heads:
        print(f"no bundled heads found under {HEADS_DIR}", flush=True)
        return 1
    seeded = {} if args.no_seed else seed_pretrained_heads(args.cache_dir)
    for head in heads:
        print(f"{head.repo_id}\t{head.task}\t{seeded.get(head.repo_id, head.folder)}")
        if args.export:
            print(f"  exported to {head.write_repo(Path(args.export) / head.folder.name)}")
        if args.push:
            from ..modeling.hub import push_head_folder

            with tempfile.TemporaryDirectory() as tmp:
                print(f"  pushed: {push_head_folder(head.write_repo(tmp), head.repo_id)}")
    return 0
