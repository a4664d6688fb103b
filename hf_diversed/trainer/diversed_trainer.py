"""Reinforcement-learning trainer for the DIVERSED ensemble head (REINFORCE++ with a PPO clipped surrogate)."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..evaluation.weights import weights_record
from ..generation.trace import Trace
from ..modeling.hub import push_head_folder, write_custom_generate
from ..modeling.model_card import render_head_card, weights_sentence
from ..modeling.modeling_diversed_head import DiversedHead, position_weights
from .curves import CURVES_FILE, plot_learning_curves
from .diversed_config import DiversedTrainerConfig
from .objective import diversed_policy_loss, mixture_prob, reinforce_pp_advantages
from .rollout import Rollout, collect_rollouts

__all__ = ["DiversedTrainer", "DiversedTrainerConfig"]

logger = logging.getLogger(__name__)

_STATE_FILE = "trainer_state.pt"


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


def _load_init_head(config: DiversedTrainerConfig, target: torch.nn.Module, draft: torch.nn.Module) -> DiversedHead:
    """``config.init_head``: a cascade spec (``cascade-opt:0.1``: :meth:`DiversedHead.from_cascade`), else a head's
    Hub id or directory."""
    from ..generation.verification import SpecCascade, parse_rule
    from ..modeling.hub import load_head

    if config.init_head.strip().lower().startswith("cascade-"):
        cascade: SpecCascade = parse_rule(config.init_head)  # a cascade, or an error naming the valid forms
        return DiversedHead.from_cascade(
            target, draft, cascade.rule, cascade.alpha, init_weight=config.init_weight, task=config.task,
            head_hidden_size=config.head_hidden_size,
        )  # fmt: skip
    head = load_head(config.init_head, cache=False)  # trained in place: never the memoised instance
    defaults = DiversedTrainerConfig.__dataclass_fields__
    for name in ("init_weight", "head_hidden_size", "use_distribution_features"):
        if getattr(config, name) != defaults[name].default and getattr(config, name) != getattr(head.config, name):
            raise ValueError(
                f"`{name}`={getattr(config, name)} contradicts the head in `init_head` ({config.init_head!r}), which "
                f"has {name}={getattr(head.config, name)}; drop `{name}` (the head keeps its own) or `init_head`."
            )
    return head


def training_section(config: DiversedTrainerConfig) -> str:
    """The Training section of a head's model card: the method and every setting of ``config``."""
    return "\n".join(
        [
            "Trained with `hf_diversed.trainer.DiversedTrainer` (REINFORCE++ advantages, PPO-clipped ratio of "
            "the head's mixture policy, frozen target and draft). Configuration:",
            "",
            "| key | value |",
            "|---|---|",
        ]
        + [f"| {k} | {v} |" for k, v in asdict(config).items() if k not in ("hub_model_id", "resume_from_checkpoint")]
    )


class DiversedTrainer:
    """Trains a DIVERSED ensemble head by reinforcement learning on the decoding task.

    Objective. At a drafted position t the head's weight w_theta,t defines the policy
    ``nu_theta,t(y) = w_theta,t p_t(y) + (1 - w_theta,t) q_t(y)`` (p: target, q: draft, both frozen:
    ``requires_grad`` is switched off, the models are never copied, and their parameters are asserted
    unchanged at the end of training). Rollouts are DIVERSED speculative decoding with the current head,
    drawn ``rollout_batch_size`` rows at a time by the batched sampler (:mod:`hf_diversed.generation.batched`, the law
    of ``generate``; each rollout seeded from ``seed``, the step and its prompt, so a resumed run redraws
    them exactly), which is on-policy: the law of an emitted token at a drafted position is exactly
    ``nu_theta,t`` (bonus tokens follow p whatever the head and carry no gradient). Each completion gets a sequence
    reward r from ``reward_funcs`` (any TRL-signature functions ``f(prompts, completions, **columns)``,
    summed) or the task's reward; ``kl_coef`` subtracts ``kl_coef * sum_t log(nu_old / nu_init)(y_t)``
    (token KL to the initial head). REINFORCE++ advantages ``A = (r - b) / std(r - b)`` over the global
    batch (gathered across processes), with ``b`` the batch mean, or the group mean of the prompt's
    completions when ``num_generations > 1``. The head minimises, for ``ppo_epochs`` epochs over the
    stored features,

        - mean_t min(rho_t A, clip(rho_t, 1 - eps, 1 + eps) A),   rho_t = nu_theta,t(y_t) / nu_old,t(y_t)
        + lambda * mean_t w_theta,t TV(p_t, q_t)

    over the verified (emitted drafted) positions; the second term is the expected rejection rate
    (acceptance = 1 - w TV), so lambda > 0 pushes w down where the models disagree and raises acceptance.

    With ``steps_per_generation`` K > 1 the rollouts of K consecutive steps are drawn together (K times the rows,
    so the sampler's batch fills) by the head of the block's first step; the later steps learn off-policy, and
    rho_t, taken against the recorded w of the head that drew y_t, is the importance ratio that corrects for it.

    ``accelerate`` runs it on one or many processes: only the head and optimiser are prepared; each
    process rolls out its shard of each step's prompts (``num_prompts`` must divide by the process count).
    """

    def __init__(
        self,
        config: DiversedTrainerConfig,
        target,
        draft,
        *,
        head: DiversedHead | None = None,
        tokenizer=None,
        train_dataset=None,
        eval_dataset=None,
        reward_funcs: Sequence[Callable[..., list[float]]] | None = None,
        accelerator=None,
    ):
        from accelerate import Accelerator
        from transformers import get_scheduler

        from ..evaluation.tasks import get_task

        self.config = config
        self.accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        for model in (target, draft):
            model.requires_grad_(False)
            model.eval()
        # Rollouts draft N tokens every round (no confidence early stop), as the paper and methods.timed_generate.
        draft.generation_config.assistant_confidence_threshold = 0.0
        self._frozen = (_fingerprint(target), _fingerprint(draft))
        self.task = get_task(config.task) if config.task else None
        if reward_funcs is not None:
            reward_funcs = list(reward_funcs)
            if not reward_funcs or not all(callable(f) for f in reward_funcs):
                raise ValueError("`reward_funcs` must be a non-empty list of callables f(prompts, completions, **kw).")
        elif self.task is None:
            raise ValueError("Pass `reward_funcs` or set `config.task` (whose reward is used).")
        self.reward_funcs = reward_funcs
        self.train_dataset = train_dataset if train_dataset is not None else self._load(config.train_split)
        if config.max_train_prompts is not None:
            self.train_dataset = self.train_dataset.select(
                range(min(config.max_train_prompts, len(self.train_dataset)))
            )
        self.eval_dataset = eval_dataset
        if self.eval_dataset is None and config.num_eval_prompts > 0:
            self.eval_dataset = self._load(config.eval_split)
        if len(self.train_dataset) == 0:
            raise ValueError("The training dataset is empty.")
        world = self.accelerator.num_processes
        if config.num_prompts % world:
            raise ValueError(f"`num_prompts`={config.num_prompts} must be divisible by the process count {world}.")

        torch.manual_seed(config.seed)
        if config.init_head:
            if head is not None:
                raise ValueError("Pass the initial head either as `head=` or as `config.init_head`, not both.")
            head = _load_init_head(config, target, draft)
        if head is None:
            head = DiversedHead.for_models(
                target,
                draft,
                init_weight=config.init_weight,
                head_hidden_size=config.head_hidden_size,
                use_distribution_features=config.use_distribution_features,
                task=config.task,
            )
        from ..generation.checks import check_pair

        check_pair(target, draft, head)  # a head built for another pair fails here, naming both sizes
        head.config.training_weights = {"target": weights_record(target), "draft": weights_record(draft)}
        head.float().train()
        self.ref_head = copy.deepcopy(head).requires_grad_(False).eval()
        optimizer = torch.optim.AdamW(head.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
        self.scheduler = get_scheduler(
            config.lr_scheduler_type,
            optimizer,
            num_warmup_steps=config.warmup_steps,
            num_training_steps=config.max_steps,
        )
        self.head, self.optimizer = self.accelerator.prepare(head, optimizer)
        self.step = 0
        self.data_position = 0
        self.history: list[dict[str, float]] = []
        self.eval_metrics: dict[str, Any] = {}
        self.untrained_eval: dict[str, float] | None = None  # the held-out metrics of the initial head
        self._writer = None
        self._pending: list[tuple[list[dict], list[Rollout], int]] = []  # drawn rollouts of the block's later steps

    # ----------------------------------------------------------------- data
    def _load(self, split: str):
        if self.task is None:
            raise ValueError(f"No dataset given and no task to load the {split!r} split from.")
        return self.task.load(split)

    def _order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.config.seed * 1000003 + epoch)
        return torch.randperm(len(self.train_dataset), generator=g).tolist()

    def _step_rows(self, position: int) -> list[int]:
        n = len(self.train_dataset)
        indices = []
        for i in range(position, position + self.config.num_prompts):
            indices.append(self._order(i // n)[i % n])
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        per = self.config.num_prompts // world
        return indices[rank * per : (rank + 1) * per]

    def _prompt_ids(self, row: dict) -> torch.Tensor:
        if "input_ids" in row:
            return torch.as_tensor(row["input_ids"], dtype=torch.long).view(1, -1)
        if self.tokenizer is None:
            raise ValueError("Rows without `input_ids` need a `tokenizer` to apply the chat template.")
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

    # ---------------------------------------------------------------- steps
    def _rollout_seed(self, *key: Any) -> int:
        """A 63-bit seed from (config seed, *key): the same on every run, process count and resume."""
        text = ":".join(str(k) for k in (self.config.seed, *key))
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1

    def _rollouts(self, head, rows: list[dict], generations: int, keys: list[tuple]) -> list[Rollout]:
        """``generations`` rollouts per row (row-major), drawn by the batched sampler; rollout g of row i draws
        from its own generator seeded with ``_rollout_seed(*keys[i], g)``."""
        return self._draw([(head, rows, generations, keys)])[0]

    def _draw(self, parts: list[tuple[DiversedHead, list[dict], int, list[tuple]]]) -> list[list[Rollout]]:
        """Several (head, rows, generations, keys) parts in one sampler call, so they fill its batch together;
        returns each part's rollouts. A rollout depends on its prompt, seed and head only, not on its batch."""
        cfg = self.config
        prompts, seeds, heads, sizes = [], [], [], []
        for head, rows, generations, keys in parts:
            for row, key in zip(rows, keys, strict=True):
                ids = self._prompt_ids(row)
                for g in range(generations):
                    prompts.append(ids)
                    seeds.append(self._rollout_seed(*key, g))
                    heads.append(head)
            sizes.append(len(rows) * generations)
        rollouts = collect_rollouts(
            self.target,
            self.draft,
            heads,
            prompts,
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            num_assistant_tokens=cfg.num_assistant_tokens,
            seeds=seeds,
            batch_size=cfg.rollout_batch_size,
        )
        out, start = [], 0
        for size in sizes:
            out.append(rollouts[start : start + size])
            start += size
        return out

    def _advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        from accelerate.utils import gather

        cfg = self.config
        grouped = rewards.view(-1, cfg.num_generations)
        everything = gather(grouped.to(self.accelerator.device)).cpu()
        return reinforce_pp_advantages(grouped, everything), everything

    def _next_rollouts(self) -> tuple[list[dict], list[Rollout], int]:
        """This step's prompts, rollouts and their age (steps since the head that drew them).

        At the first step of a block of ``steps_per_generation`` steps, the rollouts of every step of the block are
        drawn in one sampler call with the current head (unless an evaluation drew them already, see
        :meth:`evaluate`); the block's later steps take theirs from it. Seeds are keyed by (step, index in the
        step's global batch), so a block's first step draws what an on-policy run draws, and a run resumed at a
        block boundary redraws exactly the same rollouts."""
        if not self._pending:
            blocks, rows, keys = self._block_rows()
            head = self.accelerator.unwrap_model(self.head)
            with _eval_mode(head), torch.no_grad():
                rollouts = self._rollouts(head, rows, self.config.num_generations, keys)
            self._stash_block(blocks, rollouts)
        return self._pending.pop(0)

    def _block_rows(self) -> tuple[list[list[dict]], list[dict], list[tuple]]:
        """The rows of each step of the next block, all of them in order, and their seed keys."""
        cfg = self.config
        steps = min(cfg.steps_per_generation, cfg.max_steps - self.step)
        blocks, rows_all, keys_all = [], [], []
        for j in range(steps):
            rows = [self.train_dataset[i] for i in self._step_rows(self.data_position + j * cfg.num_prompts)]
            first = self.accelerator.process_index * len(rows)
            rows_all += rows
            keys_all += [("train", self.step + j, first + k) for k in range(len(rows))]
            blocks.append(rows)
        return blocks, rows_all, keys_all

    def _stash_block(self, blocks: list[list[dict]], rollouts: list[Rollout]) -> None:
        start = 0
        for age, rows in enumerate(blocks):
            count = len(rows) * self.config.num_generations
            self._pending.append((rows, rollouts[start : start + count], age))
            start += count

    def training_step(self) -> dict[str, float]:
        cfg = self.config
        rows, rollouts, age = self._next_rollouts()
        expanded_rows = [row for row in rows for _ in range(cfg.num_generations)]
        task_rewards = self._rewards(expanded_rows, rollouts)

        lengths = [r.num_tokens for r in rollouts]
        trace = Trace.cat([r.trace for r in rollouts])  # w: the drawing head's, w_old
        h_d, h_t, p_y, q_y, tv, w_old = trace.h_draft, trace.h_target, trace.p_y, trace.q_y, trace.tv, trace.w
        device = self.accelerator.device
        h_d, h_t, p_y, q_y, tv, w_old = (x.to(device) for x in (h_d, h_t, p_y, q_y, tv, w_old))
        features = trace.distribution_features().to(device)

        with torch.no_grad():
            w_ref = position_weights(self.ref_head.to(device), h_d, h_t, features)
            eps = torch.finfo(torch.float32).tiny
            log_ratio = (
                mixture_prob(w_old, p_y, q_y).clamp_min(eps).log() - mixture_prob(w_ref, p_y, q_y).clamp_min(eps).log()
            )
            kl_per_seq = torch.stack([s.sum() for s in log_ratio.cpu().split(lengths)]) if rollouts else torch.zeros(0)
        rewards = task_rewards - cfg.kl_coef * kl_per_seq
        advantages, all_rewards = self._advantages(rewards)
        token_adv = torch.repeat_interleave(advantages, torch.tensor(lengths, dtype=torch.long)).to(device)

        losses, parts = [], {}
        for _ in range(cfg.ppo_epochs):
            w = position_weights(self.head, h_d, h_t, features)
            loss, parts = diversed_policy_loss(
                w, w_old, p_y, q_y, tv, token_adv, clip_eps=cfg.clip_eps, acceptance_coef=cfg.acceptance_coef
            )
            self.accelerator.backward(loss)
            self.accelerator.clip_grad_norm_(self.head.parameters(), cfg.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad()
            losses.append(float(loss.detach()))
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        self.step += 1
        self.data_position += cfg.num_prompts

        from accelerate.utils import gather

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
            ],
            dtype=torch.float64,
        )
        totals = gather(stats.view(1, -1).to(device)).cpu().sum(0)
        n = max(totals[6].item(), 1.0)
        return {
            "reward": totals[5].item() / n,
            "acceptance_rate": totals[1].item() / max(totals[0].item(), 1.0),
            "mean_w": totals[2].item() / max(totals[3].item(), 1.0),
            "mean_wtv": float((w_old * tv).mean()) if tv.numel() else 0.0,
            "kl": totals[7].item() / n,
            "loss": sum(losses) / len(losses),
            "lr": lr,
            "reward_std": float(all_rewards.std()) if all_rewards.numel() > 1 else 0.0,
            "rollout_age": float(age),
            "cut_fraction": totals[8].item() / n,
            **{k: v for k, v in parts.items() if k != "wtv"},
        }

    # ----------------------------------------------------------- evaluation
    def evaluate(self, head: DiversedHead | None = None, draw_next_block: bool = False) -> dict[str, float]:
        """Reward, acceptance, mean w and share of rollouts cut at ``max_new_tokens`` (``cut_fraction``) of ``head``
        (default: the current head) on the eval prompts.

        Each eval prompt's rollout has its own seed (from ``config.seed`` and the prompt's index), so different
        heads are compared on the same draws (paired) and training's random stream is untouched. With
        ``draw_next_block`` at a block boundary, the next block's training rollouts (current head) are drawn in
        the same sampler call: the evaluation's rows then fill the batch instead of running it alone.
        """
        cfg = self.config
        if self.eval_dataset is None or cfg.num_eval_prompts == 0:
            return {}
        current = self.accelerator.unwrap_model(self.head)
        head = head if head is not None else current
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        n = min(cfg.num_eval_prompts, len(self.eval_dataset))
        indices = list(range(rank, n, world))
        rows = [self.eval_dataset[i] for i in indices]
        parts = [(head, rows, 1, [("eval", i) for i in indices])]
        block = None
        if draw_next_block and not self._pending and self.step < cfg.max_steps:
            block = self._block_rows()
            parts.append((current, block[1], cfg.num_generations, block[2]))
        with _eval_mode(head), _eval_mode(current), torch.no_grad():
            drawn = self._draw(parts)
        rollouts = drawn[0]
        if block is not None:
            self._stash_block(block[0], drawn[1])
        rewards = self._rewards(rows, rollouts) if rollouts else torch.zeros(0)
        from accelerate.utils import gather

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
        t = gather(stats.view(1, -1).to(self.accelerator.device)).cpu().sum(0).tolist()
        return {
            "reward": t[0] / max(t[1], 1.0),
            "acceptance_rate": t[3] / max(t[2], 1.0),
            "mean_w": t[4] / max(t[5], 1.0),
            "tokens_per_round": (t[3] + t[6]) / max(t[6], 1.0),
            "cut_fraction": t[7] / max(t[1], 1.0),
        }

    # ----------------------------------------------------------- checkpoints
    def save_checkpoint(self, directory: str | Path | None = None) -> Path:
        directory = Path(directory or Path(self.config.output_dir) / f"checkpoint-{self.step}")
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            directory.mkdir(parents=True, exist_ok=True)
            self.accelerator.unwrap_model(self.head).save_pretrained(directory)
            torch.save(
                {
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                    "ref_head": self.ref_head.state_dict(),
                    "step": self.step,
                    "data_position": self.data_position,
                    "history": self.history,
                    "untrained_eval": self.untrained_eval,
                    "config": asdict(self.config),
                },
                directory / _STATE_FILE,
            )
        self.accelerator.wait_for_everyone()
        torch.save(
            {"python": random.getstate(), "torch": torch.get_rng_state()},
            directory / f"rng_state_{self.accelerator.process_index}.pth",
        )
        self.accelerator.wait_for_everyone()
        return directory

    def load_checkpoint(self, directory: str | Path) -> None:
        from safetensors.torch import load_file

        directory = Path(directory)
        if not (directory / _STATE_FILE).is_file():
            raise FileNotFoundError(f"{directory} is not a DIVERSED trainer checkpoint (no {_STATE_FILE}).")
        state = torch.load(directory / _STATE_FILE, weights_only=False)
        self.accelerator.unwrap_model(self.head).load_state_dict(load_file(str(directory / "model.safetensors")))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.ref_head.load_state_dict(state["ref_head"])
        self.step, self.data_position = state["step"], state["data_position"]
        self._pending = []
        self.history = list(state.get("history", []))
        self.untrained_eval = state.get("untrained_eval")
        rng_file = directory / f"rng_state_{self.accelerator.process_index}.pth"
        if rng_file.is_file():
            rng = torch.load(rng_file, weights_only=False)
            random.setstate(rng["python"])
            torch.set_rng_state(rng["torch"])

    # ------------------------------------------------------------------ train
    def _log(self, metrics: dict[str, float], prefix: str = "train") -> None:
        if not self.accelerator.is_main_process:
            return
        logger.info("step %d %s %s", self.step, prefix, {k: round(v, 5) for k, v in metrics.items()})
        log_path = Path(self.config.output_dir) / "log_history.jsonl"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("a") as f:
            f.write(json.dumps({"step": self.step, "split": prefix, **metrics}) + "\n")
        if prefix == "eval":
            try:
                plot_learning_curves(log_path, log_path.parent / CURVES_FILE)
            except ImportError:  # matplotlib is in the bench extra; the JSONL holds the same numbers
                pass
        if self.config.report_to == "tensorboard":
            if self._writer is None:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(log_dir=str(Path(self.config.output_dir) / "runs"))
            for key, value in metrics.items():
                self._writer.add_scalar(f"{prefix}/{key}", value, self.step)

    def train(self, resume_from_checkpoint: str | Path | None = None) -> DiversedHead:
        """Run ``max_steps`` steps (from a checkpoint when given); returns the trained (unwrapped) head."""
        from tqdm.auto import tqdm

        cfg = self.config
        resume = resume_from_checkpoint or cfg.resume_from_checkpoint
        if resume:
            self.load_checkpoint(resume)
        else:
            torch.manual_seed(cfg.seed + self.accelerator.process_index)
            random.seed(cfg.seed + self.accelerator.process_index)
        if cfg.num_eval_prompts and cfg.eval_steps and self.step == 0 and self.untrained_eval is None:
            # the curve's first point; its values are also the final "untrained" row (same prompts and seeds)
            self.untrained_eval = self.evaluate(self.ref_head, draw_next_block=True)
            self._log(self.untrained_eval, prefix="eval")
        elif resume and self._evaluation_due() and not self._evaluation_logged():
            self._log(self.evaluate(draw_next_block=True), prefix="eval")  # the run stopped before logging it
        bar = tqdm(
            total=cfg.max_steps,
            initial=self.step,
            disable=not self.accelerator.is_local_main_process,
            desc="diversed-head",
        )
        while self.step < cfg.max_steps:
            metrics = self.training_step()
            self.history.append({"step": self.step, **metrics})
            if self.step % cfg.logging_steps == 0:
                self._log(metrics)
            bar.update(1)
            bar.set_postfix(
                reward=f"{metrics['reward']:.3f}", acc=f"{metrics['acceptance_rate']:.3f}", w=f"{metrics['mean_w']:.3f}"
            )
            # the checkpoint first: a run stopped during the evaluation resumes here and evaluates again
            if cfg.save_steps and self.step % cfg.save_steps == 0:
                self.save_checkpoint()
            if self._evaluation_due():
                self._log(self.evaluate(draw_next_block=True), prefix="eval")
        bar.close()
        self._check_frozen()
        head = self.accelerator.unwrap_model(self.head)
        if cfg.num_eval_prompts:
            untrained = self.untrained_eval if self.untrained_eval is not None else self.evaluate(self.ref_head)
            self.eval_metrics = {"trained": self.evaluate(head), "untrained": untrained}
            self._log(self.eval_metrics["trained"], prefix="eval")
        self.save_model()
        if self._writer is not None:
            self._writer.close()
        return head

    def _evaluation_due(self) -> bool:
        """An in-run evaluation point: every ``eval_steps`` steps, before the last (the final one evaluates)."""
        cfg = self.config
        return (
            bool(cfg.num_eval_prompts and cfg.eval_steps)
            and 0 < self.step < cfg.max_steps
            and (self.step % cfg.eval_steps == 0)
        )

    def _evaluation_logged(self) -> bool:
        """Whether ``log_history.jsonl`` in the output directory holds an evaluation at the current step."""
        log_path = Path(self.config.output_dir) / "log_history.jsonl"
        if not log_path.is_file():
            return False
        for line in log_path.read_text().splitlines():
            entry = json.loads(line) if line.strip() else {}
            if entry.get("split") == "eval" and entry.get("step") == self.step:
                return True
        return False

    def _check_frozen(self) -> None:
        if (_fingerprint(self.target), _fingerprint(self.draft)) != self._frozen:
            raise RuntimeError("The frozen target/draft parameters changed during head training.")

    # ------------------------------------------------------------ saving
    def model_card(self) -> str:
        cfg = self.config
        head = self.accelerator.unwrap_model(self.head)
        training = training_section(cfg)
        if self.eval_metrics:
            keys = list(self.eval_metrics["trained"])
            lines = [
                f"{min(cfg.num_eval_prompts, len(self.eval_dataset))} prompts of the `{cfg.eval_split}` "
                f"split, temperature {cfg.temperature}, {cfg.max_new_tokens} new tokens.",
                "",
                "| head | " + " | ".join(keys) + " |",
                "|---|" + "---|" * len(keys),
            ]
            for name in ("untrained", "trained"):
                m = self.eval_metrics[name]
                label = f"untrained (static w={cfg.init_weight})" if name == "untrained" else "trained"
                lines.append(f"| {label} | " + " | ".join(f"{m[k]:.4f}" for k in keys) + " |")
            evaluation = "\n".join(lines)
        else:
            evaluation = "Not evaluated (num_eval_prompts=0)."
        return render_head_card(
            target_model=cfg.target or head.config.target_model,
            draft_model=cfg.draft or head.config.draft_model,
            vocab_size=head.config.vocab_size,
            task=cfg.task,
            weights=weights_sentence(head.config.training_weights),
            repo_id=cfg.hub_model_id or cfg.output_dir,
            training=training,
            evaluation=evaluation,
        )

    def save_model(self, output_dir: str | Path | None = None) -> Path:
        output_dir = Path(output_dir or self.config.output_dir)
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            head = self.accelerator.unwrap_model(self.head)
            head.config.task = self.config.task
            output_dir.mkdir(parents=True, exist_ok=True)
            head.save_pretrained(output_dir)
            card = self.model_card()
            (output_dir / "README.md").write_text(card)
            # The repository's transformers-only recipe; without a Hub id it loads the head from this directory.
            write_custom_generate(output_dir, self.config.hub_model_id or str(output_dir.resolve()))
            if self.config.push_to_hub:
                push_head_folder(output_dir, self.config.hub_model_id)
        self.accelerator.wait_for_everyone()
        return output_dir
