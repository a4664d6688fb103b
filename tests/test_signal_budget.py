"""training/signal_budget.py and its maths: the coupled draw of the target's and the draft's token, the gradient's
noise scale, per-rollout gradients that average to the trainer's, and branches recorded as they are scored."""

from __future__ import annotations

import json
import math
from pathlib import Path

import datasets
import pytest
import torch
from conftest import build_tiny, prompts

from hf_diversed.trainer import DiversedConfig, DiversedTrainer
from hf_diversed.trainer.analysis import gradient_noise_scale, maximal_coupling

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
P = torch.tensor([0.5, 0.3, 0.15, 0.05])
Q = torch.tensor([0.1, 0.3, 0.2, 0.4])


def _chi_square(draws: torch.Tensor, law: torch.Tensor) -> float:
    expected = law.double() * draws.numel()
    return float(((torch.bincount(draws, minlength=law.numel()).double() - expected) ** 2 / expected).sum())


# chi-square with 3 degrees of freedom: P(X > 21.1) = 1e-4; |z| > 3.9: 1e-4
CHI2_3_AT_1E4, Z_AT_1E4 = 21.1, 3.9


def test_maximal_coupling_keeps_both_laws_and_agrees_as_often_as_any_coupling_can():
    n = 200_000
    y_p, y_q = maximal_coupling(P.repeat(n, 1), Q.repeat(n, 1), torch.Generator().manual_seed(0))
    assert _chi_square(y_p, P) < CHI2_3_AT_1E4 and _chi_square(y_q, Q) < CHI2_3_AT_1E4
    agree, best = float((y_p == y_q).double().mean()), float(torch.minimum(P, Q).sum())  # 1 - TV = 0.55
    assert abs(agree - best) / math.sqrt(best * (1 - best) / n) < Z_AT_1E4
    # independent draws keep the laws but agree far less often (sum p q = 0.225): the check above tells them apart
    g = torch.Generator().manual_seed(1)
    independent = torch.multinomial(P, n, True, generator=g) == torch.multinomial(Q, n, True, generator=g)
    assert abs(float(independent.double().mean()) - best) / math.sqrt(best * (1 - best) / n) > 100
    # a coupling that draws y_q from p's residual where they differ breaks q's law: the marginal check sees it
    wrong_q = torch.where(y_p == y_q, y_q, y_p)
    assert _chi_square(wrong_q, Q) > 100 * CHI2_3_AT_1E4


def test_gradient_noise_scale_is_the_pairwise_dot_product_and_its_interval_covers():
    grads = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, -1.0], [1.0, 0.5]])
    out = gradient_noise_scale(grads, batch_size=2)
    pairs = [float(grads[i] @ grads[j]) for i in range(4) for j in range(4) if i != j]
    assert out["signal"] == pytest.approx(sum(pairs) / len(pairs))
    assert out["noise"] == pytest.approx(float(grads.var(0).sum()))
    assert out["noise_scale"] == pytest.approx(out["noise"] / out["signal"])
    assert out["steps_for_snr_2"] == pytest.approx(4 / out["step_snr"] ** 2)
    centred = torch.cat([grads, -grads])  # mean 0: no signal to find
    assert gradient_noise_scale(centred, 2)["noise_scale"] is None
    # Gaussian gradients, |mu|^2 = 50 x 0.1^2 = 0.5: the 95% interval covers it in 176+ of 200 draws (false
    # failure ~1e-5 at a true coverage of 95%)
    g = torch.Generator().manual_seed(0)
    covered = 0
    for _ in range(200):
        out = gradient_noise_scale(torch.randn(128, 50, generator=g) + 0.1, 8)
        covered += out["signal_low"] <= 0.5 <= out["signal_high"]
    assert covered >= 176


@pytest.fixture(scope="module")
def pair():
    return build_tiny("llama", hidden=64, layers=2, seed=0), build_tiny("llama", hidden=32, layers=1, seed=3)


def _even_share(prompts, completions, **kwargs):
    """The share of a completion's token ids that are even: a reward every token moves."""
    return [sum(int(t) % 2 == 0 for t in c) / max(len(c), 1) for c in completions]


def _setup(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "training"))
    import lr_sweep
    import signal_budget

    config = DiversedConfig(task="gsm8k", num_prompts=4, max_new_tokens=12, num_assistant_tokens=4,
                            max_steps=8, output_dir=str(tmp_path / "out"), seed=0, disable_tqdm=True,
                            acceptance_coef=0.5, save_strategy="no")  # fmt: skip
    data = dict(
        train_dataset=datasets.Dataset.from_list([{"input_ids": p[0].tolist()} for p in prompts(8)]),
        reward_funcs=[_even_share],
    )
    return lr_sweep, signal_budget, config, data


def test_per_rollout_gradients_average_to_the_trainers_step(pair, tmp_path, monkeypatch):
    lr_sweep, signal_budget, config, data = _setup(tmp_path, monkeypatch)
    target, draft = pair
    blocks = lr_sweep.draw_block(config, 2, target, draft, None, tmp_path / "rollouts.pt", **data)
    trainer = DiversedTrainer(target, draft, lr_sweep._sweep_config(config), **data)
    steps = [(rows, rollouts) for rows, rollouts, _ in blocks]
    rows = signal_budget.per_rollout_gradients(trainer, steps)
    head = trainer.accelerator.unwrap_model(trainer.model)
    for s, (batch_rows, rollouts) in enumerate(steps):
        loss = trainer.compute_loss(head, trainer._score(batch_rows, rollouts))
        whole = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(head.parameters()))]).double()
        torch.testing.assert_close(rows[4 * s : 4 * s + 4].mean(0), whole, rtol=1e-5, atol=1e-8)
        assert not torch.allclose(rows[4 * s], rows[4 * s + 1])  # per rollout, not the step's gradient four times


def test_signal_budget_branches_decisive_positions_and_resumes(pair, tmp_path, monkeypatch):
    lr_sweep, signal_budget, config, data = _setup(tmp_path, monkeypatch)
    target, draft = pair
    args = signal_budget.BudgetArguments(rollout_steps=2, budget_dir=str(tmp_path / "budget"),
                                         decisive_quantile=0.5, branch_batch_size=8, branch_chunk=3)  # fmt: skip
    summary = signal_budget.measure(config, args, target, draft, None, lr_sweep.draw_block, lr_sweep._sweep_config,
                                    **data)  # fmt: skip
    assert summary["rollouts"] == 8 and summary["steps"] == 2 and summary["batch_size"] == 4
    blocks = torch.load(tmp_path / "budget" / "rollouts.pt", weights_only=False)
    rollouts = [r for _, batch, _ in blocks for r in batch]
    records = [json.loads(line) for line in (tmp_path / "budget" / "branches.jsonl").read_text().splitlines()]
    assert len(records) == summary["branches"]["positions"]
    threshold = summary["decisive_tv_threshold"]
    trainer = DiversedTrainer(target, draft, lr_sweep._sweep_config(config), **data)
    rows = [row for rows, _, _ in blocks for row in rows for _ in range(config.num_generations)]
    for i, (row, rollout) in enumerate(zip(rows, rollouts, strict=True)):  # two decisive positions per rollout
        ids = rollout.completion_ids
        p, q = (signal_budget.next_token_laws(m, trainer._prompt_ids(row), ids, 1.0) for m in (target, draft))
        above = torch.nonzero(0.5 * (p - q).abs().sum(-1) >= threshold).view(-1).tolist()
        mine = [r["position"] for r in records if r["rollout"] == i]
        assert len(mine) == min(2, len(above)) and set(mine) <= set(above)
    differ = [r for r in records if r["y_p"] != r["y_q"]]
    assert differ and summary["branches"]["differ"] == len(differ)
    assert all(r["rewards"] is None for r in records if r["y_p"] == r["y_q"])
    for r in differ:  # each branch keeps the rollout's prefix, takes its token, and is scored by the reward
        prefix = rollouts[r["rollout"]].completion_ids[: r["position"]].tolist()
        for ids, y, reward in zip(r["completions"], (r["y_p"], r["y_q"]), r["rewards"], strict=True):
            assert ids[: r["position"]] == prefix and ids[r["position"]] == y
            assert reward == pytest.approx(_even_share(None, [ids])[0])
    deltas = [r["rewards"][0] - r["rewards"][1] if r["rewards"] else 0.0 for r in records]
    assert summary["branches"]["mean_delta"] == pytest.approx(sum(deltas) / len(deltas))
    assert any(deltas)  # some branch changed the reward: the branches' own budget, 4 Var(D) / mean(D)^2
    mean = sum(deltas) / len(deltas)
    var = sum((d - mean) ** 2 for d in deltas) / (len(deltas) - 1)
    assert summary["branches"]["branches_for_snr_2"] == pytest.approx(4 * var / mean**2)
    tokens = sum(len(ids) - r["position"] - 1 for r in differ for ids in r["completions"])
    assert summary["branches"]["tokens_per_branch"] == pytest.approx(tokens / len(records))
    assert summary["reward_gradient"]["noise"] > 0 and summary["total_gradient"]["noise"] > 0
    # resumed: the rollouts and the branches come from the files, nothing is drawn again
    import hf_diversed.trainer.rollout as rollout_module

    monkeypatch.setattr(rollout_module, "collect_rollouts", None)
    monkeypatch.setattr(lr_sweep, "DiversedTrainer", None)
    again = signal_budget.measure(config, args, target, draft, None, lr_sweep.draw_block, lr_sweep._sweep_config,
                                  **data)  # fmt: skip
    assert again == summary
    text = signal_budget.markdown(summary, "python training/signal_budget.py ...")
    assert "| reward part |" in text and f"{summary['branches']['differ']}" in text
    # the decoding budget: tokens for SNR 2 on a gain G = c (1 - w) delta, from the noise measured above
    d, budget = summary["decisive_direction"], summary["budget"]
    assert summary["branches"]["delta_var"] == pytest.approx(var)
    k_trainer = (d["decisive_per_rollout"] / d["sigma_reward"]) ** 2 / (
        d["push_std"] ** 2 * summary["branches"]["rollout_tokens"]
    )
    assert budget["k_trainer"] == pytest.approx(k_trainer)
    assert budget["k_branch"] == pytest.approx(1 / (var * summary["branches"]["tokens_per_branch"]))
    for gain, row in budget["gains"].items():
        delta = float(gain) / (d["decisive_per_rollout"] * (1 - d["mean_w_decisive"]))
        assert row["delta"] == pytest.approx(delta)
        assert row["trainer_tokens"] == pytest.approx(4 / (k_trainer * delta**2))
    assert budget["gains"]["0.02"]["branch_tokens"] == pytest.approx(25 * budget["gains"]["0.1"]["branch_tokens"])
    assert "| 0.05 |" in text
    # --refresh rebuilds the budget and the report from budget.json and branches.jsonl alone
    out = tmp_path / "budget"
    older = {k: v for k, v in summary.items() if k != "budget"}
    older["branches"] = {k: v for k, v in summary["branches"].items() if k != "delta_var"}
    (out / "budget.json").write_text(json.dumps(older))
    (out / "budget.md").write_text(signal_budget.markdown(older, "python training/signal_budget.py --seed 3"))
    assert signal_budget.main(["--budget_dir", str(out), "--refresh"]) == 0
    again = json.loads((out / "budget.json").read_text())
    assert again["branches"]["delta_var"] == pytest.approx(var) and again["mean_reward"] == summary["mean_reward"]
    for gain, row in budget["gains"].items():
        assert again["budget"]["gains"][gain] == pytest.approx(row)
    refreshed = (out / "budget.md").read_text()
    assert "python training/signal_budget.py --seed 3" in refreshed and "| 0.05 |" in refreshed


def test_signal_budget_without_branches_reports_the_gradients_alone(pair, tmp_path, monkeypatch):
    lr_sweep, signal_budget, config, data = _setup(tmp_path, monkeypatch)
    target, draft = pair
    args = signal_budget.BudgetArguments(rollout_steps=1, budget_dir=str(tmp_path / "budget"), branches_per_rollout=0)
    summary = signal_budget.measure(config, args, target, draft, None, lr_sweep.draw_block, lr_sweep._sweep_config,
                                    **data)  # fmt: skip
    assert summary["branches"]["positions"] == 0 and summary["branches"]["mean_delta"] is None
    assert "signal" not in summary["decisive_direction"]
    text = signal_budget.markdown(summary, "python training/signal_budget.py --branches_per_rollout 0")
    assert "| reward part |" in text and "none branched (--branches_per_rollout 0)." in text


def test_signal_budget_refuses_bad_flags_in_one_line(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "training"))
    import signal_budget

    with pytest.raises(SystemExit, match="--decisive_quantile in"):
        signal_budget.main(["--task", "gsm8k", "--decisive_quantile", "1.5"])
