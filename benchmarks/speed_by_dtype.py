"""Tokens/s of the target alone, exact SD and the static ensemble on one GSM8K prompt, in one dtype.

python benchmarks/speed_by_dtype.py bfloat16
python benchmarks/speed_by_dtype.py float32
"""

from __future__ import annotations

import argparse

import torch

from hf_diversed.evaluation.methods import Method, timed_generate
from hf_diversed.evaluation.models import load_pair
from hf_diversed.evaluation.real_models import DRAFT_NAME, TARGET_NAME
from hf_diversed.evaluation.tasks import get_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dtype", choices=["bfloat16", "float32"])
    parser.add_argument("--row", type=int, default=1, help="GSM8K test row")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    tokenizer, target, draft = load_pair(TARGET_NAME, DRAFT_NAME, getattr(torch, args.dtype))
    task = get_task("gsm8k")
    messages = task.build_messages(task.load("test")[args.row])
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = ids["input_ids"]
    kwargs = dict(max_new_tokens=args.max_new_tokens, temperature=1.0, num_assistant_tokens=5)
    for method in ("ar", "exact"):  # warm-up
        timed_generate(target, draft, ids, Method(method), **{**kwargs, "max_new_tokens": 16})
    print("| dtype | method | seed | tokens | tok/s | acceptance |\n|---|---|---|---|---|---|")
    for seed in range(args.repeats):
        for method in ("ar", "exact", "static:0.5"):
            r = timed_generate(target, draft, ids, Method(method), seed=seed, **kwargs)
            acceptance = f"{r.stats.acceptance_rate:.1%}" if r.stats else "-"
            row = [args.dtype, method, seed, len(r.new_tokens), f"{r.tokens_per_second:.2f}", acceptance]
            print("| " + " | ".join(map(str, row)) + " |")


if __name__ == "__main__":
    main()
