"""A real decode step with its linear layers' weights in oneDNN's blocked layout, against transformers' own.

``bench_weight_floor.py`` shows torch's one-row ``F.linear`` reading bf16 weights at a fraction of the speed of the
same product on weights reordered once into oneDNN's blocked layout. This measures what that is worth in the real
pair's forwards: each model's step of 1 token (a decode step, a draft step) and of 6 tokens (a verification at
N = 5) on a windowed static cache at ``--position``, eager, with every ``nn.Linear`` as transformers runs it and on
a second copy of the pair with ``pack_linear_weights`` (``mkldnn._linear_pointwise`` on
``mkldnn._reorder_linear_weight``), timed in turn (round-robin), fastest of ``--repeats``. It also prints the largest
logit difference between the two (the same arithmetic in another memory order).

    python benchmarks/bench_packed_linear.py --threads 2 --output docs/compiled/packed-linear-avx512bf16.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hf_diversed import pack_linear_weights
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
    _, *copies = load_pair(TARGET_NAME, DRAFT_NAME, getattr(torch, dtype))
    packed_models = dict(zip(("target", "draft"), (pack_linear_weights(model) for model in copies), strict=True))
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 20000, (1, args.position), generator=generator)
    steps, differences = {}, {}
    with torch.no_grad(), grouped_attention_on_cpu():
        for model_name, model in (("target", target), ("draft", draft)):
            for kind, lm in (("dense", model), ("packed", packed_models[model_name])):
                cache = windowed_static_cache(lm.config, args.position + 64)
                set_static_window(cache, args.position + 8)
                lm(prompt, past_key_values=cache, use_cache=True)
                for width in (1, 6):
                    tokens = prompt[:, -width:].clone()

                    def step(lm=lm, cache=cache, tokens=tokens):
                        logits = lm(input_ids=tokens, past_key_values=cache, use_cache=True).logits
                        rewind_static_cache(cache, args.position)
                        return logits

                    steps[(model_name, width, kind)] = step
            for width in (1, 6):
                dense, packed = steps[(model_name, width, "dense")](), steps[(model_name, width, "packed")]()
                differences[f"{model_name} {width}"] = (packed.float() - dense.float()).abs().max().item()
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
