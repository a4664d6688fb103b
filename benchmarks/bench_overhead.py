"""Overhead of hf_diversed's loop + head against transformers' own static ensemble, at identical tokens.

For each prompt, runs (interleaved, same seed) transformers' ``assistant_ensemble_weight=w`` and
``generate(..., diversed_head=<fresh head, init_weight=w>)``, checks the tokens are identical, and
prints per-token times and their ratio (target: <= 1.03).

    python benchmarks/bench_overhead.py                      # real Qwen2.5-Coder pair, bf16, GSM8K prompts
    python benchmarks/bench_overhead.py --target DIR --draft DIR --prompts 4 --repeats 2
"""

from __future__ import annotations

import argparse
import statistics

import torch

from hf_diversed import DiversedHead
from hf_diversed.evaluation.methods import Method, timed_generate
from hf_diversed.evaluation.models import load_pair
from hf_diversed.evaluation.real_models import DRAFT_NAME, TARGET_NAME
from hf_diversed.evaluation.tasks import get_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=TARGET_NAME)
    parser.add_argument("--draft", default=DRAFT_NAME)
    parser.add_argument("--weight", type=float, default=0.5)
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per method and prompt (interleaved)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--num-assistant-tokens", type=int, default=5)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    tokenizer, target, draft = load_pair(args.target, args.draft, getattr(torch, args.dtype))
    head = DiversedHead.for_models(target, draft, init_weight=args.weight)
    task = get_task("gsm8k")
    rows = task.load("test").select(range(args.prompts))
    native, ours = Method(f"native-static:{args.weight}"), Method("diversed")
    common = dict(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        num_assistant_tokens=args.num_assistant_tokens,
        head=head,
    )
    first = tokenizer.apply_chat_template(
        task.build_messages(rows[0]), add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    for _ in range(2):  # warm-up: the first forwards at each shape are much slower on this CPU
        for method in (native, ours):
            timed_generate(target, draft, first, method, **{**common, "max_new_tokens": 32})

    per_token = {native.spec: [], ours.spec: []}
    tokens = 0
    print("| prompt | tokens | transformers ms/token | hf_diversed ms/token | ratio | identical |")
    print("|---|---|---|---|---|---|")
    for i, row in enumerate(rows):
        ids = tokenizer.apply_chat_template(
            task.build_messages(row), add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        times = {native.spec: [], ours.spec: []}
        outputs = {}
        for rep in range(args.repeats):
            order = (native, ours) if rep % 2 == 0 else (ours, native)  # alternate to cancel drift
            for method in order:
                record = timed_generate(target, draft, ids, method, seed=i, **common)
                times[method.spec].append(record.seconds / len(record.new_tokens))
                outputs[method.spec] = record.new_tokens
        identical = torch.equal(outputs[native.spec], outputs[ours.spec])
        n = len(outputs[ours.spec])
        tokens += n
        t_native, t_ours = min(times[native.spec]), min(times[ours.spec])
        per_token[native.spec].append(t_native)
        per_token[ours.spec].append(t_ours)
        print(f"| {i} | {n} | {1e3 * t_native:.1f} | {1e3 * t_ours:.1f} | {t_ours / t_native:.3f} | {identical} |")
        if not identical:
            raise SystemExit("tokens differ: the fresh head must reproduce transformers' static ensemble exactly")
    total_native = statistics.fmean(per_token[native.spec])
    total_ours = statistics.fmean(per_token[ours.spec])
    print(
        f"\nmean over {args.prompts} prompts ({tokens} tokens, best of {args.repeats} per prompt): "
        f"transformers {1e3 * total_native:.1f} ms/token, hf_diversed {1e3 * total_ours:.1f} ms/token, "
        f"ratio {total_ours / total_native:.3f} (target <= 1.03)"
    )


if __name__ == "__main__":
    main()
