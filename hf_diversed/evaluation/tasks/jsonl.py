"""A user's own task: a JSON Lines file of prompts and a reward built from the built-in tasks' metrics.

Each line holds ``"prompt"`` (one user turn) or ``"messages"`` (a chat), an optional ``"id"``, and the fields its
reward reads:

=================  ============================================================  ==============  ===========
``--reward``       score of a completion                                        field           metric
=================  ============================================================  ==============  ===========
``number``         1 iff its final number equals the answer's (GSM8K's rule)    ``answer``      exact_match
``regex:PATTERN``  1 iff PATTERN's last match (its group 1 if it has one)       ``answer``      exact_match
                   equals the answer, both stripped
``rouge``          ROUGE-2 F1 ×100 against the reference                        ``reference``   rouge2
``pass@1``         1 iff the fenced code passes every assert in the sandbox     ``tests``       pass@1
``module:fn``      ``fn(prompts, completions, **fields) -> list[float]`` (TRL   every other     ``fn``
                   reward signature; scores in [0, 1])                          field
=================  ============================================================  ==============  ===========

The file is one split, ``test``; a row's id is its ``"id"`` or ``<file stem>/<line number>``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import Message, Task, TaskError, _aligned_columns, completion_text
from .code import mbpp_pass_at_1
from .math import gsm8k_exact_match
from .summarization import rouge2_f1

REWARDS = "number, regex:PATTERN, rouge, pass@1 or module:function"
_FIELD_HINTS = {
    "answer": '"answer": "42" (the reference the reward compares with)',
    "reference": '"reference": "<the reference text>"',
    "tests": '"tests": ["assert f(1) == 2", ...]',
}


@dataclasses.dataclass(frozen=True)
class JsonlTask(Task):
    """A :class:`Task` read from ``path``, scored by ``reward_spec`` (see the module docstring)."""

    path: str = ""
    reward_spec: str = ""

    def source(self, split: str, data_dir: str | os.PathLike[str] | None = None) -> str:
        self._split(split)
        return self.path


def regex_match(pattern: str, prompts: Sequence[Any] | None, completions: Sequence[Any], **columns: Any) -> list[float]:
    """1.0 iff ``pattern``'s last match in the completion (group 1 where it has groups) equals ``answer``."""
    compiled = re.compile(pattern)
    cols = _aligned_columns(prompts, completions, columns, ["answer"])
    scores = []
    for completion, answer in zip(completions, cols["answer"], strict=True):
        matches = list(compiled.finditer(completion_text(completion)))
        found = (matches[-1].group(1) if compiled.groups else matches[-1].group(0)) if matches else None
        scores.append(1.0 if found is not None and found.strip() == str(answer).strip() else 0.0)
    return scores


def rouge_reward(prompts: Sequence[Any] | None, completions: Sequence[Any], **columns: Any) -> list[float]:
    """ROUGE-2 F1 ×100 of each completion against its ``reference``."""
    cols = _aligned_columns(prompts, completions, columns, ["reference"])
    return [rouge2_f1(str(ref), completion_text(c)) for c, ref in zip(completions, cols["reference"], strict=True)]


def tests_pass_at_1(prompts: Sequence[Any] | None, completions: Sequence[Any], **columns: Any) -> list[float]:
    """1.0 iff the completion's code passes every assert of ``tests`` (MBPP's sandboxed pass@1)."""
    cols = _aligned_columns(prompts, completions, columns, ["tests"])
    return mbpp_pass_at_1(prompts, completions, test_list=cols["tests"])


def _import_callable(spec: str) -> Callable[..., list[float]]:
    """``package.module:function``, the working directory importable (a ``rewards.py`` beside the data)."""
    module_name, _, name = spec.partition(":")
    added = os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise TaskError(
            f"--reward {spec}: cannot import module {module_name!r} ({err}); put {module_name}.py in the working "
            "directory or on PYTHONPATH."
        ) from None
    finally:
        if added:
            sys.path.remove(os.getcwd())
    fn = getattr(module, name, None)
    if not callable(fn):
        raise TaskError(
            f"--reward {spec}: {module_name} has no function {name!r}; define "
            f"{name}(prompts, completions, **fields) -> list[float] there."
        )
    return fn


def _reward(spec: str) -> tuple[Callable[..., list[float]], tuple[str, ...] | None, str]:
    """(reward function, the fields it reads or None for every field, metric name) of a ``--reward`` spec."""
    if spec == "number":
        return gsm8k_exact_match, ("answer",), "exact_match"
    if spec.startswith("regex:"):
        pattern = spec[len("regex:") :]
        try:
            re.compile(pattern)
        except re.error as err:
            raise TaskError(f"--reward {spec}: not a regular expression ({err}).") from None
        return functools.partial(regex_match, pattern), ("answer",), "exact_match"
    if spec == "rouge":
        return rouge_reward, ("reference",), "rouge2"
    if spec == "pass@1":
        return tests_pass_at_1, ("tests",), "pass@1"
    if re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", spec):
        fn = _import_callable(spec)
        return fn, None, getattr(fn, "__name__", spec.rsplit(":", 1)[1])
    raise TaskError(f"unknown --reward {spec!r}; use {REWARDS}.")


def _messages(record: Mapping[str, Any], where: str) -> list[Message]:
    if "messages" in record:
        messages = record["messages"]
        ok = isinstance(messages, list) and messages and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )  # fmt: skip
        if not ok:
            raise TaskError(
                f'{where}: "messages" must be a list of {{"role": ..., "content": "..."}} turns; fix that line.'
            )
        return [{"role": m["role"], "content": m["content"]} for m in messages]
    if isinstance(record.get("prompt"), str):
        return [{"role": "user", "content": record["prompt"]}]
    raise TaskError(f'{where} has no "prompt" (a string) or "messages" (a chat); add one to every line.')


def _read(path: Path, fields: tuple[str, ...] | None, reward: str) -> list[dict]:
    """The file's rows, each checked: a prompt and the reward's fields (the error names the line and the fix)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise TaskError(f"cannot read --task {str(path)!r}: {err.strerror or err}.") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise TaskError(f"{where} is not JSON ({err.msg}); write one JSON object per line.") from None
        if not isinstance(record, dict):
            raise TaskError(f"{where} is not a JSON object; write one object per line.")
        row = {"id": str(record.get("id", f"{path.stem}/{number}")), "messages": _messages(record, where)}
        for field in fields if fields is not None else [k for k in record if k not in ("id", "prompt", "messages")]:
            if field not in record:
                hint = _FIELD_HINTS.get(field, f'"{field}": ...')
                raise TaskError(
                    f'{where} has no "{field}" field, which --reward {reward} reads; add {hint} to every line '
                    "(or choose another --reward)."
                )
            value = record[field]
            if field == "tests":
                value = [value] if isinstance(value, str) else [str(t) for t in value]
            elif field in ("answer", "reference"):
                value = str(value)
            row[field] = value
        rows.append(row)
    if not rows:
        raise TaskError(f"{path} holds no rows; write one JSON object per line.")
    return rows


def jsonl_task(path: str | os.PathLike[str], reward: str) -> JsonlTask:
    """The :class:`JsonlTask` of ``path`` scored by ``reward``; every line is checked now (:class:`TaskError`)."""
    import datasets

    file = Path(path)
    reward_fn, fields, metric = _reward(reward.strip())
    rows = _read(file, fields, reward)
    data = datasets.Dataset.from_list(rows)
    columns = fields if fields is not None else tuple(c for c in data.column_names if c not in ("id", "messages"))
    return JsonlTask(
        name=file.stem,
        splits=("test",),
        metric_name=metric,
        reward_columns=columns,
        reward_fn=reward_fn,
        loader=lambda split, data_dir: data,
        message_builder=lambda row, max_words: list(row["messages"]),
        description=f"{file.name}, scored by --reward {reward}",
        path=str(file),
        reward_spec=reward,
    )
