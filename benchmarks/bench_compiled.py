"""The static-cache, compiled speculative loop against the eager one, on the real pair, batch 1, one run side by side.

For each task (Table 1's first rows), each prompt and each method (the target alone, exact SD, static 0.5, the task's
bundled head), eager (dynamic cache, the default ``generate``) and compiled (``cache_implementation="static"`` with a
``compile_config``; the target alone through transformers' own static-cache compiled ``generate``; on a CPU with
every linear layer on oneDNN's blocked weights, ``pack_linear_weights``, unless ``--no-pack``: a second copy of the
pair, so eager runs the models as loaded), interleaved:
tokens/s, acceptance, tokens per round τ, and the τ model's prediction τ / (N·c + v) from the per-token costs
measured in the same mode in the same run. Warm-up (the first call's extra time, compilation included, and for the
compiled loop the compilation of every attention window ahead, ``compile_windows``) is recorded per mode and
method. Records go to ``--output-dir`` as they come; a rerun resumes.

    python benchmarks/bench_compiled.py                                   # GSM8K and MBPP, 10 rows, 512 tokens
    python benchmarks/bench_compiled.py --tasks gsm8k --num-examples 2 --max-new-tokens 64 --output-dir /tmp/c
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch._dynamo
from transformers import CompileConfig

from hf_diversed import compile_windows, pack_linear_weights
from hf_diversed.evaluation.bench.costs import (
    measure_compiled_costs,
    measure_costs,
    round_seconds_at_full_acceptance,
    tau_speedup,
)
from hf_diversed.evaluation.methods import Method, timed_generate
from hf_diversed.evaluation.models import load_pair
from hf_diversed.evaluation.real_models import DRAFT_NAME, TARGET_NAME
from hf_diversed.evaluation.tasks import get_task
from hf_diversed.generation import _compat
from hf_diversed.generation.static_loop import RECOMPILE_LIMIT
from hf_diversed.modeling.dtypes import cpu_capability, resolve_dtype
from hf_diversed.modeling.hub import load_head
from hf_diversed.modeling.pretrained import head_for_task, seed_pretrained_heads

METHODS = ("ar", "exact", "static:0.5", "diversed")
MODES = ("eager", "compiled")
IDS_DIR = Path(__file__).resolve().parents[1] / "docs" / "table1"


def compile_config(args) -> CompileConfig:
    options = {"freezing": True} if args.freezing else None
    mode = "reduce-overhead" if torch.cuda.is_available() else "default"
    return CompileConfig(fullgraph=True, dynamic=False, mode=mode, options=options)


def mode_kwargs(method: Method, mode: str, config: CompileConfig, cache_len: int) -> dict:
    """``generate``'s arguments for ``mode``; compiled: static caches of ``cache_len`` positions for every call (the
    longest prompt plus the new tokens), so the warm-up compiles the very graphs the timed calls run."""
    if mode == "eager":
        return {}
    static = {"cache_implementation": "static", "max_cache_len": cache_len}
    if method.spec == "ar":  # transformers compiles its own static-cache loop only on accelerators unless told
        return {**static, "compile_config": _compat.compile_on_every_device(config)}
    return {**static, "compile_config": config}


def costs(target, draft, input_ids, n: int, mode: str, config: CompileConfig, repeats: int, cache_len: int) -> dict:
    """Per-token seconds of the target alone and of a draft step, one verification's seconds, c and v, and the
    loop's round at full acceptance, in ``mode``."""
    if mode == "compiled":
        m = measure_compiled_costs(target, draft, input_ids, n, config, repeats=repeats, cache_len=cache_len)
        out = {"target_seconds_per_token": m["target_alone_seconds_per_token"],
               "draft_seconds_per_token": m["draft_step_seconds"], "verify_seconds": m["verify_seconds"],
               "c": m["c"], "v": m["v"][str(n)]}  # fmt: skip
    else:
        m = measure_costs(target, draft, input_ids, [n], repeats=repeats)
        out = {"target_seconds_per_token": m["target_seconds_per_token"],
               "draft_seconds_per_token": m["draft_seconds_per_token"],
               "verify_seconds": m["v"][str(n)] * m["target_seconds_per_token"], "c": m["c"],
               "v": m["v"][str(n)]}  # fmt: skip
    out["round_seconds_at_full_acceptance"] = round_seconds_at_full_acceptance(
        target, draft, input_ids, n, 64, **mode_kwargs(Method("exact"), mode, config, cache_len)
    )
    return out


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=TARGET_NAME)
    parser.add_argument("--draft", default=DRAFT_NAME)
    parser.add_argument("--tasks", default="gsm8k,mbpp")
    parser.add_argument("--num-examples", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--num-assistant-tokens", type=int, default=5)
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per cost measurement (fastest kept)")
    parser.add_argument("--freezing", action="store_true", help="inductor freezing (weights folded as constants)")
    parser.add_argument("--no-pack", action="store_true", help="compiled: leave the linear weights unpacked (CPU)")
    parser.add_argument("--output-dir", default="docs/compiled/bench")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    dtype = resolve_dtype(args.dtype)
    pack = not args.no_pack and not torch.cuda.is_available()
    machine = {"cpu": cpu_capability(), "threads": torch.get_num_threads(), "dtype": dtype, "torch": torch.__version__,
               "platform": platform.platform(), "freezing": args.freezing, "packed": pack,
               "max_new_tokens": args.max_new_tokens, "num_assistant_tokens": args.num_assistant_tokens,
               "temperature": args.temperature,
               "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None}  # fmt: skip
    tokenizer, target, draft = load_pair(args.target, args.draft, getattr(torch, dtype))
    pair = {"eager": (target, draft), "compiled": (target, draft)}
    if pack:
        _, *compiled_pair = load_pair(args.target, args.draft, getattr(torch, dtype))
        pair["compiled"] = tuple(pack_linear_weights(model) for model in compiled_pair)
    for model in {*pair["eager"], *pair["compiled"]}:
        model.generation_config.pad_token_id = tokenizer.eos_token_id
    seed_pretrained_heads()
    config = compile_config(args)
    n = args.num_assistant_tokens
    common = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, num_assistant_tokens=n)
    runs, setup_path = out / "runs.jsonl", out / "setup.json"
    setup = json.loads(setup_path.read_text()) if setup_path.is_file() else {"machine": machine, "tasks": {}}
    if setup["machine"] != machine:
        raise SystemExit(f"{out} was measured on {setup['machine']}, this is {machine}: use another --output-dir.")
    done = {(r["task"], r["row"], r["method"], r["mode"]) for r in read_jsonl(runs)}

    data = {}
    for task_name in args.tasks.split(","):
        task = get_task(task_name)
        ids = [line for line in (IDS_DIR / task_name / "ids.txt").read_text().splitlines() if not line.startswith("#")]
        rows = task.load("test", ids=ids[: args.num_examples])
        prompts = [
            tokenizer.apply_chat_template(
                task.build_messages(row), add_generation_prompt=True, return_tensors="pt", return_dict=True
            )["input_ids"]
            for row in rows
        ]
        data[task_name] = (ids, rows, prompts)
    cache_len = max(p.shape[1] for *_, prompts in data.values() for p in prompts) + args.max_new_tokens + 1

    for task_name, (ids, rows, prompts) in data.items():
        head = load_head(head_for_task(task_name)).to(target.device)
        info = setup["tasks"].get(task_name)
        if info is None:  # warm-up (compilation included) and costs, once per task, before any timed record
            info = {"warm_up_seconds": {}, "costs": {}}
            for mode in MODES:
                for spec in METHODS:
                    method, short = Method(spec), {**common, "max_new_tokens": 16}
                    kwargs = mode_kwargs(method, mode, config, cache_len)
                    lm, assistant = pair[mode]
                    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                        ahead = 0.0
                        if mode == "compiled" and spec != "ar":  # every attention window the timed calls enter
                            start = time.perf_counter()
                            compile_windows(
                                lm, assistant, max_cache_len=cache_len, num_assistant_tokens=n, compile_config=config,
                                diversed_head=head if spec == "diversed" else None,
                            )  # fmt: skip
                            ahead = time.perf_counter() - start
                        first = (
                            ahead
                            + timed_generate(lm, assistant, prompts[0], method, head=head, **short, **kwargs).seconds
                        )
                        again = timed_generate(lm, assistant, prompts[0], method, head=head, **short, **kwargs).seconds
                    info["warm_up_seconds"][f"{spec} {mode}"] = first - again
                    print(f"{task_name}: warm-up {spec} {mode}: {first - again:.1f}s", flush=True)
            info["costs"] = {
                mode: costs(*pair[mode], prompts[0], n, mode, config, args.repeats, cache_len) for mode in MODES
            }
            print(f"{task_name}: costs {json.dumps(info['costs'])}", flush=True)
            setup["tasks"][task_name] = info
            setup_path.write_text(json.dumps(setup, indent=1))
        for i, (row, ids_) in enumerate(zip(rows, prompts, strict=True)):
            order = [(s, m) for s in METHODS for m in MODES]
            if i % 2:
                order.reverse()  # alternate the order to cancel drift
            for spec, mode in order:
                if (task_name, i, spec, mode) in done:
                    continue
                method = Method(spec)
                with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):  # transformers' own compiled loop
                    record = timed_generate(
                        *pair[mode],
                        ids_,
                        method,
                        head=head,
                        seed=i,
                        **common,
                        **mode_kwargs(method, mode, config, cache_len),
                    )
                stats = record.stats
                entry = {"task": task_name, "row": i, "id": row.get("id", ids[i]), "method": spec, "mode": mode,
                         "tokens": len(record.new_tokens), "seconds": record.seconds,
                         "tau": stats.mean_accepted_per_round if stats else None,
                         "acceptance": stats.acceptance_rate if stats else None,
                         "mean_w": stats.mean_weight if stats else None}  # fmt: skip
                append(runs, entry)
                print(json.dumps(entry), flush=True)
    report(out)


def round_vs_forwards(c: dict, n: int) -> float:
    """The loop's time per round at full acceptance over its bare forwards N·t_draft + t_verify."""
    return c["round_seconds_at_full_acceptance"] / (n * c["draft_seconds_per_token"] + c["verify_seconds"])


def report(out: Path) -> None:
    """Print (and write ``report.md``): per task, method and mode, tok/s, τ, the τ model, real / τ model, warm-up."""
    setup = json.loads((out / "setup.json").read_text())
    records = read_jsonl(out / "runs.jsonl")
    lines = [f"Machine: {json.dumps(setup['machine'])}", ""]
    lines += ["| task | method | mode | rows | tok/s | τ | acceptance | τ-model tok/s | real / τ model | "
              "speedup over the target alone, real / τ model | vs eager | warm-up s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    n = setup["machine"]["num_assistant_tokens"]
    for task_name, info in setup["tasks"].items():
        speed = {}
        for spec in METHODS:
            for mode in MODES:
                rs = [r for r in records if r["task"] == task_name and r["method"] == spec and r["mode"] == mode]
                if not rs:
                    continue
                tok_s = sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs)
                speed[(spec, mode)] = tok_s
                costs = info["costs"][mode]
                base = 1.0 / costs["target_seconds_per_token"]
                tau = acc = model = speedup = None
                if spec != "ar":
                    rounds = sum(r["tokens"] / r["tau"] for r in rs if r["tau"])
                    tau = sum(r["tokens"] for r in rs) / rounds if rounds else None
                    acc = statistics.fmean(r["acceptance"] for r in rs)
                    speedup = tau_speedup(tau, n, costs["c"], costs["v"])
                    model = base * speedup if speedup else None
                else:
                    model = base
                vs = tok_s / speed[(spec, "eager")] if (spec, "eager") in speed else None
                # as docs/results.md: the real speedup over the target alone in the same mode (prefill, sampling and
                # the attention's growth paid by both) over the τ model's τ / (N·c + v)
                over = "-"
                if speedup and ("ar", mode) in speed:
                    real = tok_s / speed[("ar", mode)]
                    over = f"{real:.2f}x / {speedup:.2f}x = {real / speedup:.2f}"
                lines.append(
                    f"| {task_name} | {spec} | {mode} | {len(rs)} | {tok_s:.2f} | "
                    f"{f'{tau:.2f}' if tau else '-'} | {f'{acc:.1%}' if acc is not None else '-'} | "
                    f"{model:.2f} | {tok_s / model:.2f} | {over} | {f'{vs:.2f}x' if vs else '-'} | "
                    f"{info['warm_up_seconds'].get(f'{spec} {mode}', float('nan')):.0f} |"
                )
        for mode in MODES:
            c = info["costs"][mode]
            lines.append(
                f"| {task_name} | costs | {mode} | | target {1e3 * c['target_seconds_per_token']:.1f} ms/token, "
                f"draft {1e3 * c['draft_seconds_per_token']:.1f} | c = {c['c']:.3f} | v(N) = {c['v']:.3f} | "
                f"round at full acceptance {1e3 * c['round_seconds_at_full_acceptance']:.0f} ms = "
                f"{round_vs_forwards(c, n):.2f}x its forwards | | | | |"
            )
    text = "\n".join(lines)
    (out / "report.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
