"""``hf-diversed demo``: generate on the real pair and compare decoding methods side by side."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from .methods import Method, timed_generate
from .models import load_pair

DEMO_PROMPTS = Path(__file__).with_name("demo_prompts.jsonl")  # GSM8K (MIT) and MBPP (CC BY 4.0) test rows 0-2


def demo_row(task_name: str, example: int) -> dict:
    """Row ``example`` of ``task_name``'s test split: shipped with the package for GSM8K and MBPP (no data folder or
    Hub needed), loaded like any task's rows otherwise."""
    from .tasks import TaskError, get_task
    from .tasks.sources import read_jsonl

    task = get_task(task_name)
    shipped = [row for row in read_jsonl(DEMO_PROMPTS) if row["task"] == task.name]
    if shipped:
        if not 0 <= example < len(shipped):
            raise TaskError(f"--example {example}: the demo ships {task.name} test rows 0-{len(shipped) - 1}.")
        return {k: v for k, v in shipped[example].items() if k != "task"}
    if example < 0:
        raise TaskError(f"--example {example}: pass a row index >= 0.")
    data = task.load(f"test[{example}:{example + 1}]")
    if len(data) == 0:
        raise TaskError(f"--example {example}: {task.name}'s test split has fewer rows.")
    return data[0]


def run(args: argparse.Namespace) -> int:
    """``hf-diversed demo`` with its parsed options (:mod:`hf_diversed.cli.demo`): one prompt, four methods, a table."""
    from ..modeling.hub import load_head
    from ..modeling.modeling_diversed_head import DiversedHead
    from ..modeling.pretrained import head_for_task, seed_pretrained_heads
    from .tasks import get_task
    from .weights import describe_weights

    if args.threads:
        torch.set_num_threads(args.threads)
    from ..modeling.dtypes import cpu_capability, resolve_dtype

    task = get_task(args.task)
    row = demo_row(task.name, args.example)  # before the models: a wrong task or row fails at once
    start = time.perf_counter()
    dtype = resolve_dtype(args.dtype)
    tokenizer, target, draft = load_pair(args.target, args.draft, getattr(torch, dtype), args.weights)
    seed_pretrained_heads()  # bundled heads resolve by Hub id, offline, like downloaded ones
    head_name = args.head or head_for_task(args.task)
    head = load_head(head_name) if head_name else DiversedHead.for_models(target, draft, init_weight=0.5)
    input_ids = tokenizer.apply_chat_template(
        task.build_messages(row), add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    print(f"loaded target/draft in {time.perf_counter() - start:.1f}s ({dtype}, CPU {cpu_capability()}, "
          f"{torch.get_num_threads()} threads); prompt: {len(input_ids[0])} tokens")  # fmt: skip
    for role, model in (("target", target), ("draft", draft)):
        print(f"{role} weights: {describe_weights(model)}")

    methods = [Method("ar"), Method("exact"), Method("static:0.5"), Method("diversed")]
    kwargs = dict(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        num_assistant_tokens=args.num_assistant_tokens,
        head=head,
    )
    timed_generate(target, draft, input_ids, Method("exact"), **{**kwargs, "max_new_tokens": 8})  # warm-up
    records = {}
    for method in methods:
        records[method.spec] = record = timed_generate(target, draft, input_ids, method, seed=args.seed, **kwargs)
        print(f"\n--- {method.spec} ---\n{tokenizer.decode(record.new_tokens, skip_special_tokens=True)}")

    base = records["ar"].tokens_per_second
    label = head_name or "fresh head, w=0.5"
    print("\n| method | tokens | tok/s | speedup | acceptance | accepted/round | mean w |")
    print("|---|---|---|---|---|---|---|")
    for spec, rec in records.items():
        s = rec.stats
        name = f"diversed ({label})" if spec == "diversed" else spec
        acc = f"{s.acceptance_rate:.1%} | {s.mean_accepted_per_round:.2f} | {s.mean_weight:.2f}" if s else "- | - | -"
        print(
            f"| {name} | {len(rec.new_tokens)} | {rec.tokens_per_second:.2f} | "
            f"{rec.tokens_per_second / base:.2f}x | {acc} |"
        )
    return 0
