"""What a benchmark run is: its options (:class:`BenchConfig`), its methods, its files and its errors."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...generation.verification import parse_token_class_spec

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"
MARKDOWN_FILE = "results.md"
COSTS_FILE = "costs.json"
RUNS_FILE = "runs.jsonl"
PLOT_FILE = "quality_speed.png"
PLOT_ACCEPTANCE_FILE = "quality_acceptance.png"
LORA_METHOD = "exact+lora-draft"
DEFAULT_TASKS = ("gsm8k", "humaneval", "mbpp", "cnndm", "xsum")
SCHEMA_VERSION = 1

METHOD_FORMS = (
    "ar, exact, static:W, lossy:L, cascade-chow:A, cascade-diff:A, cascade-opt:A, token-class:digits:W, "
    "diversed (needs --head), "
    f"native-exact, native-static:W, {LORA_METHOD} (needs --lora-draft)"
)


class BenchError(ValueError):
    """A user-fixable benchmark problem; the message says what to change."""


# ------------------------------------------------------------------------------------------------ methods


_NUMBERED = re.compile(r"^(?P<name>static|lossy|native-static|cascade-(?:chow|diff|opt)):(?P<value>.+)$")


def _normalize_spec(spec: str) -> str:
    """Canonical spelling of a method spec: lower case, numbers as ``%g`` (``static:0.50`` -> ``static:0.5``)."""
    spec = spec.strip().lower()
    try:
        token_class = parse_token_class_spec(spec)
    except ValueError as err:
        raise BenchError(f"{err} Valid methods: {METHOD_FORMS}.") from None
    if token_class is not None:
        return f"token-class:{token_class[0]}:{token_class[1]:g}"
    match = _NUMBERED.match(spec)
    if match:
        try:
            value = float(match["value"])
        except ValueError:
            raise BenchError(
                f"method {spec!r} has a non-numeric parameter {match['value']!r}; write e.g. "
                f"{match['name']}:0.5. Valid methods: {METHOD_FORMS}."
            ) from None
        return f"{match['name']}:{value:g}"
    return spec


@dataclass(frozen=True)
class BenchMethod:
    """One benchmarked method: its label (the JSONL ``method`` field) and the :class:`Method` it runs.

    ``lora`` is True for ``exact+lora-draft`` (exact SD with the LoRA-adapted draft).
    """

    label: str

    @property
    def lora(self) -> bool:
        return self.label == LORA_METHOD

    @property
    def method(self):
        from ..methods import Method

        return Method("exact" if self.lora else self.label)

    @property
    def uses_draft(self) -> bool:
        return self.label != "ar"

    @property
    def has_stats(self) -> bool:
        """Whether hf_diversed's loop runs it (and so reports drafted/accepted counts)."""
        return self.uses_draft and not self.label.startswith("native-")

    @classmethod
    def parse(cls, spec: str) -> BenchMethod:
        from ..methods import Method

        label = _normalize_spec(spec)
        if not label:
            raise BenchError(f"empty method in the method list; valid methods: {METHOD_FORMS}.")
        if label != LORA_METHOD:
            try:
                Method(label)
            except ValueError as err:
                raise BenchError(
                    f"unknown method {spec!r} ({err}). Valid methods: {METHOD_FORMS}; e.g. "
                    f"--methods ar,exact,static:0.5."
                ) from None
        return cls(label)


def _split_list(text: str | Sequence[str] | None) -> list[str]:
    if text is None:
        return []
    items = text.split(",") if isinstance(text, str) else [x for t in text for x in str(t).split(",")]
    return [x.strip() for x in items if x.strip()]


def _floats(text: str, option: str) -> list[float]:
    out = []
    for item in _split_list(text):
        try:
            out.append(float(item))
        except ValueError:
            raise BenchError(f"{option} expects comma-separated numbers such as 0.1,0.5,0.9; got {item!r}.") from None
    return out


def expand_methods(
    methods: str | Sequence[str] | None = None,
    *,
    static_sweep: str | None = None,
    lossy_sweep: str | None = None,
    cascade_sweep: str | None = None,
    heads: str | Sequence[str] | None = None,
    lora_draft: str | None = None,
) -> tuple[str, ...]:
    """The method labels to run: ``methods`` plus the sweeps, ``ar`` first, duplicates dropped.

    ``methods=None`` means ``ar,exact`` (+ ``diversed`` with heads); a LoRA draft always adds
    ``exact+lora-draft``.
    ``cascade_sweep`` items are ``VARIANT:A`` (``opt:0.1``) or full specs (``cascade-opt:0.1``).
    """
    labels = _split_list(methods)
    if methods is None:
        labels = ["ar", "exact"] + (["diversed"] if heads else [])
    labels += [LORA_METHOD] if lora_draft else []
    labels += [f"static:{w:g}" for w in _floats(static_sweep, "--static-sweep")] if static_sweep else []
    labels += [f"lossy:{x:g}" for x in _floats(lossy_sweep, "--lossy-sweep")] if lossy_sweep else []
    for item in _split_list(cascade_sweep):
        variant, _, value = item.rpartition(":")
        variant = variant.removeprefix("cascade-")
        if variant not in ("chow", "diff", "opt") or not value:
            raise BenchError(
                f"--cascade-sweep item {item!r} is not VARIANT:A; write e.g. --cascade-sweep opt:0.1,chow:0.3 "
                "(variants: chow, diff, opt)."
            )
        labels.append(f"cascade-{variant}:{value}")
    out: list[str] = ["ar"]
    for label in labels:
        label = BenchMethod.parse(label).label
        if label not in out:
            out.append(label)
    return tuple(out)


# ------------------------------------------------------------------------------------------------ config


def _canonical_model(name: str) -> str:
    """A stable model name for the records: the name as given (a Hub id stays a Hub id: which weights ran is in each
    record's ``weights``); the spec name for a GGUF copy named any case; for a directory, its path relative to
    the working directory when it lies inside it (records committed with a repository stay valid in any clone run
    from its root), else its absolute path."""
    from ..real_models import RealModelError, get_spec

    if os.path.exists(name):
        path, cwd = Path(name).resolve(), Path.cwd().resolve()
        return path.relative_to(cwd).as_posix() if path.is_relative_to(cwd) else str(path)
    try:
        spec = get_spec(name)
    except RealModelError:
        return name
    return spec.name if name.strip().lower() == spec.name else name


@dataclass
class BenchConfig:
    """Everything one benchmark run needs; validated on construction (:class:`BenchError` names the fix).

    Attributes mirror the command-line options (``--num-examples`` -> ``num_examples``, ...). ``methods``
    holds method labels (see :func:`expand_methods`); ``heads`` (``--head``, repeatable) each run method
    ``diversed``, side by side in one sampler batch; ``temperatures`` and ``num_assistant_tokens`` are
    tuples (each value is a separate setting). The first ``timed_examples`` examples (``ar_examples`` for the
    target alone, default the same) are also timed with the real loop; ``dtype="auto"`` resolves to bf16 where
    the CPU has fast bf16, else float32. ``first_example``: generate only rows ``first_example..num_examples-1``
    (each keeps its index and seed in the whole split, so a held-out range's records are those of a full run).
    """

    target: str = "qwen2.5-coder-1.5b-instruct"
    draft: str = "qwen2.5-coder-0.5b-instruct"
    weights: str | None = None
    tasks: tuple[str, ...] = DEFAULT_TASKS
    split: str = "test"
    methods: tuple[str, ...] = ("ar", "exact")
    heads: tuple[str, ...] = ()
    lora_draft: str | None = None
    num_assistant_tokens: tuple[int, ...] = (5,)
    temperatures: tuple[float, ...] = (1.0,)
    max_new_tokens: int = 128
    num_examples: int = 20
    first_example: int = 0
    ar_examples: int | None = None
    timed_examples: int = 10
    batch_size: int = 32
    seed: int = 0
    dtype: str = "auto"
    threads: int | None = None
    output_dir: str = "bench_out"
    data_dir: str | None = None
    ids: tuple[str, ...] | None = None
    summarize_only: bool = False
    warmup: bool = True
    measure_costs: bool = True
    remeasure_costs: bool = False
    progress: bool = True
    command: str | None = None

    def __post_init__(self) -> None:
        from ..tasks import TASKS, get_task, parse_split

        self.tasks = tuple(_split_list(self.tasks) if isinstance(self.tasks, str) else self.tasks)
        if not self.tasks:
            raise BenchError(f"no tasks given; pass --tasks with some of: {', '.join(TASKS)}.")
        names = []
        for name in self.tasks:
            try:
                task = get_task(name)
            except ValueError:
                raise BenchError(
                    f"unknown task {name!r}; pass --tasks with a comma list of: {', '.join(TASKS)}."
                ) from None
            try:
                split_name = parse_split(self.split)[0]
            except ValueError as err:
                raise BenchError(f"{err} (--split)") from None
            if split_name not in task.splits:
                raise BenchError(
                    f"task {task.name!r} has no split {split_name!r}; pass --split with one of "
                    f"{', '.join(task.splits)}, optionally sliced like test[100:] (or drop {task.name} from --tasks)."
                )
            if task.name not in names:
                names.append(task.name)
        self.tasks = tuple(names)

        methods = _split_list(self.methods) if isinstance(self.methods, str) else list(self.methods)
        self.methods = expand_methods(methods)
        heads = (self.heads,) if isinstance(self.heads, str) else tuple(self.heads or ())
        if any(not isinstance(h, str) or not h for h in heads):
            raise BenchError(f"--head expects Hub ids or directories; got {heads!r}.")
        self.heads = heads
        if "diversed" in self.methods and not self.heads:
            raise BenchError(
                "method 'diversed' needs a trained ensemble head: pass --head ORG/NAME or a directory saved "
                "with DiversedHead.save_pretrained (or drop 'diversed' from --methods)."
            )
        if self.heads and "diversed" not in self.methods:
            raise BenchError(
                f"--head {' '.join(self.heads)} is given but method 'diversed' is not in --methods; add diversed "
                "to --methods (or drop --head)."
            )
        ids = [_canonical_model(h) for h in self.heads]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise BenchError(f"--head {', '.join(twice)} is given twice; pass each head once.")
        if LORA_METHOD in self.methods and not self.lora_draft:
            raise BenchError(
                f"method {LORA_METHOD!r} needs --lora-draft PATH (a PEFT adapter directory for the draft)."
            )
        if self.lora_draft and not self.summarize_only and not Path(self.lora_draft).exists():
            raise BenchError(
                f"--lora-draft {self.lora_draft!r} does not exist; pass the directory written by "
                "PeftModel.save_pretrained (adapter_config.json + adapter_model.safetensors)."
            )

        ns = (self.num_assistant_tokens,) if isinstance(self.num_assistant_tokens, int) else self.num_assistant_tokens
        try:
            ns = tuple(int(n) for n in (_split_list(ns) if isinstance(ns, str) else ns))
        except (TypeError, ValueError):
            raise BenchError(f"--num-assistant-tokens expects integers >= 1 such as 5 or 3,5,7; got {ns!r}.") from None
        if not ns or any(n < 1 for n in ns):
            raise BenchError(f"--num-assistant-tokens must be >= 1 (e.g. 3, 5 or 7); got {ns!r}.")
        self.num_assistant_tokens = tuple(dict.fromkeys(ns))

        temps = (self.temperatures,) if isinstance(self.temperatures, (int, float)) else self.temperatures
        temps = _floats(temps, "--temperature") if isinstance(temps, str) else [float(t) for t in temps]
        if not temps or any(not math.isfinite(t) or t < 0 for t in temps):
            raise BenchError(f"--temperature must be >= 0 (0 = greedy, 1 = plain sampling); got {temps!r}.")
        self.temperatures = tuple(dict.fromkeys(temps))

        for name in ("max_new_tokens", "num_examples"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                option = "--" + name.replace("_", "-")
                raise BenchError(f"{option} must be a positive integer; got {value!r}.")
        if not isinstance(self.timed_examples, int) or not 0 <= self.timed_examples <= self.num_examples:
            raise BenchError(
                f"--timed-examples must be between 0 and --num-examples ({self.num_examples}); "
                f"got {self.timed_examples!r}."
            )
        if not isinstance(self.first_example, int) or not 0 <= self.first_example < self.num_examples:
            raise BenchError(
                f"the first row must lie before --num-examples ({self.num_examples}); got {self.first_example!r}."
            )
        if self.ar_examples is None:
            self.ar_examples = self.timed_examples
        if not isinstance(self.ar_examples, int) or not 0 <= self.ar_examples <= self.num_examples:
            raise BenchError(
                f"--ar-examples must be between 0 and --num-examples ({self.num_examples}); got {self.ar_examples!r}."
            )
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise BenchError(f"--batch-size must be a positive integer (rows the sampler decodes together); "
                             f"got {self.batch_size!r}.")  # fmt: skip
        from ...modeling.dtypes import DTYPE_CHOICES, resolve_dtype

        if self.dtype not in DTYPE_CHOICES:
            raise BenchError(f"--dtype must be one of {', '.join(DTYPE_CHOICES)}; got {self.dtype!r}.")
        self.dtype = resolve_dtype(self.dtype)
        if self.threads is not None and self.threads < 1:
            raise BenchError(f"--threads must be >= 1 (or left out for all cores); got {self.threads!r}.")
        if self.remeasure_costs and not self.measure_costs:
            raise BenchError("--remeasure-costs and --no-costs contradict each other; drop one of them.")
        if self.remeasure_costs and self.summarize_only:
            raise BenchError(
                "--remeasure-costs loads the models to time them, --summarize-only loads none; drop one of them."
            )
        if self.ids is not None:
            self.ids = tuple(str(i) for i in self.ids)
            if len(self.tasks) != 1:
                raise BenchError("--ids selects rows of one task; pass a single task to --tasks.")
            if not self.ids:
                raise BenchError("--ids selects no rows; give a file with one row id per line.")
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise BenchError(
                f"--data-dir {self.data_dir!r} is not a directory; point it at the folder holding "
                "<task>/<split>.jsonl (see shared/data/MANIFEST.md)."
            )

    # identity of the models / settings in the records
    @property
    def target_id(self) -> str:
        return _canonical_model(self.target)

    @property
    def draft_id(self) -> str:
        return _canonical_model(self.draft)

    @property
    def head_ids(self) -> tuple[str, ...]:
        """The heads' names in the records (``--head`` order); each runs as its own ``diversed`` method."""
        return tuple(_canonical_model(h) for h in self.heads)

    @property
    def lora_id(self) -> str | None:
        return _canonical_model(self.lora_draft) if self.lora_draft else None

    @property
    def output_path(self) -> Path:
        return Path(self.output_dir)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def command_line(self) -> str:
        """``command``, or for programmatic runs the ``run_bench(BenchConfig(...))`` call (non-default fields)."""
        if self.command:
            return self.command
        changed = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.name != "command" and getattr(self, f.name) != f.default
        ]
        return f"run_bench(BenchConfig({', '.join(changed)}))"
