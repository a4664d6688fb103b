"""Throughput of the batched law-exact sampler against the real batch-1 loop, on the same GSM8K prompts.

One run, side by side, on the real pair: tokens/s of ``sample_batched`` at B = 1, 8, 16, 32 (end to end, and in
the decode phase alone, prefill excluded), the real loop (``generate`` with exact SD, batch 1), and the bare
batched decode steps of the two models (one target + one draft forward of B rows on a cached prefix), which
bound what a walk of one position per step can reach. Prints a Markdown table and the peak resident memory.

    python benchmarks/bench_sampler.py                         # real Qwen2.5-Coder pair, --dtype auto
    python benchmarks/bench_sampler.py --batch-sizes 1,8,16,32 --max-new-tokens 64 --loop-prompts 2
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from hf_diversed.evaluation.methods import Method, timed_generate
from hf_diversed.evaluation.models import load_pair
from hf_diversed.evaluation.real_models import DRAFT_NAME, TARGET_NAME
from hf_diversed.evaluation.tasks import get_task
from hf_diversed.generation import batched
from hf_diversed.generation.batched import SamplerConfig, SampleRequest, sample_batched
from hf_diversed.modeling.dtypes import cpu_capability, resolve_dtype


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _bare_step_seconds(model, prompt: torch.Tensor, batch: int, repeats: int = 3) -> float:
    """One decode step of ``batch`` rows after a cached prefill of ``prompt`` (median of ``repeats``)."""
    ids = prompt.repeat(batch, 1)
    with torch.no_grad():
        out = model(ids, use_cache=True, logits_to_keep=1)
        cache, length = out.past_key_values, ids.shape[1]
        token = ids[:, -1:]
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            model(token, past_key_values=cache, use_cache=True, logits_to_keep=1)
            times.append(time.perf_counter() - start)
            cache.crop(-(cache.get_seq_length() - length))
    return sorted(times[1:])[len(times[1:]) // 2]


class _Timing:
    """Wraps the sampler's prefill and one-position forward to split its time into prefill and decode."""

    def __init__(self):
        self.prefill = 0.0
        self.steps = 0
        self._prefill, self._forward = batched._Sampler._prefill, batched._Sampler._forward

    def __enter__(self):
        timing = self

        def prefill(sampler, *args):
            start = time.perf_counter()
            try:
                return timing._prefill(sampler, *args)
            finally:
                timing.prefill += time.perf_counter() - start

        def forward(sampler, *args):
            timing.steps += 1
            return timing._forward(sampler, *args)

        batched._Sampler._prefill, batched._Sampler._forward = prefill, forward
        return self

    def __exit__(self, *exc):
        batched._Sampler._prefill, batched._Sampler._forward = self._prefill, self._forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=TARGET_NAME)
    parser.add_argument("--draft", default=DRAFT_NAME)
    parser.add_argument("--batch-sizes", default="1,8,16,32")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--loop-prompts", type=int, default=2, help="prompts timed with the real batch-1 loop (0: the sampler alone)"
    )
    parser.add_argument("--num-assistant-tokens", type=int, default=5)
    parser.add_argument(
        "--rules-per-prompt", type=int, default=1,
        help="R > 1: each prompt is drawn under R rules (exact, then static 0.9, 0.7, ...) sharing one prefill, "
        "as an evaluation of a static sweep does; B / R prompts per batch",
    )  # fmt: skip
    parser.add_argument(
        "--prompts", type=int, default=0,
        help="P > 0: P prompts x R rules per batch size (default B / R: one batch, no refill); more requests than B "
        "keep the batch full, rows joining as others finish, as an evaluation or Table 1 run does",
    )  # fmt: skip
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    dtype = resolve_dtype(args.dtype)
    tokenizer, target, draft = load_pair(args.target, args.draft, getattr(torch, dtype))
    draft.generation_config.assistant_confidence_threshold = 0.0
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    task = get_task("gsm8k")
    rows = task.load("test").select(range(max(max(sizes), args.prompts)))
    prompts = [
        tokenizer.apply_chat_template(
            task.build_messages(row), add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        for row in rows
    ]
    config = SamplerConfig(max_new_tokens=args.max_new_tokens, num_assistant_tokens=args.num_assistant_tokens)
    eos = target.generation_config.eos_token_id

    # warm-up: first forwards at a shape are slow on CPU
    list(sample_batched(target, draft, [SampleRequest(prompts[0], "exact")] * 2, SamplerConfig(max_new_tokens=8)))
    timed_generate(target, draft, prompts[0], Method("exact"), max_new_tokens=8, temperature=1.0)

    results = []
    loop_tokens = loop_seconds = 0.0
    for i in range(args.loop_prompts):
        record = timed_generate(
            target, draft, prompts[i], Method("exact"), max_new_tokens=args.max_new_tokens, temperature=1.0,
            num_assistant_tokens=args.num_assistant_tokens, seed=i, eos_token_id=eos,
        )  # fmt: skip
        loop_tokens += len(record.new_tokens)
        loop_seconds += record.seconds
    loop_tps = loop_tokens / loop_seconds if loop_seconds else None  # --loop-prompts 0: the sampler alone
    prompt_len = sum(p.shape[1] for p in prompts) // len(prompts)
    rules = ["exact"] + [f"static:{w / 10:g}" for w in range(9, 0, -1)]
    if not 1 <= args.rules_per_prompt <= len(rules):
        parser.error(f"--rules-per-prompt must be between 1 and {len(rules)}")
    rules = rules[: args.rules_per_prompt]
    for b in sizes:
        num_prompts = args.prompts or max(1, b // len(rules))
        requests = [SampleRequest(prompts[i], rule, seed=i) for i in range(num_prompts) for rule in rules]
        requests = requests if args.prompts else requests[:b]
        with _Timing() as timing:
            start = time.perf_counter()
            out = list(sample_batched(target, draft, requests, config, batch_size=b))
            seconds = time.perf_counter() - start
        tokens = sum(len(r.completion_ids) for r in out)
        decode = seconds - timing.prefill
        bare_t = _bare_step_seconds(target, prompts[0][:, :prompt_len], b)
        bare_d = _bare_step_seconds(draft, prompts[0][:, :prompt_len], b)
        step = decode / max(timing.steps, 1)
        results.append(
            dict(
                b=b,
                tokens=tokens,
                seconds=seconds,
                prefill=timing.prefill,
                steps=timing.steps,
                tps=tokens / seconds,
                decode_tps=tokens / decode,
                step=step,
                bare=bare_t + bare_d,
                rss=_peak_rss_gib(),
            )  # fmt: skip
        )

    print(f"CPU {cpu_capability()}, dtype {dtype}, {args.threads} threads, {args.max_new_tokens} new tokens, "
          f"T=1, N={args.num_assistant_tokens}, GSM8K test prompts (~{prompt_len} tokens), sampler rules per prompt: "
          f"{', '.join(rules)} (one shared prefill); {args.prompts or 'B / R'} prompts per batch size; "
          f"real loop: exact SD\n")  # fmt: skip
    print("| engine | B | tokens | seconds | prefill s | tok/s | × loop | decode tok/s | s/step | bare target+draft "
          "s/step | step / bare | peak RSS GiB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    if loop_tps is not None:
        print(f"| real loop (generate) | 1 | {loop_tokens:.0f} | {loop_seconds:.1f} | - | {loop_tps:.2f} | 1.00 | - | "
              f"- | - | - | - |")  # fmt: skip
    for r in results:
        ratio = f"{r['tps'] / loop_tps:.2f}" if loop_tps is not None else "-"
        print(f"| sampler | {r['b']} | {r['tokens']} | {r['seconds']:.1f} | {r['prefill']:.1f} | {r['tps']:.2f} | "
              f"{ratio} | {r['decode_tps']:.2f} | {r['step']:.3f} | {r['bare']:.3f} | "
              f"{r['step'] / r['bare']:.2f} | {r['rss']:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
