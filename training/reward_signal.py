"""Does the task reward tell the head where to keep w high? The trainer's push on w, before any training.

    python training/reward_signal.py --rollouts_cache lr-sweep-gsm8k/rollouts.pt --rule token-class:digits:0 \
        --acceptance_coefs 0.1,0.01 --output reward_signal.json

On a block of rollouts cached by ``training/lr_sweep.py`` (the recipe's first steps, drawn by the untrained head,
with their prompts), scores every rollout with the task's reward and splits the trainer's first-update push on
w into its reward part and its acceptance-regularizer part, on a token-class rule's exact positions and elsewhere
(:func:`hf_diversed.trainer.analysis.reward_push`). The rule's positions are where a head should learn to keep w
high; the reward part must beat lambda x TV there for RL to find it. Prints a Markdown table; ``--output`` also
writes JSON.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from trl import TrlParser

from hf_diversed.trainer.analysis import reward_push


@dataclass
class SignalArguments:
    rollouts_cache: str = field(metadata={"help": "training/lr_sweep.py's cache: steps of (rows, rollouts, age)."})
    rule: str = field(metadata={"help": "A token-class rule whose exact positions are compared with the rest."})
    task: str = field(default="gsm8k", metadata={"help": "The task whose reward scores the rollouts."})
    target: str = field(default="qwen2.5-coder-1.5b-instruct", metadata={"help": "Target (tokenizer)."})
    acceptance_coefs: str = field(default="0.1,0.01", metadata={"help": "Comma list of lambdas for the net push."})
    resamples: int = field(default=2000, metadata={"help": "Bootstrap resamples over rollouts."})
    output: str | None = field(default=None, metadata={"help": "Also write the result as JSON here."})


def markdown(result: dict[str, dict], coefs: Sequence[float]) -> str:
    lines = [
        "| positions | n | reward push [95% CI] | mean TV | λ where they balance | "
        + " | ".join(f"net push at λ = {c:g}" for c in coefs)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(coefs),
    ]
    for name, r in result.items():
        if not r.get("positions"):
            continue
        nets = " | ".join(f"{r[f'net_push_at_{c:g}']:+.4f}" for c in coefs)
        lines.append(
            f"| {name} | {r['positions']} | {r['reward_push']:+.4f} [{r['reward_push_low']:+.4f}, "
            f"{r['reward_push_high']:+.4f}] | {r['mean_tv']:.4f} | {r['lambda_balance']:.4f} | {nets} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from transformers import AutoTokenizer

    from hf_diversed.evaluation.tasks import get_task
    from hf_diversed.evaluation.weights import resolve_model
    from hf_diversed.generation.verification import parse_token_class_rule

    (args,) = TrlParser((SignalArguments,)).parse_args_and_config(list(sys.argv[1:] if argv is None else argv))
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.target))
    rule = parse_token_class_rule(args.rule, tokenizer)
    blocks = torch.load(args.rollouts_cache, weights_only=False)
    if not blocks or not isinstance(blocks[0], tuple):
        raise SystemExit(
            f"{args.rollouts_cache} holds no prompts to score: pass training/lr_sweep.py's cache, whose steps are "
            "(rows, rollouts, age)."
        )
    task = get_task(args.task)
    steps, rewards_all = [], []
    for rows, rollouts, _ in blocks:
        completions = tokenizer.batch_decode([r.completion_ids.tolist() for r in rollouts], skip_special_tokens=True)
        columns = {key: [row[key] for row in rows] for key in rows[0] if key not in ("input_ids", "prompt")}
        rewards = torch.tensor(task.reward(None, completions, **columns), dtype=torch.float64)
        steps.append((rollouts, rewards))
        rewards_all.append(rewards)
    coefs = [float(c) for c in args.acceptance_coefs.split(",") if c]
    result = reward_push(steps, rule, coefs, resamples=args.resamples)
    rewards_all = torch.cat(rewards_all)
    header = {
        "rollouts": int(rewards_all.numel()),
        "steps": len(steps),
        "mean_reward": float(rewards_all.mean()),
        "rule": args.rule,
        "rollouts_cache": args.rollouts_cache,
    }
    if args.output:
        Path(args.output).write_text(json.dumps({**header, **result}, indent=2) + "\n", encoding="utf-8")
    print(f"{header['rollouts']} rollouts in {header['steps']} steps, mean reward {header['mean_reward']:.3f}")
    print(markdown(result, coefs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
