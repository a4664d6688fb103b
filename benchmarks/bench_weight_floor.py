"""How close a batch-1 decode step is to the floor set by reading the model's weights once.

A decode step of one token multiplies one row by every weight matrix, so on a CPU it cannot be faster than reading
all the weights from memory once. This times, for a model's shapes (random weights, ``--config``), one run side by
side, each the fastest of ``--repeats`` timed in turn (round-robin):

- a streaming read of the weights' bytes (``torch.sum`` over one buffer of that size): the memory's floor;
- every linear layer of one decode step in order, one row each (``F.linear``, M = 1): the floor of torch's GEMV
  kernels (attention, norms and the sampling are left out);
- the same with the weights reordered once into oneDNN's blocked layout (what the inductor's ``freezing`` uses);

and prints each as GB/s of weights read and as ms per token. Compare with a measured decode step
(``bench_static_cache_length.py``): a step near the GEMV floor leaves compilation little to remove.

    python benchmarks/bench_weight_floor.py --threads 2 --dtype auto
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hf_diversed.evaluation.bench.costs import fastest_interleaved
from hf_diversed.modeling.dtypes import cpu_capability, resolve_dtype

CONFIGS = Path(__file__).parent / "configs"


def linear_shapes(config: dict) -> list[tuple[int, int]]:
    """(in, out) of every linear layer one decode step runs, in order, the LM head last."""
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    layer = [(hidden, q), (hidden, kv), (hidden, kv), (q, hidden), (hidden, inner), (hidden, inner), (inner, hidden)]
    return layer * config["num_hidden_layers"] + [(hidden, config["vocab_size"])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=CONFIGS / "qwen2.5-coder-1.5b-instruct.json")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--output", default=None, help="JSON record")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, resolve_dtype(args.dtype))
    config = json.loads(args.config.read_text())
    shapes = linear_shapes(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        weights = [(torch.randn(fan_out, fan_in, generator=g) * 0.02).to(dtype) for fan_in, fan_out in shapes]
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in weights]
        nbytes = sum(w.numel() * w.element_size() for w in weights)
        flat = torch.empty(nbytes // weights[0].element_size(), dtype=dtype).normal_(generator=g)
        rows = {fan_in: torch.randn(1, fan_in, generator=g).to(dtype) for fan_in, _ in shapes}

        def dense():
            for (fan_in, _), w in zip(shapes, weights, strict=True):
                torch.nn.functional.linear(rows[fan_in], w)

        def reordered():
            for (fan_in, _), w in zip(shapes, packed, strict=True):
                torch.ops.mkldnn._linear_pointwise(rows[fan_in], w, None, "none", [], "")

        steps = {"streaming read": lambda: flat.sum(), "F.linear, M = 1": dense, "oneDNN blocked, M = 1": reordered}
        for step in steps.values():
            step()
        best = fastest_interleaved(steps, args.repeats)
    record = {"cpu": cpu_capability(), "threads": torch.get_num_threads(), "dtype": str(dtype).removeprefix("torch."),
              "torch": torch.__version__, "config": args.config.name, "weight_bytes": nbytes,
              "seconds": best}  # fmt: skip
    print(f"{args.config.name}: {len(shapes)} linear layers, {nbytes / 1e9:.2f} GB of {record['dtype']} weights; "
          f"CPU {record['cpu']}, {record['threads']} threads, torch {torch.__version__}\n")  # fmt: skip
    print("| what | ms per token | GB/s of weights |\n|---|---|---|")
    for name, seconds in best.items():
        print(f"| {name} | {1e3 * seconds:.1f} | {nbytes / seconds / 1e9:.1f} |")
    if args.output:
        Path(args.output).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
