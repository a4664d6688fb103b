"""Why verification costs about two decode steps on CPU (v ≈ 2): a linear layer over a few rows.

At batch 1 a decode step multiplies one row by each weight matrix, and a verification forward multiplies N + 1
rows. Both read the same weights once, so on a memory-bound CPU they should cost about the same. This times
``F.linear`` at the real target's shapes for M = 1, 2 and N + 1 rows, against the same product with the weight
reordered once into oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, the layout torch's
inductor uses for frozen CPU linears). Median of ``--repeats``; run it on an idle machine.

    python benchmarks/bench_linear_packing.py --threads 2                      # float32
    python benchmarks/bench_linear_packing.py --threads 2 --dtype bfloat16     # where the CPU has AVX512-BF16
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from hf_diversed.modeling.dtypes import cpu_capability

CONFIGS = Path(__file__).parent / "configs"


def _ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=CONFIGS / "qwen2.5-coder-1.5b-instruct.json")
    parser.add_argument("--rows", default="1,2,6", help="rows M (6 = a verification forward with N = 5)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.threads:
        torch.set_num_threads(args.threads)
    config = json.loads(args.config.read_text())
    hidden, inner, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    shapes = {"MLP up/gate": (hidden, inner), "MLP down": (inner, hidden), "LM head": (hidden, vocab)}
    rows = [int(m) for m in args.rows.split(",")]
    print(f"CPU {cpu_capability()}; {args.dtype}; torch {torch.__version__}; threads {torch.get_num_threads()}; "
          f"shapes of {args.config.name}\n")  # fmt: skip
    print("| layer | in → out | M | F.linear ms | × M=1 | reordered weight ms | × F.linear M=1 |")
    print("|---|---|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, (fan_in, fan_out) in shapes.items():
            weight = (torch.randn(fan_out, fan_in, generator=g) * 0.02).to(dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
            base = None
            for m in rows:
                x = torch.randn(m, fan_in, generator=g).to(dtype)
                dense = _ms(lambda x=x, w=weight: torch.nn.functional.linear(x, w), args.repeats)
                reordered = _ms(lambda x=x, w=packed: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""),
                                args.repeats)  # fmt: skip
                base = dense if base is None else base
                print(f"| {name} | {fan_in} → {fan_out} | {m} | {dense:.2f} | {dense / base:.2f} | {reordered:.2f} | "
                      f"{reordered / base:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
