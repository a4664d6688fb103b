"""Configuration of the DIVERSED head's trainer: :class:`transformers.TrainingArguments` plus the method's fields.

Every field is a flag of ``training/train.py``. Steps are the Trainer's: one step is one optimizer update, and each
rollout batch of ``num_prompts`` prompts is learned from for ``num_iterations`` updates (TRL's names and meaning).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from transformers import TrainingArguments

from ..evaluation.weights import WEIGHTS_HELP
from ..modeling.configuration_diversed_head import VERIFICATIONS


@dataclass
class DiversedConfig(TrainingArguments):
    """Configuration of :class:`~hf_diversed.trainer.DiversedTrainer`.

    The method's own fields are below; every :class:`transformers.TrainingArguments` field works as in any Trainer
    (``report_to``, ``save_steps``, ``eval_strategy``/``eval_steps``/``eval_on_start``, ``push_to_hub``,
    ``resume_from_checkpoint``, accelerate/DeepSpeed/FSDP settings), with these defaults changed: the paper's
    recipe (``learning_rate`` 5e-4, cosine schedule, ``max_grad_norm`` 5, seed 0) and ``max_steps`` 400 updates =
    100 rollout batches of 4 iterations. The batch is ``num_prompts`` prompts (global), so
    ``per_device_train_batch_size`` and ``gradient_accumulation_steps`` stay at their defaults.
    """

    # ---- TrainingArguments whose defaults are the paper's recipe
    output_dir: str | None = field(default="outputs/diversed-head", metadata={"help": "Checkpoints and final head."})
    learning_rate: float = field(default=5e-4, metadata={"help": "AdamW learning rate."})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "transformers.get_scheduler name."})
    warmup_steps: float = field(default=40, metadata={"help": "Linear warm-up updates (a float < 1: a ratio)."})
    max_steps: int = field(default=400, metadata={"help": "Optimizer updates (num_iterations per rollout batch)."})
    max_grad_norm: float = field(default=5.0, metadata={"help": "Gradient clipping norm."})
    logging_steps: float = field(default=1, metadata={"help": "Log metrics every N updates."})
    seed: int = field(default=0, metadata={"help": "Seed of data order, rollouts and head init."})
    report_to: None | str | list[str] = field(
        default="none", metadata={"help": "Trackers transformers knows (tensorboard, wandb, mlflow, trackio, ...)."}
    )

    # ---- models and data
    task: str | None = field(
        default="gsm8k", metadata={"help": "Task (hf_diversed.evaluation.tasks): prompts, reward."}
    )
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
    num_eval_prompts: int = field(
        default=0,
        metadata={"help": "Eval prompts (0: no evaluation). Evaluated when eval_strategy says, and the trained and "
                  "untrained heads at the end (the model card's table)."},
    )  # fmt: skip

    # ---- rollouts
    num_prompts: int = field(default=8, metadata={"help": "Prompts per rollout batch (global, over all processes)."})
    num_generations: int = field(default=1, metadata={"help": "Completions per prompt (>1: group-mean baseline)."})
    max_new_tokens: int = field(default=128, metadata={"help": "New tokens per rollout."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of rollouts (> 0)."})
    num_assistant_tokens: int = field(default=5, metadata={"help": "Draft length per round."})
    rollout_batch_size: int = field(
        default=32,
        metadata={"help": "Rows decoded together by the batched sampler (1 decodes one sequence at a time)."},
    )
    steps_per_generation: int = field(
        default=1,
        metadata={"help": "Rollout batches drawn together, with the head of the first update of the block (TRL's "
                  "name): K x num_prompts x num_generations rows fill the sampler's batch. The later batches learn "
                  "off-policy; the PPO ratio against the recorded w corrects for it."},
    )  # fmt: skip

    # ---- objective
    num_iterations: int = field(
        default=4, metadata={"help": "Updates per rollout batch (TRL's name; PPO epochs over the stored features)."}
    )
    epsilon: float = field(default=0.2, metadata={"help": "PPO ratio clip epsilon (TRL's name)."})
    kl_coef: float = field(default=0.0, metadata={"help": "Token KL to the initial head, subtracted from reward."})
    acceptance_coef: float = field(default=0.0, metadata={"help": "lambda: weight of mean w*TV (acceptance)."})

    # ---- the head
    init_weight: float = field(default=0.5, metadata={"help": "w of a fresh head (its static ensemble)."})
    verification: str = field(
        default="mixture",
        metadata={"help": "What the head's output sets: 'mixture', the weight w_t of nu_t (DIVERSED); 'lenience', "
                  "lossy SD's lenience l_t (a fresh head is lossy SD with l = init_weight)."},
    )  # fmt: skip
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

    @property
    def updates_per_generation(self) -> int:
        """Optimizer updates between two sampler calls: ``steps_per_generation * num_iterations``."""
        return self.steps_per_generation * self.num_iterations

    def __post_init__(self):
        self._check_method_fields()
        if isinstance(self.report_to, str) and "," in self.report_to:  # the command line's "tensorboard,wandb"
            self.report_to = [name.strip() for name in self.report_to.split(",") if name.strip()]
        elif isinstance(self.report_to, list):
            self.report_to = [name.strip() for entry in self.report_to for name in entry.split(",") if name.strip()]
        if self.ddp_backend and "WORLD_SIZE" not in os.environ:
            raise ValueError(
                f"`ddp_backend`={self.ddp_backend!r} is for runs started by `accelerate launch` (or torchrun); "
                "drop it for a single process."
            )
        super().__post_init__()
        if self.per_device_train_batch_size != 8 or self.gradient_accumulation_steps != 1:
            raise ValueError(
                "The head's batch is `num_prompts` prompts over all processes: leave `per_device_train_batch_size` "
                "and `gradient_accumulation_steps` at their defaults and set `num_prompts`."
            )
        if self.dataloader_num_workers:
            raise ValueError("`dataloader_num_workers` must be 0: rollouts are drawn in the training process.")
        if self.max_steps <= 0:
            raise ValueError(f"`max_steps` must be > 0 (optimizer updates), got {self.max_steps}.")
        period = self.updates_per_generation
        if self.save_strategy == "steps" and self.save_steps >= 1 and self.save_steps % period:
            raise ValueError(
                f"`save_steps`={self.save_steps:g} must be a multiple of steps_per_generation x num_iterations = "
                f"{period}: a checkpoint inside a generation block could not redraw that block's rollouts on resume."
            )
        if self.dtype == "auto":
            from ..modeling.dtypes import resolve_dtype

            self.dtype = resolve_dtype("auto")

    def _check_method_fields(self) -> None:
        def positive(name: str, allow_zero: bool = False) -> None:
            value = getattr(self, name)
            ok = isinstance(value, int) and not isinstance(value, bool) and (value >= 0 if allow_zero else value > 0)
            if not ok:
                raise ValueError(f"`{name}` must be an int {'>= 0' if allow_zero else '> 0'}, got {value!r}.")

        for name in (
            "num_prompts",
            "num_generations",
            "max_new_tokens",
            "num_assistant_tokens",
            "rollout_batch_size",
            "steps_per_generation",
            "num_iterations",
        ):
            positive(name)
        for name in ("num_eval_prompts", "head_hidden_size"):
            positive(name, allow_zero=True)
        if self.max_train_prompts is not None:
            positive("max_train_prompts")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(
                f"`temperature` must be > 0: the head is trained on-policy on sampled rollouts; got {self.temperature}."
            )
        if not self.learning_rate > 0:
            raise ValueError(f"`learning_rate` must be > 0, got {self.learning_rate}.")
        if not 0 < self.epsilon < 1:
            raise ValueError(f"`epsilon` must be in (0, 1), got {self.epsilon}.")
        for name in ("kl_coef", "acceptance_coef", "weight_decay"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"`{name}` must be >= 0, got {getattr(self, name)}.")
        if not self.max_grad_norm > 0:
            raise ValueError(f"`max_grad_norm` must be > 0, got {self.max_grad_norm}.")
        if not 0.0 <= self.init_weight <= 1.0:
            raise ValueError(f"`init_weight` must be in [0, 1], got {self.init_weight}.")
        if self.verification not in VERIFICATIONS:
            raise ValueError(
                f"`verification` must be one of {', '.join(VERIFICATIONS)} (what the head's output sets), got "
                f"{self.verification!r}."
            )
        if self.dtype not in ("auto", "bfloat16", "float32", "float16"):
            raise ValueError(f"`dtype` must be auto, bfloat16, float16 or float32, got {self.dtype!r}.")
