"""Configuration of the DIVERSED head's trainer: every field is a flag of ``training/train.py``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..evaluation.weights import WEIGHTS_HELP


@dataclass
class DiversedTrainerConfig:
    """Configuration of :class:`DiversedTrainer` (every field is a command-line flag of ``training/train.py``)."""

    task: str = field(default="gsm8k", metadata={"help": "Task (hf_diversed.evaluation.tasks): prompts, reward."})
    target: str = field(
        default="qwen2.5-coder-1.5b-instruct", metadata={"help": "Target model: Hub id, path, or a GGUF copy's name."}
    )
    draft: str = field(
        default="qwen2.5-coder-0.5b-instruct", metadata={"help": "Draft model sharing the target's tokenizer."}
    )
    weights: str | None = field(default=None, metadata={"help": WEIGHTS_HELP})
    dtype: str = field(
        default="auto",
        metadata={"help": "dtype of the frozen LMs: auto (bfloat16 where the CPU has fast bf16, else float32), "
                  "bfloat16 or float32."},
    )  # fmt: skip
    train_split: str = field(default="train", metadata={"help": "Split the training prompts come from."})
    eval_split: str = field(default="test", metadata={"help": "Split the evaluation prompts come from."})
    max_train_prompts: int | None = field(default=None, metadata={"help": "Use only the first N training rows."})
    num_prompts: int = field(default=8, metadata={"help": "Prompts per optimisation step (global batch)."})
    num_generations: int = field(default=1, metadata={"help": "Completions per prompt (>1: group-mean baseline)."})
    max_new_tokens: int = field(default=128, metadata={"help": "New tokens per rollout."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of rollouts (> 0)."})
    num_assistant_tokens: int = field(default=5, metadata={"help": "Draft length per round."})
    rollout_batch_size: int = field(
        default=32,
        metadata={
            "help": "Rows decoded together by the batched sampler (1 decodes one sequence at a time through the "
            "sampler)."
        },
    )
    steps_per_generation: int = field(
        default=1,
        metadata={
            "help": "Optimisation steps whose rollouts are drawn together, with the head of the first of them (TRL's "
            "name): K x num_prompts x num_generations rows fill the sampler's batch. 1: every step on-policy. "
            "Later steps of a block learn off-policy; the PPO ratio against the recorded w corrects for it."
        },
    )
    learning_rate: float = field(default=5e-4, metadata={"help": "AdamW learning rate."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    warmup_steps: int = field(default=10, metadata={"help": "Linear warm-up steps."})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "transformers.get_scheduler name."})
    max_steps: int = field(default=100, metadata={"help": "Optimisation steps (one rollout batch each)."})
    ppo_epochs: int = field(default=4, metadata={"help": "Gradient epochs over each batch of stored features."})
    clip_eps: float = field(default=0.2, metadata={"help": "PPO ratio clip epsilon."})
    kl_coef: float = field(default=0.0, metadata={"help": "Token KL to the initial head, subtracted from reward."})
    acceptance_coef: float = field(default=0.0, metadata={"help": "lambda: weight of mean w*TV (acceptance)."})
    max_grad_norm: float = field(default=5.0, metadata={"help": "Gradient clipping norm."})
    seed: int = field(default=0, metadata={"help": "Seed of data order, rollouts and head init."})
    output_dir: str = field(default="outputs/diversed-head", metadata={"help": "Checkpoints and final head."})
    save_steps: int = field(default=0, metadata={"help": "Checkpoint every N steps (0: never)."})
    eval_steps: int = field(
        default=0, metadata={"help": "Evaluate every N steps and the untrained head at step 0 (0: only at the end)."}
    )
    num_eval_prompts: int = field(default=0, metadata={"help": "Eval prompts (0: no evaluation)."})
    logging_steps: int = field(default=1, metadata={"help": "Log metrics every N steps."})
    report_to: str = field(default="none", metadata={"help": "none or tensorboard."})
    push_to_hub: bool = field(default=False, metadata={"help": "Push the final head and its card to the Hub."})
    hub_model_id: str | None = field(default=None, metadata={"help": "Hub repo id for push_to_hub."})
    init_weight: float = field(default=0.5, metadata={"help": "w of a fresh head (its static ensemble)."})
    head_hidden_size: int = field(default=0, metadata={"help": "0: one linear layer; >0: hidden layer width."})
    use_distribution_features: bool = field(
        default=False,
        metadata={"help": "The fresh head also reads max p_t, max q_t and TV(p_t, q_t) at each position (what the "
                  "speculative cascades' deferral rules compare)."},
    )  # fmt: skip
    init_head: str | None = field(
        default=None,
        metadata={"help": "Start from this head (Hub id or directory, e.g. one fitted to a rule by "
                  "training/imitate_rule.py) instead of a fresh static one; or from a speculative cascade, "
                  "cascade-{chow,diff,opt}:ALPHA: a head reading the next-token laws, set to that cascade "
                  "(DiversedHead.from_cascade; linear, or an MLP of head_hidden_size >= 2)."},
    )  # fmt: skip
    resume_from_checkpoint: str | None = field(default=None, metadata={"help": "Checkpoint directory to resume."})

    def __post_init__(self):
        def positive(name: str, allow_zero: bool = False) -> None:
            value = getattr(self, name)
            ok = isinstance(value, int) and not isinstance(value, bool) and (value >= 0 if allow_zero else value > 0)
            if not ok:
                bound = ">= 0" if allow_zero else "> 0"
                raise ValueError(f"`{name}` must be an int {bound}, got {value!r}.")

        for name in (
            "num_prompts",
            "num_generations",
            "max_new_tokens",
            "num_assistant_tokens",
            "rollout_batch_size",
            "steps_per_generation",
            "max_steps",
            "ppo_epochs",
            "logging_steps",
        ):
            positive(name)
        for name in ("warmup_steps", "save_steps", "eval_steps", "num_eval_prompts", "head_hidden_size"):
            positive(name, allow_zero=True)
        if self.save_steps % self.steps_per_generation:
            raise ValueError(
                f"`save_steps`={self.save_steps} must be a multiple of `steps_per_generation`="
                f"{self.steps_per_generation}: a checkpoint inside a generation block could not redraw that block's "
                "rollouts on resume. Pick save_steps as a multiple of steps_per_generation."
            )
        if self.max_train_prompts is not None:
            positive("max_train_prompts")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(
                f"`temperature` must be > 0: the head is trained on-policy on sampled rollouts; got {self.temperature}."
            )
        if not self.learning_rate > 0:
            raise ValueError(f"`learning_rate` must be > 0, got {self.learning_rate}.")
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"`clip_eps` must be in (0, 1), got {self.clip_eps}.")
        for name in ("kl_coef", "acceptance_coef", "weight_decay"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"`{name}` must be >= 0, got {getattr(self, name)}.")
        if not self.max_grad_norm > 0:
            raise ValueError(f"`max_grad_norm` must be > 0, got {self.max_grad_norm}.")
        if not 0.0 <= self.init_weight <= 1.0:
            raise ValueError(f"`init_weight` must be in [0, 1], got {self.init_weight}.")
        if self.report_to not in ("none", "tensorboard"):
            raise ValueError(f"`report_to` must be 'none' or 'tensorboard', got {self.report_to!r}.")
        if self.dtype not in ("auto", "bfloat16", "float32", "float16"):
            raise ValueError(f"`dtype` must be auto, bfloat16, float16 or float32, got {self.dtype!r}.")
        if self.dtype == "auto":
            from ..modeling.dtypes import resolve_dtype

            self.dtype = resolve_dtype("auto")
        if self.push_to_hub and not self.hub_model_id:
            raise ValueError("`push_to_hub` needs `hub_model_id` (e.g. 'org/diversed-head-gsm8k').")
