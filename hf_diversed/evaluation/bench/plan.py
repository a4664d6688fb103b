"""The records of a run: what makes one unique, the plan of generations, and the results file."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, NamedTuple

from .config import BenchConfig, BenchMethod

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


class Planned(NamedTuple):
    """One planned generation: its record key and what to run (``head``: the head id of a ``diversed`` one)."""

    key: tuple
    task: str
    temperature: float
    method: BenchMethod
    index: int
    n: int | None
    engine: str
    head: str | None = None


def _planned(
    config: BenchConfig,
    task: str,
    temperature: float,
    method: BenchMethod,
    index: int,
    n: int | None,
    engine: str,
    head: str | None,
) -> Planned:
    """One planned generation with its record key."""
    key = record_key(
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
            "head": head,
            "lora_draft": config.lora_id if method.lora else None,
        }
    )
    return Planned(key, task, temperature, method, index, n, engine, head)


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


def _repair_torn_line(path: Path) -> None:
    """End a torn last line (a killed run's half-written record) with a newline, so the next record starts a
    line of its own; :func:`load_records` skips the fragment and the generation is redone. In a data-parallel
    run only the main process repairs, before any process appends."""
    try:
        with open(path, "rb+") as fh:
            if fh.seek(0, os.SEEK_END) == 0:
                return
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                fh.seek(0, os.SEEK_END)
                fh.write(b"\n")
                fh.flush()
                os.fsync(fh.fileno())
    except FileNotFoundError:
        return


class _Appender:
    """Append JSON lines durably: each record is one ``os.write`` of the whole line to a file opened with
    ``O_APPEND``, then fsync. On a local Linux filesystem such a write is atomic with respect to other appenders,
    so the processes of a data-parallel run share one file without interleaving inside a line."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)

    def write(self, record: dict) -> None:
        data = (json.dumps(_clean(record), ensure_ascii=False) + "\n").encode("utf-8")
        written = os.write(self.fd, data)
        while written < len(data):  # a short write (disk full, signal): finish the line; a torn one is redone
            written += os.write(self.fd, data[written:])
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def shard_plan(plan: list[Planned], index: int, count: int) -> list[Planned]:
    """Process ``index`` of ``count``'s share of a plan: the generations of examples ``i`` with ``i % count ==
    index`` (sampler and timed loop alike, in plan order), so every method of an example runs on one process."""
    return [p for p in plan if p.index % count == index]


def plan_generations(config: BenchConfig, rows: dict[str, list[dict]]) -> list[Planned]:
    """Every generation of the run, in order.

    The timed loop's examples outermost so machine drift hits all methods alike; every example through the
    sampler (from ``config.first_example`` on)."""
    methods = [BenchMethod(label) for label in config.methods]
    head_ids = config.head_ids  # method diversed runs once per head (one record set each)
    variants = {m.label: head_ids if m.label == "diversed" else (None,) for m in methods}
    plan = []
    for task_name in config.tasks:
        for temperature in config.temperatures:
            for index in range(config.first_example, len(rows[task_name])):
                for method in methods:
                    if index >= (config.ar_examples if method.label == "ar" else config.timed_examples):
                        continue
                    for n in config.num_assistant_tokens if method.uses_draft else (None,):
                        for head in variants[method.label]:
                            plan.append(_planned(config, task_name, temperature, method, index, n, "loop", head))
    for task_name in config.tasks:
        for temperature in config.temperatures:
            for n in config.num_assistant_tokens:
                for index in range(config.first_example, len(rows[task_name])):
                    for method in methods:
                        if method.has_stats:
                            for head in variants[method.label]:
                                plan.append(_planned(config, task_name, temperature, method, index, n, "sampler", head))
    return plan
