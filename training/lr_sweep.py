"""A short learning-rate sweep for head training, on one fixed block of rollouts.

    python training/lr_sweep.py --config training/recipes/gsm8k-paper.yaml \
        --learning_rates 5e-4,1.5e-4,5e-5,1.5e-5 --sweep_steps 16 --sweep_dir docs/training/lr-sweep-gsm8k

The first ``sweep_steps`` rollout batches are drawn once, by the untrained head (the recipe's prompts, seeds and
``max_new_tokens``), and cached in ``--rollouts_cache`` (after every ``--draw_chunk_steps`` batches), so an
interrupted sweep resumes without redrawing. For each learning rate a fresh head (same initialisation) then makes
``sweep_steps x num_iterations`` updates on exactly those rollouts (the batches in turn, as the trainer does), with
the recipe's scheduler, clipping and λ. After every update the sweep records the
head's w on every drafted position of the block: its mean, its spread across positions (a per-token head spreads
w; a static one does not), how far it moved since the previous update, and the share of ratios clipped.

It measures how far each learning rate moves w per update, not which one ends with the best reward (the rollouts
are fixed, so later updates are off-policy). Output: ``sweep.jsonl`` (one line per rate and update), ``sweep.md``
and ``sweep.png`` in ``--sweep_dir``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from transformers import TrainerCallback
from trl import TrlParser

from hf_diversed.modeling.modeling_diversed_head import position_weights
from hf_diversed.trainer import DiversedConfig, DiversedTrainer
from hf_diversed.trainer.rollout import rollouts_trace


@dataclass
class SweepArguments:
    """The sweep's own flags (the recipe's fields are flags too)."""

    learning_rates: str = field(default="5e-4,1.5e-4,5e-5,1.5e-5", metadata={"help": "Comma list of rates."})
    sweep_steps: int = field(
        default=16, metadata={"help": "Rollout batches drawn once; each rate makes num_iterations updates on each."}
    )
    sweep_dir: str = field(default="lr-sweep", metadata={"help": "Where sweep.jsonl, sweep.md, sweep.png go."})
    rollouts_cache: str | None = field(
        default=None, metadata={"help": "File caching the drawn rollouts (default: <sweep_dir>/rollouts.pt)."}
    )
    draw_chunk_steps: int | None = field(
        default=None, metadata={"help": "Steps drawn per sampler call, cached after each (default: all at once)."}
    )

    def rates(self) -> list[float]:
        try:
            rates = [float(x) for x in self.learning_rates.split(",") if x.strip()]
        except ValueError:
            raise ValueError(
                f"--learning_rates must be a comma list of numbers, got {self.learning_rates!r}."
            ) from None
        if not rates or any(r <= 0 for r in rates):
            raise ValueError(f"--learning_rates needs positive rates, got {self.learning_rates!r}.")
        if self.sweep_steps < 1:
            raise ValueError(f"--sweep_steps must be >= 1, got {self.sweep_steps}.")
        return rates


def _features(blocks) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    trace = rollouts_trace([r for _, batch, _ in blocks for r in batch])
    return trace.h_draft, trace.h_target, trace.distribution_features()


def _weights(trainer: DiversedTrainer, h_draft: torch.Tensor, h_target: torch.Tensor, features) -> torch.Tensor:
    head = trainer.accelerator.unwrap_model(trainer.model)
    with torch.no_grad():
        return position_weights(head, h_draft, h_target, features)


def _sweep_config(config: DiversedConfig, **changes) -> DiversedConfig:
    """The recipe with ``changes``, never saving, evaluating or reporting: the sweep writes its own files."""
    return replace(config, save_strategy="no", num_eval_prompts=0, eval_strategy="no", eval_on_start=False,
                   report_to="none", push_to_hub=False, disable_tqdm=True, **changes)  # fmt: skip


def draw_block(
    config: DiversedConfig,
    steps: int,
    target,
    draft,
    tokenizer,
    cache: Path,
    chunk_steps: int | None = None,
    **trainer_kwargs,
):
    """The first ``steps`` rollout batches' (rows, rollouts, age) of the recipe, drawn by the untrained head.

    Drawn ``chunk_steps`` batches per sampler call (default: all at once) and cached after each call, so an
    interrupted draw resumes with the next chunk; rollout seeds depend on the batch, not on the chunking."""
    cache = Path(cache)
    blocks = torch.load(cache, weights_only=False) if cache.is_file() else []
    if len(blocks) >= steps:
        return blocks[:steps]
    chunk = chunk_steps or steps
    trainer = DiversedTrainer(target, draft, _sweep_config(config), processing_class=tokenizer, **trainer_kwargs)
    head = trainer.accelerator.unwrap_model(trainer.model)
    cache.parent.mkdir(parents=True, exist_ok=True)
    while len(blocks) < steps:
        batches = range(len(blocks), min(len(blocks) + chunk, steps))
        parts = [(head, *trainer._batch_rows(b)) for b in batches]
        drawn = trainer._draw([(h, rows, config.num_generations, keys) for h, rows, keys in parts])
        blocks += [(rows, rollouts, b % chunk) for (_, rows, _), rollouts, b in zip(parts, drawn, batches, strict=True)]
        partial = cache.with_suffix(".partial")
        torch.save(blocks, partial)
        partial.replace(cache)
    return blocks


class _Recorder(TrainerCallback):
    """w on every cached position after each update (and before the first)."""

    def __init__(self, trainer: DiversedTrainer, rate: float, features):
        self.trainer, self.rate, self.features = trainer, rate, features
        w = _weights(trainer, *features)
        self.w_prev = w
        self.records = [{"learning_rate": rate, "update": 0, "mean_w": float(w.mean()), "std_w": float(w.std()),
                         "moved": 0.0}]  # fmt: skip

    def on_step_end(self, args, state, control, **kwargs):
        w = _weights(self.trainer, *self.features)
        metrics = self.trainer._last_update
        self.records.append(
            {
                "learning_rate": self.rate,
                "update": state.global_step,
                "mean_w": float(w.mean()),
                "std_w": float(w.std()),
                "moved": float((w - self.w_prev).abs().mean()),
                "clip_frac": metrics["clip_frac"],
                "policy_loss": metrics["policy_loss"],
                "lr": self.trainer.lr_scheduler.get_last_lr()[0],
                "batch_reward": metrics["reward"],
            }
        )
        self.w_prev = w


def sweep(
    config: DiversedConfig,
    rates: Sequence[float],
    blocks,
    target,
    draft,
    tokenizer=None,
    **trainer_kwargs,
) -> list[dict]:
    """For each rate, a fresh head's first ``len(blocks) * num_iterations`` updates on ``blocks`` (every batch in
    one generation block, learned from in turn, as the trainer does); one record per rate and update."""
    features = _features(blocks)
    records = []
    steps = len(blocks)
    for rate in rates:
        run_config = _sweep_config(
            config, learning_rate=rate, steps_per_generation=steps, max_steps=steps * config.num_iterations
        )
        trainer = DiversedTrainer(target, draft, run_config, processing_class=tokenizer, **trainer_kwargs)
        trainer._draw = lambda parts: [batch for _, batch, _ in blocks]  # the cached rollouts, never drawn again
        recorder = _Recorder(trainer, rate, features)
        trainer.add_callback(recorder)
        trainer.train()
        records += recorder.records
    return records


def write_report(records: list[dict], out_dir: Path, command: str, positions: int, rollouts: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sweep.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    rates = list(dict.fromkeys(r["learning_rate"] for r in records))
    lines = [
        "# Learning-rate sweep on one block of rollouts",
        "",
        "```",
        command,
        "```",
        "",
        f"{rollouts} rollouts drawn once by the untrained head ({positions} drafted positions); w measured on all "
        "of them after every update. *moved*: mean |w − w before the update| per update.",
        "",
        "| learning rate | mean w after | std of w across positions | mean moved per update | largest move | "
        "mean clip fraction |",
        "|---|---|---|---|---|---|",
    ]
    for rate in rates:
        mine = [r for r in records if r["learning_rate"] == rate]
        updates = [r for r in mine if r["update"] > 0]
        last = mine[-1]
        lines.append(
            f"| {rate:g} | {last['mean_w']:.3f} | {last['std_w']:.3f} | "
            f"{sum(r['moved'] for r in updates) / len(updates):.4f} | {max(r['moved'] for r in updates):.4f} | "
            f"{sum(r['clip_frac'] for r in updates) / len(updates):.3f} |"
        )
    (out_dir / "sweep.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return
    figure = Figure(figsize=(10, 3.6), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 2)
    for rate in rates:
        mine = [r for r in records if r["learning_rate"] == rate]
        axes[0].plot([r["update"] for r in mine], [r["mean_w"] for r in mine], marker=".", label=f"lr {rate:g}")
        axes[1].plot([r["update"] for r in mine], [r["std_w"] for r in mine], marker=".", label=f"lr {rate:g}")
    axes[0].set_title("mean w over the block's positions")
    axes[1].set_title("std of w across positions")
    for axis in axes:
        axis.set_xlabel("update")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.savefig(out_dir / "sweep.png", dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    import shlex

    from hf_diversed.evaluation.models import load_pair

    argv = list(sys.argv[1:] if argv is None else argv)
    config, args = TrlParser((DiversedConfig, SweepArguments)).parse_args_and_config(argv)
    rates = args.rates()
    if args.sweep_steps * config.num_iterations > config.max_steps:
        raise SystemExit(
            f"--sweep_steps {args.sweep_steps} batches of {config.num_iterations} updates exceed the recipe's "
            f"max_steps {config.max_steps}: the sweep makes the recipe's first updates; lower --sweep_steps."
        )
    tokenizer, target, draft = load_pair(config.target, config.draft, getattr(torch, config.dtype), config.weights)
    out_dir = Path(args.sweep_dir)
    cache = Path(args.rollouts_cache) if args.rollouts_cache else out_dir / "rollouts.pt"
    blocks = draw_block(config, args.sweep_steps, target, draft, tokenizer, cache, args.draw_chunk_steps)
    records = sweep(config, rates, blocks, target, draft, tokenizer)
    positions = sum(r.num_tokens for _, batch, _ in blocks for r in batch)
    rollouts = sum(len(batch) for _, batch, _ in blocks)
    write_report(records, out_dir, shlex.join(["python", "training/lr_sweep.py", *argv]), positions, rollouts)
    print((out_dir / "sweep.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
