"""Where one verification step's time goes inside vLLM for a rule and for a DIVERSED head (run in vLLM's environment).

The real pair in an in-process vLLM engine (CPU backend, eager, the worker on ``VLLM_CPU_OMP_THREADS_BIND``), one
GSM8K-style prompt, ``--max-new-tokens`` tokens with ``ignore_eos``, T = 1, N = 5 probabilistic drafts; each method
runs ``--reps`` times, the methods alternating so that both meet the same machine speed. cProfile splits each run's
engine steps into the draft's proposal, the plugin's verification (``rejection_sample``) and, for a head, its
weights (``_with_head_weights``: hidden states, distribution features, the head, the weight log). Times are per
engine step and include cProfile's own overhead, the same for every method.

    .venv-vllm/bin/python benchmarks/profile_vllm_step.py --methods static:0.5,diversed --max-new-tokens 160
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the worker in this process, so cProfile sees it
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips "
    "did Natalia sell altogether in April and May? Think step by step."
)
PARTS = {  # column: (file name ends with, function)
    "step": ("v1/engine/core.py", "step"),
    "draft": ("vllm/_compat.py", "propose_draft_token_ids"),
    "verification": ("vllm/_compat.py", "rejection_sample"),
    "head weights": ("vllm/_compat.py", "_with_head_weights"),
}


def _cumulative(stats: pstats.Stats, ends: str, name: str) -> tuple[int, float]:
    """Calls and cumulative seconds of the function ``name`` in a file ending with ``ends`` (0, 0.0 if absent)."""
    for (path, _, func), (_, calls, _, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        if func == name and path.endswith(ends):
            return calls, cumulative
    return 0, 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="static:0.5,diversed", help="rules; 'diversed' is the GSM8K head")
    parser.add_argument("--head", default="hf-diversed/diversed-head-qwen2.5-coder-1.5b-gsm8k")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()

    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from hf_diversed.evaluation.real_models import ensure_pair

    target, draft = (str(path) for path in ensure_pair())  # the pair bench_vllm.py serves, where `models` put it
    ids = AutoTokenizer.from_pretrained(target).apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True
    )["input_ids"]
    llm = LLM(model=target, dtype="bfloat16", enforce_eager=True, max_model_len=2048, seed=0,
              speculative_config={"method": "draft_model", "model": draft, "num_speculative_tokens": 5,
                                  "draft_sample_method": "probabilistic"})  # fmt: skip
    xargs = {m: {"diversed_head": args.head} if m == "diversed" else {"diversed_verifier": m}
             for m in args.methods.split(",")}  # fmt: skip
    for extra in xargs.values():  # warm-up: the head loads, the first steps run
        llm.generate([{"prompt_token_ids": ids}], SamplingParams(temperature=1.0, max_tokens=16, extra_args=extra))
    print(
        "| method | rep | tokens | steps | s | ms/step | " + " | ".join(f"{c} ms/step" for c in list(PARTS)[1:]) + " |"
    )
    print("|---" * (6 + len(PARTS) - 1) + "|")
    for rep in range(args.reps):
        for method, extra in xargs.items():
            params = SamplingParams(temperature=1.0, max_tokens=args.max_new_tokens, ignore_eos=True, seed=rep,
                                    extra_args=extra)  # fmt: skip
            profile = cProfile.Profile()
            start = time.perf_counter()
            profile.enable()
            out = llm.generate([{"prompt_token_ids": ids}], params)
            profile.disable()
            seconds = time.perf_counter() - start
            stats = pstats.Stats(profile)
            steps, step_s = _cumulative(stats, *PARTS["step"])
            parts = [1000 * _cumulative(stats, *PARTS[c])[1] / max(steps, 1) for c in list(PARTS)[1:]]
            print(f"| {method} | {rep} | {len(out[0].outputs[0].token_ids)} | {steps} | {seconds:.2f} | "
                  f"{1000 * step_s / max(steps, 1):.0f} | " + " | ".join(f"{v:.1f}" for v in parts) + " |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
