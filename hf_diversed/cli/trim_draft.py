"""``hf-diversed trim-draft``: save a draft that proposes only from the K token ids most frequent in a task's texts.

:mod:`hf_diversed.evaluation.trim_draft` gathers the texts; ``trim_draft_vocabulary`` (``modeling.draft_vocabulary``)
trims the draft's LM head."""

from __future__ import annotations

import argparse
import os

from ..evaluation.trim_draft import default_split, read_corpus_file, task_corpus


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from ..evaluation.real_models import DRAFT_NAME
    from ..evaluation.weights import WEIGHTS, WEIGHTS_HELP

    parser.add_argument("--draft", default=DRAFT_NAME, help="draft model: Hub id, path or a GGUF copy's name")
    parser.add_argument("--weights", default=None, choices=WEIGHTS, help=WEIGHTS_HELP)
    parser.add_argument("--task", default="gsm8k", help="task whose rows are the corpus the ids are counted on")
    parser.add_argument("--split", default=None, help="split of --task (default: train; cnndm: test[100:])")
    parser.add_argument("--corpus-file", action="append", default=[],
                        help="more texts to count (repeatable): a .jsonl of {completion|text} lines, e.g. bench "
                             "records of the target's own outputs on train prompts, or any text file")  # fmt: skip
    parser.add_argument("--size", type=int, required=True, help="K: how many token ids to keep (e.g. 32768)")
    parser.add_argument("--output", required=True, help="directory to save the trimmed draft and its tokenizer")
    return parser


def run(args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..evaluation.weights import resolve_model
    from ..modeling.draft_vocabulary import trim_draft_vocabulary

    path = resolve_model(args.draft, args.weights)
    split = args.split or default_split(args.task)
    tokenizer = AutoTokenizer.from_pretrained(path)
    draft = AutoModelForCausalLM.from_pretrained(path)
    corpus = task_corpus(args.task, split)
    source = f"{args.task} {split} ({len(corpus)} texts)"
    for path in args.corpus_file:
        extra = read_corpus_file(path)
        corpus += extra
        source += f" + {os.path.basename(path)} ({len(extra)} texts)"
    trim_draft_vocabulary(draft, size=args.size, corpus=corpus, tokenizer=tokenizer, source=source)
    draft.save_pretrained(args.output)
    tokenizer.save_pretrained(args.output)
    record = draft.config.diversed_draft_vocabulary
    print(f"saved {args.output}: keeps {record['size']} of {record['vocab_size']} ids, counted on {record['source']}")
    return 0
