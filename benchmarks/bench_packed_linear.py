"""A real decode step with its linear layers' weights in oneDNN's blocked layout, against transformers' own.

``bench_weight_floor.py`` shows torch's one-row ``F.linear`` reading bf16 weights at a fraction of the speed of the
same product on weights reordered once into oneDNN's blocked layout. This measures what that is worth in the real
pair's forwards: each model's step of 1 token (a decode step, a draft step) and of 6 tokens (a verification at
N = 5) on a windowed static cache at ``--position``, eager, with every ``nn.Linear`` as transformers runs it and with
every ``nn.Linear`` swapped for the packed product (``mkldnn._linear_pointwise`` on
``mkldnn._reorder_linear_weight``), timed in turn (round-robin), fastest of ``--repeats``. It also prints the largest
logit difference between the two (the same arithmetic in another memory order). Measurement only: the packed
module here is not part of hf_diversed.

    python benchmarks/bench_packed_linear.py --threads 2 --output docs/compiled/packed-linear-avx512bf16.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import torch

from hf_diversed.evaluation.bench.costs import fastest_interleaved
from hf_diversed.evaluation.models import load_pair
from hf_diversed.evaluation.real_models import DRAFT_NAME, TARGET_NAME
from hf_diversed.generation._compat import (
    grouped_attention_on_cpu,
    rewind_static_cache,
    set_static_window,
    windowed_static_cache,
)
from hf_diversed.modeling.dtypes import cpu_capability, resolve_dtype


class PackedLinear(torch.nn.Module):
    """``linear``'s product y = x Wᵀ + b with W reordered once into oneDNN's blocked layout."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), self.weight, self.bias, "none", [], "")
        return y.reshape(*x.shape[:-1], y.shape[-1])


@contextlib.contextmanager
def packed(model: torch.nn.Module, packs: dict):
    """Within the block, every ``nn.Linear`` of ``model`` is its ``PackedLinear`` from ``packs``."""
    for (parent, name), module in packs.items():
        setattr(parent, name, module)
    try:
        yield
    finally:
        for (parent, name), module in packs.items():
            setattr(parent, name, module.original)


def pack_all(model: torch.nn.Module) -> dict:
    packs = {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                packs[(parent, name)] = PackedLinear(child)
                packs[(parent, name)].__dict__["original"] = child  # not a submodule
    return packs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--position", type=int, default=131, help="tokens already in the cache")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--output", default=None, help="JSON record")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    dtype = resolve_dtype(args.dtype)
    _, target, draft = load_pair(TARGET_NAME, DRAFT_NAME, getattr(torch, dtype))
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 20000, (1, args.position), generator=generator)
    steps, differences = {}, {}
    with torch.no_grad(), grouped_attention_on_cpu():
        for model_name, model in (("target", target), ("draft", draft)):
            cache = windowed_static_cache(model.config, args.position + 64)
            set_static_window(cache, args.position + 8)
            model(prompt, past_key_values=cache, use_cache=True)
            packs = pack_all(model)
            for width in (1, 6):
                tokens = prompt[:, -width:].clone()

                def dense(model=model, cache=cache, tokens=tokens):
                    logits = model(input_ids=tokens, past_key_values=cache, use_cache=True).logits
                    rewind_static_cache(cache, args.position)
                    return logits

                def packed_step(model=model, packs=packs, dense=dense):
                    with packed(model, packs):
                        return dense()

                differences[f"{model_name} {width}"] = (packed_step().float() - dense().float()).abs().max().item()
                steps[(model_name, width, "dense")] = dense
                steps[(model_name, width, "packed")] = packed_step
        best = fastest_interleaved(steps, args.repeats)
    record = {"cpu": cpu_capability(), "threads": torch.get_num_threads(), "dtype": dtype, "torch": torch.__version__,
              "position": args.position, "repeats": args.repeats, "rows": []}  # fmt: skip
    print(f"{dtype}, CPU {record['cpu']}, {record['threads']} threads, torch {torch.__version__}, "
          f"position {args.position}\n")  # fmt: skip
    print("| model | tokens | transformers ms | packed ms | packed speed-up | max logit difference |")
    print("|---|---|---|---|---|---|")
    for model_name in ("target", "draft"):
        for width in (1, 6):
            dense_s, packed_s = best[(model_name, width, "dense")], best[(model_name, width, "packed")]
            difference = differences[f"{model_name} {width}"]
            record["rows"].append({"model": model_name, "tokens": width, "dense_s": dense_s, "packed_s": packed_s,
                                   "max_logit_difference": difference})  # fmt: skip
            print(f"| {model_name} | {width} | {1e3 * dense_s:.1f} | {1e3 * packed_s:.1f} | "
                  f"{dense_s / packed_s:.2f}x | {difference:.3g} |")  # fmt: skip
    if args.output:
        Path(args.output).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
