"""``hf-diversed tune``: pick the fastest zero-training rule whose quality loss stays within a budget.

Two bench runs (:func:`~hf_diversed.evaluation.bench.run_bench`, the batched law-exact sampler, resumable records):

1. calibration rows: exact SD and the sweep (static w, cascade α, lossy l, token-class where a class applies, any
   heads), every rule on the same rows with the same seeds;
2. held-out rows: the chosen rule and exact SD, as a confirmation (the choice is not revisited).

The choice. Exact SD has the target's law, so its quality is the target's. For each rule the paired differences
d_i = 100·(r_i(rule) − r_i(exact)) on the same rows and seeds (ROUGE is already ×100) give Δ = mean d_i and a 95%
percentile bootstrap interval [lo, hi] (2000 resamples). A rule meets the budget B (``--max-drop``) when lo ≥ −B:
the data exclude a loss larger than B points. At equal N the speed τ/(N·c + v) rises with the tokens per round τ,
which rises with acceptance α (i.i.d.: τ = (1 − α^(N+1))/(1 − α)), so among the rules that meet the budget (exact
SD always does) the one with the highest calibration acceptance is the fastest.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from .bench import RESULTS_FILE, BenchConfig, BenchError, load_records, record_key, run_bench, summarize_records
from .bench.config import _canonical_model, _floats, _split_list
from .bench.frontier import compare_to_frontier, fitted_frontier, method_label
from .bench.plan import _Appender, _clean, plan_generations

TUNE_FILE = "tune.json"
FRONTIER_PLOT = "frontier.png"
CALIBRATION_DIR = "calibration"
HELDOUT_DIR = "heldout"
SCHEMA_VERSION = 1
CRITERION = (
    "a rule meets the budget when the lower end of the 95% paired bootstrap interval of its quality minus exact "
    "SD's (the target's law; same rows, same seeds, points ×100) is >= -max_drop; among those, the highest "
    "calibration acceptance (at equal N the fastest) is chosen; exact SD when no relaxed rule meets it"
)
# token classes and the tasks where they apply: digits where the answer is a number
_TOKEN_CLASS_TASKS = {"digits": ("gsm8k",)}
_TOKEN_CLASS_REWARDS = {"digits": ("number",)}


@dataclass
class TuneConfig:
    """The options of a tune run (``hf-diversed tune``); rows are ``(start, stop)`` indices in ``split``."""

    task: str
    target: str = "qwen2.5-coder-1.5b-instruct"
    draft: str = "qwen2.5-coder-0.5b-instruct"
    weights: str | None = None
    reward: str | None = None
    split: str = "test"
    calibration_rows: tuple[int, int] = (0, 60)
    heldout_rows: tuple[int, int] = (60, 120)
    max_drop: float = 1.0
    static: str = "0.1,0.3,0.5,0.7,0.9"
    cascade: str = "opt:0.1"
    lossy: str = "0.5"
    token_class: str | None = None  # None: digits:0,digits:0.3 where the digits class applies, else none
    heads: tuple[str, ...] = ()
    num_assistant_tokens: int = 5
    temperature: float = 1.0
    max_new_tokens: int = 512
    batch_size: int = 32
    seed: int = 0
    dtype: str = "auto"
    threads: int | None = None
    data_dir: str | None = None
    records_from: tuple[str, ...] = ()
    output_dir: str = "tune_out"
    progress: bool = True
    command: str | None = None

    def __post_init__(self) -> None:
        if not (self.max_drop >= 0):
            raise BenchError(f"--max-drop must be >= 0 points (e.g. 1.0); got {self.max_drop!r}.")
        for name in ("calibration_rows", "heldout_rows"):
            start, stop = getattr(self, name)
            if not 0 <= start < stop:
                option = "--" + name.replace("_", "-")
                raise BenchError(f"{option} must be START:STOP with 0 <= START < STOP (e.g. 0:60); got {start}:{stop}.")
        (a, b), (c, d) = self.calibration_rows, self.heldout_rows
        if a < d and c < b:
            raise BenchError(
                f"--calibration-rows {a}:{b} and --heldout-rows {c}:{d} overlap; a held-out row must not be "
                "calibrated on (e.g. 0:60 and 60:120)."
            )
        for path in self.records_from:
            if not Path(path).is_file():
                raise BenchError(f"--records-from {path!r} is not a file; pass a bench results.jsonl.")


def parse_rows(text: str, option: str) -> tuple[int, int]:
    """``"0:60"`` -> ``(0, 60)``."""
    start, sep, stop = text.partition(":")
    try:
        return int(start or 0), int(stop)
    except ValueError:
        raise BenchError(f"{option} expects START:STOP row indices such as 0:60; got {text!r}.") from None


def resolve_task(config: TuneConfig):
    """The task to tune on: a built-in one by name, or a JSONL file with ``--reward`` (registered by its stem)."""
    from .tasks import REWARDS, TASKS, get_task, jsonl_task, register_task

    if config.task.lower() in TASKS:
        if config.reward is not None:
            raise BenchError(f"--reward applies to a JSONL --task; {config.task} has its own metric. Drop --reward.")
        return get_task(config.task)
    if not config.task.endswith(".jsonl") and not Path(config.task).is_file():
        raise BenchError(
            f"unknown task {config.task!r}; pass one of {', '.join(TASKS)}, or a JSONL file of prompts with "
            f"--reward {REWARDS}."
        )
    if not Path(config.task).is_file():
        raise BenchError(f"--task {config.task!r} does not exist; pass a JSONL file (one prompt per line).")
    if config.reward is None:
        raise BenchError(f"--task {config.task} is a JSONL file: say how to score it with --reward {REWARDS}.")
    return register_task(jsonl_task(config.task, config.reward))


def sweep_methods(config: TuneConfig, task) -> tuple[str, ...]:
    """exact, then the rules to sweep (``diversed`` last when heads are given)."""
    methods = ["exact"]
    methods += [f"static:{w:g}" for w in _floats(config.static, "--static")]
    methods += [f"lossy:{x:g}" for x in _floats(config.lossy, "--lossy")]
    for item in _split_list(config.cascade):
        variant, _, value = item.rpartition(":")
        methods.append(f"cascade-{variant.removeprefix('cascade-')}:{value}")
    if config.token_class is None:
        reward = getattr(task, "reward_spec", None)
        applies = task.name in _TOKEN_CLASS_TASKS["digits"] or reward in _TOKEN_CLASS_REWARDS["digits"]
        token_classes = ["digits:0", "digits:0.3"] if applies else []
    else:
        token_classes = _split_list(config.token_class)
    methods += [f"token-class:{item}" for item in token_classes]
    return (*methods, *(["diversed"] if config.heads else []))


def bench_config(config: TuneConfig, task, phase: str, methods, heads) -> BenchConfig:
    """The bench run of one phase: its rows, no timing (speed follows acceptance), records in ``<output>/<phase>``."""
    start, stop = config.calibration_rows if phase == CALIBRATION_DIR else config.heldout_rows
    return BenchConfig(
        target=config.target, draft=config.draft, weights=config.weights, tasks=(task.name,), split=config.split,
        methods=tuple(methods), heads=tuple(heads), num_assistant_tokens=(config.num_assistant_tokens,),
        temperatures=(config.temperature,), max_new_tokens=config.max_new_tokens, num_examples=stop,
        first_example=start, timed_examples=0, ar_examples=0, batch_size=config.batch_size, seed=config.seed,
        dtype=config.dtype, threads=config.threads, output_dir=str(Path(config.output_dir) / phase),
        data_dir=config.data_dir, measure_costs=False, progress=config.progress,
        command=config.command or "run_tune(TuneConfig(...))",
    )  # fmt: skip


def planned_keys(config: BenchConfig) -> set[tuple]:
    """The record keys a bench run plans (rows counted, not loaded)."""
    rows = {task: [{}] * config.num_examples for task in config.tasks}
    return {p.key for p in plan_generations(config, rows) if p.engine == "sampler"}


def import_records(sources, config: BenchConfig) -> int:
    """Copy into ``config``'s results file the records of ``sources`` that this run plans (same task, split, row,
    method, head, T, N, max_new_tokens, models, dtype and seed): they are not generated again. Returns how many."""
    wanted = planned_keys(config)
    results = config.output_path / RESULTS_FILE
    have = {record_key(r) for r in load_records(results)}
    new = {}
    for source in sources:
        for record in load_records(source):
            key = record_key(record)
            if key in wanted and key not in have and key not in new:
                new[key] = record
    if new:
        writer = _Appender(results)
        try:
            for record in new.values():
                writer.write(record)
        finally:
            writer.close()
    return len(new)


def _phase_rows(config: BenchConfig) -> list[dict]:
    """The summary rows of a phase's planned records (its folder may hold others)."""
    keys = planned_keys(config)
    return summarize_records([r for r in load_records(config.output_path / RESULTS_FILE) if record_key(r) in keys])


def _point(row: dict, max_drop: float | None = None) -> dict:
    point = {
        "method": method_label(row),
        "n": row["n"],
        "acceptance": row.get("acceptance_rate"),
        "tokens_per_round": row.get("mean_accepted_per_round"),
        "quality": row.get("quality"),
        "quality_ci": row.get("quality_ci"),
        "paired_diff": 0.0 if row["method"] == "exact" else row.get("paired_diff"),
        "paired_diff_ci": [0.0, 0.0] if row["method"] == "exact" else row.get("paired_diff_ci"),
    }
    ci = point["paired_diff_ci"]
    point["budget_needed"] = None if ci is None else max(0.0, -ci[0])  # the smallest --max-drop it meets
    if max_drop is not None:
        point["meets_budget"] = meets_budget(point, max_drop)
    return point


def meets_budget(point: dict, max_drop: float) -> bool:
    """Exact SD always; another rule when its paired interval's lower end is >= -max_drop."""
    ci = point.get("paired_diff_ci")
    return point["method"] == "exact" or (ci is not None and ci[0] >= -max_drop - 1e-9)


def choose_rule(rows: list[dict], max_drop: float) -> dict:
    """The choice on summary rows (:func:`~hf_diversed.evaluation.bench.summarize_records` of one task, T and N):
    the highest-acceptance rule among those meeting the budget (:data:`CRITERION`). Returns the chosen point, every
    point (``meets_budget`` each) and a one-line ``message``."""
    points = [_point(r, max_drop) for r in rows if r["method"] != "ar" and r.get("acceptance_rate") is not None]
    exact = next((p for p in points if p["method"] == "exact"), None)
    if exact is None:
        raise BenchError("the calibration records hold no exact SD rows: the budget is judged against it.")
    eligible = [p for p in points if p["meets_budget"]]
    # ties: the better quality, then exact SD (no relaxation for nothing)
    chosen = max(eligible, key=lambda p: (p["acceptance"], p["quality"] or 0.0, p["method"] == "exact"))
    relaxed = [p for p in points if p["method"] != "exact"]
    if chosen["method"] != "exact":
        lo, hi = chosen["paired_diff_ci"]
        message = (
            f"{chosen['method']}: acceptance {100 * chosen['acceptance']:.1f}% "
            f"(exact SD {100 * exact['acceptance']:.1f}%), "
            f"quality {chosen['paired_diff']:+.1f} [{lo:+.1f}, {hi:+.1f}] points against the target "
            f"(budget -{max_drop:g})"
        )
        fallback = False
    elif len(eligible) == 1:
        message = (
            f"no rule meets the budget (a loss of at most {max_drop:g} points, judged on the paired interval's lower "
            f"end) among {len(relaxed)}: use exact SD (the target's law; acceptance {100 * exact['acceptance']:.1f}%)"
        )
        fallback = True
    else:
        message = "no rule within the budget accepts more than exact SD: use exact SD (the target's law)"
        fallback = True
    return {"chosen": chosen, "exact": exact, "points": points, "fallback": fallback, "message": message}


def usage(method: str, head: str | None, temperature: float, n: int) -> dict[str, str]:
    """How to use the choice: ``generate`` and vLLM, with the rule spec (or the head)."""
    if head:
        argument, extra = f'diversed_head="{head}"', {"diversed_head": head}
    else:
        argument, extra = f'diversed_verifier="{method}"', {"diversed_verifier": method}
        if method.startswith("token-class:"):
            argument += ", tokenizer=tokenizer"
    sampling = "do_sample=False" if temperature == 0 else f"do_sample=True, temperature={temperature:g}"
    return {
        "generate": f"model.generate(**inputs, assistant_model=draft, {argument}, {sampling}, "
        f"num_assistant_tokens={n})",
        "vllm": f"SamplingParams(temperature={temperature:g}, extra_args={json.dumps(extra)})",
        "vllm_server_default": f"--additional-config '{json.dumps(extra)}'",
    }


def speed_command(config: TuneConfig, task, method: str, head: str | None, dtype: str) -> str:
    """The timed bench (real batch-1 loop, the target alone beside it) that measures the choice's speed."""
    methods = "exact" if method == "exact" else f"exact,{'diversed' if head else method}"
    argv = ["hf-diversed", "bench", "--target", config.target, "--draft", config.draft, "--tasks", task.name,
            "--methods", methods, *(["--head", head] if head else []), "--temperature", f"{config.temperature:g}",
            "--num-examples", "10", "--timed-examples", "10", "--max-new-tokens", str(config.max_new_tokens),
            "--num-assistant-tokens", str(config.num_assistant_tokens), "--dtype", dtype,
            "--output-dir", str(Path(config.output_dir) / "timed")]  # fmt: skip
    return shlex.join(argv)


def _check_rows(config: TuneConfig, task) -> None:
    """Both row ranges start inside the split (a range may end past it: the rows there are used)."""
    from .tasks import DataNotFoundError, TaskError

    try:
        available = len(task.load(config.split, config.data_dir))
    except (DataNotFoundError, TaskError, ImportError) as err:
        raise BenchError(str(err)) from None
    for option, (start, stop) in (("--calibration-rows", config.calibration_rows),
                                  ("--heldout-rows", config.heldout_rows)):  # fmt: skip
        if start >= available:
            raise BenchError(
                f"{task.name}/{config.split} has {available} rows, none in {option} {start}:{stop}; pass a range "
                "within them (row indices count from 0)."
            )


def _log(config: TuneConfig, message: str) -> None:
    if config.progress:
        print(f"[hf-diversed tune] {message}", file=sys.stderr, flush=True)


def run_tune(config: TuneConfig) -> dict:
    """Sweep on the calibration rows, choose (:func:`choose_rule`), confirm on the held-out rows; write
    ``tune.json`` and ``frontier.png`` into ``config.output_dir`` and return what ``tune.json`` holds."""
    task = resolve_task(config)
    _check_rows(config, task)
    methods = sweep_methods(config, task)
    heads = tuple(config.heads)
    head_name = {_canonical_model(h): h for h in heads}

    calibration = bench_config(config, task, CALIBRATION_DIR, methods, heads)
    copied = import_records(config.records_from, calibration)
    _log(config, f"calibration rows {calibration.first_example}:{calibration.num_examples}, {len(methods)} rules "
                 f"({copied} records taken from --records-from)")  # fmt: skip
    run_bench(calibration)
    rows = [r for r in _phase_rows(calibration) if r["N"] == config.num_assistant_tokens]
    choice = choose_rule(rows, config.max_drop)
    chosen = choice["chosen"]
    method, _, head_id = chosen["method"].partition("@")
    head = head_name.get(head_id, head_id) if head_id else None
    _log(config, f"calibration: {choice['message']}")

    planned = planned_keys(calibration)
    records = [r for r in load_records(calibration.output_path / RESULTS_FILE) if record_key(r) in planned]
    frontier_rows = [r for r in rows if r["method"] == "exact" or r["method"].startswith("static:")]
    accs, fitted = fitted_frontier([(r["acceptance_rate"], r["quality"]) for r in frontier_rows])
    versus = None if method in ("exact",) or method.startswith("static:") else compare_to_frontier(
        records, method_label({"method": method, "head": head_id or None})
    )  # fmt: skip

    heldout = bench_config(config, task, HELDOUT_DIR, ("exact",) if method == "exact" else ("exact", method),
                           (head,) if head else ())  # fmt: skip
    copied = import_records(config.records_from, heldout)
    what = "exact SD" if method == "exact" else f"{chosen['method']} and exact SD"
    _log(config, f"held-out rows {heldout.first_example}:{heldout.num_examples}: {what} "
                 f"({copied} records taken from --records-from)")  # fmt: skip
    run_bench(heldout)
    held_rows = [r for r in _phase_rows(heldout) if r["N"] == config.num_assistant_tokens]
    held = {p["method"]: p for p in (_point(r) for r in held_rows if r["method"] != "ar")}
    confirm = dict(held[chosen["method"]])
    confirm["exact_acceptance"] = held["exact"]["acceptance"]
    confirm["exact_quality"] = held["exact"]["quality"]
    confirm["holds"] = meets_budget(confirm, config.max_drop)
    if method == "exact":
        confirm["verdict"] = "exact SD has the target's law: nothing to confirm"
    else:
        lo, hi = confirm["paired_diff_ci"] or (float("nan"), float("nan"))
        confirm["verdict"] = (
            f"{'holds' if confirm['holds'] else 'does not hold'}: {confirm['paired_diff']:+.1f} [{lo:+.1f}, {hi:+.1f}]"
            f" points against the target (budget -{config.max_drop:g}), acceptance {100 * confirm['acceptance']:.1f}%"
            f" (exact SD {100 * confirm['exact_acceptance']:.1f}%)"
        )

    out = Path(config.output_dir)
    result = {
        "schema": SCHEMA_VERSION,
        "command": config.command,
        "rule": method,
        "head": head,
        "spec": {"diversed_head": head} if head else {"diversed_verifier": method},
        "fallback_to_exact": choice["fallback"],
        "message": choice["message"],
        "budget": {"max_drop": config.max_drop, "criterion": CRITERION},
        "task": {
            "name": task.name,
            "source": task.source(config.split, config.data_dir),
            "metric": task.metric_name,
            "reward": getattr(task, "reward_spec", None),
        },  # fmt: skip
        "models": {
            "target": calibration.target_id,
            "draft": calibration.draft_id,
            "heads": list(heads),
            "weights": config.weights,
            "dtype": calibration.dtype,
        },  # fmt: skip
        "settings": {
            "split": config.split,
            "calibration_rows": list(config.calibration_rows),
            "heldout_rows": list(config.heldout_rows),
            "temperature": config.temperature,
            "num_assistant_tokens": config.num_assistant_tokens,
            "max_new_tokens": config.max_new_tokens,
            "seed": config.seed,
            "sample_seed": "seed + row index",
        },  # fmt: skip
        "calibration": {
            "n": chosen["n"],
            "chosen": chosen,
            "points": choice["points"],
            "frontier": {"methods": [r["method"] for r in frontier_rows], "acceptance": accs, "quality": fitted},
            "chosen_vs_frontier": versus,
        },
        "heldout": confirm,
        "usage": usage(method, head, config.temperature, config.num_assistant_tokens),
        "speed_command": speed_command(config, task, method, head, calibration.dtype),
        "files": {"calibration": CALIBRATION_DIR, "heldout": HELDOUT_DIR, "plot": FRONTIER_PLOT},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / TUNE_FILE).write_text(json.dumps(_clean(result), indent=2) + "\n", encoding="utf-8")
    try:
        from .plotting import plot_tune_choice

        plot_tune_choice(rows, out / FRONTIER_PLOT, chosen=chosen["method"], max_drop=config.max_drop)
    except ImportError as err:  # pragma: no cover - matplotlib is in the bench extra
        print(f"warning: no plot ({err}); pip install 'hf-diversed[bench]'", file=sys.stderr)
    return result
