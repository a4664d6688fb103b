"""The DIVERSED head's reinforcement-learning trainer: a :class:`transformers.Trainer` whose policy is the head.

Why not TRL's ``GRPOTrainer``: its config refuses ``num_generations < 2`` (the paper's REINFORCE++ recipe draws one
completion per prompt, baseline = the batch mean), and its policy log-probabilities come from a causal LM's forward
over prompt + completion (``_get_per_token_logps_and_entropies``, called while scoring and in the loss), with a
reference model and tokenizer loaded from that LM's Hub id. The head's policy nu_w(y) = w p(y) + (1 - w) q(y) is a
function of per-token features recorded at rollout time, not of the token ids, so every one of those pieces would
be overridden. The Trainer underneath gives the rest: the loop, optimizer and schedule, accelerate (DDP, DeepSpeed,
FSDP), checkpoints and resume, callbacks, every tracker of ``report_to``, evaluation during training, and the Hub.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import math
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from ..evaluation.weights import weights_record
from ..generation.trace import Trace
from ..modeling.hub import write_custom_generate
from ..modeling.model_card import render_head_card, weights_sentence
from ..modeling.modeling_diversed_head import DiversedHead, head_verification, position_weights
from .curves import CURVES_FILE, plot_learning_curves
from .diversed_config import DiversedConfig
from .objective import diversed_policy_loss, emitted_prob, reinforce_pp_advantages, rejection_prob
from .rollout import Rollout, collect_rollouts

__all__ = ["DiversedConfig", "DiversedTrainer"]

logger = logging.getLogger(__name__)

REF_HEAD_FILE = "ref_head.safetensors"
STATE_FILE = "diversed_state.json"
LOG_FILE = "log_history.jsonl"
# The Trainer's fields a head's card reports beside the method's own.
_LAST_VALUE_METRICS = ("rollout_age", "rollout_batch")  # logged as at the last update, not averaged
_CARD_TRAINING_FIELDS = ("learning_rate", "lr_scheduler_type", "warmup_steps", "max_steps", "max_grad_norm",
                         "weight_decay", "seed")  # fmt: skip


@contextlib.contextmanager
def _eval_mode(module: torch.nn.Module):
    """``module`` in eval mode inside the block, its previous mode restored after."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


def _fingerprint(model: torch.nn.Module) -> list[tuple[str, float, float]]:
    with torch.no_grad():
        return [
            (n, float(torch.sum(p, dtype=torch.float64)), float(torch.linalg.vector_norm(p, dtype=torch.float64)))
            for n, p in model.named_parameters()
        ]


def _load_init_head(config: DiversedConfig, target: torch.nn.Module, draft: torch.nn.Module) -> DiversedHead:
    """``config.init_head``: a cascade spec (``cascade-opt:0.1``: :meth:`DiversedHead.from_cascade`), else a head's
    Hub id or directory."""
    from ..generation.verification import SpecCascade, parse_rule
    from ..modeling.hub import load_head

    if config.init_head.strip().lower().startswith("cascade-"):
        cascade: SpecCascade = parse_rule(config.init_head)  # a cascade, or an error naming the valid forms
        return DiversedHead.from_cascade(
            target, draft, cascade.rule, cascade.alpha, init_weight=config.init_weight, task=config.task,
            head_hidden_size=config.head_hidden_size, verification=config.verification,
        )  # fmt: skip
    head = load_head(config.init_head, cache=False)  # trained in place: never the memoised instance
    defaults = DiversedConfig.__dataclass_fields__
    for name in ("init_weight", "verification", "head_hidden_size", "use_distribution_features"):
        if getattr(config, name) != defaults[name].default and getattr(config, name) != getattr(head.config, name):
            raise ValueError(
                f"`{name}`={getattr(config, name)} contradicts the head in `init_head` ({config.init_head!r}), which "
                f"has {name}={getattr(head.config, name)}; drop `{name}` (the head keeps its own) or `init_head`."
            )
    return head


def method_settings(config: DiversedConfig) -> dict[str, Any]:
    """The settings that define a head's training: the method's fields and the Trainer's optimisation ones."""
    from dataclasses import fields

    from transformers import TrainingArguments

    inherited = {f.name for f in fields(TrainingArguments)}
    names = [f.name for f in fields(DiversedConfig) if f.name not in inherited] + list(_CARD_TRAINING_FIELDS)
    return {name: getattr(config, name) for name in names}


def training_section(config: DiversedConfig) -> str:
    """The Training section of a head's model card: the method and its settings."""
    return "\n".join(
        [
            "Trained with `hf_diversed.trainer.DiversedTrainer` (a `transformers.Trainer`: REINFORCE++ advantages, "
            "PPO-clipped ratio of the head's mixture policy, frozen target and draft). Configuration:",
            "",
            "| key | value |",
            "|---|---|",
        ]
        + [f"| {k} | {v} |" for k, v in method_settings(config).items()]
    )


class _Updates(torch.utils.data.Dataset):
    """Item s is the Trainer's update s; its prompts and rollouts follow from s (and the seed), so the same update
    draws the same rows on any process count and after a resume."""

    def __init__(self, num_updates: int):
        self.num_updates = num_updates

    def __len__(self) -> int:
        return self.num_updates

    def __getitem__(self, index: int) -> dict[str, int]:
        return {"update": index}


def _single(items: list[dict[str, int]]) -> dict[str, int]:
    return items[0]


class _HeadTrainingCallback(TrainerCallback):
    """Writes ``log_history.jsonl`` (one line per logged step and split, the learning curves redrawn at each
    evaluation) and puts the reference head and the untrained evaluation in every checkpoint."""

    def __init__(self, trainer: DiversedTrainer):
        self.trainer = trainer

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "train_runtime" in logs:
            return
        split = "eval" if any(k.startswith("eval_") for k in logs) else "train"
        metrics = {
            ("lr" if k == "learning_rate" else k.removeprefix("eval_")): v
            for k, v in logs.items()
            if k != "epoch" and not k.endswith(("_runtime", "_per_second"))
        }
        path = Path(args.output_dir) / LOG_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps({"step": state.global_step, "split": split, **metrics}) + "\n")
        if split == "eval":
            try:
                plot_learning_curves(path, path.parent / CURVES_FILE)
            except ImportError:  # matplotlib is in the bench extra; the JSONL holds the same numbers
                pass

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.trainer._save_extra_state(Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")


class DiversedTrainer(Trainer):
    """Trains a DIVERSED ensemble head by reinforcement learning on the decoding task.

    Objective. At a drafted position t the head's weight w_theta,t defines the policy
    ``nu_theta,t(y) = w_theta,t p_t(y) + (1 - w_theta,t) q_t(y)`` (p: target, q: draft, both frozen:
    ``requires_grad`` is switched off, the models are never copied, and their parameters are asserted unchanged at
    the end of training). Rollouts are DIVERSED speculative decoding with the current head, drawn
    ``rollout_batch_size`` rows at a time by the batched sampler (:mod:`hf_diversed.generation.batched`, the law of
    ``generate``; each rollout seeded from ``seed``, its batch and its prompt, so a resumed run and any process
    count redraw them exactly), which is on-policy: the law of an emitted token at a drafted position is exactly
    ``nu_theta,t`` (bonus tokens follow p whatever the head and carry no gradient). Each completion gets a sequence
    reward r from ``reward_funcs`` (TRL-signature functions ``f(prompts, completions, **columns)``, summed) or the
    task's reward; ``kl_coef`` subtracts ``kl_coef * sum_t log(nu_old / nu_init)(y_t)`` (token KL to the initial
    head). REINFORCE++ advantages ``A = (r - b) / std(r - b)`` over the global batch, with ``b`` the batch mean, or
    the group mean of the prompt's completions when ``num_generations > 1``. Each update minimises

        - sum_t min(rho_t A, clip(rho_t, 1 - eps, 1 + eps) A) / T  +  lambda * sum_t w_theta,t TV(p_t, q_t) / T,
          rho_t = nu_theta,t(y_t) / nu_old,t(y_t),

    over the batch's verified (emitted drafted) positions, T of them over all processes; the second term is the
    expected rejection rate (acceptance = 1 - w TV), so lambda > 0 lowers w where the models disagree.

    Schedule (TRL's): ``steps_per_generation`` K rollout batches are drawn in one sampler call by the head of the
    block's first update, then each is learned from ``num_iterations`` times, the K batches in turn; the Trainer's
    step is one update. Later updates learn off-policy, and rho_t, against the recorded w of the head that drew y_t,
    is the importance ratio that corrects for it.
    """

    def __init__(
        self,
        target,
        draft,
        args: DiversedConfig | None = None,
        *,
        head: DiversedHead | None = None,
        reward_funcs: Sequence[Callable[..., list[float]]] | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        callbacks: list[TrainerCallback] | None = None,
    ):
        from ..evaluation.tasks import get_task
        from ..generation.checks import check_pair

        args = args if args is not None else DiversedConfig()
        if not isinstance(args, DiversedConfig):
            raise TypeError(f"`args` must be a DiversedConfig, got {type(args).__name__}.")
        self.target, self.draft, self.tokenizer = target, draft, processing_class
        for model in (target, draft):
            model.requires_grad_(False)
            model.eval()
        # Rollouts draft N tokens every round (no confidence early stop), as the paper and methods.timed_generate.
        draft.generation_config.assistant_confidence_threshold = 0.0
        self._frozen = (_fingerprint(target), _fingerprint(draft))
        self.task = get_task(args.task) if args.task else None
        if reward_funcs is not None:
            reward_funcs = list(reward_funcs)
            if not reward_funcs or not all(callable(f) for f in reward_funcs):
                raise ValueError("`reward_funcs` must be a non-empty list of callables f(prompts, completions, **kw).")
        elif self.task is None:
            raise ValueError("Pass `reward_funcs` or set `task` in the config (whose reward is used).")
        self.reward_funcs = reward_funcs
        prompts = train_dataset if train_dataset is not None else self._load(args.train_split)
        if args.max_train_prompts is not None:
            prompts = prompts.select(range(min(args.max_train_prompts, len(prompts))))
        if len(prompts) == 0:
            raise ValueError("The training dataset is empty.")
        if eval_dataset is None and args.num_eval_prompts > 0:
            eval_dataset = self._load(args.eval_split)

        torch.manual_seed(args.seed)
        if args.init_head:
            if head is not None:
                raise ValueError("Pass the initial head either as `head=` or as `init_head` in the config, not both.")
            head = _load_init_head(args, target, draft)
        if head is None:
            head = DiversedHead.for_models(
                target,
                draft,
                init_weight=args.init_weight,
                verification=args.verification,
                head_hidden_size=args.head_hidden_size,
                use_distribution_features=args.use_distribution_features,
                task=args.task,
            )
        check_pair(target, draft, head)  # a head built for another pair fails here, naming both sizes
        head.config.training_weights = {"target": weights_record(target), "draft": weights_record(draft)}
        head.float().train()
        self.ref_head = copy.deepcopy(head).requires_grad_(False).eval()
        self._lenience_head = head_verification(head) == "lenience"

        super().__init__(
            model=head,
            args=args,
            train_dataset=prompts,
            eval_dataset=eval_dataset,
            callbacks=[*(callbacks or []), _HeadTrainingCallback(self)],
        )
        world = self.accelerator.num_processes
        if args.num_prompts % world:
            raise ValueError(f"`num_prompts`={args.num_prompts} must be divisible by the process count {world}.")
        self._block: int | None = None  # index of the generation block whose batches are drawn
        self._batches: list[dict[str, Any]] = []
        self._rollout_metrics: dict[str, list[float]] = defaultdict(list)  # since the last log
        self._last_update: dict[str, float] = {}  # the batch's metrics and the loss's parts, of the last update
        self.untrained_eval: dict[str, float] | None = None  # held-out metrics of the initial head
        self.eval_metrics: dict[str, dict[str, float]] = {}
        self._last_eval: tuple[int, dict[str, float]] | None = None  # (update, metrics) of the last evaluate()

    # ----------------------------------------------------------------- data
    def _load(self, split: str):
        if self.task is None:
            raise ValueError(f"No dataset given and no task to load the {split!r} split from.")
        return self.task.load(split)

    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        """One item per update; the update's prompts come from :meth:`_batch_rows` (not sharded by the loader)."""
        return torch.utils.data.DataLoader(_Updates(self.args.max_steps), batch_size=1, collate_fn=_single)

    def _order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.args.seed * 1000003 + epoch)
        return torch.randperm(len(self.train_dataset), generator=g).tolist()

    def _batch_rows(self, batch: int) -> tuple[list[dict], list[tuple]]:
        """This process's share of rollout batch ``batch``: rows ``batch * num_prompts ...`` of the seeded epoch
        permutations, and their seed keys (batch, index in the global batch)."""
        n, size = len(self.train_dataset), self.args.num_prompts
        indices = [self._order(i // n)[i % n] for i in range(batch * size, (batch + 1) * size)]
        rank, per = self.accelerator.process_index, size // self.accelerator.num_processes
        mine = range(rank * per, (rank + 1) * per)
        return [self.train_dataset[indices[i]] for i in mine], [("train", batch, i) for i in mine]

    def _prompt_ids(self, row: dict) -> torch.Tensor:
        if "input_ids" in row:
            return torch.as_tensor(row["input_ids"], dtype=torch.long).view(1, -1)
        if self.tokenizer is None:
            raise ValueError("Rows without `input_ids` need a `processing_class` (tokenizer) for the chat template.")
        return self.tokenizer.apply_chat_template(
            self.task.build_messages(row), add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]

    def _prompt_text(self, row: dict) -> Any:
        if self.task is not None and self.tokenizer is not None and "input_ids" not in row:
            return self.task.build_messages(row)
        return row.get("prompt", row.get("input_ids"))

    # -------------------------------------------------------------- rewards
    def _rewards(self, rows: list[dict], rollouts: list[Rollout]) -> torch.Tensor:
        completion_ids = [r.completion_ids.tolist() for r in rollouts]
        if self.tokenizer is not None:
            completions = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        else:
            completions = completion_ids
        prompts = [self._prompt_text(row) for row in rows]
        columns = {key: [row[key] for row in rows] for key in (rows[0].keys() if rows else ())}
        columns.pop("input_ids", None)
        columns.pop("prompt", None)
        funcs = self.reward_funcs or [self.task.reward]
        total = torch.zeros(len(rollouts), dtype=torch.float64)
        for func in funcs:
            name = getattr(func, "__name__", type(func).__name__)
            try:
                values = func(prompts, completions, completion_ids=completion_ids, **columns)
            except TypeError:
                values = func(prompts, completions, **columns)
            values = list(values) if values is not None else None
            if values is None or len(values) != len(rollouts):
                got = "None" if values is None else f"{len(values)} values"
                raise ValueError(f"Reward function {name!r} returned {got} for {len(rollouts)} completions.")
            tensor = torch.tensor([float("nan") if v is None else float(v) for v in values], dtype=torch.float64)
            if not torch.isfinite(tensor).all():
                bad = [i for i, v in enumerate(tensor.tolist()) if not math.isfinite(v)]
                raise ValueError(f"Reward function {name!r} returned NaN/inf/None for completions {bad[:10]}.")
            total += tensor
        return total.float()

    # -------------------------------------------------------------- rollouts
    def _rollout_seed(self, *key: Any) -> int:
        """A 63-bit seed from (config seed, *key): the same on every run, process count and resume."""
        text = ":".join(str(k) for k in (self.args.seed, *key))
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1

    def _draw(self, parts: list[tuple[DiversedHead, list[dict], int, list[tuple]]]) -> list[list[Rollout]]:
        """Several (head, rows, generations, keys) parts in one sampler call, so they fill its batch together;
        returns each part's rollouts (row-major), rollout g of a row drawn with ``_rollout_seed(*key, g)``. A
        rollout depends on its prompt, seed and head only, not on its batch."""
        args = self.args
        prompts, seeds, heads, sizes = [], [], [], []
        for head, rows, generations, keys in parts:
            for row, key in zip(rows, keys, strict=True):
                ids = self._prompt_ids(row)
                for g in range(generations):
                    prompts.append(ids)
                    seeds.append(self._rollout_seed(*key, g))
                    heads.append(head)
            sizes.append(len(rows) * generations)
        with contextlib.ExitStack() as stack, torch.no_grad():
            for head in {id(h): h for h in heads}.values():
                stack.enter_context(_eval_mode(head))
            rollouts = collect_rollouts(
                self.target,
                self.draft,
                heads,
                prompts,
                max_new_tokens=args.max_new_tokens,
                temperature=args.temperature,
                num_assistant_tokens=args.num_assistant_tokens,
                seeds=seeds,
                batch_size=args.rollout_batch_size,
            )
        out, start = [], 0
        for size in sizes:
            out.append(rollouts[start : start + size])
            start += size
        return out

    def _block_parts(self, block: int) -> list[tuple[DiversedHead, list[dict], int, list[tuple]]]:
        """The rollout batches of generation block ``block``, drawn by the current head: K of them, or in a last
        block cut by ``max_steps`` as many as its updates learn from ``num_iterations`` times each."""
        args = self.args
        updates_left = args.max_steps - block * args.updates_per_generation
        head = self.accelerator.unwrap_model(self.model)
        parts = []
        for j in range(min(args.steps_per_generation, -(-updates_left // args.num_iterations))):
            rows, keys = self._batch_rows(block * args.steps_per_generation + j)
            parts.append((head, rows, args.num_generations, keys))
        return parts

    def _set_block(self, block: int, parts, drawn: list[list[Rollout]]) -> None:
        self._block = block
        self._batches = [self._score(rows, rollouts) for (_, rows, _, _), rollouts in zip(parts, drawn, strict=True)]

    def _score(self, rows: list[dict], rollouts: list[Rollout]) -> dict[str, Any]:
        """A rollout batch as the loss reads it: per verified position the head's inputs, p(y), q(y), TV, the
        drawing head's w and the sequence's advantage; the batch's verified count over all processes; its
        metrics."""
        args, device = self.args, self.accelerator.device
        expanded = [row for row in rows for _ in range(args.num_generations)]
        task_rewards = self._rewards(expanded, rollouts)
        lengths = [r.num_tokens for r in rollouts]
        trace = Trace.cat([r.trace for r in rollouts])
        batch = {
            "h_draft": trace.h_draft, "h_target": trace.h_target, "p_y": trace.p_y, "q_y": trace.q_y,
            "tv": trace.tv, "w_old": trace.w, "features": trace.distribution_features(),
        }  # fmt: skip
        if self._lenience_head:  # lossy SD's law at l reads S(l) and its slope at the drawing head's l_old
            batch.update(overlap=trace.overlap, overlap_slope=trace.overlap_slope)
        batch = {k: v.to(device) for k, v in batch.items()}
        lenience = (batch["overlap"], batch["overlap_slope"]) if self._lenience_head else None
        with torch.no_grad():
            w_ref = position_weights(self.ref_head.to(device), batch["h_draft"], batch["h_target"], batch["features"])
            eps = torch.finfo(torch.float32).tiny
            log_ratio = (
                emitted_prob(batch["w_old"], batch["w_old"], batch["p_y"], batch["q_y"], lenience).clamp_min(eps).log()
                - emitted_prob(w_ref, batch["w_old"], batch["p_y"], batch["q_y"], lenience).clamp_min(eps).log()
            )
            kl_per_seq = torch.stack([s.sum() for s in log_ratio.cpu().split(lengths)]) if rollouts else torch.zeros(0)
        rewards = task_rewards - args.kl_coef * kl_per_seq
        grouped = rewards.view(-1, args.num_generations)
        everything = self.accelerator.gather(grouped.to(device)).cpu()
        advantages = reinforce_pp_advantages(grouped, everything)
        batch["advantages"] = torch.repeat_interleave(advantages, torch.tensor(lengths, dtype=torch.long)).to(device)

        stats = torch.tensor(
            [
                sum(r.stats.num_drafted for r in rollouts),
                sum(r.stats.num_accepted for r in rollouts),
                sum(r.stats.weight_sum for r in rollouts),
                sum(r.stats.num_verified for r in rollouts),
                sum(r.stats.tv_sum for r in rollouts),
                float(task_rewards.sum()),
                float(len(rollouts)),
                float(kl_per_seq.sum()),
                float(sum(r.cut for r in rollouts)),
                float(sum(lengths)),
                float(rejection_prob(batch["w_old"], batch["w_old"], batch["tv"], lenience).sum()),
            ],
            dtype=torch.float64,
        )
        totals = self.accelerator.gather(stats.view(1, -1).to(device)).cpu().sum(0).tolist()
        n = max(totals[6], 1.0)
        batch["num_positions"] = totals[9]  # the loss's T, over all processes
        batch["metrics"] = {
            "reward": totals[5] / n,
            "reward_std": float(everything.std()) if everything.numel() > 1 else 0.0,
            "acceptance_rate": totals[1] / max(totals[0], 1.0),
            "mean_w": totals[2] / max(totals[3], 1.0),
            "mean_wtv": totals[10] / max(totals[9], 1.0),
            "kl": totals[7] / n,
            "cut_fraction": totals[8] / n,
        }
        return batch

    # ---------------------------------------------------------------- updates
    def training_step(self, model, inputs: dict[str, int], num_items_in_batch=None) -> torch.Tensor:
        """Update ``inputs["update"]``: its generation block is drawn at the block's first update (or by the
        evaluation just before it), then the update learns from the block's batches in turn
        (``update % steps_per_generation``)."""
        args = self.args
        update = int(inputs["update"])
        block, within = divmod(update, args.updates_per_generation)
        if self._block != block:
            if within:
                raise RuntimeError(
                    f"Update {update} is inside generation block {block}, drawn by an earlier head; resume from a "
                    "checkpoint at a multiple of steps_per_generation x num_iterations."
                )
            parts = self._block_parts(block)
            self._set_block(block, parts, self._draw(parts))
        batch = self._batches[within % len(self._batches)]
        index = block * args.steps_per_generation + within % len(self._batches)
        self._last_update = {**batch["metrics"], "rollout_age": float(within), "rollout_batch": float(index)}
        for key, value in self._last_update.items():
            self._rollout_metrics[key].append(value)
        return super().training_step(model, batch, num_items_in_batch)

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None) -> torch.Tensor:
        """The clipped surrogate plus lambda * w TV over this process's positions, each sum divided by the batch's
        T over all processes times the process count: the data-parallel mean of gradients is then the gradient
        of the global batch, the same on any process count."""
        if return_outputs:
            raise ValueError("DiversedTrainer.compute_loss has no outputs to return.")
        w = position_weights(model, inputs["h_draft"], inputs["h_target"], inputs["features"])
        normalizer = max(inputs["num_positions"], 1.0) / self.accelerator.num_processes
        lenience = (inputs["overlap"], inputs["overlap_slope"]) if self._lenience_head else None
        loss, parts = diversed_policy_loss(
            w, inputs["w_old"], inputs["p_y"], inputs["q_y"], inputs["tv"], inputs["advantages"],
            clip_eps=self.args.epsilon, acceptance_coef=self.args.acceptance_coef, normalizer=normalizer,
            lenience=lenience,
        )  # fmt: skip
        for key in ("policy_loss", "clip_frac"):
            self._rollout_metrics[key].append(parts[key])
            self._last_update[key] = parts[key]
        return loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """The Trainer's log, with the rollout metrics averaged over the updates since the last one."""
        if "loss" in logs and self._rollout_metrics:
            means = {k: sum(v) / len(v) for k, v in self._rollout_metrics.items()}
            means.update({k: self._rollout_metrics[k][-1] for k in _LAST_VALUE_METRICS if k in self._rollout_metrics})
            logs = {**logs, **means}
            self._rollout_metrics.clear()
        super().log(logs, start_time)

    # ------------------------------------------------------------- evaluation
    def _evaluate_head(self, head: DiversedHead, also_draw_next_block: bool = False) -> dict[str, float]:
        """Reward, acceptance, mean w, tokens per round and share of rollouts cut at ``max_new_tokens`` of ``head``
        on the eval prompts: each prompt's rollout has its own seed (from the seed and the prompt's index), so
        heads are compared on the same draws (paired). With ``also_draw_next_block`` at a block boundary, the next
        block's training rollouts are drawn in the same sampler call (they fill its batch together)."""
        args = self.args
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        n = min(args.num_eval_prompts, len(self.eval_dataset))
        indices = list(range(rank, n, world))
        rows = [self.eval_dataset[i] for i in indices]
        parts = [(head, rows, 1, [("eval", i) for i in indices])]
        next_update = self.state.global_step
        block, within = divmod(next_update, args.updates_per_generation)
        draw_block = also_draw_next_block and within == 0 and self._block != block and next_update < args.max_steps
        if draw_block:
            block_parts = self._block_parts(block)
            parts += block_parts
        drawn = self._draw(parts)
        if draw_block:
            self._set_block(block, block_parts, drawn[1:])
        rollouts = drawn[0]
        rewards = self._rewards(rows, rollouts) if rollouts else torch.zeros(0)
        stats = torch.tensor(
            [
                float(rewards.sum()),
                float(len(rollouts)),
                sum(r.stats.num_drafted for r in rollouts),
                sum(r.stats.num_accepted for r in rollouts),
                sum(r.stats.weight_sum for r in rollouts),
                sum(r.stats.num_verified for r in rollouts),
                sum(r.stats.num_rounds for r in rollouts),
                float(sum(r.cut for r in rollouts)),
            ],
            dtype=torch.float64,
        )
        t = self.accelerator.gather(stats.view(1, -1).to(self.accelerator.device)).cpu().sum(0).tolist()
        return {
            "reward": t[0] / max(t[1], 1.0),
            "acceptance_rate": t[3] / max(t[2], 1.0),
            "mean_w": t[4] / max(t[5], 1.0),
            "tokens_per_round": (t[3] + t[6]) / max(t[6], 1.0),
            "cut_fraction": t[7] / max(t[1], 1.0),
        }

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """The current head's rollout metrics on ``num_eval_prompts`` eval prompts (see :meth:`_evaluate_head`),
        logged with ``metric_key_prefix``; at update 0 they are the untrained head's."""
        if eval_dataset is not None:
            raise ValueError("DiversedTrainer evaluates on the eval_dataset it was built with; pass none here.")
        if self.eval_dataset is None or self.args.num_eval_prompts == 0:
            raise ValueError("Evaluation needs `num_eval_prompts` > 0 (and an eval split or `eval_dataset`).")
        head = self.accelerator.unwrap_model(self.model)
        step, every = self.state.global_step, self.state.eval_steps
        # Only an evaluation the run would make uninterrupted shares the next block's sampler call: the Trainer's
        # eval_on_start at a resumed step is drawn alone, so the block's rollouts stay those of the uninterrupted run
        # (rows drawn together share padded batch shapes, which moves the features by rounding).
        scheduled = step == 0 or (self.args.eval_strategy == "steps" and bool(every) and step % every == 0)
        metrics = self._evaluate_head(head, also_draw_next_block=scheduled)
        if self.state.global_step == 0:
            self.untrained_eval = dict(metrics)
        self._last_eval = (self.state.global_step, dict(metrics))
        metrics = {f"{metric_key_prefix}_{k}": v for k, v in metrics.items()}
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    # ------------------------------------------------------------------ train
    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """The Trainer's loop (resumed from a checkpoint when given: a path, or True for the output directory's
        last), then, with ``num_eval_prompts``, the trained and the untrained head evaluated on the same draws."""
        resume_from_checkpoint = resolve_checkpoint(resume_from_checkpoint, self.args.output_dir)
        if resume_from_checkpoint:
            self._load_extra_state(Path(resume_from_checkpoint))
        self._block, self._batches = None, []
        output = super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
        self._check_frozen()
        if self.args.num_eval_prompts and self.eval_dataset is not None:
            head = self.accelerator.unwrap_model(self.model)
            untrained = self.untrained_eval if self.untrained_eval is not None else self._evaluate_head(self.ref_head)
            if self._last_eval is not None and self._last_eval[0] == self.state.global_step:
                trained = self._last_eval[1]  # the Trainer's evaluation at the last update
            else:
                trained = self._evaluate_head(head)
                self.log({f"eval_{k}": v for k, v in trained.items()})
            self.eval_metrics = {"trained": trained, "untrained": untrained}
        return output

    def _save_extra_state(self, checkpoint: Path) -> None:
        from safetensors.torch import save_file

        checkpoint.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.ref_head.state_dict().items()}, str(checkpoint / REF_HEAD_FILE))
        (checkpoint / STATE_FILE).write_text(json.dumps({"untrained_eval": self.untrained_eval}))

    def _load_extra_state(self, checkpoint: Path) -> None:
        from safetensors.torch import load_file

        if not (checkpoint / REF_HEAD_FILE).is_file():
            raise FileNotFoundError(f"{checkpoint} is not a DIVERSED trainer checkpoint (no {REF_HEAD_FILE}).")
        self.ref_head.load_state_dict(load_file(str(checkpoint / REF_HEAD_FILE)))
        self.untrained_eval = json.loads((checkpoint / STATE_FILE).read_text())["untrained_eval"]

    def _check_frozen(self) -> None:
        if (_fingerprint(self.target), _fingerprint(self.draft)) != self._frozen:
            raise RuntimeError("The frozen target/draft parameters changed during head training.")

    # ------------------------------------------------------------ saving
    def model_card(self) -> str:
        """The head's card: its pair, the weights it was trained on, the training settings and the evaluation."""
        args = self.args
        head = self.accelerator.unwrap_model(self.model)
        if self.eval_metrics:
            keys = list(self.eval_metrics["trained"])
            lines = [
                f"{min(args.num_eval_prompts, len(self.eval_dataset))} prompts of the `{args.eval_split}` "
                f"split, temperature {args.temperature}, {args.max_new_tokens} new tokens.",
                "",
                "| head | " + " | ".join(keys) + " |",
                "|---|" + "---|" * len(keys),
            ]
            for name in ("untrained", "trained"):
                m = self.eval_metrics[name]
                label = "untrained (the initial head)" if name == "untrained" else "trained"
                lines.append(f"| {label} | " + " | ".join(f"{m[k]:.4f}" for k in keys) + " |")
            evaluation = "\n".join(lines)
        else:
            evaluation = "Not evaluated (num_eval_prompts=0)."
        return render_head_card(
            target_model=args.target or head.config.target_model,
            draft_model=args.draft or head.config.draft_model,
            vocab_size=head.config.vocab_size,
            task=args.task,
            weights=weights_sentence(head.config.training_weights),
            repo_id=args.hub_model_id or args.output_dir,
            training=training_section(args),
            evaluation=evaluation,
            verification=head_verification(head),
        )

    def create_model_card(self, model_name: str | None = None, **kwargs) -> None:
        """Write the head's card (:meth:`model_card`) as ``README.md`` in the output directory."""
        if kwargs:
            raise TypeError(f"DiversedTrainer's card takes no {sorted(kwargs)}; it is built from the config.")
        if self.is_world_process_zero():
            (Path(self.args.output_dir) / "README.md").write_text(self.model_card())

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The head (``config.json``, ``model.safetensors``), its card and its transformers-only
        ``custom_generate/`` recipe; ``push_to_hub`` uploads the same folder."""
        output_dir = output_dir or self.args.output_dir
        head = self.accelerator.unwrap_model(self.model)
        head.config.task = self.args.task
        super().save_model(output_dir, _internal_call)
        if self.is_world_process_zero():
            (Path(output_dir) / "README.md").write_text(self.model_card())
            # The repository's transformers-only recipe; without a Hub id it loads the head from this directory. It
            # runs mixture heads only (a lenience head's card says so).
            if not self._lenience_head:
                write_custom_generate(Path(output_dir), self.args.hub_model_id or str(Path(output_dir).resolve()))


def resolve_checkpoint(value: str | bool | None, output_dir: str | os.PathLike) -> str | None:
    """``resume_from_checkpoint`` as a path: True (or "true") means the output directory's last checkpoint."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"
    if value is True:
        last = get_last_checkpoint(str(output_dir))
        if last is None:
            raise ValueError(f"No checkpoint to resume in {output_dir}; drop `resume_from_checkpoint`.")
        return last
    return value or None
