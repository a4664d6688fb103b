"""Training: the REINFORCE++ trainer of the DIVERSED head, its rollouts, and the LoRA-draft distillation baseline.

- ``diversed_trainer.py``: :class:`DiversedTrainer` and :class:`DiversedTrainerConfig`.
- ``rollout.py``: on-policy rollouts with the per-token features the trainer needs.
- ``distill_trainer.py``: the paper's "SD with a fine-tuned draft" baseline (TRL + PEFT).

Uses :mod:`hf_diversed.generation`, :mod:`hf_diversed.modeling` and the tasks of :mod:`hf_diversed.evaluation`.
"""

from .distill_trainer import DraftDistillConfig, build_distill_dataset, distill_draft, reference_completion
from .diversed_trainer import DiversedTrainer, DiversedTrainerConfig, diversed_policy_loss, mixture_prob

__all__ = [
    "DiversedTrainer",
    "DiversedTrainerConfig",
    "DraftDistillConfig",
    "build_distill_dataset",
    "distill_draft",
    "diversed_policy_loss",
    "mixture_prob",
    "reference_completion",
]
