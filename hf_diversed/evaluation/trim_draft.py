"""The texts a trimmed draft vocabulary is counted on (``hf-diversed trim-draft``, :mod:`hf_diversed.cli.trim_draft`):
a draft that proposes only from the K token ids most frequent in a task.

The corpus is every text field of the task's rows (question and worked answer, problem and reference code,
article and highlights), by default the train split, plus any ``--corpus-file`` (e.g. the target's own outputs
on train prompts, whose style, such as LaTeX or code in math answers, the references may lack). The saved
directory is an ordinary checkpoint (weights unchanged, the kept ids in ``config.json``) plus the tokenizer, so
``hf-diversed bench --draft DIR`` and ``generate(assistant_model=AutoModelForCausalLM.from_pretrained(DIR))``
take it as any draft.
"""

from __future__ import annotations

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
