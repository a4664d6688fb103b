"""What a static cache's length costs one decode step: the same model, the same position, caches of several lengths.

A static-cache step attends over the whole cache (the causal mask hides the unwritten part), so at a fixed position
it costs more on a longer cache; a dynamic cache attends over the written part only. This prints one forward of one
token at ``--position`` for the dynamic cache (eager) and for static caches of ``position + extra`` positions, eager
and compiled (the inductor, as the static loop compiles on a CPU), fastest of ``--repeats``, one run side by side.

    python benchmarks/bench_static_cache_length.py --model target --extra 8,520,1032 \\
        --output docs/compiled/static-cache-length.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import CompileConfig, DynamicCache, StaticCache

from hf_diversed.evaluation.bench.costs import _fastest_time
from hf_diversed.evaluation.models import load_pair
from hf_diversed.evaluation.real_models import DRAFT_NAME, TARGET_NAME
from hf_diversed.generation._compat import grouped_attention_on_cpu, rewind_static_cache
from hf_diversed.generation.static_loop import compiled_forward
from hf_diversed.modeling.dtypes import cpu_capability, resolve_dtype


def fastest(step, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls after one untimed call (which compiles a new shape)."""
    step()
    return _fastest_time(step, repeats)


def one_step(forward, cache: StaticCache, token: torch.Tensor, position: int):
    """One forward of ``token`` at ``position``, then the cache set back to ``position`` (nothing re-allocated)."""

    def run():
        forward(input_ids=token, past_key_values=cache, use_cache=True)
        rewind_static_cache(cache, position)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="target", choices=["target", "draft"])
    parser.add_argument("--position", type=int, default=131, help="tokens already in the cache")
    parser.add_argument("--extra", default="8,520,1032", help="static cache lengths beyond --position")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--output", default=None, help="JSON record")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    dtype = resolve_dtype(args.dtype)
    _, target, draft = load_pair(TARGET_NAME, DRAFT_NAME, getattr(torch, dtype))
    model = target if args.model == "target" else draft
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 20000, (1, args.position), generator=generator)
    last = prompt[:, -1:].clone()
    call = compiled_forward(model, CompileConfig(fullgraph=True, dynamic=False, mode="default"))
    record = {"cpu": cpu_capability(), "threads": torch.get_num_threads(), "dtype": dtype, "torch": torch.__version__,
              "model": args.model, "position": args.position, "rows": []}  # fmt: skip
    with torch.no_grad(), grouped_attention_on_cpu():
        dynamic = DynamicCache(config=model.config)
        model(prompt, past_key_values=dynamic, use_cache=True)

        def dynamic_step():
            model(input_ids=last, past_key_values=dynamic, use_cache=True)
            dynamic.crop(-1)

        record["dynamic_eager_s"] = fastest(dynamic_step, args.repeats)
        for extra in (int(x) for x in args.extra.split(",")):
            cache = StaticCache(config=model.config, max_cache_len=args.position + extra)
            model(prompt, past_key_values=cache, use_cache=True)

            eager = fastest(one_step(model.__call__, cache, last, args.position), args.repeats)
            compiled = fastest(one_step(call, cache, last, args.position), args.repeats)
            record["rows"].append({"cache_len": args.position + extra, "eager_s": eager, "compiled_s": compiled})
    print(f"{args.model}, {dtype}, {record['cpu']}, {record['threads']} threads, position {args.position}: "
          f"dynamic cache eager {1e3 * record['dynamic_eager_s']:.1f} ms")  # fmt: skip
    print("| static cache length | eager ms | compiled ms | compiled / dynamic eager |\n|---|---|---|---|")
    for row in record["rows"]:
        print(f"| {row['cache_len']} | {1e3 * row['eager_s']:.1f} | {1e3 * row['compiled_s']:.1f} | "
              f"{row['compiled_s'] / record['dynamic_eager_s']:.2f} |")  # fmt: skip
    if args.output:
        Path(args.output).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
