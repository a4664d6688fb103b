"""A head's training run as Markdown tables, from its ``log_history.jsonl``: every held-out evaluation, and the
training batches' means over blocks of steps (the reward with its standard error over the steps).

    python training/curve_table.py docs/training/mbpp-full/opt0.1-lambda-0.01             # blocks of 25 steps
    python training/curve_table.py docs/training/cnndm-full/opt0.3-lambda-0.01 --block 24

A block's reward, acceptance, mean w and cut share are means over its steps (each step: the mean over its rollouts);
± is the standard error of the per-step rewards, std / sqrt(steps). The last row pools every step.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_diversed.trainer.curves import by_rollout_batch, load_history  # noqa: E402


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def eval_table(history: list[dict]) -> list[str]:
    """One row per held-out evaluation: reward, acceptance, mean w, tokens per round, cut share."""
    evals = sorted((h for h in history if h.get("split") == "eval"), key=lambda h: h["step"])
    if not evals:
        return ["No held-out evaluation in this run (eval_steps = 0)."]
    lines = ["| step | eval reward | eval acceptance | eval mean w | tokens/round | cut at max |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for h in evals:
        lines.append(
            f"| {h['step']} | {_fmt(h.get('reward'), '.3f')} | {_pct(h.get('acceptance_rate'))} | "
            f"{_fmt(h.get('mean_w'), '.2f')} | {_fmt(h.get('tokens_per_round'), '.2f')} | "
            f"{_pct(h.get('cut_fraction'))} |"
        )
    return lines


def _block_row(label: str, steps: list[dict], rollouts_per_step: int | None) -> str:
    rewards = [h["reward"] for h in steps]
    mean = sum(rewards) / len(rewards)
    se = (math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1) / len(rewards))
          if len(rewards) > 1 else None)  # fmt: skip

    def avg(key: str) -> float | None:
        values = [h[key] for h in steps if h.get(key) is not None]
        return sum(values) / len(values) if values else None

    rollouts = "-" if rollouts_per_step is None else str(rollouts_per_step * len(steps))
    reward = f"{mean:.3f}" + ("" if se is None else f" ± {se:.3f}")
    return (f"| {label} | {rollouts} | {reward} | {_pct(avg('acceptance_rate'))} | {_fmt(avg('mean_w'), '.2f')} | "
            f"{_pct(avg('cut_fraction'))} |")  # fmt: skip


def block_table(history: list[dict], block: int, rollouts_per_step: int | None = None) -> list[str]:
    """Training-batch means over consecutive blocks of ``block`` steps, then over every step. A run that logs
    ``rollout_batch`` (one line per update, several updates per batch) counts rollout batches as steps."""
    if block < 1:
        raise ValueError(f"--block must be a positive number of steps, got {block}.")
    train = sorted((h for h in by_rollout_batch(history) if h.get("split") == "train" and "reward" in h),
                   key=lambda h: h["step"])  # fmt: skip
    if not train:
        return ["No training step logged yet."]
    lines = ["| steps | rollouts | reward (± s.e.) | acceptance | mean w | cut |", "|---|---|---|---|---|---|"]
    last = train[-1]["step"]
    for start in range(1, last + 1, block):
        steps = [h for h in train if start <= h["step"] < start + block]
        if steps:
            lines.append(_block_row(f"{start}–{min(start + block - 1, last)}", steps, rollouts_per_step))
    lines.append(_block_row(f"1–{last} (all)", train, rollouts_per_step))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a training output directory (holding log_history.jsonl)")
    parser.add_argument("--block", type=int, default=25, help="steps per row of the training-batch table")
    parser.add_argument("--rollouts_per_step", type=int, default=8, help="rollouts a step (the recipe's prompts)")
    args = parser.parse_args(argv)
    log = args.run / "log_history.jsonl"
    if not log.is_file():
        parser.error(f"{log} does not exist: pass a training run's output directory (train.py --output_dir).")
    history = load_history(log)
    blocks = block_table(history, args.block, args.rollouts_per_step)
    print("\n".join(["Held-out evaluations:", "", *eval_table(history), "", "Training-batch means:", "", *blocks]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
