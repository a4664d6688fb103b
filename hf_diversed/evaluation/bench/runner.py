"""``hf-diversed bench``: Spec-Bench-style speed / acceptance / quality benchmark of decoding methods.

Two engines. Quality, acceptance (accepted / drafted), accepted tokens per round (counting the bonus token),
mean w and TV come from the batched law-exact sampler (:mod:`hf_diversed.batched`) on every example: the
sequences it draws have exactly the law of the real loop's. Speed comes from the real batch-1 loop on the
first ``--timed-examples`` examples (Spec-Bench: every method timed on the same machine in the same run,
speedup = tokens/s of a method / tokens/s of autoregressive decoding, "ar"). Each record says which engine
produced it (``engine``: ``sampler`` or ``loop``), and the summary which column came from which.

Every generation is one JSON line in ``<output-dir>/results.jsonl`` (written and fsync-ed as soon as it
finishes); a rerun first reads that file and skips what is already there, so a killed run resumes where it
stopped. At the end (or with ``--summarize-only``) the records are pooled into ``summary.json``,
``results.md`` and ``quality_speed.png`` / ``quality_acceptance.png``.

Programmatic use::

    from hf_diversed.bench import BenchConfig, run_bench
    summary = run_bench(BenchConfig(tasks=("gsm8k",), methods=("ar", "exact", "static:0.5"), num_examples=5))
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import re
import shlex
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BenchConfig",
    "BenchError",
    "BenchMethod",
    "RESULTS_FILE",
    "SUMMARY_FILE",
    "add_arguments",
    "analytic_speedup",
    "config_from_args",
    "tau_speedup",
    "wilson_interval",
    "bootstrap_interval",
    "expand_methods",
    "load_records",
    "main",
    "record_key",
    "run",
    "run_bench",
    "summarize",
    "summarize_records",
    "write_markdown",
]

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"
MARKDOWN_FILE = "results.md"
COSTS_FILE = "costs.json"
PLOT_FILE = "quality_speed.png"
PLOT_ACCEPTANCE_FILE = "quality_acceptance.png"
LORA_METHOD = "exact+lora-draft"
DEFAULT_TASKS = ("gsm8k", "humaneval", "mbpp", "cnndm", "xsum")
SCHEMA_VERSION = 1

METHOD_FORMS = (
    "ar, exact, static:W, lossy:L, cascade-chow:A, cascade-diff:A, cascade-opt:A, diversed (needs --head), "
    f"native-exact, native-static:W, {LORA_METHOD} (needs --lora-draft)"
)


class BenchError(ValueError):
    """A user-fixable benchmark problem; the message says what to change."""


# ------------------------------------------------------------------------------------------------ methods


_NUMBERED = re.compile(r"^(?P<name>static|lossy|native-static|cascade-(?:chow|diff|opt)):(?P<value>.+)$")


def _normalize_spec(spec: str) -> str:
    """Canonical spelling of a method spec: lower case, numbers as ``%g`` (``static:0.50`` -> ``static:0.5``)."""
    spec = spec.strip().lower()
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
    head: str | None = None,
    lora_draft: str | None = None,
) -> tuple[str, ...]:
    """The method labels to run: ``methods`` plus the sweeps, ``ar`` first, duplicates dropped.

    ``methods=None`` means ``ar,exact`` (+ ``diversed`` with a head); a LoRA draft always adds
    ``exact+lora-draft``.
    ``cascade_sweep`` items are ``VARIANT:A`` (``opt:0.1``) or full specs (``cascade-opt:0.1``).
    """
    labels = _split_list(methods)
    if methods is None:
        labels = ["ar", "exact"] + (["diversed"] if head else [])
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
    """A stable model name for the records: the spec name for built-in models, an absolute path for dirs."""
    from ..real_models import RealModelError, get_spec

    if os.path.exists(name):
        return str(Path(name).resolve())
    try:
        return get_spec(name).name
    except RealModelError:
        return name


@dataclass
class BenchConfig:
    """Everything one benchmark run needs; validated on construction (:class:`BenchError` names the fix).

    Attributes mirror the command-line options (``--num-examples`` -> ``num_examples``, ...). ``methods``
    holds method labels (see :func:`expand_methods`), ``temperatures`` and ``num_assistant_tokens`` are
    tuples (each value is a separate setting). The first ``timed_examples`` examples (``ar_examples`` for the
    target alone, default the same) are also timed with the real loop; ``dtype="auto"`` resolves to bf16 where
    the CPU has fast bf16, else float32.
    """

    target: str = "qwen2.5-coder-1.5b-instruct"
    draft: str = "qwen2.5-coder-0.5b-instruct"
    tasks: tuple[str, ...] = DEFAULT_TASKS
    split: str = "test"
    methods: tuple[str, ...] = ("ar", "exact")
    head: str | None = None
    lora_draft: str | None = None
    num_assistant_tokens: tuple[int, ...] = (5,)
    temperatures: tuple[float, ...] = (1.0,)
    max_new_tokens: int = 128
    num_examples: int = 20
    ar_examples: int | None = None
    timed_examples: int = 10
    batch_size: int = 32
    seed: int = 0
    dtype: str = "auto"
    threads: int | None = None
    output_dir: str = "bench_out"
    data_dir: str | None = None
    summarize_only: bool = False
    warmup: bool = True
    measure_costs: bool = True
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
        if "diversed" in self.methods and not self.head:
            raise BenchError(
                "method 'diversed' needs a trained ensemble head: pass --head ORG/NAME or a directory saved "
                "with DiversedHead.save_pretrained (or drop 'diversed' from --methods)."
            )
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
    def head_id(self) -> str | None:
        return _canonical_model(self.head) if self.head else None

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


# ------------------------------------------------------------------------------------------------ records

KEY_FIELDS = (
    "task", "split", "temperature", "method", "example_index", "N", "max_new_tokens",
    "target", "draft", "dtype", "seed", "head", "lora_draft", "engine",
)  # fmt: skip
ENGINES = ("sampler", "loop")  # the batched law-exact sampler; the real batch-1 loop (timed)


def record_key(record: dict) -> tuple:
    """What makes a record unique: a rerun skips every planned generation whose key is already on disk.

    Records written before engines existed came from the real loop."""
    return tuple(
        float(record[k]) if k == "temperature" else record.get(k, "loop") if k == "engine" else record.get(k)
        for k in KEY_FIELDS
    )


def _plan_key(
    config: BenchConfig, task: str, temperature: float, method: BenchMethod, index: int, n: int, engine: str
) -> tuple:
    return record_key(
        {
            "engine": engine,
            "task": task,
            "split": config.split,
            "temperature": temperature,
            "method": method.label,
            "example_index": index,
            "N": n if method.uses_draft else None,
            "max_new_tokens": config.max_new_tokens,
            "target": config.target_id,
            "draft": config.draft_id if method.uses_draft else None,
            "dtype": config.dtype,
            "seed": config.seed,
            "head": config.head_id if method.label == "diversed" else None,
            "lora_draft": config.lora_id if method.lora else None,
        }
    )


def load_records(path: str | os.PathLike) -> list[dict]:
    """The records of a results JSONL (missing file: none). A torn last line of a killed run is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # half-written line of a killed run; the generation is redone
            if isinstance(record, dict) and all(k in record for k in ("task", "method", "example_index")):
                records.append(record)
    return records


def _clean(value: Any) -> Any:
    """JSON-safe value: NaN/inf -> None (strict JSON), recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class _Appender:
    """Append JSON lines durably (flush + fsync per record), repairing a torn last line first."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        needs_newline = path.is_file() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
        self.fh = open(path, "a", encoding="utf-8")
        if needs_newline:
            self.fh.write("\n")

    def write(self, record: dict) -> None:
        self.fh.write(json.dumps(_clean(record), ensure_ascii=False) + "\n")
        self.fh.flush()
        os.fsync(self.fh.fileno())

    def close(self) -> None:
        self.fh.close()


# ------------------------------------------------------------------------------------------------ costs


def analytic_speedup(alpha: float | None, gamma: int, c: float | None, v: float = 1.0) -> float | None:
    """Expected speedup of exact SD (Leviathan et al. 2023): (1 - α^(γ+1)) / ((1 - α)(γ·c + v)).

    α: per-token acceptance rate; γ: draft length N; c: draft / target cost of one token; v: cost of the
    target's verification forward over γ+1 tokens relative to one token (1 = memory-bound ideal).
    """
    if alpha is None or c is None or v is None or not (math.isfinite(alpha) and math.isfinite(c)):
        return None
    tokens = gamma + 1.0 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (gamma * c + v)


def tau_speedup(tau: float | None, gamma: int, c: float | None, v: float = 1.0) -> float | None:
    """Speedup from the measured tokens per round τ (accepted + bonus): τ / (γ·c + v).

    Unlike :func:`analytic_speedup` it needs no i.i.d. assumption: acceptance is bursty, so the i.i.d. form
    under-predicts τ."""
    if tau is None or c is None or v is None or not (math.isfinite(tau) and math.isfinite(c)):
        return None
    return tau / (gamma * c + v)


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _seconds_per_token(model, input_ids, short: int, long: int, repeats: int) -> float:
    """Marginal decode cost of a plain greedy ``generate`` of ``model`` alone (prefill cancels out)."""
    import torch

    def gen(n):
        with torch.no_grad():
            model.generate(input_ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, top_k=None, top_p=None)

    gen(2)  # warm-up
    t_short, t_long = _median_time(lambda: gen(short), repeats), _median_time(lambda: gen(long), repeats)
    marginal = (t_long - t_short) / (long - short)
    return marginal if marginal > 0 else t_long / long


def _verify_cost_ratio(model, input_ids, n: int, repeats: int) -> float | None:
    """v: time of one target forward over n+1 new tokens / over 1 new token, both after a cached prefill."""
    import torch

    try:
        with torch.no_grad():
            out = model(input_ids, use_cache=True)
            cache, length = out.past_key_values, input_ids.shape[1]
            token = input_ids[:, -1:]

            def step(k):
                model(token.repeat(1, k), past_key_values=cache, use_cache=True)
                cache.crop(-(cache.get_seq_length() - length))  # transformers 5: crop(-n) drops n tokens

            step(1), step(n + 1)  # warm-up
            one = _median_time(lambda: step(1), repeats)
            many = _median_time(lambda: step(n + 1), repeats)
        return many / one if one > 0 else None
    except Exception:  # noqa: BLE001 - an optional measurement; a model without crop-able cache skips it
        return None


def measure_costs(target, draft, input_ids, ns: Iterable[int], *, repeats: int = 3, short: int = 4,
                  long: int = 16) -> dict:  # fmt: skip
    """Per-token costs of target and draft alone (plain generate) and the verification ratio v per N."""
    t_target = _seconds_per_token(target, input_ids, short, long, repeats)
    t_draft = _seconds_per_token(draft, input_ids, short, long, repeats)
    return {
        "target_seconds_per_token": t_target,
        "draft_seconds_per_token": t_draft,
        "c": t_draft / t_target,
        "v": {str(n): _verify_cost_ratio(target, input_ids, n, repeats) for n in ns},
        "prompt_tokens": int(input_ids.shape[1]),
        "method": (
            f"c: marginal seconds/token of greedy generate ({long} vs {short} new tokens, median of {repeats}) of "
            f"each model alone; v: target forward on N+1 vs 1 new token(s) after a cached prefill "
            f"(median of {repeats})"
        ),
    }


def _costs_key(target: str, draft: str | None, dtype: str) -> str:
    return f"{target} | {draft} | {dtype}"


def _read_costs(out_dir: Path) -> dict:
    try:
        return json.loads((out_dir / COSTS_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


# ------------------------------------------------------------------------------------------------ running


def _load_rows(config: BenchConfig) -> dict[str, list[dict]]:
    from ..tasks import get_task

    rows = {}
    for name in config.tasks:
        try:
            data = get_task(name).load(config.split, config.data_dir)
        except (FileNotFoundError, ImportError) as err:
            raise BenchError(
                f"cannot load {name}/{config.split}: {err} From the command line: pass --data-dir DIR (or set "
                f"HF_DIVERSED_DATA_DIR), or drop {name} from --tasks."
            ) from None
        if len(data) == 0:
            raise BenchError(f"{name}/{config.split} has no rows; check the data folder (--data-dir).")
        rows[name] = [data[i] for i in range(min(config.num_examples, len(data)))]
    return rows


def _example_id(row: dict, index: int) -> str:
    return str(row.get("id", row.get("task_id", index)))


def _load_models(config: BenchConfig, need_lora: bool):
    """(tokenizer, target, draft, LoRA draft or None) through demo.load_pair, the same path for every model."""
    import torch
    from transformers.utils import logging as hf_logging

    dtype = getattr(torch, config.dtype)
    bars_were_on = hf_logging.is_progress_bar_enabled()
    if not config.progress:
        hf_logging.disable_progress_bar()
    try:
        return _load_models_inner(config, need_lora, dtype)
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()


def _load_models_inner(config: BenchConfig, need_lora: bool, dtype):
    from transformers import AutoModelForCausalLM

    from ...generation.api import check_pair
    from ..demo import load_pair
    from ..real_models import resolve_model

    try:
        tokenizer, target, draft = load_pair(config.target, config.draft, dtype)
    except (OSError, ValueError) as err:  # not found / invalid repo id (HFValidationError is a ValueError)
        from ..real_models import SPECS

        raise BenchError(
            f"cannot load --target {config.target!r} / --draft {config.draft!r}: {err}. Pass a built-in model "
            f"({', '.join(SPECS)}), a Hub id available offline in the HF cache, or a local directory saved with "
            "save_pretrained (model + tokenizer)."
        ) from None
    try:
        check_pair(target, draft, None)
    except ValueError as err:
        raise BenchError(f"--target {config.target!r} / --draft {config.draft!r}: {err}") from None
    if tokenizer.chat_template is None:
        raise BenchError(f"the tokenizer of {config.target!r} has no chat template; use an instruct/chat target model.")
    lora = None
    if need_lora:
        try:
            from peft import PeftModel
        except ImportError:
            raise BenchError(f"{LORA_METHOD} needs peft: pip install 'hf-diversed[train]'.") from None
        base = AutoModelForCausalLM.from_pretrained(resolve_model(config.draft), dtype=dtype).eval()
        # A separate copy: merging would otherwise change the plain draft used by the other methods. Merged,
        # the adapted draft costs exactly what the plain draft costs, so the timing isolates acceptance.
        lora = PeftModel.from_pretrained(base, config.lora_draft).merge_and_unload().eval()
    return tokenizer, target, draft, lora


def _load_head(config: BenchConfig, target, draft):
    from ...generation.api import check_pair
    from ...modeling.hub import load_head

    try:
        head = load_head(config.head)
    except (OSError, ValueError) as err:
        raise BenchError(str(err)) from None
    try:
        check_pair(target, draft, head)
    except ValueError as err:
        raise BenchError(f"--head {config.head!r}: {err}") from None
    return head


def _prompt_ids(tokenizer, task, row):
    messages = task.build_messages(row)
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return encoded["input_ids"], text


def _stats_fields(stats) -> dict:
    if stats is None:
        return dict(drafted=None, accepted=None, rounds=None, verified=None, weight_sum=None, acceptance_rate=None,
                    mean_accepted_per_round=None, mean_weight=None, mean_tv=None)  # fmt: skip
    return dict(
        drafted=stats.num_drafted,
        accepted=stats.num_accepted,
        rounds=stats.num_rounds,
        verified=stats.num_verified,
        weight_sum=stats.weight_sum,
        acceptance_rate=stats.acceptance_rate,
        mean_accepted_per_round=stats.mean_accepted_per_round,
        mean_weight=stats.mean_weight,
        mean_tv=stats.mean_tv,
    )


def _log(config: BenchConfig, message: str) -> None:
    if config.progress:
        print(f"[hf-diversed bench] {message}", file=sys.stderr, flush=True)


def run_bench(config: BenchConfig) -> dict:
    """Run (or resume) the benchmark described by ``config`` and return the summary (also written to disk)."""
    out_dir = config.output_path
    results_path = out_dir / RESULTS_FILE
    if config.summarize_only:
        records = load_records(results_path)
        if not records:
            raise BenchError(
                f"no results in {results_path}; run the benchmark first (without --summarize-only) or pass the "
                "--output-dir of an earlier run."
            )
        return summarize(records, out_dir, command=config.command_line, costs=_read_costs(out_dir))

    import torch

    if config.threads:
        torch.set_num_threads(config.threads)
    rows = _load_rows(config)
    methods = [BenchMethod(label) for label in config.methods]
    done = {record_key(r) for r in load_records(results_path)}

    # (key, task, temperature, method, index, n, engine): the timed loop's examples outermost so machine drift
    # hits all methods alike; every example through the sampler.
    plan = []
    for task_name in config.tasks:
        for temperature in config.temperatures:
            for index in range(len(rows[task_name])):
                for method in methods:
                    if index >= (config.ar_examples if method.label == "ar" else config.timed_examples):
                        continue
                    for n in config.num_assistant_tokens if method.uses_draft else (None,):
                        key = _plan_key(config, task_name, temperature, method, index, n, "loop")
                        plan.append((key, task_name, temperature, method, index, n, "loop"))
    for task_name in config.tasks:
        for temperature in config.temperatures:
            for n in config.num_assistant_tokens:
                for index in range(len(rows[task_name])):
                    for method in methods:
                        if method.has_stats:
                            key = _plan_key(config, task_name, temperature, method, index, n, "sampler")
                            plan.append((key, task_name, temperature, method, index, n, "sampler"))
    planned_keys = {p[0] for p in plan}
    todo = [p for p in plan if p[0] not in done]
    _log(config, f"{len(plan)} generations planned, {len(plan) - len(todo)} already in {results_path}, "
                 f"{len(todo)} to run")  # fmt: skip

    costs_all = _read_costs(out_dir)
    costs_key = _costs_key(config.target_id, config.draft_id, config.dtype)
    need_costs = config.measure_costs and (
        costs_key not in costs_all
        or any(str(n) not in costs_all[costs_key].get("v", {}) for n in config.num_assistant_tokens)
    )
    if todo or need_costs:
        _execute(config, rows, todo, results_path, costs_all, costs_key, need_costs)

    records = [r for r in load_records(results_path) if record_key(r) in planned_keys]
    return summarize(records, out_dir, command=config.command_line, costs=_read_costs(out_dir), config=config.to_dict())


def _execute(config, rows, todo, results_path, costs_all, costs_key, need_costs) -> None:
    import torch
    from tqdm.auto import tqdm

    from ..methods import timed_generate
    from ..tasks import get_task

    started = time.perf_counter()
    need_lora = any(p[3].lora for p in todo)
    tokenizer, target, draft, lora = _load_models(config, need_lora)
    head = _load_head(config, target, draft) if any(p[3].label == "diversed" for p in todo) else None
    _log(config, f"loaded models in {time.perf_counter() - started:.1f}s (dtype {config.dtype}, "
                 f"{torch.get_num_threads()} threads)")  # fmt: skip

    first_task = get_task(config.tasks[0])
    warm_ids, _ = _prompt_ids(tokenizer, first_task, rows[config.tasks[0]][0])
    if need_costs:
        _log(config, "measuring per-token costs of target and draft alone (for the analytic speedup)")
        costs_all[costs_key] = {**measure_costs(target, draft, warm_ids, config.num_assistant_tokens),
                                "threads": torch.get_num_threads()}  # fmt: skip
        config.output_path.mkdir(parents=True, exist_ok=True)
        (config.output_path / COSTS_FILE).write_text(json.dumps(_clean(costs_all), indent=2) + "\n", encoding="utf-8")

    def generate(method, input_ids, *, max_new_tokens, temperature, n, seed):
        return timed_generate(
            target, lora if method.lora else (draft if method.uses_draft else None), input_ids, method.method,
            max_new_tokens=max_new_tokens, temperature=temperature, num_assistant_tokens=n or 5, head=head,
            seed=seed,
        )  # fmt: skip

    loop_todo = [p for p in todo if p[6] == "loop"]
    sampler_todo = [p for p in todo if p[6] == "sampler"]
    if config.warmup and loop_todo:  # one short generation per method: first-call allocations are not timed
        for label in dict.fromkeys(p[3].label for p in loop_todo):
            method = BenchMethod(label)
            generate(method, warm_ids, max_new_tokens=8, temperature=config.temperatures[0],
                     n=config.num_assistant_tokens[0] if method.uses_draft else None, seed=config.seed)  # fmt: skip

    from ...modeling.dtypes import cpu_capability

    environment = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.node(),
        "cpu_capability": cpu_capability(),  # AVX2 vs AVX512(+bf16): bf16 speed differs a lot
    }
    writer = _Appender(results_path)
    prompts: dict[tuple[str, int], tuple[Any, str]] = {}

    def prompt(task_name: str, index: int):
        if (task_name, index) not in prompts:
            prompts[task_name, index] = _prompt_ids(tokenizer, get_task(task_name), rows[task_name][index])
        return prompts[task_name, index]

    def write(task_name, index, temperature, method, n, engine, new_tokens, seconds, stats, extra=None):
        task, row = get_task(task_name), rows[task_name][index]
        input_ids, prompt_text = prompt(task_name, index)
        completion = tokenizer.decode(new_tokens, skip_special_tokens=True)
        columns = {col: [row[col]] for col in task.reward_columns}
        quality = float(task.reward([prompt_text], [completion], **columns)[0])
        writer.write(
            {
                "schema": SCHEMA_VERSION,
                "engine": engine,
                "task": task_name,
                "split": config.split,
                "example_index": index,
                "example_id": _example_id(row, index),
                "temperature": float(temperature),
                "method": method.label,
                "N": n,
                "max_new_tokens": config.max_new_tokens,
                "target": config.target_id,
                "draft": config.draft_id if method.uses_draft else None,
                "head": config.head_id if method.label == "diversed" else None,
                "lora_draft": config.lora_id if method.lora else None,
                "dtype": config.dtype,
                "seed": config.seed,
                "sample_seed": config.seed + index,
                "prompt_tokens": int(input_ids.shape[1]),
                "new_tokens": len(new_tokens),
                "seconds": seconds,
                "tokens_per_s": len(new_tokens) / seconds if seconds else None,
                **_stats_fields(stats),
                "metric": task.metric_name,
                "quality": quality,
                "completion": completion,
                **(extra or {}),
                **environment,
                "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
        )

    try:
        # The full sample first (quality and acceptance), then the timed subset.
        if sampler_todo:
            _run_sampler(config, sampler_todo, prompt, write, target, draft, lora, head)
        bar = tqdm(loop_todo, desc="bench (timed loop)", unit="gen", disable=not config.progress, dynamic_ncols=True)
        for _key, task_name, temperature, method, index, n, _engine in bar:
            bar.set_postfix_str(f"{task_name} T={temperature:g} {method.label}" + (f" N={n}" if n else ""))
            input_ids, _ = prompt(task_name, index)
            record = generate(method, input_ids, max_new_tokens=config.max_new_tokens, temperature=temperature,
                              n=n, seed=config.seed + index)  # fmt: skip
            write(task_name, index, temperature, method, n, "loop", record.new_tokens, record.seconds, record.stats)
        bar.close()
    finally:
        writer.close()


def _run_sampler(config, todo, prompt, write, target, draft, lora, head) -> None:
    """Every planned (example, method) through the batched sampler, one call per task, temperature, N and draft;
    records are written as sequences finish, so a killed run keeps them."""
    from tqdm.auto import tqdm

    from ...generation.batched import SamplerConfig, SampleRequest, sample_batched

    groups: dict[tuple, list] = defaultdict(list)
    for item in todo:
        _key, task_name, temperature, method, index, n, _engine = item
        groups[task_name, temperature, n, method.lora].append(item)
    bar = tqdm(total=len(todo), desc="bench (sampler)", unit="seq", disable=not config.progress, dynamic_ncols=True)
    for (task_name, temperature, n, lora_group), items in groups.items():
        sampler_config = SamplerConfig(
            max_new_tokens=config.max_new_tokens, do_sample=temperature > 0, temperature=temperature or 1.0,
            top_k=0, top_p=1.0, repetition_penalty=1.0, num_assistant_tokens=n,
        )  # fmt: skip
        requests = []
        for _key, _task, _t, method, index, _n, _engine in items:
            rule = "exact" if method.lora else method.label
            requests.append(
                SampleRequest(
                    prompt(task_name, index)[0],
                    rule,
                    head=head if rule == "diversed" else None,
                    seed=config.seed + index,
                    tag=(method, index),
                )  # fmt: skip
            )
        model = lora if lora_group else draft
        model.generation_config.assistant_confidence_threshold = 0.0  # N drafted tokens a round, as timed
        bar.set_postfix_str(f"{task_name} T={temperature:g} N={n}")
        for result in sample_batched(target, model, requests, sampler_config, batch_size=config.batch_size):
            method, index = result.tag
            extra = {"finish_reason": result.finish_reason,
                     "verified_acceptance_rate": result.stats.verified_acceptance_rate}  # fmt: skip
            write(task_name, index, temperature, method, n, "sampler", result.completion_ids, None, result.stats, extra)
            bar.update(1)
    bar.close()


# ------------------------------------------------------------------------------------------------ summary


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """95% Wilson score interval of a proportion (0/1 rewards): robust near 0 and 1 and for small n."""
    if n <= 0:
        return None
    phat = successes / n
    center = (phat + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, center - half), min(1.0, center + half)


def bootstrap_interval(values: Sequence[float], *, resamples: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """95% percentile bootstrap interval of a mean (deterministic: a fixed seed)."""
    import random

    if len(values) < 2:
        return None
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _std(xs: list[float]) -> float | None:
    return statistics.stdev(xs) if len(xs) > 1 else None


def _finite(xs: Iterable[Any]) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(float(x))]


GROUP_FIELDS = ("task", "split", "temperature", "target", "max_new_tokens", "dtype", "seed",
                "method", "N", "draft", "head", "lora_draft")  # fmt: skip
AR_FIELDS = GROUP_FIELDS[:7]


def summarize_records(records: Sequence[dict], costs: dict | None = None) -> list[dict]:
    """Pool records per (task, temperature, method, N, models, settings) into summary rows.

    Pooled: acceptance = Σaccepted / Σdrafted, accepted/round = (Σaccepted + Σrounds) / Σrounds, tokens/s =
    Σtokens / Σseconds, mean w = Σweight / Σverified. Speedup = tokens/s / tokens/s of ``ar`` in the same
    (task, split, temperature, target, max_new_tokens, dtype, seed), also on the examples both ran
    (``speedup_matched``). Quality is the task metric x100 (ROUGE-2 already is) with its standard error.
    """
    costs = costs or {}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in records:
        groups[tuple(record.get(k) for k in GROUP_FIELDS)].append(record)
    method_at = GROUP_FIELDS.index("method")

    def loop(recs):
        return [r for r in recs if r.get("engine", "loop") == "loop"]

    ar_groups = {key[: len(AR_FIELDS)]: loop(recs) for key, recs in groups.items() if key[method_at] == "ar"}
    # The target alone has exact SD's law: its quality is exact SD's sampled quality (same examples and seeds).
    exact_all: dict[tuple, list[dict]] = defaultdict(list)
    for key, recs in groups.items():
        if key[method_at] == "exact":
            exact_all[key[: len(AR_FIELDS)]] += [r for r in recs if r.get("engine") == "sampler"]

    def exact_records(ar_key: tuple, n: int | None) -> list[dict]:
        """Exact SD's sampled records at draft length n (the smallest N sampled when n is None or absent)."""
        recs = exact_all.get(ar_key, [])
        ns = sorted({r["N"] for r in recs})
        use = n if n in ns else (ns[0] if ns else None)
        return [r for r in recs if r["N"] == use]

    rows = []
    for key, recs in groups.items():
        recs = sorted(recs, key=lambda r: r["example_index"])
        row = dict(zip(GROUP_FIELDS, key, strict=True))
        timed = loop(recs)
        sampled = [r for r in recs if r.get("engine") == "sampler"]
        if row["method"] == "ar" and exact_records(key[: len(AR_FIELDS)], None):
            sampled, row["quality_from"] = exact_records(key[: len(AR_FIELDS)], None), "sampler (exact SD: same law)"
        else:
            row["quality_from"] = "sampler" if sampled else "loop"
        measured = sampled or timed  # quality and acceptance: the full sample where the sampler ran
        scale = 1.0 if recs[0].get("metric") == "rouge2" else 100.0
        tokens = sum(r["new_tokens"] for r in timed)
        seconds = sum(r["seconds"] or 0.0 for r in timed)
        tps = tokens / seconds if seconds > 0 else None
        quality = _finite(r.get("quality") for r in measured)
        per_tps = _finite(r.get("tokens_per_s") for r in timed)
        row.update(
            n=len(measured), n_timed=len(timed), metric=recs[0].get("metric"), new_tokens=tokens, seconds=seconds,
            tokens_per_s=tps, tokens_per_s_std=_std(per_tps),
            quality=None if not quality else _mean(quality) * scale,
            quality_stderr=None if len(quality) < 2 else _std(quality) * scale / math.sqrt(len(quality)),
            truncated_rate=sum(r["new_tokens"] >= r["max_new_tokens"] for r in measured) / len(measured),
        )  # fmt: skip
        interval = None
        if quality and all(q in (0.0, 1.0) for q in quality):
            interval = wilson_interval(sum(quality), len(quality))
        elif quality:
            interval = bootstrap_interval(quality)
        row["quality_ci"] = None if interval is None else [interval[0] * scale, interval[1] * scale]
        # Paired difference to the target alone (exact SD's sampled law): same examples, same seeds.
        row["paired_diff"] = row["paired_diff_ci"] = None
        reference = {r["example_index"]: r.get("quality") for r in exact_records(key[: len(AR_FIELDS)], row["N"])}
        if row["method"] not in ("ar", "exact") and sampled and reference:
            diffs = [
                (r["quality"] - reference[r["example_index"]]) * scale
                for r in sampled
                if r["example_index"] in reference and r.get("quality") is not None
                and reference[r["example_index"]] is not None
            ]  # fmt: skip
            if diffs:
                row["paired_diff"] = _mean(diffs)
                ci = bootstrap_interval(diffs)
                row["paired_diff_ci"] = None if ci is None else list(ci)
                row["paired_n"] = len(diffs)
        own = [r for r in recs if r.get("engine") == "sampler"] or timed
        with_stats = [r for r in own if r.get("drafted") is not None]
        if with_stats:
            drafted = sum(r["drafted"] for r in with_stats)
            accepted = sum(r["accepted"] for r in with_stats)
            rounds = sum(r["rounds"] for r in with_stats)
            verified = sum(r.get("verified") or 0 for r in with_stats)
            weight = sum(r.get("weight_sum") or 0.0 for r in with_stats)
            tv = sum((r.get("mean_tv") or 0.0) * (r.get("verified") or 0) for r in with_stats)
            row.update(
                drafted=drafted, accepted=accepted, rounds=rounds,
                acceptance_rate=accepted / drafted if drafted else None,
                verified_acceptance_rate=accepted / verified if verified else None,
                acceptance_std=_std(_finite(r.get("acceptance_rate") for r in with_stats)),
                mean_accepted_per_round=(accepted + rounds) / rounds if rounds else None,
                mean_weight=weight / verified if verified else None,
                mean_tv=tv / verified if verified else None,
            )  # fmt: skip
        else:
            row.update(drafted=None, accepted=None, rounds=None, acceptance_rate=None, acceptance_std=None,
                       verified_acceptance_rate=None, mean_accepted_per_round=None, mean_weight=None,
                       mean_tv=None)  # fmt: skip

        ar = ar_groups.get(key[: len(AR_FIELDS)])
        row["n_ar"] = len(ar) if ar else 0
        row["speedup"] = row["speedup_matched"] = None
        if ar and tps:
            ar_tokens, ar_seconds = sum(r["new_tokens"] for r in ar), sum(r["seconds"] for r in ar)
            if ar_seconds > 0 and ar_tokens > 0:
                row["ar_tokens_per_s"] = ar_tokens / ar_seconds
                row["speedup"] = tps / row["ar_tokens_per_s"]
            ar_by_index = {r["example_index"]: r for r in ar}
            common = [r for r in timed if r["example_index"] in ar_by_index]
            m_tok, m_sec = sum(r["new_tokens"] for r in common), sum(r["seconds"] for r in common)
            a_tok = sum(ar_by_index[r["example_index"]]["new_tokens"] for r in common)
            a_sec = sum(ar_by_index[r["example_index"]]["seconds"] for r in common)
            if common and m_sec > 0 and a_sec > 0 and a_tok > 0:
                row["speedup_matched"] = (m_tok / m_sec) / (a_tok / a_sec)

        cost = costs.get(_costs_key(row["target"], row["draft"], row["dtype"])) if row["draft"] else None
        row["analytic_speedup"] = row["analytic_speedup_v1"] = row["c"] = row["v"] = None
        row["tau_speedup"] = row["tau_speedup_v1"] = None
        if cost and row["acceptance_rate"] is not None and row["N"]:
            v = (cost.get("v") or {}).get(str(row["N"]))
            c, tau = cost.get("c"), row["mean_accepted_per_round"]
            row.update(c=c, v=v)
            row["analytic_speedup_v1"] = analytic_speedup(row["acceptance_rate"], row["N"], c, 1.0)
            row["tau_speedup_v1"] = tau_speedup(tau, row["N"], c, 1.0)
            if v is not None:
                row["analytic_speedup"] = analytic_speedup(row["acceptance_rate"], row["N"], c, v)
                row["tau_speedup"] = tau_speedup(tau, row["N"], c, v)
        rows.append(row)

    order = {name: i for i, name in enumerate(DEFAULT_TASKS)}

    def sort_key(row):
        method = row["method"]
        family = method.split(":")[0]
        return (
            order.get(row["task"], 99), row["task"], row["temperature"], str(row["target"]), row["max_new_tokens"],
            _FAMILY_ORDER.index(family) if family in _FAMILY_ORDER else len(_FAMILY_ORDER), family, _num(method),
            row["N"] or 0, str(row["draft"]), str(row["head"]),
        )  # fmt: skip

    return sorted(rows, key=sort_key)


_FAMILY_ORDER = ("ar", "native-exact", "native-static", "exact", LORA_METHOD, "static", "lossy", "cascade-chow",
                 "cascade-diff", "cascade-opt", "diversed")  # fmt: skip


def _str(value) -> str:
    return "-" if value is None else str(value)


def _num(method: str) -> float:
    try:
        return float(method.rsplit(":", 1)[1]) if ":" in method else 0.0
    except ValueError:
        return 0.0


ASSUMPTIONS = (
    "Analytic speedup (Leviathan et al. 2023) = (1 - a^(N+1)) / ((1 - a)(N c + v)), with a = the measured "
    "acceptance rate (accepted/drafted, pooled), N = draft length, c = draft/target seconds per token of each "
    "model alone (plain greedy generate, same run), v = target forward on N+1 tokens / on 1 token (measured; "
    "'v=1' assumes verification costs one decode step). It assumes i.i.d. acceptance and ignores drafting/"
    "verification overheads (e.g. the DIVERSED head); it is exact SD's model and only indicative for relaxed rules."
)


def summarize(records: Sequence[dict], out_dir: str | os.PathLike, *, command: str | None = None,
              costs: dict | None = None, config: dict | None = None) -> dict:  # fmt: skip
    """Write ``summary.json``, ``results.md`` and the quality/speed plots for ``records``; return the summary."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = summarize_records(records, costs)
    summary = {
        "schema": SCHEMA_VERSION,
        "command": command,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "num_records": len(records),
        "protocol": (
            "Spec-Bench: batch size 1, all methods on the same machine in the same run; speedup = tokens/s "
            "over autoregressive (ar) tokens/s on the same task and temperature; acceptance = accepted/drafted "
            "(pooled); accepted/round counts the bonus token (pooled)."
        ),
        "assumptions": ASSUMPTIONS,
        "config": config,
        "cpu_capabilities": sorted({str(r.get("cpu_capability")) for r in records if r.get("cpu_capability")}),
        "costs": costs or {},
        "rows": rows,
    }
    (out_dir / SUMMARY_FILE).write_text(json.dumps(_clean(summary), indent=2) + "\n", encoding="utf-8")
    write_markdown(summary, out_dir / MARKDOWN_FILE)
    try:
        from ..plotting import plot_quality_speed

        plot_quality_speed(rows, out_dir / PLOT_FILE, x="speedup")
        plot_quality_speed(rows, out_dir / PLOT_ACCEPTANCE_FILE, x="acceptance_rate")
    except ImportError as err:  # pragma: no cover - matplotlib is in the bench extra
        print(f"warning: no plots ({err}); pip install 'hf-diversed[bench]'", file=sys.stderr)
    return summary


def _fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:{spec}}{suffix}"


def _short(model: str | None) -> str:
    if not model:
        return "-"
    return Path(model).name if os.path.isabs(model) else model  # local dirs: their name; Hub ids stay whole


def write_markdown(summary: dict, path: str | os.PathLike) -> None:
    """The summary as Markdown: the command, then one table (one row per task/temperature/method/N)."""
    rows = summary["rows"]
    lines = ["# hf-diversed bench", ""]
    if summary.get("command"):
        lines += ["```", summary["command"], "```", ""]
    fields = ("target", "draft", "head", "max_new_tokens", "dtype", "seed", "split")
    vary = {f: len({str(r.get(f)) for r in rows if r.get(f) is not None}) > 1 for f in fields}
    fixed = []
    for f in ("target", "draft", "head", "lora_draft", "split", "max_new_tokens", "dtype", "seed"):
        values = {str(r.get(f)) for r in rows if r.get(f) is not None}
        if len(values) == 1 and not vary.get(f):
            value = values.pop()
            fixed.append(f"{f}: `{_short(value) if f in ('target', 'draft', 'head', 'lora_draft') else value}`")
    if fixed:
        lines += ["; ".join(fixed), ""]
    extra_cols = [f for f in fields if vary[f]]
    header = ["task", "T", *extra_cols, "method", "N", "n", "quality (×100) [95% CI]", "Δ vs target [95% CI]",
              "acceptance", "per position",
              "accepted/round", "mean w", "mean TV", "cut at max", "n timed", "tok/s", "speedup",
              "τ model (v=1)", "i.i.d. model (v=1)"]  # fmt: skip
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    any_fewer = False

    def pct(x):
        return _fmt(None if x is None else 100 * x, ".1f", "%")

    def model(a, b):
        return "-" if b is None else f"{_fmt(a, '.2f', '×')} ({_fmt(b, '.2f', '×')})"

    for r in rows:
        speed = _fmt(r["speedup"], ".2f", "×")
        if r["method"] != "ar" and r["speedup"] is not None and r["n_ar"] != r["n_timed"]:
            speed += f" (ar n={r['n_ar']}; matched {_fmt(r['speedup_matched'], '.2f', '×')})"
            any_fewer = True
        quality = _fmt(r["quality"], ".1f")
        if r.get("quality_ci"):
            quality += f" [{r['quality_ci'][0]:.1f}, {r['quality_ci'][1]:.1f}]"
        diff = "-"
        if r.get("paired_diff") is not None:
            diff = f"{r['paired_diff']:+.1f}"
            if r.get("paired_diff_ci"):
                diff += f" [{r['paired_diff_ci'][0]:+.1f}, {r['paired_diff_ci'][1]:+.1f}]"
        if r.get("quality_from", "").startswith("sampler (exact"):
            quality += " ᵉ"
        elif r.get("quality_from") == "loop":
            quality += " ˡ"
        cells = [r["task"], f"{r['temperature']:g}", *[_short(_str(r.get(c))) for c in extra_cols], r["method"],
                 _fmt(r["N"], "d"), str(r["n"]), quality, diff, pct(r["acceptance_rate"]),
                 pct(r.get("verified_acceptance_rate")), _fmt(r["mean_accepted_per_round"], ".2f"),
                 _fmt(r["mean_weight"], ".2f"), _fmt(r.get("mean_tv"), ".3f"),
                 _fmt(100 * r["truncated_rate"], ".0f", "%"),
                 str(r.get("n_timed", r["n"])), _fmt(r["tokens_per_s"], ".2f"), speed,
                 model(r.get("tau_speedup"), r.get("tau_speedup_v1")),
                 model(r.get("analytic_speedup"), r.get("analytic_speedup_v1"))]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    capabilities = sorted({str(c) for c in summary.get("cpu_capabilities") or [] if c})
    lines += [
        "",
        "Engines. Quality, acceptance, per-position acceptance, accepted/round, mean w, mean TV and cut at max come "
        "from the batched law-exact sampler (`hf_diversed.batched`) over the `n` examples: its sequences have the "
        "real loop's law. `n timed`, tok/s and speedup come from the real batch-1 loop on the first examples "
        "(Spec-Bench protocol). ᵉ: the target alone has exact SD's law, so its quality is exact SD's sampled "
        "quality. ˡ: from the real loop (records without a sampler run)."
        + (f" CPU: {', '.join(capabilities)}." if capabilities else ""),
        "",
        "Speedup: tokens/s of the method / tokens/s of `ar` on the same task and temperature (pooled: total "
        "tokens / total seconds)."
        + (
            " Where `ar` was timed on fewer examples than the method, the cell says so and gives "
            "the speedup on the examples both ran ('matched')."
            if any_fewer
            else ""
        ),
        "Acceptance: accepted / drafted tokens (drafts thrown away after a rejection count as drafted, the "
        "Spec-Bench figure); per position: accepted / verified. Accepted/round counts the bonus (correction) "
        "token. Quality: task metric ×100 (ROUGE-2 F1 is already ×100) with a 95% interval (Wilson for 0/1 "
        "rewards, bootstrap for ROUGE). Δ vs target: paired difference to exact SD's sampled quality (the target's "
        "law) on the same examples and seeds, with a bootstrap 95% interval. Cut at max: share of completions that "
        "reached --max-new-tokens.",
        "",
        "Speed models, with measured v (and v = 1 in parentheses): τ model = τ / (N·c + v) with τ the measured "
        f"accepted/round; i.i.d. model: {summary.get('assumptions', '')}",
    ]
    costs = summary.get("costs") or {}
    if costs:
        lines += ["", "| target \\| draft \\| dtype | target s/token | draft s/token | c | v by N |"]
        lines += ["|---|---|---|---|---|"]
        for key, cost in costs.items():
            v = ", ".join(f"N={n}: {_fmt(x, '.2f')}" for n, x in (cost.get("v") or {}).items())
            name = " \\| ".join(_short(part.strip()) for part in key.split("|"))
            t_cost, d_cost = cost.get("target_seconds_per_token"), cost.get("draft_seconds_per_token")
            c = _fmt(cost.get("c"), ".3f")
            lines.append(f"| {name} | {_fmt(t_cost, '.4f')} | {_fmt(d_cost, '.4f')} | {c} | {v} |")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------------ CLI


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``bench`` subcommand's options to ``parser``."""
    from ..real_models import DRAFT_NAME, TARGET_NAME

    parser.description = __doc__.split("\n\n")[0] if __doc__ else None
    add = parser.add_argument
    add("--target", default=TARGET_NAME, help="target model: built-in name, Hub id or local path")
    add("--draft", default=DRAFT_NAME, help="draft model sharing the target's tokenizer")
    add("--tasks", default=",".join(DEFAULT_TASKS), help="comma list of tasks (default: %(default)s)")
    add("--split", default="test", help="dataset split (default: %(default)s)")
    add("--data-dir", default=None, help="folder with <task>/<split>.jsonl (default: $HF_DIVERSED_DATA_DIR or "
                                         "shared/data)")  # fmt: skip
    add(
        "--methods",
        default=None,
        help=f"comma list of methods: {METHOD_FORMS} (default: ar,exact, + diversed "
        "with --head; ar is always added, exact+lora-draft whenever --lora-draft is given)",
    )
    add("--static-sweep", default=None, metavar="W,W,...", help="add static:W for each W, e.g. 0.1,0.3,0.5,0.7,0.9")
    add("--lossy-sweep", default=None, metavar="L,L,...", help="add lossy:L for each L")
    add("--cascade-sweep", default=None, metavar="V:A,...", help="add cascade-V:A for each, e.g. opt:0.1,opt:0.3")
    add("--head", default=None, help="DIVERSED head (Hub id or directory) for method 'diversed'")
    add("--lora-draft", default=None, metavar="PATH", help=f"PEFT adapter for the draft; adds method {LORA_METHOD}")
    add("--num-assistant-tokens", default="5", metavar="N[,N...]", help="draft length N (e.g. 3,5,7; default 5)")
    add("--temperature", default="1", metavar="T[,T...]", help="0 = greedy, 1 = plain sampling (default 1)")
    add("--max-new-tokens", type=int, default=128)
    add("--num-examples", type=int, default=20, help="first K rows of each task (default %(default)s)")
    add("--timed-examples", type=int, default=10, help="first K rows also timed with the real batch-1 loop, per "
                                                         "method (default %(default)s; 0: no timing)")  # fmt: skip
    add("--ar-examples", type=int, default=None, help="rows timed for the ar baseline (default: --timed-examples)")
    add("--batch-size", type=int, default=32, help="rows the batched sampler decodes together (default %(default)s)")
    add("--seed", type=int, default=0, help="example i samples with seed + i, the same for every method")
    add("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
        help="auto: bfloat16 where the CPU has AVX512-BF16/AMX (or on CUDA), else float32")  # fmt: skip
    add("--threads", type=int, default=None, help="torch threads (default: all cores)")
    add("--output-dir", default="bench_out", help="results.jsonl, summary.json, results.md, plots")
    add("--summarize-only", action="store_true", help="only rebuild the summary from --output-dir/results.jsonl")
    add("--no-warmup", action="store_true", help="skip the untimed warm-up generation of each method")
    add("--no-costs", action="store_true", help="skip measuring c and v (analytic speedup)")
    add("-q", "--quiet", action="store_true", help="no progress output")
    return parser


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Build (and validate) a :class:`BenchConfig` from parsed ``bench`` arguments."""
    methods = expand_methods(
        args.methods, static_sweep=args.static_sweep, lossy_sweep=args.lossy_sweep,
        cascade_sweep=args.cascade_sweep, head=args.head, lora_draft=args.lora_draft,
    )  # fmt: skip
    command = getattr(args, "command_line", None) or shlex.join(["hf-diversed", *sys.argv[1:]])
    return BenchConfig(
        target=args.target, draft=args.draft, tasks=tuple(_split_list(args.tasks)), split=args.split,
        methods=methods, head=args.head, lora_draft=args.lora_draft,
        num_assistant_tokens=args.num_assistant_tokens, temperatures=args.temperature,
        max_new_tokens=args.max_new_tokens, num_examples=args.num_examples, ar_examples=args.ar_examples,
        timed_examples=min(args.timed_examples, args.num_examples), batch_size=args.batch_size,
        seed=args.seed, dtype=args.dtype, threads=args.threads, output_dir=args.output_dir,
        data_dir=args.data_dir, summarize_only=args.summarize_only, warmup=not args.no_warmup,
        measure_costs=not args.no_costs, progress=not args.quiet, command=command,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Execute ``hf-diversed bench`` from parsed arguments; return the exit code."""
    from ..real_models import RealModelError

    try:
        config = config_from_args(args)
        summary = run_bench(config)
    except (BenchError, RealModelError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume (finished generations are kept).", file=sys.stderr)
        return 130
    out = Path(config.output_dir)
    if not args.quiet:
        print((out / MARKDOWN_FILE).read_text(encoding="utf-8"))
    written = ", ".join(str(out / name) for name in (SUMMARY_FILE, MARKDOWN_FILE, PLOT_FILE))
    print(f"{summary['num_records']} records summarized: {written}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hf_diversed.bench [options]`` (same as ``hf-diversed bench [options]``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = add_arguments(argparse.ArgumentParser(prog="hf-diversed bench")).parse_args(argv)
    args.command_line = shlex.join(["hf-diversed", "bench", *argv])
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
