"""Train a DIVERSED ensemble head by RL: ``python training/train.py --config training/recipes/gsm8k.yaml``.

Every :class:`hf_diversed.trainer.DiversedTrainerConfig` field is a flag (``--max_steps 2``); command-line
flags override the YAML recipe. Multi-process: ``accelerate launch --num_processes 2 training/train.py ...``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import torch
from trl import TrlParser

from hf_diversed.trainer import DiversedTrainer, DiversedTrainerConfig


def parse_config(argv: Sequence[str] | None = None) -> DiversedTrainerConfig:
    """The config from ``--config recipe.yaml`` plus command-line overrides."""
    (config,) = TrlParser((DiversedTrainerConfig,)).parse_args_and_config(list(argv) if argv is not None else None)
    return config


def main(argv: Sequence[str] | None = None) -> int:
    from hf_diversed.demo import load_pair

    config = parse_config(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tokenizer, target, draft = load_pair(config.target, config.draft, getattr(torch, config.dtype))
    trainer = DiversedTrainer(config, target, draft, tokenizer=tokenizer)
    trainer.train()
    if trainer.accelerator.is_main_process:
        print(f"saved the head to {config.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
