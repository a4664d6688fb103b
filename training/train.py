"""Train a DIVERSED ensemble head by RL: ``python training/train.py --config training/recipes/gsm8k.yaml``.

Every :class:`hf_diversed.trainer.DiversedConfig` field is a flag (``--max_steps 8``), the
``transformers.TrainingArguments`` ones included (``--report_to tensorboard``, ``--resume_from_checkpoint true``,
``--push_to_hub --hub_model_id org/head``); command-line flags override the YAML recipe. Multi-process:
``accelerate launch --multi_gpu --num_processes 2 training/train.py``
(CPU-only machines too: ``--multi_gpu`` starts the ranks and the trainer joins them in a gloo group).

``--mode distill_draft`` instead fine-tunes a LoRA adapter on the draft by distillation toward the target (the
"SD with a fine-tuned draft" baseline, :mod:`hf_diversed.trainer.distill_trainer`); its flags are the fields of
:class:`hf_diversed.trainer.DraftDistillConfig`:
``python training/train.py --mode distill_draft --config training/recipes/distill_gsm8k.yaml``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import torch
from trl import TrlParser

from hf_diversed.trainer import DiversedConfig, DiversedTrainer

MODES = ("head", "distill_draft")


def split_mode(argv: Sequence[str] | None = None) -> tuple[str, list[str]]:
    """``--mode`` (default ``head``) and the remaining arguments."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--mode", choices=MODES, default="head")
    args, rest = parser.parse_known_args(list(argv) if argv is not None else sys.argv[1:])
    return args.mode, rest


def parse_config(argv: Sequence[str] | None = None):
    """The config from ``--config recipe.yaml`` plus command-line overrides.

    A :class:`DiversedConfig` for ``--mode head`` (the default), a
    :class:`hf_diversed.trainer.DraftDistillConfig` for ``--mode distill_draft``.
    """
    mode, rest = split_mode(argv)
    if mode == "distill_draft":
        from hf_diversed.trainer import DraftDistillConfig

        (config,) = TrlParser((DraftDistillConfig,)).parse_args_and_config(rest)
        return config
    (config,) = TrlParser((DiversedConfig,)).parse_args_and_config(rest)
    return config


def main(argv: Sequence[str] | None = None) -> int:
    from hf_diversed.cli.main import user_errors
    from hf_diversed.evaluation.models import load_pair

    try:
        config = parse_config(argv)
    except (ValueError, *user_errors()) as err:  # a setting the config refuses: one line naming it and the fix
        print(f"train.py: error: {err}", file=sys.stderr)
        return 2
    if not isinstance(config, DiversedConfig):
        from accelerate import PartialState

        from hf_diversed.trainer import distill_draft

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        output_dir = distill_draft(config)
        if PartialState().is_main_process:
            print(f"saved the draft's LoRA adapter to {output_dir}")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tokenizer, target, draft = load_pair(config.target, config.draft, getattr(torch, config.dtype), config.weights)
    trainer = DiversedTrainer(target, draft, config, processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    trainer.save_model()
    if config.push_to_hub:
        trainer.push_to_hub()
    if trainer.is_world_process_zero():
        pushed = f" and pushed it to {trainer.hub_model_id}" if config.push_to_hub else ""
        print(f"saved the head to {config.output_dir}{pushed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
