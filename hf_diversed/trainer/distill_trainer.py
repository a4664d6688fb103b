"""Fine-tune the draft toward the target: the paper's "SD with a fine-tuned draft" baseline, with TRL + PEFT.

``python training/train.py --mode distill_draft --config training/recipes/distill_gsm8k.yaml`` trains a LoRA
adapter on the DRAFT (the student) by knowledge distillation toward the frozen TARGET (the teacher) on the task's
training split, using TRL's :class:`trl.DistillationTrainer`, and saves an ordinary PEFT adapter directory
(``adapter_config.json`` + ``adapter_model.safetensors`` + the tokenizer) that ``PeftModel.from_pretrained(draft,
dir)`` and ``hf-diversed bench --lora-draft dir`` load.

Objective. For a training sequence ``x = (prompt, y_1..y_T)`` the student q_phi (draft + LoRA, only the LoRA
weights phi train) minimises the token-mean generalized Jensen-Shannon divergence of TRL,

    L(phi) = sum_{t in completion} JSD_beta(p(. | x_<t) || q_phi(. | x_<t)) / #completion tokens,
    JSD_beta(p || q) = beta KL(p || m) + (1 - beta) KL(q || m),   m = beta p + (1 - beta) q,

over every completion position (the prompt is context only), with p the target's and q the draft's next-token
distributions, both at ``temperature``. TRL's endpoints are ``beta = 0``: forward KL(p || q_phi) and ``beta = 1``:
reverse KL(q_phi || p). Our default is ``beta = 0``, the forward KL (classic word-level knowledge distillation:
the draft learns to cover the target's distribution, which is what speculative acceptance 1 - TV(p, q) rewards).

Which sequences. TRL 1.16's ``DistillationTrainer`` is on-policy only: the student samples every completion
(no ``lmbda`` option, unlike the older ``GKDTrainer``). We add the GKD-style mixture on top of it:
``lmbda`` is the probability that a generation batch is sampled from the student (on-policy); otherwise
(probability ``1 - lmbda``) the completions are the dataset's **reference** answers (GSM8K worked solutions, MBPP
reference code, CNN/DM highlights: off-policy, supervised KD). The default ``lmbda = 0`` is fully off-policy on
the references, so training needs no generation and runs on CPU; ``lmbda = 1`` is TRL's stock on-policy
distillation. The hook is ``hf_diversed.trainer.distill_trainer.ReferenceDistillationTrainer`` (built lazily, on first
access), a subclass that overrides the trainer's completion step (``_generate_single_turn``, plus a wrapper
that hands it the batch's references) and nothing else: the loss, batching, gradient accumulation,
checkpointing, resuming and multi-process handling are TRL's.

Both models are used as given: the target is never trained (``requires_grad`` off during training; its
parameters are checked unchanged afterwards), and the draft's base weights stay frozen; PEFT injects the LoRA
layers into the draft module in place, and they are removed again (``unload``) after the adapter is saved, and
the ``requires_grad`` flags and train/eval modes of both models are restored, so the caller's models are left as
they came (except ``pad_token_id`` in the draft's config, which TRL sets to the tokenizer's).
"""

from __future__ import annotations

import functools
import logging
import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .distill_config import DraftDistillConfig

__all__ = [
    "DraftDistillConfig",
    "build_distill_dataset",
    "distill_draft",
    "reference_completion",
]

logger = logging.getLogger(__name__)

_GSM8K_CALC = re.compile(r"<<[^<>]*>>")


def reference_completion(task_name: str, row: Mapping[str, Any]) -> str:
    """The task's reference answer for ``row``, formatted the way the task's prompt asks for it.

    gsm8k: the worked solution without its ``<<a*b=c>>`` calculator annotations (it ends in ``#### <number>``);
    mbpp: the reference ``code``, humaneval: stub + canonical solution, both in a ```python block;
    cnndm: the ``highlights``; xsum: the ``summary``.
    """
    name = task_name.strip().lower()
    if name == "gsm8k":
        return _GSM8K_CALC.sub("", row["answer"]).strip()
    if name == "mbpp":
        return f"```python\n{row['code'].strip()}\n```"
    if name == "humaneval":
        stub = row.get("code_prompt") or row["prompt"]
        return f"```python\n{stub.rstrip()}\n{row['canonical_solution'].rstrip()}\n```"
    if name == "cnndm":
        return row["highlights"].strip()
    if name == "xsum":
        return row["summary"].strip()
    raise ValueError(f"no reference completion for task {task_name!r}; add one to reference_completion.")


def build_distill_dataset(
    task: str, split: str = "train", max_examples: int | None = None, data_dir: str | None = None
):
    """Conversational prompt-completion :class:`datasets.Dataset` for TRL's ``DistillationTrainer``.

    Columns: ``prompt`` (the task's chat messages, one user turn) and ``completion`` (one assistant message holding
    :func:`reference_completion`). ``DistillationTrainer`` reads ``prompt``; ``completion`` is used by
    :class:`ReferenceDistillationTrainer` for the off-policy batches.
    """
    import datasets

    from ..evaluation.tasks import get_task

    spec = get_task(task)
    rows = spec.load(split, data_dir=data_dir)
    if max_examples is not None:
        rows = rows.select(range(min(max_examples, len(rows))))
    records = [
        {
            "prompt": spec.build_messages(row),
            "completion": [{"role": "assistant", "content": reference_completion(spec.name, row)}],
        }
        for row in rows
    ]
    if not records:
        raise ValueError(f"task {task!r} split {split!r} has no rows; check the data folder.")
    return datasets.Dataset.from_list(records)


@functools.cache
def _trainer_class():
    from trl import DistillationTrainer
    from trl.data_utils import is_conversational

    class _ReferenceDistillationTrainer(DistillationTrainer):
        """``DistillationTrainer`` that distils on the dataset's reference completions with probability 1 - lmbda.

        Only the completion source changes: per generation batch, with probability ``lmbda`` the student samples
        the completions (TRL's on-policy path), otherwise they are the tokens of the ``completion`` column,
        rendered with the chat template exactly as the conversation would be (prompt with generation prompt, then
        the assistant turn). Every completion is cut to ``max_length - prompt length`` tokens (at least 1).
        """

        def __init__(self, *args, lmbda: float = 0.0, max_length: int | None = None, **kwargs):
            self._lmbda = float(lmbda)
            self._max_length = max_length
            self._pending: list[tuple[Any, Any]] | None = None
            super().__init__(*args, **kwargs)
            self._source_rng = random.Random(self.args.seed)

        def _generate_and_score_completions(self, inputs):
            self._pending = [(x["prompt"], x.get("completion")) for x in inputs]
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                self._pending = None

        def _reference_ids(self, prompt: Any, prompt_ids: list[int], completion: Any) -> list[int]:
            tokenizer = self._tokenizer
            if is_conversational({"prompt": prompt}):
                messages = list(prompt) + list(completion)
                full = self.processing_class.apply_chat_template(
                    messages, tokenize=True, return_dict=True, **self.chat_template_kwargs
                )["input_ids"]
                if list(full[: len(prompt_ids)]) == list(prompt_ids) and len(full) > len(prompt_ids):
                    return list(full[len(prompt_ids) :])
                text = completion[-1]["content"]  # template not prefix-preserving: content + eos
            else:
                text = completion
            return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, has_tool_images=False):
            pending = self._pending
            usable = pending is not None and len(pending) == len(prompt_ids) and all(c for _, c in pending)
            on_policy = not usable or self._source_rng.random() < self._lmbda
            mode = "train" if self.model.training else "eval"
            self._metrics[mode]["on_policy"].append(float(on_policy))
            if on_policy:
                # sample no more than the longest completion that max_length leaves room for
                budget = self.generation_config.max_new_tokens
                if self._max_length is not None:
                    room = max(1, self._max_length - min(len(p) for p in prompt_ids))
                    self.generation_config.max_new_tokens = min(budget, room)
                try:
                    completions = super()._generate_single_turn(prompt_ids, images, multimodal_fields, has_tool_images)
                finally:
                    self.generation_config.max_new_tokens = budget
            else:
                completions = [
                    self._reference_ids(prompt, ids, completion)
                    for (prompt, completion), ids in zip(pending, prompt_ids, strict=True)
                ]
            if self._max_length is None:
                return completions
            return [list(c[: max(1, self._max_length - len(p))]) for p, c in zip(prompt_ids, completions, strict=True)]

    return _ReferenceDistillationTrainer


def __getattr__(name: str):
    # ReferenceDistillationTrainer is built lazily so that importing hf_diversed.trainer does not import trl.
    if name == "ReferenceDistillationTrainer":
        return _trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _load_missing(config: DraftDistillConfig, target, draft, tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..evaluation.weights import locate_model

    sources = {}

    def locate(name: str):
        if name not in sources:  # located (and announced) once per model
            sources[name] = locate_model(name, config.weights)
        return sources[name]

    def load(name: str):
        source = locate(name)
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype).eval()
        if source.substituted:  # a GGUF copy in a local cache: the adapter's base is still the Hub model
            model.config.name_or_path = model.name_or_path = source.provenance["hub_id"]  # PEFT reads this attribute
        return model

    dtype = getattr(torch, config.dtype)
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(locate(config.target).path)
    if target is None:
        target = load(config.target)
    if draft is None:
        draft = load(config.draft)
    return target, draft, tokenizer


def distillation_args(config: DraftDistillConfig):
    """The :class:`trl.DistillationConfig` that :func:`distill_draft` runs with."""
    from transformers.utils import is_torch_bf16_gpu_available
    from trl import DistillationConfig

    bf16 = config.dtype == "bfloat16"
    return DistillationConfig(
        output_dir=config.output_dir,
        learning_rate=config.learning_rate,
        lr_scheduler_type=config.lr_scheduler_type,
        warmup_steps=config.warmup_steps,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        num_train_epochs=config.num_train_epochs,
        max_steps=config.max_steps,
        per_device_train_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        max_completion_length=config.max_length,  # on-policy samples; our hook cuts prompt + completion to max_length
        temperature=config.temperature,
        beta=config.beta,
        activation_checkpointing=config.gradient_checkpointing,  # transformers 5 name of gradient_checkpointing
        bf16=bf16,
        # transformers refuses bf16 without a bf16 GPU unless told to train on the CPU, which is then where it runs
        use_cpu=bf16 and not is_torch_bf16_gpu_available(),
        fp16=config.dtype == "float16",
        seed=config.seed,
        logging_steps=config.logging_steps,
        save_strategy="steps" if config.save_steps else "no",
        save_steps=config.save_steps or 500,
        report_to="none" if config.report_to == "none" else [config.report_to],
        push_to_hub=config.push_to_hub,
        hub_model_id=config.hub_model_id,
        remove_unused_columns=False,
        dataloader_pin_memory=torch.cuda.is_available(),
    )


def distill_draft(config: DraftDistillConfig, target=None, draft=None, tokenizer=None) -> Path:
    """Train the draft's LoRA adapter by distillation toward the target; return the adapter directory.

    Models and tokenizer not passed are loaded from ``config.target`` / ``config.draft`` in ``config.dtype``.
    The adapter and the tokenizer are saved to ``config.output_dir``; ``config.resume_from_checkpoint`` is passed to
    ``trainer.train``.
    """
    from .diversed_trainer import _fingerprint

    target, draft, tokenizer = _load_missing(config, target, draft, tokenizer)
    t_vocab, d_vocab = target.config.get_text_config().vocab_size, draft.config.get_text_config().vocab_size
    if t_vocab != d_vocab:
        raise ValueError(
            f"target and draft vocabulary sizes differ ({t_vocab} and {d_vocab}); the distillation compares the two "
            "laws id by id over one vocabulary size: distil a draft with the target's (speculative decoding itself "
            "also runs a draft whose vocabulary is a padded prefix of the target's)."
        )
    dataset = build_distill_dataset(config.task, config.train_split, config.max_train_examples, config.data_dir)
    target_grad = [p.requires_grad for p in target.parameters()]
    draft_grad = [p.requires_grad for p in draft.parameters()]
    draft_was_training, target_was_training = draft.training, target.training
    target.requires_grad_(False)
    target_before = _fingerprint(target)

    trainer = _trainer_class()(
        model=draft,
        teacher_model=target,
        args=distillation_args(config),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=config.lora_config(),
        lmbda=config.lmbda,
        max_length=config.max_length,
    )
    logger.info(
        "distilling %s -> %s on %d %s/%s examples (beta=%s, lmbda=%s, LoRA r=%d)",
        config.target, config.draft, len(dataset), config.task, config.train_split,
        config.beta, config.lmbda, config.lora_r,
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    output_dir = Path(config.output_dir)
    trainer.save_model(str(output_dir))
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(output_dir)
    if config.push_to_hub:
        trainer.push_to_hub()

    if _fingerprint(target) != target_before:  # pragma: no cover - a TRL regression
        raise RuntimeError("the target changed during distillation; it must stay frozen.")
    # Give the caller its draft back as it came: remove the LoRA layers PEFT injected in place.
    peft_model = trainer.accelerator.unwrap_model(trainer.model)
    peft_model.unload()
    for param, flag in zip(draft.parameters(), draft_grad, strict=True):
        param.requires_grad_(flag)
    for param, flag in zip(target.parameters(), target_grad, strict=True):
        param.requires_grad_(flag)
    draft.train(draft_was_training)
    target.train(target_was_training)
    return output_dir
