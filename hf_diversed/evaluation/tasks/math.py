"""Math word problems: GSM8K, scored by exact match of the final number."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from .base import Message, Task, _aligned_columns, _user, completion_text
from .sources import HubDataset, load_split

if TYPE_CHECKING:
    import datasets

GSM8K_HUB = HubDataset("openai/gsm8k", "main")  # no id column: a row's id is its position, gsm8k/<split>/<i>


def _load_gsm8k(split: str, data_dir: str | os.PathLike[str] | None) -> datasets.Dataset:
    return load_split("gsm8k", GSM8K_HUB, split, data_dir)[0]


def _gsm8k_messages(row: Mapping[str, Any], max_words: int | None) -> list[Message]:
    return _user(
        "Solve the following math word problem. Reason step by step, then give the final answer as a "
        "plain number on the last line, in the form '#### <number>'.\n\n"
        f"Question: {row['question'].strip()}"
    )


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def normalize_number(text: str) -> str | None:
    """Canonical number string: no commas or ``$``, ``18.0``/``18.`` -> ``18``; None if not a number."""
    s = text.strip().replace(",", "").replace("$", "").rstrip(".")
    if not s:
        return None
    try:
        value = Decimal(s)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def extract_gsm8k_answer(text: str) -> str | None:
    """The final numeric answer of a solution, normalised with :func:`normalize_number`.

    Tries, in order: the first number after the last ``####``; the first number after the last
    "answer is" (case-insensitive); the last number in the text. Returns None if there is no number.
    """
    text = text.replace("$", "")
    segments: list[tuple[str, bool]] = []
    if "####" in text:
        segments.append((text.rsplit("####", 1)[1], True))
    answer_is = list(re.finditer(r"answer\s+is", text, flags=re.IGNORECASE))
    if answer_is:
        segments.append((text[answer_is[-1].end() :], True))
    segments.append((text, False))
    for segment, take_first in segments:
        numbers = _NUMBER.findall(segment)
        if numbers:
            return normalize_number(numbers[0] if take_first else numbers[-1])
    return None


def _gsm8k_reference(answer: str) -> str | None:
    """The reference number: the first number after the last ``####`` (the whole text if there is none)."""
    numbers = _NUMBER.findall(answer.rsplit("####", 1)[-1].replace("$", ""))
    return normalize_number(numbers[0]) if numbers else None


def gsm8k_exact_match(prompts: Sequence[Any] | None, completions: Sequence[Any], **columns: Any) -> list[float]:
    """1.0 iff the completion's final number equals the reference (text after ``#### `` in ``answer``)."""
    cols = _aligned_columns(prompts, completions, columns, ["answer"])
    scores = []
    for completion, answer in zip(completions, cols["answer"], strict=True):
        reference = _gsm8k_reference(str(answer))
        predicted = extract_gsm8k_answer(completion_text(completion))
        scores.append(1.0 if reference is not None and predicted == reference else 0.0)
    return scores


GSM8K = Task(
    name="gsm8k",
    splits=("train", "test"),
    metric_name="exact_match",
    reward_columns=("answer",),
    reward_fn=gsm8k_exact_match,
    loader=_load_gsm8k,
    message_builder=_gsm8k_messages,
    hub=GSM8K_HUB,
    description="Grade-school math; exact match of the final number after '####'.",
)
