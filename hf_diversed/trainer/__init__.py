"""Training: the REINFORCE++ trainer of the DIVERSED head, its rollouts, and the LoRA-draft distillation baseline.

As in TRL, each trainer sits beside its config:

- ``diversed_trainer.py`` / ``diversed_config.py``: :class:`DiversedTrainer` (a ``transformers.Trainer``) and
  :class:`DiversedConfig` (its ``TrainingArguments``).
- ``objective.py``: the RL objective (REINFORCE++ advantages, the clipped surrogate on nu, the acceptance term).
- ``rollout.py``: on-policy rollouts with the per-token features the trainer needs.
- ``distill_trainer.py`` / ``distill_config.py``: the paper's "SD with a fine-tuned draft" baseline (TRL + PEFT),
  :func:`distill_draft`, :class:`DraftDistillConfig`.

Uses :mod:`hf_diversed.generation`, :mod:`hf_diversed.modeling` and the tasks of :mod:`hf_diversed.evaluation`.
"""

from .distill_config import DraftDistillConfig
from .distill_trainer import build_distill_dataset, distill_draft, reference_completion
from .diversed_config import DiversedConfig
from .diversed_trainer import DiversedTrainer
from .objective import diversed_policy_loss, mixture_prob, reinforce_pp_advantages

__all__ = [
    "DiversedTrainer",
    "DiversedConfig",
    "DraftDistillConfig",
    "build_distill_dataset",
    "distill_draft",
    "diversed_policy_loss",
    "mixture_prob",
    "reference_completion",
    "reinforce_pp_advantages",
]
