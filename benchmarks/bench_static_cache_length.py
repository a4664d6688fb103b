"""What a static cache's length costs one decode step: the same model, the same position, caches of several lengths.

A plain static-cache step attends over the whole cache (the causal mask hides the unwritten part), so at a fixed
position it costs more on a longer cache; a dynamic cache attends over the written part only, and the static loop's
caches over a window of 256·2^k positions covering it (``WindowedStaticLayer``). This prints one forward of one
token at ``--position`` for the dynamic cache (eager) and for static caches of ``position + extra`` positions, whole
and windowed as the loop runs them, eager and compiled (the inductor, as the static loop compiles on a CPU): the
fastest of ``--repeats``, each step timed in turn (round-robin), one run side by side.

    python benchmarks/bench_static_cache_length.py --model target --extra 8,520,1032 \\
        --output docs/compiled/static-cache-length.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import CompileConfig, DynamicCache, StaticCache

from hf_diversed.evaluation.bench.costs import fastest_interleaved
from hf_diversed.evaluation.models import load_pair
from hf_diversed.evaluation.real_models import DRAFT_NAME, TARGET_NAME
from hf_diversed.generation._compat import (
    grouped_attention_on_cpu,
    rewind_static_cache,
    set_static_window,
    windowed_static_cache,
)
from hf_diversed.generation.static_loop import compiled_forward
from hf_diversed.modeling.dtypes import cpu_capability, resolve_dtype


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
              "model": args.model, "position": args.position, "repeats": args.repeats, "rows": []}  # fmt: skip
    windows = {}
    steps = {}
    with torch.no_grad(), grouped_attention_on_cpu():
        dynamic = DynamicCache(config=model.config)
        model(prompt, past_key_values=dynamic, use_cache=True)

        def dynamic_step():
            model(input_ids=last, past_key_values=dynamic, use_cache=True)
            dynamic.crop(-1)

        steps["dynamic"] = dynamic_step
        for extra in (int(x) for x in args.extra.split(",")):
            length = args.position + extra
            whole = StaticCache(config=model.config, max_cache_len=length)
            windowed = windowed_static_cache(model.config, length)
            windows[length] = set_static_window(windowed, args.position + 1)
            for name, cache in (("whole", whole), ("windowed", windowed)):
                model(prompt, past_key_values=cache, use_cache=True)
                steps[(length, name, "eager")] = one_step(model.__call__, cache, last, args.position)
                steps[(length, name, "compiled")] = one_step(call, cache, last, args.position)
        for step in steps.values():  # compiles each new shape and window
            step()
        best = fastest_interleaved(steps, args.repeats)
    record["dynamic_eager_s"] = best["dynamic"]
    for length, window in windows.items():
        record["rows"].append({"cache_len": length, "eager_s": best[(length, "whole", "eager")],
                               "compiled_s": best[(length, "whole", "compiled")], "window": window,
                               "windowed_eager_s": best[(length, "windowed", "eager")],
                               "windowed_compiled_s": best[(length, "windowed", "compiled")]})  # fmt: skip
    print(f"{args.model}, {dtype}, {record['cpu']}, {record['threads']} threads, position {args.position}: "
          f"dynamic cache eager {1e3 * record['dynamic_eager_s']:.1f} ms")  # fmt: skip
    print("| static cache length | eager ms | compiled ms | window | windowed eager ms | windowed compiled ms | "
          "windowed compiled / dynamic eager |\n|---|---|---|---|---|---|---|")  # fmt: skip
    for row in record["rows"]:
        print(f"| {row['cache_len']} | {1e3 * row['eager_s']:.1f} | {1e3 * row['compiled_s']:.1f} | {row['window']} | "
              f"{1e3 * row['windowed_eager_s']:.1f} | {1e3 * row['windowed_compiled_s']:.1f} | "
              f"{row['windowed_compiled_s'] / record['dynamic_eager_s']:.2f} |")  # fmt: skip
    if args.output:
        Path(args.output).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
