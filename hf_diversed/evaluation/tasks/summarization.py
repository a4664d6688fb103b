"""News summarization: CNN/DailyMail and XSum, scored by ROUGE-2 F1."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .base import Message, Task, _aligned_columns, _user, completion_text, truncate_words
from .sources import HubDataset, load_split

if TYPE_CHECKING:
    import datasets

XSUM_MAX_SUMMARY_WORDS = 32
CNNDM_HUB = HubDataset("abisee/cnn_dailymail", "3.0.0", id_column="id")  # id: sha1 of the story's URL
XSUM_HUB = HubDataset("EdinburghNLP/xsum", id_column="id")  # id: the BBC article id


def _load_cnndm(split: str, data_dir: str | os.PathLike[str] | None) -> datasets.Dataset:
    return load_split("cnndm", CNNDM_HUB, split, data_dir)[0]


def _load_xsum(split: str, data_dir: str | os.PathLike[str] | None) -> datasets.Dataset:
    return load_split("xsum", XSUM_HUB, split, data_dir)[0]


def _cnndm_messages(row: Mapping[str, Any], max_words: int | None) -> list[Message]:
    return _user(
        "Summarize the following news article in 3 to 4 short sentences that state its key facts. "
        "Reply with the summary only.\n\n"
        f"Article:\n{truncate_words(row['article'].strip(), max_words)}"
    )


def _xsum_messages(row: Mapping[str, Any], max_words: int | None) -> list[Message]:
    return _user(
        "Summarize the following article in one sentence. Reply with that sentence only.\n\n"
        f"Article:\n{truncate_words(row['document'].strip(), max_words)}"
    )


@functools.lru_cache(maxsize=1)
def _rouge2_scorer() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge2"], use_stemmer=True)


def rouge2_f1(reference: str, prediction: str) -> float:
    """ROUGE-2 F1 x 100 (``rouge_score`` 0.1.2, Porter stemmer)."""
    return 100.0 * _rouge2_scorer().score(reference, prediction)["rouge2"].fmeasure


def cnndm_rouge2(prompts: Sequence[Any] | None, completions: Sequence[Any], **columns: Any) -> list[float]:
    """ROUGE-2 F1 x 100 of each completion against its ``highlights``."""
    cols = _aligned_columns(prompts, completions, columns, ["highlights"])
    pairs = zip(completions, cols["highlights"], strict=True)
    return [rouge2_f1(str(ref), completion_text(c)) for c, ref in pairs]


def xsum_rouge2(
    prompts: Sequence[Any] | None,
    completions: Sequence[Any],
    *,
    max_words: int = XSUM_MAX_SUMMARY_WORDS,
    **columns: Any,
) -> list[float]:
    """ROUGE-2 F1 x 100 of the first ``max_words`` (32) words of each completion against ``summary``."""
    cols = _aligned_columns(prompts, completions, columns, ["summary"])
    return [
        rouge2_f1(str(ref), " ".join(completion_text(c).split()[:max_words]))
        for c, ref in zip(completions, cols["summary"], strict=True)
    ]


CNNDM = Task(
    name="cnndm",
    splits=("train", "validation", "test"),
    metric_name="rouge2",
    reward_columns=("highlights",),
    reward_fn=cnndm_rouge2,
    loader=_load_cnndm,
    message_builder=_cnndm_messages,
    hub=CNNDM_HUB,
    description="CNN/DailyMail news summarization in 3-4 sentences; ROUGE-2 F1 against the highlights.",
)


XSUM = Task(
    name="xsum",
    splits=("train", "validation", "test"),
    metric_name="rouge2",
    reward_columns=("summary",),
    reward_fn=xsum_rouge2,
    loader=_load_xsum,
    message_builder=_xsum_messages,
    hub=XSUM_HUB,
    description="BBC one-sentence summarization; ROUGE-2 F1 of the first 32 words against the summary.",
)
