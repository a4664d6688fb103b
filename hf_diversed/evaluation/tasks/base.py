"""What every task shares: the :class:`Task` record and the helpers of prompts and rewards (data: ``sources``)."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .sources import HubDataset

if TYPE_CHECKING:
    import datasets

DEFAULT_MAX_ARTICLE_WORDS = 400

Message = dict[str, str]


class TaskError(ValueError):
    """An unknown task or split; the message lists the valid ones."""


# --------------------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------------------


def truncate_words(text: str, max_words: int | None) -> str:
    """Keep the first ``max_words`` words (original spacing kept); append `` ...`` if text was cut."""
    if max_words is None or max_words <= 0:
        return text
    for i, match in enumerate(re.finditer(r"\S+", text)):
        if i == max_words - 1:
            if not text[match.end() :].strip():
                return text
            return text[: match.end()] + " ..."
    return text


def _user(content: str) -> list[Message]:
    # A single user turn: some chat templates (e.g. Gemma) reject a system role.
    return [{"role": "user", "content": content}]


# --------------------------------------------------------------------------------------------------------
# Reward helpers
# --------------------------------------------------------------------------------------------------------


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, a message dict, or a list of messages (last assistant turn)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        content = completion.get("content") or ""
        if isinstance(content, str):
            return content
        if isinstance(content, Sequence):  # multimodal parts: [{"type": "text", "text": ...}]
            return "".join(p.get("text", "") if isinstance(p, Mapping) else str(p) for p in content)
        return str(content)
    if isinstance(completion, Sequence):
        messages = list(completion)
        if not messages:
            return ""
        assistant = [m for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant"]
        return completion_text(assistant[-1] if assistant else messages[-1])
    raise TypeError(f"cannot read a completion of type {type(completion).__name__}")


def _aligned_columns(
    prompts: Sequence[Any] | None,
    completions: Sequence[Any],
    columns: Mapping[str, Any],
    required: Sequence[str],
) -> dict[str, list[Any]]:
    """Check that ``completions``, ``prompts`` and the ``required`` columns have one entry per completion."""
    if isinstance(completions, str) or not isinstance(completions, Sequence):
        raise TypeError(f"completions must be a list, got {type(completions).__name__}")
    n = len(completions)
    if prompts is not None and len(prompts) != n:
        raise ValueError(f"prompts has {len(prompts)} entries but completions has {n}")
    out: dict[str, list[Any]] = {}
    for name in required:
        if name not in columns:
            raise ValueError(
                f"missing column {name!r} (got {sorted(k for k in columns if not k.startswith('log_'))}); "
                f"pass it as {name}=[...], one entry per completion"
            )
        values = columns[name]
        if isinstance(values, str) or not isinstance(values, Sequence):
            raise ValueError(f"column {name!r} must be a list with one entry per completion")
        if len(values) != n:
            raise ValueError(f"column {name!r} has {len(values)} entries but completions has {n}")
        out[name] = list(values)
    return out


# --------------------------------------------------------------------------------------------------------
# Task and registry
# --------------------------------------------------------------------------------------------------------


_SPLIT = re.compile(r"^(?P<name>[A-Za-z_][\w-]*)(?:\[(?P<start>-?\d*):(?P<stop>-?\d*)\])?$")


def parse_split(split: str) -> tuple[str, slice]:
    """``"test[100:]"`` -> ``("test", slice(100, None))``; a bare name selects every row."""
    match = _SPLIT.match(split.strip())
    if match is None:
        raise ValueError(
            f"cannot parse split {split!r}: write a split name, optionally with a row slice, "
            "e.g. 'test', 'test[100:]', 'train[:512]' or 'test[50:150]'."
        )
    start, stop = match["start"], match["stop"]
    return match["name"], slice(int(start) if start else None, int(stop) if stop else None)


@dataclasses.dataclass(frozen=True)
class Task:
    """One evaluation/training task.

    Attributes:
        name: registry name (also the local data folder's subfolder).
        splits: split names.
        metric_name: ``"exact_match"``, ``"pass@1"`` or ``"rouge2"``.
        reward_columns: dataset columns the reward reads.
        reward_fn: module-level TRL reward function (picklable, descriptive ``__name__``).
        loader: ``(split, data_dir) -> datasets.Dataset`` of the whole split, with :attr:`id_column`.
        message_builder: ``(row, max_words) -> chat messages``.
        hub: the canonical dataset on the Hugging Face Hub (``None``: the data ships in a package).
        id_column: the column naming each row (``id`` or ``task_id``).
        max_article_words: article truncation used by :meth:`build_messages` (CNN/DM, XSum); change it with
            ``dataclasses.replace(task, max_article_words=...)`` or per call.
        description: one line about the task and its prompt.
    """

    name: str
    splits: tuple[str, ...]
    metric_name: str
    reward_columns: tuple[str, ...]
    reward_fn: Callable[..., list[float]]
    loader: Callable[[str, str | os.PathLike[str] | None], datasets.Dataset]
    message_builder: Callable[[Mapping[str, Any], int | None], list[Message]]
    hub: HubDataset | None = None
    id_column: str = "id"
    max_article_words: int = DEFAULT_MAX_ARTICLE_WORDS
    description: str = ""

    def load(
        self, split: str, data_dir: str | os.PathLike[str] | None = None, ids: Iterable[Any] | None = None
    ) -> datasets.Dataset:
        """Load ``split`` as a :class:`datasets.Dataset`: from the local data folder if it has the split, else from
        the Hub (:mod:`.sources` gives the precedence).

        Args:
            split: one of :attr:`splits`, optionally sliced by row like ``datasets`` split strings:
                ``"test[100:]"``, ``"train[:512]"``, ``"test[50:150]"``. Row ids keep the unsliced index.
            data_dir: folder holding ``<task>/<split>.jsonl``; default: ``$HF_DIVERSED_DATA_DIR`` or
                ``../shared/data`` where present, else the Hub.
            ids: keep only these rows, in this order (values of :attr:`id_column`, compared as strings), before
                the slice: how a published table's rows are selected from either source.

        Raises:
            TaskError: an unknown split. DataNotFoundError: the rows are nowhere to be had (the message says how).
        """
        name, rows = self._split(split)
        data = self.loader(name, data_dir)
        if ids is not None:
            data = select_ids(data, self.id_column, ids, f"{self.name}/{name}")
        return data.select(range(len(data))[rows])

    def source(self, split: str, data_dir: str | os.PathLike[str] | None = None) -> str:
        """Where :meth:`load` reads ``split`` from: a local file's path, ``hub:<repo>``, or the package."""
        from .sources import source_of

        name, _ = self._split(split)
        return source_of(self.name, self.hub, name, data_dir) if self.hub is not None else "package"

    def _split(self, split: str) -> tuple[str, slice]:
        try:
            name, rows = parse_split(split)
        except ValueError as err:
            raise TaskError(str(err)) from None
        if name not in self.splits:
            raise TaskError(f"task {self.name!r} has no split {name!r}; valid splits: {', '.join(self.splits)}")
        return name, rows

    def build_messages(self, row: Mapping[str, Any], max_words: int | None = None) -> list[Message]:
        """Chat messages (one user turn) asking an instruct model to solve ``row``.

        Prompts (``{...}`` are row fields; articles are cut to ``max_words`` words, default
        :attr:`max_article_words` = 400):

        * gsm8k: "Solve the following math word problem. Reason step by step, then give the final answer
          as a plain number on the last line, in the form '#### <number>'.\n\nQuestion: {question}"
        * mbpp: "You are an expert Python programmer, and here is your task: {text}\nYour code should
          pass this test:\n\n{test_list[0]}\n\nReply with the complete Python function (and any imports
          it needs) in a single ```python code block."
        * humaneval: "Complete the following Python function. Reply with the complete function, including
          its signature and any imports it needs, in a single ```python code block." + the stub
          (``code_prompt``) in a ```python fence.
        * cnndm: "Summarize the following news article in 3 to 4 short sentences that state its key
          facts. Reply with the summary only.\n\nArticle:\n{article}"
        * xsum: "Summarize the following article in one sentence. Reply with that sentence
          only.\n\nArticle:\n{document}"
        """
        return self.message_builder(row, self.max_article_words if max_words is None else max_words)

    def reward(self, prompts: Sequence[Any] | None, completions: Sequence[Any], **columns: Any) -> list[float]:
        """Score ``completions`` with :attr:`reward_fn` (TRL signature); ValueError if columns misalign."""
        return self.reward_fn(prompts, completions, **columns)


def select_ids(data: datasets.Dataset, column: str, ids: Iterable[Any], what: str) -> datasets.Dataset:
    """The rows of ``data`` whose ``column`` is in ``ids``, in the order of ``ids``; every id must be there."""
    position = {str(value): i for i, value in enumerate(data[column])}
    wanted = [str(i) for i in ids]
    missing = [i for i in wanted if i not in position]
    if missing:
        raise TaskError(
            f"{len(missing)} of the {len(wanted)} requested ids are not in {what} (e.g. {', '.join(missing[:3])}); "
            "check the id list against the split, or load the split from the source the ids came from."
        )
    return data.select([position[i] for i in wanted])
