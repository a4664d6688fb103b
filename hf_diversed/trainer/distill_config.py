"""Configuration of the draft's LoRA distillation (every field is a flag of ``train.py --mode distill_draft``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..evaluation.weights import WEIGHTS_HELP


@dataclass
class DraftDistillConfig:
    """Configuration of :func:`distill_draft` (every field is a flag of ``training/train.py --mode distill_draft``)."""

    task: str = field(
        default="gsm8k", metadata={"help": "Task (hf_diversed.evaluation.tasks): prompts and references."}
    )
    target: str = field(
        default="qwen2.5-coder-1.5b-instruct", metadata={"help": "Teacher (target) model: built-in name, Hub id, path."}
    )
    draft: str = field(
        default="qwen2.5-coder-0.5b-instruct", metadata={"help": "Student (draft) model sharing the vocabulary."}
    )
    weights: str | None = field(default=None, metadata={"help": WEIGHTS_HELP})
    dtype: str = field(
        default="auto",
        metadata={"help": "dtype of both models: auto (bfloat16 where the CPU has fast bf16, else float32), "
                  "bfloat16, float16 or float32."},
    )  # fmt: skip
    data_dir: str | None = field(
        default=None, metadata={"help": "Data folder (default: as the tasks look, else the Hub)."}
    )
    train_split: str = field(default="train", metadata={"help": "Split the training examples come from."})
    max_train_examples: int | None = field(default=None, metadata={"help": "Use only the first N rows."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: float = field(default=32.0, metadata={"help": "LoRA alpha (scaling alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout."})
    target_modules: str = field(
        default="all-linear",
        metadata={"help": "'all-linear' or comma-separated module names, e.g. 'q_proj,k_proj,v_proj,o_proj'."},
    )
    learning_rate: float = field(default=2e-4, metadata={"help": "AdamW learning rate."})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "transformers scheduler name."})
    warmup_steps: int = field(default=0, metadata={"help": "Linear warm-up steps."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm."})
    num_train_epochs: float = field(default=1.0, metadata={"help": "Epochs over the examples (if max_steps <= 0)."})
    max_steps: int = field(default=-1, metadata={"help": "Optimiser steps; > 0 overrides num_train_epochs."})
    per_device_train_batch_size: int = field(default=4, metadata={"help": "Sequences per device per micro-step."})
    gradient_accumulation_steps: int = field(default=2, metadata={"help": "Micro-steps per optimiser step."})
    max_length: int = field(
        default=512,
        metadata={"help": "Cap on prompt + completion tokens: completions are cut to max_length - prompt length."},
    )
    temperature: float = field(default=1.0, metadata={"help": "Softmax temperature of both models in the loss."})
    beta: float = field(default=0.0, metadata={"help": "TRL generalized-JSD beta: 0 forward KL(p||q), 1 reverse KL."})
    lmbda: float = field(
        default=0.0, metadata={"help": "Probability of an on-policy (student-sampled) batch; else reference answers."}
    )
    gradient_checkpointing: bool = field(default=False, metadata={"help": "Recompute activations to save memory."})
    seed: int = field(default=0, metadata={"help": "Seed of data order, LoRA init and sampling."})
    output_dir: str = field(default="outputs/draft-lora-gsm8k", metadata={"help": "Checkpoints and final adapter."})
    save_steps: int = field(default=0, metadata={"help": "Checkpoint every N steps (0: only the final adapter)."})
    logging_steps: int = field(default=10, metadata={"help": "Log metrics every N steps."})
    report_to: str = field(default="none", metadata={"help": "none, tensorboard, wandb or trackio."})
    resume_from_checkpoint: str | None = field(default=None, metadata={"help": "checkpoint-N directory to resume."})
    push_to_hub: bool = field(default=False, metadata={"help": "Push the final adapter to the Hub."})
    hub_model_id: str | None = field(default=None, metadata={"help": "Hub repo id for push_to_hub."})

    def __post_init__(self):
        from ..evaluation.tasks import get_task, parse_split

        def integer(name: str, minimum: int) -> None:
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= minimum):
                raise ValueError(f"`{name}` must be an int >= {minimum}, got {value!r}; pass e.g. --{name} {minimum}.")

        try:
            task = get_task(self.task)
        except ValueError as exc:
            raise ValueError(f"{exc}; pass one of them as --task.") from None
        try:
            split_name = parse_split(self.train_split)[0]
        except ValueError as exc:
            raise ValueError(f"{exc} (--train_split)") from None
        if split_name not in task.splits:
            raise ValueError(
                f"task {task.name!r} has no split {split_name!r}; pass --train_split as one of "
                f"{', '.join(task.splits)}, optionally sliced like test[100:]."
            )
        for name in ("lora_r", "per_device_train_batch_size", "gradient_accumulation_steps", "logging_steps"):
            integer(name, 1)
        for name in ("save_steps", "warmup_steps"):
            integer(name, 0)
        if self.max_train_examples is not None:
            integer("max_train_examples", 1)
        integer("max_length", 2)
        if not isinstance(self.max_steps, int) or isinstance(self.max_steps, bool):
            raise ValueError(f"`max_steps` must be an int (<= 0: use num_train_epochs), got {self.max_steps!r}.")
        if self.max_steps <= 0 and not (self.num_train_epochs > 0 and math.isfinite(self.num_train_epochs)):
            raise ValueError(
                f"`num_train_epochs` must be > 0 when max_steps <= 0, got {self.num_train_epochs}; "
                "set --num_train_epochs 1 or --max_steps N."
            )
        if not self.lora_alpha > 0:
            raise ValueError(f"`lora_alpha` must be > 0, got {self.lora_alpha}; the usual choice is 2 * lora_r.")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"`lora_dropout` must be in [0, 1), got {self.lora_dropout}; e.g. --lora_dropout 0.05.")
        if not self.target_modules_list():
            raise ValueError("`target_modules` is empty; pass 'all-linear' or e.g. 'q_proj,k_proj,v_proj,o_proj'.")
        if "lm_head" in self.target_modules_list():
            raise ValueError("`target_modules` must not include lm_head: TRL's loss reads lm_head.weight directly.")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"`learning_rate` must be > 0, got {self.learning_rate}; e.g. --learning_rate 2e-4.")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"`temperature` must be > 0, got {self.temperature}; 1.0 matches the raw models.")
        for name in ("beta", "lmbda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"`{name}` must be in [0, 1], got {getattr(self, name)}.")
        for name in ("weight_decay",):
            if not getattr(self, name) >= 0:
                raise ValueError(f"`{name}` must be >= 0, got {getattr(self, name)}.")
        if not self.max_grad_norm > 0:
            raise ValueError(f"`max_grad_norm` must be > 0, got {self.max_grad_norm}.")
        if self.dtype not in ("auto", "bfloat16", "float32", "float16"):
            raise ValueError(f"`dtype` must be auto, bfloat16, float16 or float32, got {self.dtype!r}.")
        if self.dtype == "auto":
            from ..modeling.dtypes import resolve_dtype

            self.dtype = resolve_dtype("auto")
        if self.push_to_hub and not self.hub_model_id:
            raise ValueError("`push_to_hub` needs `hub_model_id` (e.g. 'org/qwen-coder-0.5b-draft-lora-gsm8k').")
        if self.resume_from_checkpoint is not None and not Path(self.resume_from_checkpoint).is_dir():
            raise ValueError(
                f"`resume_from_checkpoint` {self.resume_from_checkpoint!r} is not a directory; pass a "
                f"checkpoint-N folder written under output_dir (save_steps > 0)."
            )

    def target_modules_list(self) -> str | list[str]:
        """``"all-linear"`` or the list of module names."""
        text = str(self.target_modules).strip()
        if text == "all-linear":
            return text
        return [name.strip() for name in text.split(",") if name.strip()]

    def lora_config(self):
        """The :class:`peft.LoraConfig` of the draft's adapter."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.lora_r,
            lora_alpha=self.lora_alpha,
            lora_dropout=self.lora_dropout,
            target_modules=self.target_modules_list(),
            task_type="CAUSAL_LM",
        )
