"""What every task shares: where the data is, the :class:`Task` record, and the helpers of prompts and rewards."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datasets

DATA_DIR_ENV = "HF_DIVERSED_DATA_DIR"
DEFAULT_MAX_ARTICLE_WORDS = 400

Message = dict[str, str]


# --------------------------------------------------------------------------------------------------------
# Data location and loading
# --------------------------------------------------------------------------------------------------------


def default_data_dir() -> Path:
    """The data folder: ``$HF_DIVERSED_DATA_DIR``, else ``<repo>/../shared/data``, else ``./shared/data``.

    ``<repo>`` is the parent of the ``hf_diversed`` package directory.

    Raises:
        FileNotFoundError: if the variable points nowhere or no candidate exists.
    """
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"{DATA_DIR_ENV}={env!r} is not a directory; point it at the data folder")
        return path
    repo_root = Path(__file__).resolve().parents[3]
    candidates = [repo_root.parent / "shared" / "data", Path.cwd() / "shared" / "data"]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"No data directory found (tried {tried}). Set the environment variable {DATA_DIR_ENV} to the folder "
        "holding gsm8k/, mbpp/, cnndm/ and xsum/ (see shared/data/MANIFEST.md), or pass data_dir=..."
    )


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    return rows


def _split_file(task_dir: str, split: str, data_dir: str | os.PathLike[str] | None) -> Path:
    base = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    path = base / task_dir / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist. Pass data_dir= (or set {DATA_DIR_ENV}) to a folder containing "
            f"{task_dir}/{split}.jsonl; the expected layout is described in shared/data/MANIFEST.md."
        )
    return path


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
        name: registry name.
        splits: available split names.
        metric_name: ``"exact_match"``, ``"pass@1"`` or ``"rouge2"``.
        reward_columns: dataset columns the reward reads.
        reward_fn: module-level TRL reward function (picklable, descriptive ``__name__``).
        loader: ``(split, data_dir) -> list of row dicts``.
        message_builder: ``(row, max_words) -> chat messages``.
        max_article_words: article truncation used by :meth:`build_messages` (CNN/DM, XSum); change it with
            ``dataclasses.replace(task, max_article_words=...)`` or per call.
        description: one line about the task and its prompt.
    """

    name: str
    splits: tuple[str, ...]
    metric_name: str
    reward_columns: tuple[str, ...]
    reward_fn: Callable[..., list[float]]
    loader: Callable[[str, str | os.PathLike[str] | None], list[dict[str, Any]]]
    message_builder: Callable[[Mapping[str, Any], int | None], list[Message]]
    max_article_words: int = DEFAULT_MAX_ARTICLE_WORDS
    description: str = ""

    def load(self, split: str, data_dir: str | os.PathLike[str] | None = None) -> datasets.Dataset:
        """Load ``split`` as an in-memory :class:`datasets.Dataset` (offline; no Hub access).

        Args:
            split: one of :attr:`splits`, optionally sliced by row like ``datasets`` split strings:
                ``"test[100:]"``, ``"train[:512]"``, ``"test[50:150]"``. Row ids keep the unsliced index.
            data_dir: folder holding ``<task>/<split>.jsonl``; defaults to :func:`default_data_dir`.
        """
        name, rows = parse_split(split)
        if name not in self.splits:
            valid = ", ".join(self.splits)
            raise ValueError(f"task {self.name!r} has no split {name!r}; valid splits: {valid}")
        import datasets

        return datasets.Dataset.from_list(self.loader(name, data_dir)[rows])

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
