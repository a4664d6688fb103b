"""What copying key/value heads costs speculative decoding on CPU, and what attending them in place saves.

transformers' SDPA path copies each key/value head ``num_key_value_groups`` times (``repeat_kv``) whenever a
forward has several query positions and a mask: every verification forward (the target scores N + 1 positions on
its cache) and the draft's multi-token forwards. A plain decode step (one position) avoids the copies, so they tax
speculative decoding only, more as the cache grows. A DIVERSED ``generate`` on CPU attends the grouped heads in
place (``_compat.grouped_attention_on_cpu``); this measures both ways side by side, alternating, in one process:

1. the target's verification forward (N + 1 tokens on a cache of L tokens) and its one-token decode forward, so
   v = verification / decode, at several L;
2. ``generate`` with a verification rule, end to end: tokens/s both ways, and whether the tokens are identical.

What a forward costs depends on the shapes, not the weights' values, so by default both models are built from the
real pair's ``config.json`` (``benchmarks/configs/``) with random weights; ``--real`` loads the real pair and
generates on GSM8K test prompts instead.

    OMP_NUM_THREADS=2 python benchmarks/bench_grouped_attention.py --threads 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import torch

from hf_diversed.generation import _compat
from hf_diversed.modeling.dtypes import cpu_capability

CONFIGS = Path(__file__).parent / "configs"


@contextlib.contextmanager
def copies(on: bool):
    """transformers' own choice (copies) while ``on``, a DIVERSED generate included; otherwise the grouped path."""
    if not on:
        with _compat.grouped_attention_on_cpu():
            yield
        return
    patch = _compat.grouped_attention_patch
    grouped, patch.replacement = patch.replacement, _compat.original_use_gqa_in_sdpa
    try:
        yield
    finally:
        patch.replacement = grouped


def _seconds(fn, repeats: int) -> dict[bool, float]:
    """Median seconds of ``fn()`` with copies (True) and grouped (False), alternating so drift hits both."""
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(2 * repeats + 2):
        on = bool(i % 2)
        with copies(on):
            start = time.perf_counter()
            fn()
            if i >= 2:  # the first of each is a warm-up
                times[on].append(time.perf_counter() - start)
    return {on: statistics.median(t) for on, t in times.items()}


@torch.no_grad()
def forwards(model, lengths: list[int], n: int, repeats: int) -> list[dict]:
    """Verification (n + 1 tokens) and decode (1 token) forwards on a cache of each length, both ways."""
    rows = []
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    for length in lengths:
        ids = torch.randint(vocab // 100, vocab // 2, (1, length + n + 1), generator=g)
        cache = model(ids[:, :length], use_cache=True).past_key_values

        def step(width: int, ids=ids, cache=cache, length=length) -> None:
            mask = torch.ones(1, length + width, dtype=torch.long)
            model(ids[:, length : length + width], attention_mask=mask, past_key_values=cache, use_cache=True)
            cache.crop(-width)

        verify, decode = _seconds(lambda: step(n + 1), repeats), _seconds(lambda: step(1), repeats)  # noqa: B023
        rows.append({"L": length, "verify_copies": verify[True], "verify_grouped": verify[False],
                     "decode_copies": decode[True], "decode_grouped": decode[False]})  # fmt: skip
    return rows


@torch.no_grad()
def end_to_end(target, draft, prompts: list[torch.Tensor], args) -> dict:
    """Tokens/s of ``generate(..., diversed_verifier=args.rule)`` both ways (alternating per prompt)."""
    seconds, tokens, same = {True: 0.0, False: 0.0}, {True: 0, False: 0}, True
    kwargs = dict(assistant_model=draft, diversed_verifier=args.rule, do_sample=True,
                  max_new_tokens=args.max_new_tokens, num_assistant_tokens=args.num_assistant_tokens)  # fmt: skip
    for i, prompt in enumerate(prompts):
        out = {}
        for on in (True, False) if i % 2 else (False, True):
            with copies(on):
                torch.manual_seed(i)
                start = time.perf_counter()
                out[on] = target.generate(prompt, **kwargs)
                seconds[on] += time.perf_counter() - start
                tokens[on] += out[on].shape[1] - prompt.shape[1]
        same = same and torch.equal(out[True], out[False])
    return {"tok_s_copies": tokens[True] / seconds[True], "tok_s_grouped": tokens[False] / seconds[False],
            "tokens": tokens[False], "identical_tokens": same}  # fmt: skip


def _random_pair(args):
    import runpy

    build = runpy.run_path(str(Path(__file__).parent / "bench_random_weights.py"))["build"]
    target = build(args.target_config, torch.device("cpu"), torch.float32, seed=0)
    draft = build(args.draft_config, torch.device("cpu"), torch.float32, seed=1)
    vocab = target.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(vocab // 100, vocab // 2, (1, args.prompt_tokens), generator=g) for _ in range(args.prompts)
    ]
    return target, draft, prompts, "random weights from " + args.target_config.name


def _real_pair(args):
    from hf_diversed.evaluation.models import load_pair
    from hf_diversed.evaluation.real_models import DRAFT_NAME, TARGET_NAME
    from hf_diversed.evaluation.tasks import get_task

    tokenizer, target, draft = load_pair(TARGET_NAME, DRAFT_NAME, torch.float32)
    draft.generation_config.assistant_confidence_threshold = 0.0
    task = get_task("gsm8k")
    prompts = [
        tokenizer.apply_chat_template(
            task.build_messages(row), add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        for row in task.load("test").select(range(args.prompts))
    ]
    return target, draft, prompts, "the real pair, GSM8K test prompts"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target-config", type=Path, default=CONFIGS / "qwen2.5-coder-1.5b-instruct.json")
    parser.add_argument("--draft-config", type=Path, default=CONFIGS / "qwen2.5-coder-0.5b-instruct.json")
    parser.add_argument("--real", action="store_true", help="the real pair (float32) instead of random weights")
    parser.add_argument("--lengths", default="128,256,512,768", help="cached tokens before a verification forward")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-assistant-tokens", type=int, default=5)
    parser.add_argument("--rule", default="exact", help="verification rule of the end-to-end generate")
    parser.add_argument("--prompts", type=int, default=2, help="end-to-end prompts (0: skip that part)")
    parser.add_argument("--prompt-tokens", type=int, default=130)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--output", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target, draft, prompts, what = (_real_pair if args.real else _random_pair)(args)
    print(f"CPU {cpu_capability()}; float32; torch {torch.__version__}; threads {torch.get_num_threads()}; {what}\n")

    n = args.num_assistant_tokens
    rows = forwards(target, [int(x) for x in args.lengths.split(",")], n, args.repeats)
    print(f"Target forwards (median of {args.repeats}), milliseconds:\n")
    print(f"| cached L | verify {n + 1} tokens, copies | grouped | saved | decode 1 token | v copies | v grouped |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        decode = r["decode_grouped"]
        print(f"| {r['L']} | {r['verify_copies'] * 1e3:.1f} | {r['verify_grouped'] * 1e3:.1f} | "
              f"{1 - r['verify_grouped'] / r['verify_copies']:.0%} | {decode * 1e3:.1f} | "
              f"{r['verify_copies'] / decode:.2f} | {r['verify_grouped'] / decode:.2f} |")  # fmt: skip
    record = {"cpu": cpu_capability(), "torch": torch.__version__, "threads": torch.get_num_threads(), "models": what,
              "forwards": rows, "arguments": {k: str(v) for k, v in vars(args).items()}}  # fmt: skip
    if prompts:
        e2e = end_to_end(target, draft, prompts[: args.prompts], args)
        record["generate"] = e2e
        ratio = e2e["tok_s_grouped"] / e2e["tok_s_copies"]
        print(f"\ngenerate(diversed_verifier={args.rule!r}), {len(prompts)} prompts, {e2e['tokens']} new tokens: "
              f"{e2e['tok_s_copies']:.2f} tok/s with copies, {e2e['tok_s_grouped']:.2f} grouped ({ratio:.2f}x); "
              f"identical tokens: {e2e['identical_tokens']}")  # fmt: skip
    if args.output:
        args.output.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
