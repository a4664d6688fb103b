"""One decode step through the batched sampler's slot KV cache against transformers' DynamicCache.

A ``DynamicLayer`` appends a position with ``torch.cat``, copying the whole cache at every step; the sampler's
``SlotLayer`` writes into preallocated buffers. This times one decode step of a model of the real target's
shape (Qwen2.5-Coder-1.5B: hidden 1536, 12 heads, 2 KV heads, MLP 8960; random weights, ``--layers`` of its 28
layers, a small vocabulary so that the layers dominate) on B rows with a cached prefix of L positions, the two
caches interleaved in one run. Prints a Markdown table.

    python benchmarks/bench_kv_cache.py --batch-sizes 32,128 --lengths 200,500 --layers 4 --threads 2
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from hf_diversed.generation import _compat
from hf_diversed.modeling.dtypes import cpu_capability


def _cache(model: Qwen2ForCausalLM, rows: int, length: int, slots: bool):
    """A cache of ``rows`` rows and ``length`` random positions: a DynamicCache, or the sampler's slot cache."""
    config = model.config
    with torch.no_grad():
        cache = model(torch.zeros(1, 1, dtype=torch.long), use_cache=True).past_key_values
    head_dim = config.hidden_size // config.num_attention_heads
    for layer in cache.layers:
        layer.keys = torch.randn(rows, config.num_key_value_heads, length, head_dim)
        layer.values = torch.randn(rows, config.num_key_value_heads, length, head_dim)
    return _compat.slot_cache([cache], [1]) if slots else cache


def _step_seconds(model, rows: int, length: int, slots: bool, steps: int) -> float:
    """Median time of one decode step over ``steps`` consecutive steps (the cache grows by one each)."""
    cache = _cache(model, rows, length, slots)
    mask = torch.ones(rows, length, dtype=torch.long)
    times = []
    with torch.no_grad():
        for s in range(steps + 1):
            mask = torch.cat([mask, mask.new_ones(rows, 1)], 1)
            tokens = torch.randint(0, model.config.vocab_size, (rows, 1))
            start = time.perf_counter()
            model(
                input_ids=tokens, attention_mask=mask, position_ids=torch.full((rows, 1), length + s),
                past_key_values=cache, use_cache=True,
            )  # fmt: skip
            times.append(time.perf_counter() - start)
    times = sorted(times[1:])  # the first step warms up this shape
    return times[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="32,128")
    parser.add_argument("--lengths", default="200,500")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=args.layers, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=1024, max_position_embeddings=32768,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).eval()
    print(f"CPU {cpu_capability()}, float32, {args.threads} threads, {args.layers} layers of the target's shape, "
          f"median of {args.steps} steps\n")  # fmt: skip
    print("| B | L | DynamicCache s/step | slot cache s/step | DynamicCache / slot |")
    print("|---|---|---|---|---|")
    for rows in (int(b) for b in args.batch_sizes.split(",")):
        for length in (int(n) for n in args.lengths.split(",")):
            dynamic = _step_seconds(model, rows, length, slots=False, steps=args.steps)
            slot = _step_seconds(model, rows, length, slots=True, steps=args.steps)
            print(f"| {rows} | {length} | {dynamic:.3f} | {slot:.3f} | {dynamic / slot:.2f} |")


if __name__ == "__main__":
    main()
