"""``hf-diversed trim-draft``: save a draft that proposes only from the K token ids most frequent in a task.

The corpus is every text field of the task's rows (question and worked answer, problem and reference code,
article and highlights), by default the train split, plus any ``--corpus-file`` (e.g. the target's own outputs
on train prompts, whose style, such as LaTeX or code in math answers, the references may lack). The saved
directory is an ordinary checkpoint (weights unchanged, the kept ids in ``config.json``) plus the tokenizer, so
``hf-diversed bench --draft DIR`` and ``generate(assistant_model=AutoModelForCausalLM.from_pretrained(DIR))``
take it as any draft.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _texts(item)


def task_corpus(task: str, split: str = "train", data_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """The texts of every string (or list-of-strings) field of ``task``'s ``split`` rows."""
    from .tasks import get_task

    rows = get_task(task).load(split, data_dir)
    texts = []
    for row in rows:
        for key, value in row.items():
            if key != "id":
                texts.extend(_texts(value))
    return texts


def read_corpus_file(path: str | os.PathLike[str]) -> list[str]:
    """Texts of a corpus file: for ``.jsonl``, the ``completion`` (as in ``hf-diversed bench`` records) or ``text``
    field of each line; any other file is one text."""
    import json
    from pathlib import Path

    path = Path(path)
    if path.suffix != ".jsonl":
        return [path.read_text(encoding="utf-8")]
    texts = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            text = row.get("completion", row.get("text")) if isinstance(row, dict) else None
            if not isinstance(text, str):
                raise ValueError(
                    f"{path}:{number} has no string `completion` or `text` field; a .jsonl corpus file holds one "
                    "such object per line (e.g. the results.jsonl of `hf-diversed bench --split train`)."
                )
            texts.append(text)
    return texts


def default_split(task: str) -> str:
    """The train split where the task has one; CNN/DM ships only test rows, of which 100+ train the head."""
    from .tasks import get_task

    return "train" if "train" in get_task(task).splits else "test[100:]"


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from .real_models import DRAFT_NAME
    from .weights import WEIGHTS, WEIGHTS_HELP

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

    from ..modeling.draft_vocabulary import trim_draft_vocabulary
    from .weights import resolve_model

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
