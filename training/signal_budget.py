"""How much does the task reward tell the trainer about w, and how many steps would it take to hear it?

    python training/signal_budget.py --config training/recipes/gsm8k-full.yaml --init_head cascade-opt:0.1 \
        --acceptance_coef 0.01 --rollout_steps 16 --budget_dir docs/training/signal-budget-gsm8k

On the recipe's first ``rollout_steps`` batches, drawn once by the head the run starts from (cached as
``training/lr_sweep.py`` caches them, resumable), three measurements:

1. Flat batches: the share of batches whose rewards are all equal (REINFORCE++ gives them no advantage).
2. The gradient of the trainer's loss at that head, one per rollout (through the trainer's own scoring and loss),
   split into the reward's part and the acceptance regularizer's: how much of a step's gradient is signal
   (:func:`hf_diversed.trainer.analysis.gradient_noise_scale`) and how many steps would reach a signal-to-noise of 2.
3. Branching at the decisive positions (the top decile of TV(p_t, q_t) over every completion position): at a chosen
   position the target's and the draft's tokens are drawn together (:func:`maximal_coupling`; they differ with
   probability TV), and where they differ the completion is continued from each with the same head and the same
   seed. The reward difference D_t = r(y_p) - r(y_q) (0 where they agree) is an unbiased draw of
   dE[r]/dw_t = E_p[r-to-go] - E_q[r-to-go] at a drafted position t: what raising w there is worth. Beside it, the
   trainer's own estimate of the same push along "raise w on the decisive positions", A_i sum_t (p - q) / nu at
   rollout i's drafted decisive positions: its noise against D's mean gives the steps that estimate would need.

4. The decoding budget: how many decoded tokens the trainer's estimate and the branches would each need to tell
   whether raising w on the decisive positions gains 2, 5 or 10 points of reward (:func:`decoding_budget`).

Writes ``branches.jsonl`` (one line per branched position, resumable), ``budget.json`` and ``budget.md``;
``--refresh`` rewrites the last two from the records, loading no model.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
from trl import TrlParser

from hf_diversed.evaluation.bench.summary import bootstrap_interval
from hf_diversed.trainer import DiversedConfig, DiversedTrainer
from hf_diversed.trainer.analysis import gradient_noise_scale, maximal_coupling


@dataclass
class BudgetArguments:
    """The measurement's own flags (the recipe's fields are flags too)."""

    rollout_steps: int = field(default=16, metadata={"help": "The recipe's first batches, drawn once by its start."})
    budget_dir: str = field(default="signal-budget", metadata={"help": "Where the records and reports go."})
    rollouts_cache: str | None = field(default=None, metadata={"help": "Default: <budget_dir>/rollouts.pt."})
    branches_per_rollout: int = field(default=2, metadata={"help": "Decisive positions branched per rollout."})
    decisive_quantile: float = field(default=0.9, metadata={"help": "Positions with TV above this quantile."})
    branch_batch_size: int = field(default=64, metadata={"help": "Continuations decoded together."})
    branch_chunk: int = field(default=64, metadata={"help": "Branch pairs continued per sampler call, then saved."})
    refresh: bool = field(
        default=False, metadata={"help": "Rewrite budget.json's budget and budget.md from the records, no model."}
    )

    def check(self) -> None:
        if self.rollout_steps < 1 or self.branches_per_rollout < 0 or not 0 < self.decisive_quantile < 1:
            raise ValueError(
                "--rollout_steps must be >= 1, --branches_per_rollout >= 0 and --decisive_quantile in (0, 1); got "
                f"{self.rollout_steps}, {self.branches_per_rollout}, {self.decisive_quantile}."
            )


def per_rollout_gradients(trainer: DiversedTrainer, steps: Sequence[tuple[list, list]]) -> torch.Tensor:
    """(n, P): rollout i's share of its step's loss gradient at the trainer's head, times the step's rollout count,
    so that a step's gradient is the mean of its rollouts' rows."""
    head = trainer.accelerator.unwrap_model(trainer.model)
    params = [p for p in head.parameters() if p.requires_grad]
    rows_out = []
    for rows, rollouts in steps:
        batch = trainer._score(rows, rollouts)
        bounds = torch.tensor([0] + [r.num_tokens for r in rollouts]).cumsum(0).tolist()
        for i in range(len(rollouts)):
            one = {k: (v[bounds[i] : bounds[i + 1]] if torch.is_tensor(v) else v) for k, v in batch.items()}
            loss = trainer.compute_loss(head, one) * len(rollouts)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            rows_out.append(torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).double()
                                       for g, p in zip(grads, params, strict=True)]))  # fmt: skip
    return torch.stack(rows_out)


def next_token_laws(model, prompt: torch.Tensor, completion: torch.Tensor, temperature: float) -> torch.Tensor:
    """(T, V): the model's law of each completion token given the prompt and the completion before it."""
    ids = torch.cat([prompt.view(-1), completion.view(-1)]).view(1, -1)
    with torch.no_grad():
        logits = model(ids).logits[0, prompt.numel() - 1 : ids.shape[1] - 1].float()
    return torch.softmax(logits / temperature, -1)


def _pad(x: torch.Tensor, size: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, size - x.shape[-1])) if x.shape[-1] < size else x


def choose_branches(tvs: list[torch.Tensor], quantile: float, per_rollout: int, seed: int) -> tuple[float, list]:
    """The TV threshold (the ``quantile`` of every position's TV) and, per rollout, up to ``per_rollout`` of its
    positions above it, at random: [(rollout, position)]."""
    threshold = float(torch.quantile(torch.cat(tvs).double(), quantile))
    generator = torch.Generator().manual_seed(seed)
    chosen = []
    for i, tv in enumerate(tvs):
        above = torch.nonzero(tv >= threshold).view(-1)
        picks = above[torch.randperm(above.numel(), generator=generator)[:per_rollout]].sort().values
        chosen += [(i, int(t)) for t in picks]
    return threshold, chosen


def load_branches(path: Path) -> dict[tuple[int, int], dict]:
    """The branched positions recorded so far, by (rollout, position)."""
    lines = path.read_text().splitlines() if path.is_file() else []
    return {(r["rollout"], r["position"]): r for r in map(json.loads, lines)}


def run_branches(trainer, config, args, items, laws, path: Path) -> list[dict]:
    """Branch every chosen position not yet in ``path``; append one JSON line per position as chunks finish."""
    from hf_diversed.trainer.rollout import collect_rollouts

    done = load_branches(path)
    head = trainer.accelerator.unwrap_model(trainer.model)
    eos = trainer.target.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos or ())
    todo = [c for c in laws["chosen"] if c not in done]
    for start in range(0, len(todo), args.branch_chunk):
        chunk = todo[start : start + args.branch_chunk]
        records, prompts, seeds, owners, budgets = [], [], [], [], []
        for i, t in chunk:
            row, rollout, prompt = items[i]
            p, q = laws["p"][(i, t)], laws["q"][(i, t)]
            seed = config.seed * 1_000_003 + 7919 * i + t
            y_p, y_q = (int(y) for y in maximal_coupling(p[None], q[None], torch.Generator().manual_seed(seed)))
            tv = 0.5 * float((p - q).abs().sum())
            record = {"rollout": i, "position": t, "tv": tv, "y_p": y_p, "y_q": y_q, "rewards": None}
            records.append(record)
            if y_p == y_q:
                continue
            prefix = rollout.completion_ids[:t]
            for y in (y_p, y_q):
                owners.append((len(records) - 1, y))
                prompts.append(torch.cat([prompt.view(-1), prefix, torch.tensor([y])]))
                seeds.append(seed)
                budgets.append(config.max_new_tokens - t - 1)
        continued = [SimpleNamespace(completion_ids=torch.zeros(0, dtype=torch.long))] * len(prompts)
        if prompts and max(budgets) > 0:  # each is cut at its own budget below (the law of a shorter run)
            continued = collect_rollouts(
                trainer.target, trainer.draft, head, prompts, max_new_tokens=max(budgets),
                temperature=config.temperature, num_assistant_tokens=config.num_assistant_tokens, seeds=seeds,
                batch_size=args.branch_batch_size,
            )  # fmt: skip
        scored: dict[int, list[float]] = {}
        for (k, y), more in zip(owners, continued, strict=True):
            i, t = chunk[k]
            row, rollout, _ = items[i]
            budget = max(config.max_new_tokens - t - 1, 0)
            tail = [] if y in eos else more.completion_ids[:budget].tolist()
            ids = rollout.completion_ids[:t].tolist() + [y] + tail
            (reward,) = trainer._rewards([row], [SimpleNamespace(completion_ids=torch.tensor(ids))]).tolist()
            scored.setdefault(k, []).append(reward)
            records[k].setdefault("completions", []).append(ids)
        with path.open("a") as f:
            for k, record in enumerate(records):
                # [r(y_p), r(y_q)] and the two completions, or None where the pair agrees (D = 0)
                record["rewards"] = scored.get(k)
                f.write(json.dumps(record) + "\n")
                done[(record["rollout"], record["position"])] = record
    return [done[c] for c in laws["chosen"]]


def branch_deltas(branches: Sequence[dict]) -> list[float]:
    """D = r(y_p) - r(y_q) of each branched position, 0 where the two tokens agree."""
    return [0.0 if b["rewards"] is None else b["rewards"][0] - b["rewards"][1] for b in branches]


def summarise(steps, rewards, grads_reward, grads_total, branches, threshold, decisive, config) -> dict:
    """The numbers of ``budget.json``."""
    batch = len(steps[0][1])
    flat = sum(float(r.std()) == 0.0 if r.numel() > 1 else True for r in rewards)
    all_rewards = torch.cat(rewards)
    out = {
        "rollouts": int(all_rewards.numel()), "steps": len(steps), "batch_size": batch,
        "mean_reward": float(all_rewards.mean()), "flat_batches": flat,
        "reward_gradient": gradient_noise_scale(grads_reward, batch),
        "total_gradient": gradient_noise_scale(grads_total, batch),
        "acceptance_coef": config.acceptance_coef, "decisive_tv_threshold": threshold,
    }  # fmt: skip
    reg = (grads_total - grads_reward).mean(0)
    out["regularizer_norm"] = float(reg.norm())
    out["reward_signal_norm"] = math.sqrt(max(out["reward_gradient"]["signal"], 0.0))
    deltas = branch_deltas(branches)
    differ = [b for b in branches if b["rewards"] is not None]
    mean = sum(deltas) / len(deltas) if deltas else None
    low, high = bootstrap_interval(deltas) or (None, None)
    out["branches"] = {
        "positions": len(branches), "differ": len(differ), "mean_tv": sum(b["tv"] for b in branches) /
        max(len(branches), 1), "mean_delta": mean, "delta_low": low, "delta_high": high,
        "p_better": sum(b["rewards"][0] > b["rewards"][1] for b in differ),
        "q_better": sum(b["rewards"][0] < b["rewards"][1] for b in differ),
    }  # fmt: skip
    if deltas and mean:
        # the branches as an estimator of their own mean: how many to know its sign at SNR 2, and what they cost
        # in decoded tokens (two continuations where the pair differs) against a rollout's
        var = float(torch.tensor(deltas, dtype=torch.float64).var()) if len(deltas) > 1 else 0.0
        tokens = sum(len(ids) - b["position"] - 1 for b in differ for ids in b["completions"])
        rollout_tokens = sum(r.num_tokens for _, rollouts in steps for r in rollouts) / out["rollouts"]
        out["branches"]["branches_for_snr_2"] = 4 * var / mean**2
        out["branches"]["delta_var"] = var
        out["branches"]["tokens_per_branch"] = tokens / len(deltas)
        out["branches"]["rollout_tokens"] = rollout_tokens
    # the trainer's estimate of the push along "raise w on every drafted decisive position", per rollout
    sigma = float(torch.cat([r - r.mean() for r in rewards]).std())
    pushes = torch.tensor([d["push"] for d in decisive], dtype=torch.float64)
    counts = torch.tensor([d["count"] for d in decisive], dtype=torch.float64)
    direction = {"sigma_reward": sigma, "decisive_per_rollout": float(counts.mean()),
                 "mean_w_decisive": sum(d["w_sum"] for d in decisive) / max(float(counts.sum()), 1.0),
                 "mean_tv_decisive": sum(d["tv_sum"] for d in decisive) / max(float(counts.sum()), 1.0),
                 "push_std": float(pushes.std()), "push_mean": float(pushes.mean())}  # fmt: skip
    if mean is not None and sigma > 0:
        signal = float(counts.mean()) * mean / sigma  # E[A sum_t (p - q)/nu] = sum_t dE[r]/dw_t / sigma
        direction["signal"] = signal
        direction["step_snr"] = abs(signal) / (direction["push_std"] / math.sqrt(batch))
        direction["steps_for_snr_2"] = 4 / direction["step_snr"] ** 2 if signal else None
        direction["lambda_balance"] = mean / (sigma * direction["mean_tv_decisive"])
        direction["reward_if_w_1"] = float(counts.mean()) * (1 - direction["mean_w_decisive"]) * mean
    out["decisive_direction"] = direction
    out["budget"] = decoding_budget(out["branches"], direction)
    return out


GAINS = (0.02, 0.05, 0.1)


def decoding_budget(branches: dict, direction: dict) -> dict | None:
    """Decoded tokens each estimator needs to tell, at SNR 2, whether w -> 1 on the decisive positions gains G of the
    mean reward, for G in ``GAINS``.

    The gain is G = c (1 - w̄) δ with c decisive positions a rollout at mean w̄ and δ = dE[r]/dw_t there. Both
    estimators' SNR² grow linearly in decoded tokens, as k δ², with the noise measured here held fixed: the trainer's
    push (signal c δ / σ, std push_std a rollout of L tokens) has k = (c / σ)² / (push_std² L); a branch (δ against
    Var D, ℓ tokens a branch) has k = 1 / (Var D ℓ). Tokens for SNR 2: 4 / (k δ²). None where either noise is
    unmeasured."""
    var = branches.get("delta_var")
    c, sigma, push_std = direction["decisive_per_rollout"], direction["sigma_reward"], direction["push_std"]
    if not var or "tokens_per_branch" not in branches or not sigma or not push_std or not c:
        return None
    k_trainer = (c / sigma) ** 2 / (push_std**2 * branches["rollout_tokens"])
    k_branch = 1 / (var * branches["tokens_per_branch"])
    out = {"k_trainer": k_trainer, "k_branch": k_branch, "gains": {}}
    for gain in GAINS:
        delta = gain / (c * (1 - direction["mean_w_decisive"]))
        out["gains"][f"{gain:g}"] = {"delta": delta, "trainer_tokens": 4 / (k_trainer * delta**2),
                                     "branch_tokens": 4 / (k_branch * delta**2)}  # fmt: skip
    return out


def markdown(s: dict, command: str) -> str:
    def gn(g):
        def f(x):
            return "-" if x is None else f"{x:.3g}"

        return (f"{g['signal']:.3g} [{g['signal_low']:.3g}, {g['signal_high']:.3g}] | {g['noise']:.3g} | "
                f"{f(g['noise_scale'])} | {f(g['step_snr'])} | {f(g['steps_for_snr_2'])}")  # fmt: skip

    b, d = s["branches"], s["decisive_direction"]
    lines = [
        "# How much the reward tells the trainer about w", "", "```", command, "```", "",
        f"{s['rollouts']} rollouts in {s['steps']} batches of {s['batch_size']}, drawn by the start head; mean reward "
        f"{s['mean_reward']:.3f}; batches whose rewards are all equal: {s['flat_batches']} of {s['steps']}.", "",
        "| gradient | signal \\|μ\\|² [95% CI] | noise tr Σ | noise scale (rollouts) | one step's SNR | "
        "steps to SNR 2 |", "|---|---|---|---|---|---|",
        f"| reward part | {gn(s['reward_gradient'])} |",
        f"| reward + λ = {s['acceptance_coef']:g} regularizer | {gn(s['total_gradient'])} |", "",
        f"Regularizer's mean gradient norm {s['regularizer_norm']:.3g} (per unit λ) against the reward's signal norm "
        f"{s['reward_signal_norm']:.3g}.", "",
        f"Branches at the decisive positions (TV ≥ {s['decisive_tv_threshold']:.3f}, the top decile): "
        + (f"{b['positions']} positions, mean TV {b['mean_tv']:.3f}; the two tokens differ at {b['differ']}, where the "
           f"target's continuation scores higher {b['p_better']} times and the draft's {b['q_better']} times. "
           f"dE[r]/dw_t = mean D = {b['mean_delta']:+.4f} [{b['delta_low']:+.4f}, {b['delta_high']:+.4f}] per position."
           if b["positions"] else "none branched (--branches_per_rollout 0).")
        + (f" Branches needed to know its sign at SNR 2: {b['branches_for_snr_2']:.3g}, each "
           f"{b['tokens_per_branch']:.0f} decoded tokens against a rollout's {b['rollout_tokens']:.0f}."
           if "branches_for_snr_2" in b else ""),
        "",
        f"Along 'raise w on the decisive drafted positions' ({d['decisive_per_rollout']:.1f} a rollout, mean w "
        f"{d['mean_w_decisive']:.3f}, mean TV {d['mean_tv_decisive']:.3f}; reward std {d['sigma_reward']:.3f}): the "
        f"trainer's per-rollout estimate has std {d['push_std']:.3g}",
    ]  # fmt: skip
    if "signal" in d:
        lines[-1] += (
            f", the branches' signal is {d['signal']:+.3g}: one step's SNR {d['step_snr']:.3g}, steps to SNR 2 "
            f"{d['steps_for_snr_2']:.3g}; λ at which reward and regularizer balance there {d['lambda_balance']:.3g}; "
            f"w → 1 on those positions would change the mean reward by {d['reward_if_w_1']:+.3f} (first order)."
        )
    if s.get("budget"):
        k = s["budget"]
        lines += [
            "",
            "Decoded tokens to tell at SNR 2 whether w → 1 on the decisive positions gains G of the mean "
            "reward (G = c (1 − w̄) δ; each estimator's SNR² is k δ² per token with the noise measured above: "
            f"the trainer's k = {k['k_trainer']:.3g}, the branches' {k['k_branch']:.3g}):",
            "",
            "| G | δ = dE[r]/dw_t | the trainer's rollouts (tokens) | branches (tokens) |",
            "|---|---|---|---|",
        ]
        lines += [f"| {g} | {v['delta']:.4f} | {v['trainer_tokens']:.3g} | {v['branch_tokens']:.3g} |"
                  for g, v in k["gains"].items()]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    from lr_sweep import _sweep_config, draw_block

    from hf_diversed.evaluation.models import load_pair

    argv = list(sys.argv[1:] if argv is None else argv)
    config, args = TrlParser((DiversedConfig, BudgetArguments)).parse_args_and_config(argv)
    try:
        args.check()
    except ValueError as err:
        raise SystemExit(str(err)) from None
    out = Path(args.budget_dir)
    if args.refresh:
        summary, command = refresh(out)
    else:
        tokenizer, target, draft = load_pair(config.target, config.draft, getattr(torch, config.dtype), config.weights)
        summary = measure(config, args, target, draft, tokenizer, draw_block, _sweep_config)
        command = shlex.join(["python", "training/signal_budget.py", *argv])
    (out / "budget.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (out / "budget.md").write_text(markdown(summary, command))
    print((out / "budget.md").read_text())
    return 0


def refresh(out: Path) -> tuple[dict, str]:
    """budget.json with its branches' variance and decoding budget recomputed from branches.jsonl, and the command
    that measured it (budget.md's first code block)."""
    if not (out / "budget.json").is_file():
        raise SystemExit(f"--refresh: no budget.json in {out}; run the measurement there first.")
    summary = json.loads((out / "budget.json").read_text())
    text = (out / "budget.md").read_text().splitlines() if (out / "budget.md").is_file() else []
    command = text[text.index("```") + 1] if "```" in text else "python training/signal_budget.py"
    deltas = branch_deltas(list(load_branches(out / "branches.jsonl").values()))
    if len(deltas) != summary["branches"]["positions"]:
        raise SystemExit(f"--refresh: {out}/branches.jsonl holds {len(deltas)} positions, budget.json "
                         f"{summary['branches']['positions']}; measure again.")  # fmt: skip
    if len(deltas) > 1:
        summary["branches"]["delta_var"] = float(torch.tensor(deltas, dtype=torch.float64).var())
    summary["budget"] = decoding_budget(summary["branches"], summary["decisive_direction"])
    return summary, command


def measure(config, args, target, draft, tokenizer, draw_block, sweep_config, **trainer_kwargs) -> dict:
    """Every number of ``budget.json`` (see the module's docstring)."""
    out = Path(args.budget_dir)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(args.rollouts_cache) if args.rollouts_cache else out / "rollouts.pt"
    blocks = draw_block(config, args.rollout_steps, target, draft, tokenizer, cache, **trainer_kwargs)
    trainer = DiversedTrainer(target, draft, sweep_config(config), processing_class=tokenizer, **trainer_kwargs)
    reward_only = DiversedTrainer(target, draft, sweep_config(config, acceptance_coef=0.0),
                                  processing_class=tokenizer, **trainer_kwargs)  # fmt: skip
    steps = [(rows, rollouts) for rows, rollouts, _ in blocks]
    expanded = [[row for row in rows for _ in range(config.num_generations)] for rows, _ in steps]
    rewards = [trainer._rewards(rows, rollouts) for rows, (_, rollouts) in zip(expanded, steps, strict=True)]
    grads_total = per_rollout_gradients(trainer, steps)
    grads_reward = per_rollout_gradients(reward_only, steps)

    items = [(row, rollout, trainer._prompt_ids(row)) for rows, (_, rollouts) in zip(expanded, steps, strict=True)
             for row, rollout in zip(rows, rollouts, strict=True)]  # fmt: skip

    def laws_of(item) -> tuple[torch.Tensor, torch.Tensor]:
        _, rollout, prompt = item
        p = next_token_laws(target, prompt, rollout.completion_ids, config.temperature)
        q = next_token_laws(draft, prompt, rollout.completion_ids, config.temperature)
        size = max(p.shape[-1], q.shape[-1])
        return _pad(p, size), _pad(q, size)

    # two passes: every position's TV first, then the laws at the chosen positions only ((T, V) per rollout is
    # too much to keep for all of them)
    tvs = [0.5 * (p - q).abs().sum(-1) for p, q in map(laws_of, items)]
    threshold, chosen = choose_branches(tvs, args.decisive_quantile, args.branches_per_rollout, config.seed)
    laws: dict = {"p": {}, "q": {}, "chosen": chosen}
    done = load_branches(out / "branches.jsonl")
    for i in sorted({i for i, t in chosen if (i, t) not in done}):
        p, q = laws_of(items[i])
        for j, t in chosen:
            if j == i:
                laws["p"][(i, t)], laws["q"][(i, t)] = p[t].clone(), q[t].clone()  # a view would keep (T, V)

    from hf_diversed.trainer.objective import reinforce_pp_advantages

    decisive = []
    for (_, rollouts), reward in zip(steps, rewards, strict=True):
        for rollout, a in zip(rollouts, reinforce_pp_advantages(reward.double().view(-1, 1)).tolist(), strict=True):
            tr = rollout.trace
            mask = tr.tv >= threshold
            nu = (tr.w * tr.p_y + (1 - tr.w) * tr.q_y).double().clamp_min(torch.finfo(torch.float32).tiny)
            push = a * float(((tr.p_y.double() - tr.q_y.double()) / nu)[mask].sum())
            decisive.append({"push": push, "count": int(mask.sum()), "w_sum": float(tr.w[mask].sum()),
                             "tv_sum": float(tr.tv[mask].sum())})  # fmt: skip
    branches = run_branches(trainer, config, args, items, laws, out / "branches.jsonl")
    return summarise(steps, rewards, grads_reward, grads_total, branches, threshold, decisive, config)


if __name__ == "__main__":
    sys.exit(main())
