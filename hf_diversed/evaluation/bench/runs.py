"""The run log: one line per invocation of a benchmark (when it started, the command, the code's commit, the
machine), and what each invocation produced, read back from the records it wrote.

A resumed benchmark spans several invocations, often several sessions; the log gives its wall-clock time and the
throughput the sampler reached. An invocation's records are those written between its start and the next
invocation's start in the same output folder; its wall-clock time runs from its start to its last record (model
loading and cost measurement included; work in flight when it was stopped is not counted). An invocation stopped
before its first record produced nothing: it is counted, not listed."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from .config import RUNS_FILE
from .plan import _Appender

TIME_FORMAT = "%Y-%m-%dT%H:%M:%S%z"
RUN_FIELDS = ("started", "commit", "command", "machine", "cpu_capability", "threads", "batch_size", "dtype",
              "num_processes", "note")  # fmt: skip


def source_revision() -> str:
    """The commit of the checkout hf_diversed runs from (``+modified`` when its package code differs from it),
    or the package version when it is not a git checkout."""
    from ... import __version__

    package = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=package, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(package)], cwd=package,
                               capture_output=True, timeout=10).returncode != 0  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return f"hf-diversed {__version__}"
    return commit + ("+modified" if dirty else "")


def log_run(out_dir: str | os.PathLike, entry: dict) -> dict:
    """Append one invocation's start line (``entry`` plus the time, commit and machine) to ``runs.jsonl``."""
    import platform

    from ...modeling.dtypes import cpu_capability

    line = {
        "started": time.strftime(TIME_FORMAT),
        "commit": source_revision(),
        "machine": platform.node(),
        "cpu_capability": cpu_capability(),
        **entry,
    }
    writer = _Appender(Path(out_dir) / RUNS_FILE)
    try:
        writer.write(line)
    finally:
        writer.close()
    return line


def load_runs(out_dir: str | os.PathLike) -> list[dict]:
    """The run log's lines in start order (none when there is no log)."""
    path = Path(out_dir) / RUNS_FILE
    if not path.is_file():
        return []
    runs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            run = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn line of a killed process
        if isinstance(run, dict) and _parse(run.get("started")) is not None:
            runs.append(run)
    return sorted(runs, key=lambda r: _parse(r["started"]))


def _parse(stamp) -> datetime.datetime | None:
    try:
        return datetime.datetime.strptime(str(stamp), TIME_FORMAT)
    except ValueError:
        return None


def invocation_of(runs: Sequence[dict], record: dict) -> int | None:
    """Index in ``runs`` (start order) of the invocation that wrote ``record``: the last one started at or before
    its time stamp (None for a record without one or older than the log)."""
    stamp = _parse(record.get("time"))
    if stamp is None:
        return None
    started = [i for i, run in enumerate(runs) if _parse(run["started"]) <= stamp]
    return started[-1] if started else None


def summarize_runs(runs: Sequence[dict], records: Sequence[dict]) -> dict | None:
    """Per invocation that wrote records: its records, new tokens, wall-clock seconds and tokens/s (sampler records
    and all); the totals over the logged invocations; how many invocations wrote nothing and how many records
    predate the log. None without a log."""
    if not runs:
        return None
    starts = [_parse(r["started"]) for r in runs]
    stamped = [(_parse(r.get("time")), r) for r in records]
    out, empty = [], 0
    for i, run in enumerate(runs):
        begin, end = starts[i], starts[i + 1] if i + 1 < len(runs) else None
        mine = [(t, r) for t, r in stamped if t is not None and t >= begin and (end is None or t < end)]
        if not mine:
            empty += 1  # stopped before its first record (or wrote none): no time to count
            continue
        sampler = [(t, r) for t, r in mine if r.get("engine") == "sampler"]
        wall = (max(t for t, _ in mine) - begin).total_seconds()
        sampler_wall = (max(t for t, _ in sampler) - begin).total_seconds() if sampler else 0.0
        sampler_tokens = sum(int(r.get("new_tokens") or 0) for _, r in sampler)
        out.append(
            {
                **{k: run.get(k) for k in RUN_FIELDS},
                "records": len(mine),
                "new_tokens": sum(int(r.get("new_tokens") or 0) for _, r in mine),
                "wall_seconds": wall,
                "sampler_records": len(sampler),
                "sampler_tokens": sampler_tokens,
                "sampler_tokens_per_s": sampler_tokens / sampler_wall if sampler_wall > 0 else None,
            }
        )
    wall = sum(r["wall_seconds"] for r in out)
    sampler_wall = sum(r["wall_seconds"] for r in out if r["sampler_records"])
    sampler_tokens = sum(r["sampler_tokens"] for r in out)
    return {
        "runs": out,
        "wall_seconds": wall,
        "records": sum(r["records"] for r in out),
        "sampler_tokens": sampler_tokens,
        "sampler_tokens_per_s": sampler_tokens / sampler_wall if sampler_wall > 0 else None,
        "records_before_log": sum(1 for t, _ in stamped if t is None or t < starts[0]),
        "runs_without_records": empty,
    }


def format_runs(runs: dict | None) -> list[str]:
    """The run log as Markdown lines: one row per invocation, then the totals (nothing without a log)."""
    if not runs:
        return []
    lines = [
        "Runs (from `runs.jsonl`; wall-clock from an invocation's start to its last record, model loading "
        "included; sampler tok/s = new tokens of its sampler records / that time):",
        "",
        "| started | commit | CPU | threads | batch | records | new tokens | wall-clock | sampler tok/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs["runs"]:
        rate = run["sampler_tokens_per_s"]
        lines.append(
            f"| {run['started']} | `{str(run.get('commit') or '-')[:12]}` | {run.get('cpu_capability') or '-'} | "
            f"{run.get('threads') or '-'} | {run.get('batch_size') or '-'} | {run['records']} | {run['new_tokens']} | "
            f"{run['wall_seconds'] / 3600:.2f} h | {'-' if rate is None else f'{rate:.1f}'} |"
        )
    rate, empty = runs["sampler_tokens_per_s"], runs.get("runs_without_records", 0)
    lines += [
        "",
        f"Logged: {runs['records']} records in {runs['wall_seconds'] / 3600:.2f} h of wall-clock"
        + ("" if rate is None else f"; the sampler reached {rate:.1f} new tokens/s over its runs")
        + (f". {runs['records_before_log']} earlier records predate the log." if runs["records_before_log"] else ".")
        + (f" {empty} invocation{'s' * (empty > 1)} stopped before writing a record (not listed)." if empty else ""),
    ]
    return lines
