"""Running a benchmark: the models, the batched sampler over every example, the timed loop over the first ones.

Every generation is one JSON line in ``<output-dir>/results.jsonl``, written as soon as it finishes; a rerun skips
what is already there. Under ``accelerate launch`` the same run is data-parallel: process r of K takes the examples
i with i % K == r, every process appends to the one results file, and the main process measures the costs and
writes the summary."""

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import os
import platform
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from .config import COSTS_FILE, LORA_METHOD, RESULTS_FILE, SCHEMA_VERSION, BenchConfig, BenchError, BenchMethod
from .costs import _read_costs, costs_key, measure_costs
from .plan import _Appender, _clean, _repair_torn_line, load_records, plan_generations, record_key, shard_plan
from .report import summarize
from .runs import load_runs, log_run

# A finished process waits at a barrier for the slowest one, which may be hours behind (a resumed run whose
# remaining work sits on one process): far longer than torch.distributed's default 30 minutes.
_GROUP_TIMEOUT = datetime.timedelta(days=30)
_WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def _launched_processes() -> int:
    """How many processes a launcher (``accelerate launch``, torchrun, mpirun) started; 1 when none did."""
    sizes = [os.environ.get(name, "").strip() for name in _WORLD_SIZE_VARIABLES]
    return max([int(size) for size in sizes if size.isdigit()] + [1])


@dataclass
class _Processes:
    """The processes of a data-parallel run: process ``index`` of ``count`` (index 0 is the main process).

    One process, with no synchronisation, when no launcher started several (``WORLD_SIZE`` and the like).
    ``device``: where this process's models go; None leaves them on the CPU, as always."""

    index: int = 0
    count: int = 1
    device: Any = None
    state: Any = None

    @property
    def is_main(self) -> bool:
        return self.index == 0

    def wait(self) -> None:
        """Barrier: return once every process has called it (nothing to wait for with one process)."""
        if self.state is not None:
            self.state.wait_for_everyone()

    @classmethod
    def detect(cls) -> _Processes:
        launched = _launched_processes()
        if launched == 1:
            return cls()
        try:
            from accelerate import PartialState
        except ImportError:
            raise BenchError(
                f"launched as {launched} processes, but a data-parallel run needs accelerate: pip install "
                "'hf-diversed[train]' (or run one process: hf-diversed bench ...)."
            ) from None
        import torch

        # cpu=True without CUDA: accelerate then joins the launched processes into a gloo group (cpu=False would
        # leave each one alone, and every process would run everything).
        state = PartialState(cpu=not torch.cuda.is_available(), timeout=_GROUP_TIMEOUT)
        if state.num_processes != launched:
            raise BenchError(
                f"launched as {launched} processes, but accelerate sees {state.num_processes}; launch with "
                "`accelerate launch --multi_gpu --num_processes K` (on CPUs too) or torchrun."
            )
        if state.num_processes == 1:
            return cls()
        device = state.device if state.device.type != "cpu" else None
        return cls(state.process_index, state.num_processes, device, state)


def _load_rows(config: BenchConfig) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """The first ``num_examples`` rows of each task (of ``config.ids`` where given), and where each task's came from."""
    from ..tasks import DataNotFoundError, TaskError, get_task

    rows, sources = {}, {}
    for name in config.tasks:
        task = get_task(name)
        try:
            sources[name] = task.source(config.split, config.data_dir)
            data = task.load(config.split, config.data_dir, ids=config.ids)
        except (DataNotFoundError, TaskError, ImportError) as err:
            raise BenchError(str(err)) from None  # each names the task, the split and the fix
        if len(data) == 0:
            raise BenchError(f"{name}/{config.split} has no rows; check the data folder (--data-dir).")
        rows[name] = [data[i] for i in range(min(config.num_examples, len(data)))]
    return rows, sources


def _check_rows_match(records: list[dict], rows: dict[str, list[dict]], split: str, results_path) -> None:
    """A resumed run must see the rows its records were made on: same example id at each index."""
    for record in records:
        task_rows = rows.get(record.get("task"))
        index = record.get("example_index")
        if record.get("split") != split or task_rows is None or not isinstance(index, int) or index >= len(task_rows):
            continue
        now = _example_id(task_rows[index], index)
        if str(record.get("example_id", now)) != now:
            raise BenchError(
                f"{results_path} holds {record['task']} row {index} as id {record['example_id']}, but the data now "
                f"gives id {now} there (another data source or --ids); pass a new --output-dir, or the rows it used "
                "(--ids with the ids of its records)."
            )


def _example_id(row: dict, index: int) -> str:
    return str(row.get("id", row.get("task_id", index)))


@contextlib.contextmanager
def _loading_bars(config: BenchConfig):
    """transformers' loading progress bars only with ``config.progress``."""
    from transformers.utils import logging as hf_logging

    bars_were_on = hf_logging.is_progress_bar_enabled()
    if not config.progress:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()


def _load_models(config: BenchConfig, need_lora: bool):
    """(tokenizer, target, draft, LoRA draft or None) through models.load_pair, the same path for every model."""
    import torch

    with _loading_bars(config):
        return _load_models_inner(config, need_lora, getattr(torch, config.dtype))


def _load_models_inner(config: BenchConfig, need_lora: bool, dtype):
    from transformers import AutoModelForCausalLM

    from ...generation.checks import check_pair
    from ..models import load_pair
    from ..weights import resolve_model

    try:
        tokenizer, target, draft = load_pair(config.target, config.draft, dtype, config.weights)
    except (OSError, ValueError) as err:  # not found / invalid repo id (HFValidationError is a ValueError)
        from ..real_models import SPECS

        raise BenchError(
            f"cannot load --target {config.target!r} / --draft {config.draft!r}: {err}. Pass a Hub id (the Hub "
            f"reachable or the model in the HF cache), a GGUF copy ({', '.join(SPECS)}), or a local directory saved "
            "with save_pretrained (model + tokenizer)."
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
        base = AutoModelForCausalLM.from_pretrained(resolve_model(config.draft, config.weights), dtype=dtype).eval()
        # A separate copy: merging would otherwise change the plain draft used by the other methods. Merged,
        # the adapted draft costs exactly what the plain draft costs, so the timing isolates acceptance.
        lora = PeftModel.from_pretrained(base, config.lora_draft).merge_and_unload().eval()
    return tokenizer, target, draft, lora


def _load_heads(config: BenchConfig, needed: set[str], target, draft) -> dict[str, Any]:
    """The heads the plan uses, by their id in the records, each checked against the pair."""
    from ...generation.checks import check_pair
    from ...modeling.hub import load_head

    heads = {}
    for name, head_id in zip(config.heads, config.head_ids, strict=True):
        if head_id not in needed:
            continue
        try:
            head = load_head(name)
        except (OSError, ValueError) as err:
            raise BenchError(str(err)) from None
        try:
            check_pair(target, draft, head)
        except ValueError as err:
            raise BenchError(f"--head {name!r}: {err}") from None
        heads[head_id] = head
    return heads


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


def run_bench(config: BenchConfig) -> dict | None:
    """Run (or resume) the benchmark described by ``config`` and return the summary (also written to disk).

    Under ``accelerate launch`` each process runs its share of the examples (``i % K == rank``) and appends to
    the same results file; the main process returns the summary, the others None once every record is on disk.
    """
    processes = _Processes.detect()
    if not processes.is_main:  # progress and messages come from the main process only
        config = copy.copy(config)
        config.progress = False
    out_dir = config.output_path
    results_path = out_dir / RESULTS_FILE
    if config.summarize_only:
        if not processes.is_main:
            return None
        records = load_records(results_path)
        if not records:
            raise BenchError(
                f"no results in {results_path}; run the benchmark first (without --summarize-only) or pass the "
                "--output-dir of an earlier run."
            )
        return summarize(records, out_dir, command=config.command_line, costs=_read_costs(out_dir),
                         runs=load_runs(out_dir))  # fmt: skip

    import torch

    if config.threads:
        torch.set_num_threads(config.threads)
    rows, sources = _load_rows(config)
    existing = load_records(results_path)
    _check_rows_match(existing, rows, config.split, results_path)
    done = {record_key(r) for r in existing}
    plan = plan_generations(config, rows)
    planned_keys = {p[0] for p in plan}
    todo_all = [p for p in plan if p[0] not in done]
    todo = shard_plan(todo_all, processes.index, processes.count)
    share = (
        f" by {processes.count} processes (examples i with i % {processes.count} == rank; {len(todo)} on process 0)"
        if processes.count > 1
        else ""
    )
    for name, source in sources.items():
        _log(config, f"{name}/{config.split}: {len(rows[name])} rows from {source}")
    _log(config, f"{len(plan)} generations planned, {len(plan) - len(todo_all)} already in {results_path}, "
                 f"{len(todo_all)} to run{share}")  # fmt: skip
    if todo_all and processes.is_main:
        _repair_torn_line(results_path)  # before any process appends (they wait for the main process below)

    costs_all = _read_costs(out_dir)
    pair_key = costs_key(config.target_id, config.draft_id, config.dtype)
    need_costs = (
        processes.is_main
        and config.measure_costs
        and (
            config.remeasure_costs
            or pair_key not in costs_all
            or any(str(n) not in costs_all[pair_key].get("v", {}) for n in config.num_assistant_tokens)
        )
    )
    if todo_all and processes.is_main:
        log_run(out_dir, {
            "command": config.command_line, "threads": config.threads or torch.get_num_threads(),
            "batch_size": config.batch_size, "dtype": config.dtype, "num_processes": processes.count,
            "planned": len(plan), "to_run": len(todo_all), "data": sources,
        })  # fmt: skip
    _execute(config, rows, todo, results_path, costs_all, pair_key, need_costs, processes)
    processes.wait()  # every process's records are on disk
    if not processes.is_main:
        return None
    every = load_records(results_path)
    records = [r for r in every if record_key(r) in planned_keys]  # the rows: what this command asked for
    summary_config = {**config.to_dict(), "num_processes": processes.count}
    return summarize(records, out_dir, command=config.command_line, costs=_read_costs(out_dir), config=summary_config,
                     runs=load_runs(out_dir), run_records=every)  # fmt: skip


def _execute(config, rows, todo, results_path, costs_all, costs_key, need_costs, processes) -> None:
    """Load the models (when this process has work), let the main process measure the costs on a quiet machine,
    then run this process's generations. Every process passes the same barriers, with or without work."""
    if not (todo or need_costs):
        processes.wait()  # the others load their models
        processes.wait()  # the main process measures the costs
        return

    import torch
    from tqdm.auto import tqdm

    from ..methods import timed_generate
    from ..tasks import get_task

    started = time.perf_counter()
    need_lora = any(p[3].lora for p in todo)
    tokenizer, target, draft, lora = _load_models(config, need_lora)
    heads = {}
    if any(p.head for p in todo):
        with _loading_bars(config):
            heads = _load_heads(config, {p.head for p in todo if p.head}, target, draft)
    device = processes.device
    if device is not None:  # one accelerator per process
        for model in (target, draft, lora, *heads.values()):
            if model is not None:
                model.to(device)
    _log(config, f"loaded models in {time.perf_counter() - started:.1f}s (dtype {config.dtype}, "
                 f"{torch.get_num_threads()} threads)")  # fmt: skip

    first_task = get_task(config.tasks[0])
    warm_ids, _ = _prompt_ids(tokenizer, first_task, rows[config.tasks[0]][0])
    warm_ids = warm_ids.to(device) if device is not None else warm_ids
    processes.wait()  # every process has its models: the costs are measured on an otherwise idle machine
    if need_costs:
        _log(config, "measuring per-token costs of target and draft alone (for the analytic speedup)")
        costs_all[costs_key] = {**measure_costs(target, draft, warm_ids, config.num_assistant_tokens),
                                "threads": torch.get_num_threads()}  # fmt: skip
        config.output_path.mkdir(parents=True, exist_ok=True)
        (config.output_path / COSTS_FILE).write_text(json.dumps(_clean(costs_all), indent=2) + "\n", encoding="utf-8")
    processes.wait()  # costs measured, a torn last line repaired: the processes may append
    if not todo:
        return

    def generate(method, input_ids, *, max_new_tokens, temperature, n, seed, head_id):
        extra = {"tokenizer": tokenizer} if method.method.needs_tokenizer else {}
        return timed_generate(
            target, lora if method.lora else (draft if method.uses_draft else None), input_ids, method.method,
            max_new_tokens=max_new_tokens, temperature=temperature, num_assistant_tokens=n or 5,
            head=heads.get(head_id), seed=seed, **extra,
        )  # fmt: skip

    loop_todo = [p for p in todo if p.engine == "loop"]
    sampler_todo = [p for p in todo if p.engine == "sampler"]
    if config.warmup and loop_todo:  # one short generation per method: first-call allocations are not timed
        for label, head_id in dict.fromkeys((p.method.label, p.head) for p in loop_todo):
            method = BenchMethod(label)
            generate(method, warm_ids, max_new_tokens=8, temperature=config.temperatures[0],
                     n=config.num_assistant_tokens[0] if method.uses_draft else None, seed=config.seed,
                     head_id=head_id)  # fmt: skip

    from ...modeling.dtypes import cpu_capability
    from ..weights import weights_record

    environment = {
        # which weights ran: the Hub's (by id), a local folder, or a GGUF copy (quantization, sha256)
        "weights": {"target": weights_record(target), "draft": weights_record(draft)},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.node(),
        "cpu_capability": cpu_capability(),  # AVX2 vs AVX512(+bf16): bf16 speed differs a lot
        "process_index": processes.index,  # data-parallel runs (accelerate launch): which process wrote it
        "num_processes": processes.count,
    }
    writer = _Appender(results_path)
    prompts: dict[tuple[str, int], tuple[Any, str]] = {}

    def prompt(task_name: str, index: int):
        if (task_name, index) not in prompts:
            ids, text = _prompt_ids(tokenizer, get_task(task_name), rows[task_name][index])
            prompts[task_name, index] = (ids.to(device) if device is not None else ids), text
        return prompts[task_name, index]

    def write(task_name, index, temperature, method, n, engine, head_id, new_tokens, seconds, stats, extra=None):
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
                "head": head_id,
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
            _run_sampler(config, sampler_todo, prompt, write, target, draft, lora, heads, tokenizer)
        bar = tqdm(loop_todo, desc="bench (timed loop)", unit="gen", disable=not config.progress, dynamic_ncols=True)
        for item in bar:
            task_name, temperature, method, index, n = item.task, item.temperature, item.method, item.index, item.n
            bar.set_postfix_str(f"{task_name} T={temperature:g} {method.label}" + (f" N={n}" if n else ""))
            input_ids, _ = prompt(task_name, index)
            record = generate(method, input_ids, max_new_tokens=config.max_new_tokens, temperature=temperature,
                              n=n, seed=config.seed + index, head_id=item.head)  # fmt: skip
            write(task_name, index, temperature, method, n, "loop", item.head, record.new_tokens, record.seconds,
                  record.stats)  # fmt: skip
        bar.close()
    finally:
        writer.close()


def _run_sampler(config, todo, prompt, write, target, draft, lora, heads, tokenizer) -> None:
    """Every planned (example, method) through the batched sampler, one call per task, temperature, N and draft;
    records are written as sequences finish, so a killed run keeps them."""
    from tqdm.auto import tqdm

    from ...generation.batched import SamplerConfig, SampleRequest, sample_batched
    from ...generation.verification import parse_rule

    resolved: dict[str, object] = {}  # token-class specs -> rules, resolved once with the tokenizer
    groups: dict[tuple, list] = defaultdict(list)
    for item in todo:
        groups[item.task, item.temperature, item.n, item.method.lora].append(item)
    bar = tqdm(total=len(todo), desc="bench (sampler)", unit="seq", disable=not config.progress, dynamic_ncols=True)
    for (task_name, temperature, n, lora_group), items in groups.items():
        sampler_config = SamplerConfig(
            max_new_tokens=config.max_new_tokens, do_sample=temperature > 0, temperature=temperature or 1.0,
            top_k=0, top_p=1.0, repetition_penalty=1.0, num_assistant_tokens=n,
        )  # fmt: skip
        requests = []
        for item in items:
            method, index = item.method, item.index
            rule = "exact" if method.lora else method.label
            if method.method.needs_tokenizer:
                if rule not in resolved:
                    resolved[rule] = parse_rule(rule, tokenizer=tokenizer)
                rule = resolved[rule]
            requests.append(
                SampleRequest(
                    prompt(task_name, index)[0],
                    rule,
                    head=heads[item.head] if rule == "diversed" else None,
                    seed=config.seed + index,
                    tag=(method, index, item.head),
                )  # fmt: skip
            )
        model = lora if lora_group else draft
        model.generation_config.assistant_confidence_threshold = 0.0  # N drafted tokens a round, as timed
        bar.set_postfix_str(f"{task_name} T={temperature:g} N={n}")
        for result in sample_batched(target, model, requests, sampler_config, batch_size=config.batch_size):
            method, index, head_id = result.tag
            extra = {"finish_reason": result.finish_reason,
                     "verified_acceptance_rate": result.stats.verified_acceptance_rate}  # fmt: skip
            write(task_name, index, temperature, method, n, "sampler", head_id, result.completion_ids, None,
                  result.stats, extra)  # fmt: skip
            bar.update(1)
    bar.close()
