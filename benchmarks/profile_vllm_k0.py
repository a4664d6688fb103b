"""Profile vLLM's decoding at a full batch: the target alone beside the speculative engine forced to draft nothing.

Engines: ``ar`` (the target alone), ``k0`` (the draft-model engine with the policy's ``force_k`` 0: every step the
target's own) and ``k0-vllm`` (the same with vLLM's rejection sampler at every step, as before the plugin sampled a
step without drafts with the plain sampler).

Both engines run in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) under cProfile, one after the other, each
over the same requests (T = 1, seeded, fixed length); the tables give each run's seconds and the functions whose
own seconds (cProfile's tottime) differ most from the target alone's. A step that drafts nothing should cost what
the target's own step does (docs/vllm/load/README.md). Run in vLLM's environment, machine alone::

    VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_OMP_THREADS_BIND=0 .venv-vllm/bin/python benchmarks/profile_vllm_k0.py \\
        --requests 8 --max-tokens 96 --order ar,k0,k0-vllm,ar,k0,k0-vllm
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import sys
import time
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, so that cProfile sees its steps

MODELS = Path.home() / ".cache" / "hf_diversed" / "models"
PROMPT = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
          "clips did Natalia sell altogether in April and May? ") * 3  # fmt: skip


def run(engine: str, args) -> tuple[float, int, dict[str, float]]:
    """(seconds, tokens, own seconds per function) of one engine's decoding of the requests."""
    from vllm import LLM, SamplingParams

    settings = dict(model=args.target, dtype=args.dtype, max_model_len=2048, enforce_eager=True, seed=0,
                    max_num_seqs=args.requests, enable_prefix_caching=False)  # fmt: skip
    extra = None
    from hf_diversed.integrations.vllm import _compat

    verifies_drafts = _compat.verifies_drafts
    if engine == "k0-vllm":
        _compat.verifies_drafts = lambda metadata: True
    if engine.startswith("k0"):
        settings["speculative_config"] = {"method": "draft_model", "model": args.draft, "num_speculative_tokens": 5,
                                          "draft_sample_method": "probabilistic"}  # fmt: skip
        settings["additional_config"] = {"diversed_draft_policy": {"force_k": 0}}
        extra = {"diversed_verifier": args.rule}
    llm = LLM(**settings)
    llm.generate([PROMPT], SamplingParams(max_tokens=8), use_tqdm=False)  # warm-up
    params = [SamplingParams(temperature=1.0, max_tokens=args.max_tokens, ignore_eos=True, seed=i, extra_args=extra)
              for i in range(args.requests)]  # fmt: skip
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    outs = llm.generate([f"Problem {i}: {PROMPT}" for i in range(args.requests)], params, use_tqdm=False)
    profile.disable()
    seconds = time.perf_counter() - start
    stats = pstats.Stats(profile).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    own = {f"{Path(f).name}:{line}({name})": tt for (f, line, name), (_, _, tt, _, _) in stats.items()}
    del llm
    gc.collect()
    _compat.verifies_drafts = verifies_drafts
    return seconds, sum(len(o.outputs[0].token_ids) for o in outs), own


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=str(MODELS / "qwen2.5-coder-1.5b-instruct"))
    parser.add_argument("--draft", default=str(MODELS / "qwen2.5-coder-0.5b-instruct"))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rule", default="cascade-opt:0.1", help="the speculative engine's requests' rule")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--order", default="ar,k0,k0-vllm,ar,k0,k0-vllm", help="ar, k0, k0-vllm, in the order run")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    import torch

    print(f"# {torch.backends.cpu.get_cpu_capability()}, {args.dtype}, torch threads {torch.get_num_threads()}, "
          f"{args.requests} requests x {args.max_tokens} tokens, K = 0 requests' rule {args.rule}")  # fmt: skip
    runs = []
    for engine in args.order.split(","):
        seconds, tokens, own = run(engine, args)
        runs.append((engine, seconds, tokens, own))
    print("\n| run | engine | seconds | tok/s |\n|---|---|---|---|")
    for i, (engine, seconds, tokens, _) in enumerate(runs, 1):
        print(f"| {i} | {engine} | {seconds:.2f} | {tokens / seconds:.2f} |")
    mean: dict[str, dict[str, list[float]]] = {}
    for engine, _, _, own in runs:
        for name, ct in own.items():
            mean.setdefault(engine, {}).setdefault(name, []).append(ct)
    avg = {e: {n: sum(v) / len(v) for n, v in m.items()} for e, m in mean.items()}
    engines = list(avg)
    if "ar" in avg and len(engines) > 1:
        functions = set().union(*avg.values())
        spread = {n: max(abs(avg[e].get(n, 0.0) - avg["ar"].get(n, 0.0)) for e in engines) for n in functions}
        names = sorted(spread, key=lambda n: -spread[n])
        print("\nFunctions whose own seconds differ most from the target alone's (mean over runs):\n")
        print("| function | " + " | ".join(f"{e} s" for e in engines) + " |\n|---|" + "---|" * len(engines))
        for name in names[: args.top]:
            print(f"| {name} | " + " | ".join(f"{avg[e].get(name, 0.0):.2f}" for e in engines) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
