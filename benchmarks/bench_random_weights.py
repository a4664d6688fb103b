"""The real pair's speed where its weights cannot go: the same architectures with random weights.

What one position costs depends on the shapes, not on the weights' values, so a model built from the real
``config.json`` (``benchmarks/configs/``) with random weights decodes as fast as the real one. On a machine the
weights cannot reach (a lent GPU machine takes 64 MiB), this measures:

- the speed model's costs: c (draft / target seconds per token of plain greedy ``generate`` at batch 1) and v (one
  target forward over N + 1 tokens / over 1 token), exactly as ``hf-diversed bench`` measures them;
- the batched sampler's throughput at each batch size: B rows (``--rules-per-prompt`` rules sharing each prompt's
  prefill, as in an evaluation), ``--max-new-tokens`` tokens each.

- with ``--compiled``, the same costs for the static-cache compiled path (``cache_implementation="static"`` and a
  ``compile_config``; CUDA graphs on a GPU) beside the eager ones, and the loop's time per round at full acceptance
  (``static:0``: N draft steps, one verification and the loop's own work) against its bare forwards
  N·t_draft + v·t_target. The static loop always drafts N, so a round costs that at any acceptance and the
  speedup over the target alone (in the same mode) at τ tokens per round is τ·t_target / round.

Acceptance and quality need the real weights; combine these costs with τ measured on the real pair
(``docs/results.md``, ``--tau``) or with a per-token acceptance α (``--acceptance``, τ = (1 − α^(N+1)) / (1 − α)):
speedup = τ / (N·c + v).

    python benchmarks/bench_random_weights.py --device cuda --dtype bfloat16 --batch-sizes 32,128,256
    python benchmarks/bench_random_weights.py --device cuda --compiled --batch-sizes "" --tau 3.56,4.27
    python benchmarks/bench_random_weights.py --device cuda --compiled --batch-sizes "" \
        --target-config benchmarks/configs/llama-3.1-8b-instruct.json \
        --draft-config benchmarks/configs/llama-3.2-1b-instruct.json --acceptance 0.8
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, CompileConfig

from hf_diversed.evaluation.bench.costs import (
    measure_compiled_costs,
    measure_costs,
    round_seconds_at_full_acceptance,
    synchronize,
)
from hf_diversed.generation.batched import SamplerConfig, SampleRequest, sample_batched
from hf_diversed.modeling.dtypes import cpu_capability

CONFIGS = Path(__file__).parent / "configs"
RULES = ["exact", "static:0", "static:0.1", "static:0.3", "static:0.5", "static:0.7", "static:0.9", "lossy:0.5"]


def build(config_file: Path, device: torch.device, dtype: torch.dtype, seed: int):
    """A causal LM of ``config_file``'s architecture with random weights, initialised on ``device``."""
    config = AutoConfig.for_model(**json.loads(config_file.read_text()))
    torch.manual_seed(seed)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.assistant_confidence_threshold = 0.0
    return model.eval()


def _ordinary_ids(model) -> tuple[int, int]:
    """A range of token ids clear of the special tokens at either end of the vocabulary."""
    vocab = model.config.vocab_size
    return vocab // 100, vocab // 2


def sampler_throughput(target, draft, batch: int, args, device: torch.device) -> dict:
    """One wave of ``batch`` rows: seconds, new tokens and tokens/s end to end (prefill included)."""
    per_prompt = min(args.rules_per_prompt, len(RULES))
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(*_ordinary_ids(target), (1, args.prompt_tokens), generator=g) for _ in range(batch)]
    requests = [
        SampleRequest(prompts[i // per_prompt], RULES[i % per_prompt], seed=i) for i in range(batch)
    ]  # fmt: skip
    config = SamplerConfig(max_new_tokens=args.max_new_tokens, num_assistant_tokens=args.num_assistant_tokens)
    synchronize()
    start = time.perf_counter()
    tokens = sum(r.completion_ids.numel() for r in sample_batched(target, draft, requests, config, batch_size=batch))
    synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {"B": batch, "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds, "peak_gib": peak}


def compiled_comparison(target, draft, prompt, args, device: torch.device) -> list[dict]:
    """Eager and compiled: per-token costs, c, v, the loop's round at full acceptance and the speedups at ``--tau``."""
    n = args.num_assistant_tokens
    mode = "reduce-overhead" if device.type == "cuda" else "default"
    config = CompileConfig(fullgraph=True, dynamic=False, mode=mode)
    taus = [float(t) for t in args.tau.split(",") if t]
    taus += [
        (1 - a ** (n + 1)) / (1 - a) if a < 1 else n + 1.0 for a in (float(x) for x in args.acceptance.split(",") if x)
    ]
    rows = []
    # one static cache length for every compiled call: the round's, so the bare forwards are timed on the same cache
    cache_len = prompt.shape[1] + args.max_new_tokens + 1
    static = {"cache_implementation": "static", "compile_config": config, "max_cache_len": cache_len}
    for name, extra in (("eager", {}), ("compiled", static)):
        start = time.perf_counter()
        if extra:
            costs = measure_compiled_costs(target, draft, prompt, n, config, cache_len=cache_len)
            t_alone, t_d, t_verify = (costs[k] for k in ("target_alone_seconds_per_token", "draft_step_seconds",
                                                         "verify_seconds"))  # fmt: skip
        else:
            costs = measure_costs(target, draft, prompt, [n])
            t_alone, t_d = costs["target_seconds_per_token"], costs["draft_seconds_per_token"]
            t_verify = costs["v"][str(n)] * t_alone
        v = costs["v"][str(n)]
        round_s = round_seconds_at_full_acceptance(target, draft, prompt, n, args.max_new_tokens, **extra)
        rows.append({"mode": name, "target_ms": 1e3 * t_alone, "draft_ms": 1e3 * t_d, "c": costs["c"], "v": v,
                     "verify_ms": 1e3 * t_verify, "round_ms": 1e3 * round_s,
                     "round_vs_forwards": round_s / (n * t_d + t_verify),
                     "speedups": {f"{tau:.2f}": tau * t_alone / round_s for tau in taus},
                     "tau_model": {f"{tau:.2f}": tau / (n * costs["c"] + v) for tau in taus},
                     "costs": costs, "seconds": time.perf_counter() - start})  # fmt: skip
    print("| mode | target alone ms/token | draft step ms | c | v | verification ms | round ms (full acceptance) | "
          "round / its forwards | "
          + " | ".join(f"speedup at τ = {k}" for k in rows[0]["speedups"]) + " |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|" + "---|" * len(taus))
    for r in rows:
        speedups = " | ".join(f"{s:.2f}x (τ model {r['tau_model'][k]:.2f}x)" for k, s in r["speedups"].items())
        print(f"| {r['mode']} | {r['target_ms']:.2f} | {r['draft_ms']:.2f} | {r['c']:.3f} | {r['v']:.2f} | "
              f"{r['verify_ms']:.1f} | {r['round_ms']:.1f} | {r['round_vs_forwards']:.2f} | {speedups} |")  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target-config", type=Path, default=CONFIGS / "qwen2.5-coder-1.5b-instruct.json")
    parser.add_argument("--draft-config", type=Path, default=CONFIGS / "qwen2.5-coder-0.5b-instruct.json")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--batch-sizes", default="32,128")
    parser.add_argument("--prompt-tokens", type=int, default=130, help="about a GSM8K chat prompt")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rules-per-prompt", type=int, default=8)
    parser.add_argument("--num-assistant-tokens", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--output", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--compiled", action="store_true", help="also time the static-cache compiled path")
    parser.add_argument("--tau", default="", help="tokens per round to turn into speedups, e.g. Table 1's: 3.56,4.27")
    parser.add_argument("--acceptance", default="", help="per-token acceptance rates to turn into τ, e.g. 0.8")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    target = build(args.target_config, device, dtype, seed=0)
    draft = build(args.draft_config, device, dtype, seed=1)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU {cpu_capability()}"
    print(f"{where}; {args.dtype}; torch {torch.__version__}; threads {torch.get_num_threads()}")

    prompt = torch.randint(*_ordinary_ids(target), (1, args.prompt_tokens), generator=torch.Generator().manual_seed(0))
    costs = measure_costs(target, draft, prompt.to(device), [args.num_assistant_tokens])
    v = costs["v"][str(args.num_assistant_tokens)]
    print(
        f"\ntarget {costs['target_seconds_per_token'] * 1e3:.2f} ms/token, draft "
        f"{costs['draft_seconds_per_token'] * 1e3:.2f} ms/token: c = {costs['c']:.3f}, v = {v:.2f} "
        f"(N = {args.num_assistant_tokens}); speedup = τ / ({args.num_assistant_tokens}·c + v) = "
        f"τ / {args.num_assistant_tokens * costs['c'] + v:.2f}\n"
    )
    compiled = compiled_comparison(target, draft, prompt.to(device), args, device) if args.compiled else None
    rows = [sampler_throughput(target, draft, int(b), args, device) for b in args.batch_sizes.split(",") if b]
    print("| B | new tokens | seconds | tok/s (prefill included) | peak GPU memory GiB |")
    print("|---|---|---|---|---|")
    for r in rows:
        peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
        print(f"| {r['B']} | {r['tokens']} | {r['seconds']:.1f} | {r['tok_s']:.0f} | {peak} |")
    if args.output:
        record = {"device": where, "dtype": args.dtype, "torch": torch.__version__, "cuda": torch.version.cuda,
                  "costs": costs, "sampler": rows, "compiled": compiled,
                  "arguments": {k: str(v) for k, v in vars(args).items()}}  # fmt: skip
        args.output.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
