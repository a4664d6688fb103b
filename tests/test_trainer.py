"""DiversedTrainer on tiny random models: learning signal, regulariser sign, frozen LMs, resume, CLI, and the
batched rollouts it trains on (the same rollouts as batch-1 generate)."""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path

import datasets
import pytest
import torch
from conftest import EOS, build_tiny, chat_model, chat_tokenizer, prompts, require_data_dir
from safetensors.torch import load_file

from hf_diversed import DiversedHeadConfig
from hf_diversed.modeling.modeling_diversed_head import DiversedHead, position_weights
from hf_diversed.trainer import DiversedConfig, DiversedTrainer, diversed_policy_loss
from hf_diversed.trainer.curves import CURVES_FILE, by_rollout_batch, load_history
from hf_diversed.trainer.imitation import fit_head_to_weights, roc_auc
from hf_diversed.trainer.rollout import Rollout, collect_rollout, collect_rollouts, load_rollouts, rollouts_trace

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pair():
    """Target and a clearly different draft (different width and weights), so TV(p, q) is large."""
    return build_tiny("llama", hidden=64, layers=2, seed=0), build_tiny("llama", hidden=32, layers=1, seed=3)


def _dataset(n: int = 8, seed: int = 0) -> datasets.Dataset:
    return datasets.Dataset.from_list([{"input_ids": ids[0].tolist()} for ids in prompts(n, seed=seed)])


def _config(tmp_path, **overrides) -> DiversedConfig:
    values = dict(
        task="gsm8k",
        num_prompts=4,
        max_new_tokens=12,
        num_assistant_tokens=4,
        learning_rate=2e-2,
        warmup_steps=0,
        lr_scheduler_type="constant",
        max_steps=16,
        num_iterations=4,
        save_strategy="steps" if "save_steps" in overrides else "no",
        output_dir=str(tmp_path / "out"),
        seed=0,
        disable_tqdm=True,
    )
    values.update(overrides)
    return DiversedConfig(**values)


def _constant_reward(prompts, completions, **kwargs):
    return [1.0] * len(completions)


def _trust_draft_reward(target, draft):
    """Mean log q(y) - log p(y) over the completion: higher when tokens come from the draft's law."""

    def reward(prompts, completions, **kwargs):
        out = []
        for prompt, completion in zip(prompts, completions, strict=True):
            if not completion:
                out.append(0.0)
                continue
            ids = torch.tensor([list(prompt) + list(completion)], device=target.device)
            with torch.no_grad():
                lp = target(ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
                lq = draft(ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
            y = torch.tensor(completion, device=target.device).view(-1, 1)
            out.append(float((lq.gather(-1, y) - lp.gather(-1, y)).mean()))
        return out

    return reward


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


def test_regularizer_sign_pushes_w_down():
    w = torch.full((6,), 0.5, requires_grad=True)
    tv = torch.rand(6) * 0.5 + 0.1
    p_y, q_y = torch.rand(6), torch.rand(6)
    loss, _ = diversed_policy_loss(w, w.detach(), p_y, q_y, tv, torch.zeros(6), clip_eps=0.2, acceptance_coef=1.0)
    loss.backward()
    assert (w.grad > 0).all()  # gradient descent lowers w -> acceptance 1 - w * TV rises
    w2 = (w - 0.1 * w.grad).detach()
    assert ((1 - w2 * tv) > (1 - w.detach() * tv)).all()


def test_rollout_trace_matches_head(pair):
    target, draft = pair
    head = DiversedHead.for_models(target, draft)
    torch.manual_seed(0)
    r = collect_rollout(target, draft, head, prompts(1)[0], max_new_tokens=16, temperature=1.0, num_assistant_tokens=4)
    t = r.trace
    assert t.h_draft.shape == (r.num_tokens, 32) and t.h_target.shape == (r.num_tokens, 64)
    # drafted positions only: never more than the verified ones, never the bonus tokens
    assert 0 < r.num_tokens <= min(r.stats.num_verified, r.completion_ids.numel())
    torch.testing.assert_close(position_weights(head, t.h_draft, t.h_target), t.w)
    assert ((t.p_y > 0) & (t.q_y > 0) & (t.tv >= 0) & (t.tv <= 1)).all()
    # the completion's tokens in order, less the bonus tokens; per round accepted drafts, then at most one correction
    emitted = iter(r.completion_ids.tolist())
    assert all(token in emitted for token in t.tokens.tolist())
    assert int(t.accepted.sum()) <= r.stats.num_accepted and int((~t.accepted).sum()) <= r.stats.num_rounds


def _assert_same_rollout(real, batched, what: str, unseen_draft_eos: bool = False) -> None:
    assert torch.equal(real.completion_ids, batched.completion_ids), f"{what}: tokens differ"
    assert real.finish_reason == batched.finish_reason, f"{what}: {real.finish_reason} vs {batched.finish_reason}"
    assert real.stats.accepted_per_round == batched.stats.accepted_per_round, f"{what}: accepted per round differ"
    for name in ("num_accepted", "num_rounds", "num_verified"):
        assert getattr(real.stats, name) == getattr(batched.stats, name), f"{what}: {name} differs"
    extra = batched.stats.num_drafted - real.stats.num_drafted
    if unseen_draft_eos:
        # A known limit of the sampler's num_drafted: when generate's draft drafts an EOS *after* the round's first
        # rejected position, it stops there and drafts fewer; the sampler never draws those positions and counts
        # the full round (at most N - 1 too many per round). Tokens, the other counts and the features agree.
        assert 0 <= extra <= real.stats.num_rounds * 3, f"{what}: num_drafted {extra:+d}"
    else:
        assert extra == 0, f"{what}: num_drafted differs by {extra:+d}"
    for name in ("weight_sum", "tv_sum"):
        assert getattr(real.stats, name) == pytest.approx(getattr(batched.stats, name), abs=1e-4), what
    for name in ("h_draft", "h_target", "p_y", "q_y", "tv", "w", "max_p", "max_q"):
        a, b = getattr(real.trace, name), getattr(batched.trace, name)
        assert a.shape == b.shape and a.dtype == b.dtype == torch.float32, f"{what}: {name} {a.shape} {b.shape}"
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0, msg=f"{what}: {name} differs")
    for name in ("tokens", "accepted", "top_p", "top_q"):
        assert torch.equal(getattr(real.trace, name), getattr(batched.trace, name)), f"{what}: {name} differs"


def test_collect_rollouts_match_collect_rollout_greedy(pair):
    """The batched sampler's rollouts are generate's (greedy, float32): tokens, counts and every feature, with
    rows leaving and joining a 3-row batch, a repeated prompt (one shared prefill) and rollouts ending on EOS."""
    target, draft = pair
    head = DiversedHead.for_models(target, draft, init_weight=0.5)
    torch.manual_seed(0)
    with torch.no_grad():
        head.out.weight.normal_(0.0, 0.5)  # w varies per position (a fresh head is constant)
    ids = prompts(4, seed=7)
    ids = [ids[0], ids[1], ids[0], ids[2], ids[3]]
    settings = dict(max_new_tokens=14, temperature=0.0, num_assistant_tokens=4)

    def check(eos: int) -> list:
        batched = collect_rollouts(
            target, draft, head, ids, seeds=range(len(ids)), batch_size=3, eos_token_id=eos, **settings
        )
        assert len(batched) == len(ids)
        for i, (prompt, rollout) in enumerate(zip(ids, batched, strict=True)):
            # the sampler's law is generate's with pad = the first EOS id (the tiny models' pad is 2)
            real = collect_rollout(target, draft, head, prompt, eos_token_id=eos, pad_token_id=eos, **settings)
            _assert_same_rollout(real, rollout, f"eos {eos}, prompt {i}", unseen_draft_eos=eos != EOS)
            assert 0 < rollout.num_tokens <= rollout.stats.num_verified
            ended = int(rollout.completion_ids[-1]) == eos
            assert rollout.cut == (not ended) and (ended or len(rollout.completion_ids) == settings["max_new_tokens"])
        return batched

    first = check(EOS)
    early = int(first[1].completion_ids[2])  # as EOS, prompt 1's rollout (at least) ends on it, early
    assert early != EOS
    second = check(early)
    assert not second[1].cut and second[1].finish_reason == "eos"
    tokens = first[1].completion_ids.tolist()
    assert second[1].completion_ids.tolist() == tokens[: tokens.index(early) + 1]


def _trainer(pair, config, **kwargs) -> DiversedTrainer:
    target, draft = pair
    kwargs.setdefault("train_dataset", _dataset())
    kwargs.setdefault("reward_funcs", [_trust_draft_reward(target, draft)])
    return DiversedTrainer(target, draft, config, **kwargs)


def _head(trainer: DiversedTrainer) -> DiversedHead:
    return trainer.accelerator.unwrap_model(trainer.model)


def _train_logs(trainer: DiversedTrainer) -> list[dict]:
    """The Trainer's per-update training logs (its log_history, without the run's summary line)."""
    return [e for e in trainer.state.log_history if "loss" in e]


def test_reward_trusting_draft_lowers_w(pair, tmp_path):
    target, draft = pair
    before_t, before_d = _params(target), _params(draft)
    config = _config(
        tmp_path, max_steps=100, num_eval_prompts=6, eval_strategy="steps", eval_steps=40, eval_on_start=True
    )
    trainer = _trainer(pair, config, eval_dataset=_dataset(6, seed=1))
    head0 = _params(trainer.ref_head)
    trainer.train()
    trainer.save_model()
    head = _head(trainer)
    assert not _same(_params(head), head0)
    assert _same(_params(target), before_t) and _same(_params(draft), before_d)
    assert all(not p.requires_grad for p in target.parameters())
    trained, untrained = trainer.eval_metrics["trained"], trainer.eval_metrics["untrained"]
    assert trained["mean_w"] < untrained["mean_w"] - 0.1
    assert trained["acceptance_rate"] > untrained["acceptance_rate"]
    assert trained["reward"] > untrained["reward"]
    # the learning curve: the untrained head at update 0 (reused as the final "untrained" row), every 40, the end
    out = Path(config.output_dir)
    evals = [h for h in load_history(out / "log_history.jsonl") if h["split"] == "eval"]
    assert [h["step"] for h in evals] == [0, 40, 80, 100]
    assert {k: evals[0][k] for k in untrained} == untrained == trainer._evaluate_head(trainer.ref_head)
    assert {k: evals[-1][k] for k in trained} == trained
    assert (out / CURVES_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "model.safetensors").is_file()
    card = (out / "README.md").read_text()
    assert "## Training" in card and "| learning_rate |" in card and "| num_iterations | 4 |" in card
    assert "untrained" in card and "| logging_dir |" not in card  # the method's settings, not every Trainer field
    assert not re.search(r"\{[a-z_]+\}", card), "an unfilled template field"
    recipe = (out / "custom_generate" / "generate.py").read_text()
    assert f"HEAD_REPO_ID = {json.dumps(str(out.resolve()))}" in recipe


def test_acceptance_regularizer_alone_raises_acceptance_and_every_tracker_logs(pair, tmp_path, monkeypatch):
    """``report_to`` is the Trainer's: TensorBoard and Weights & Biases (offline) both receive the run."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = _config(
        tmp_path, max_steps=60, acceptance_coef=1.0, num_eval_prompts=6, report_to=["tensorboard", "wandb"]
    )
    trainer = _trainer(pair, config, eval_dataset=_dataset(6, seed=1), reward_funcs=[_constant_reward])
    trainer.train()
    logs = _train_logs(trainer)
    assert logs[-1]["mean_w"] < logs[0]["mean_w"]
    trained, untrained = trainer.eval_metrics["trained"], trainer.eval_metrics["untrained"]
    assert trained["mean_w"] < untrained["mean_w"]
    assert trained["acceptance_rate"] > untrained["acceptance_rate"]
    assert all(0.0 <= m["cut_fraction"] <= 1.0 for m in (trained, untrained, *logs))
    import wandb
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    wandb.finish()  # flush the offline run
    events = list((Path(config.output_dir) / "runs").rglob("events.out.tfevents.*"))
    scalars = {tag for e in events for tag in EventAccumulator(str(e)).Reload().Tags()["scalars"]}
    assert {"train/mean_w", "train/acceptance_rate", "train/reward", "train/loss", "eval/mean_w"} <= scalars
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    record = runs[0].read_bytes()
    assert all(key in record for key in (b"train/mean_w", b"train/acceptance_rate", b"eval/mean_w"))


def test_resume_is_exact(pair, tmp_path):
    """A run resumed from its checkpoint at update 8 takes the same updates 9-16 as the run that went on: the same
    rollouts (redrawn from their seeds), logs and head."""

    def make(out):
        config = _config(
            tmp_path / out, max_steps=16, save_steps=8, acceptance_coef=0.5, num_generations=2, rollout_batch_size=3
        )  # 8 sampled rollouts a batch through 3 rows: rows leave and join
        return _trainer(pair, config, train_dataset=_dataset(5))

    full = make("a")
    full.train()
    full.save_model()
    checkpoint = tmp_path / "a" / "out" / "checkpoint-8"
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "optimizer.pt").is_file()
    resumed = make("b")
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 16

    def strip(logs):
        return [{k: v for k, v in e.items() if k != "grad_norm"} for e in logs]

    assert strip(_train_logs(resumed)) == strip(_train_logs(full))
    assert _same(_params(_head(full)), _params(_head(resumed)))
    assert _same(load_file(str(tmp_path / "a" / "out" / "model.safetensors")), _params(_head(resumed)))
    again = make("c")  # `true`: the output directory's last checkpoint
    with pytest.raises(ValueError, match="No checkpoint to resume"):
        again.train(resume_from_checkpoint=True)
    # each rollout of a run has its own seed (batches, prompts and generations all differ)
    seeds = {full._rollout_seed("train", b, i, g) for b in range(4) for i in range(4) for g in range(2)}
    assert len(seeds) == 32


def test_steps_per_generation_draws_a_block_with_one_head(pair, tmp_path):
    """K = 2: one sampler call draws two batches with the head of the block's first update; the K batches are then
    learned from in turn, num_iterations times (TRL's schedule); resuming at a block boundary is exact."""
    target, draft = pair

    def make(out, k, **extra):
        config = _config(tmp_path / out, max_steps=16, acceptance_coef=0.5, steps_per_generation=k, **extra)
        trainer = _trainer(pair, config, train_dataset=_dataset(6))
        calls, heads = [], []
        real_draw, real_step = trainer._draw, trainer.training_step

        def draw(parts):
            calls.append([sorted({key[1] for key in keys}) for _, _, _, keys in parts])
            heads.append(copy.deepcopy(_head(trainer)))
            return real_draw(parts)

        def training_step(model, inputs, num_items_in_batch=None):
            loss = real_step(model, inputs, num_items_in_batch)
            batch = trainer._batches[inputs["update"] % 8 % k]
            w_now = position_weights(_head(trainer), batch["h_draft"], batch["h_target"]).detach()
            seen.append((inputs["update"], batch, w_now))  # w_now: the head this update differentiates
            return loss

        seen = []
        trainer._draw, trainer.training_step = draw, training_step
        return trainer, calls, heads, seen

    on_policy, on_calls, _, _ = make("k1", 1)
    on_policy.train()
    blocked, calls, heads, seen = make("k2", 2, save_steps=8)
    blocked.train()
    assert on_calls == [[[b]] for b in range(4)]
    assert calls == [[[0], [1]], [[2], [3]]]
    logs = _train_logs(blocked)
    assert [e["rollout_age"] for e in logs] == list(range(8)) * 2
    # the block's first update is on-policy and learns from batch 0, as the K = 1 run's first update
    first, reference = logs[0], _train_logs(on_policy)[0]
    assert all(first[k] == reference[k] for k in ("reward", "acceptance_rate", "mean_w"))
    assert first == pytest.approx(reference, rel=1e-5, abs=1e-7)
    for update, batch, w_now in seen:
        w_drew = position_weights(heads[update // 8], batch["h_draft"], batch["h_target"]).detach()
        assert torch.allclose(batch["w_old"], w_drew, atol=1e-6)  # the head at the block's first update drew it
        if update % 8:  # the head has moved since: these rollouts are off-policy, and the ratio corrects for it
            assert not torch.allclose(batch["w_old"], w_now, atol=1e-4)
        else:
            assert torch.allclose(batch["w_old"], w_now, atol=1e-6)
    resumed, _, _, _ = make("k2b", 2, save_steps=8)
    resumed.train(resume_from_checkpoint=str(tmp_path / "k2" / "out" / "checkpoint-8"))
    strip = lambda logs: [{k: v for k, v in e.items() if k != "grad_norm"} for e in logs]  # noqa: E731
    assert strip(_train_logs(resumed)) == strip(logs)
    assert _same(_params(_head(resumed)), _params(_head(blocked)))
    with pytest.raises(ValueError, match="multiple of steps_per_generation x num_iterations = 8"):
        _config(tmp_path, steps_per_generation=2, save_steps=4)


def test_a_block_cut_by_max_steps_draws_only_the_batches_it_learns_from(pair, tmp_path):
    """K = 2, num_iterations 4, max_steps 12: the second block has 4 updates, so it draws one batch and learns from
    it 4 times (max_steps = batches x num_iterations), rather than drawing two batches and learning from each twice."""
    config = _config(tmp_path, max_steps=12, acceptance_coef=0.5, steps_per_generation=2, save_steps=8)
    trainer = _trainer(pair, config, train_dataset=_dataset(6))
    calls, real_draw = [], trainer._draw

    def draw(parts):
        calls.append([sorted({key[1] for key in keys}) for _, _, _, keys in parts])
        return real_draw(parts)

    trainer._draw = draw
    trainer.train()
    assert calls == [[[0], [1]], [[2]]]
    assert [e["rollout_batch"] for e in _train_logs(trainer)] == [0, 1] * 4 + [2] * 4


def _recording_trainer(pair, out: Path, **extra) -> tuple[DiversedTrainer, list]:
    """A K = 2 trainer with eval prompts that records, per sampler call, what it drew: "eval" or the batches."""
    config = _config(out, max_steps=16, acceptance_coef=0.5, steps_per_generation=2, **extra)
    trainer = _trainer(pair, config, train_dataset=_dataset(6), eval_dataset=_dataset(3, seed=5))
    calls = []
    real_draw = trainer._draw

    def draw(parts):
        calls.append([sorted({key[0] if key[0] == "eval" else key[1] for key in keys}) for _, _, _, keys in parts])
        return real_draw(parts)

    trainer._draw = draw
    return trainer, calls


def test_evaluation_at_a_block_boundary_shares_the_blocks_sampler_call(pair, tmp_path):
    """With eval_steps a multiple of K x num_iterations, each evaluation and the next block's rollouts are drawn in
    one sampler call; training sees the same rollouts as a run without evaluations."""
    merged, calls = _recording_trainer(
        pair, tmp_path / "merged", num_eval_prompts=3, eval_strategy="steps", eval_steps=8, eval_on_start=True
    )
    merged.train()
    # update 0: untrained evaluation + block (batches 0, 1); update 8: evaluation + block (2, 3); the final ones
    assert calls == [[["eval"], [0], [1]], [["eval"], [2], [3]], [["eval"]]]
    alone, alone_calls = _recording_trainer(pair, tmp_path / "alone", num_eval_prompts=0)
    alone.train()
    assert alone_calls == [[[0], [1]], [[2], [3]]]
    for a, b in zip(_train_logs(merged), _train_logs(alone), strict=True):  # same tokens; features up to rounding
        assert all(a[k] == b[k] for k in ("acceptance_rate", "cut_fraction"))
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    for k, v in _params(_head(merged)).items():
        torch.testing.assert_close(v, _params(_head(alone))[k], atol=1e-6, rtol=1e-5)
    # the evaluation drawn beside a block equals one drawn alone, for the untrained and the trained head
    assert merged.untrained_eval == merged._evaluate_head(merged.ref_head)
    assert merged.eval_metrics["trained"] == merged._evaluate_head(_head(merged))
    assert merged.eval_metrics["untrained"] == merged.untrained_eval


def test_resume_between_evaluations_draws_the_start_evaluation_alone(pair, tmp_path):
    """eval_on_start on a run resumed at update 8, between evaluations (every 16): the Trainer evaluates the head at
    its start, drawn in its own sampler call, so the next block's rollouts, and every update after, are exactly
    those of the run that went on. Resumed on an evaluation's update, the evaluation shares the block as it did."""
    extra = dict(num_eval_prompts=3, eval_strategy="steps", eval_on_start=True, save_steps=8)
    full, full_calls = _recording_trainer(pair, tmp_path / "full", eval_steps=16, **extra)
    full.train()
    assert full_calls == [[["eval"], [0], [1]], [[2], [3]], [["eval"]]]
    resumed, calls = _recording_trainer(pair, tmp_path / "resumed", eval_steps=16, **extra)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "out" / "checkpoint-8"))
    assert calls == [[["eval"]], [[2], [3]], [["eval"]]]
    strip = lambda logs: [{k: v for k, v in e.items() if k != "grad_norm"} for e in logs]  # noqa: E731
    assert strip(_train_logs(resumed)) == strip(_train_logs(full))
    assert _same(_params(_head(resumed)), _params(_head(full)))
    on_eval, on_eval_calls = _recording_trainer(pair, tmp_path / "on-eval", eval_steps=8, **extra)
    on_eval.train()
    again, again_calls = _recording_trainer(pair, tmp_path / "again", eval_steps=8, **extra)
    again.train(resume_from_checkpoint=str(tmp_path / "on-eval" / "out" / "checkpoint-8"))
    assert again_calls == on_eval_calls[1:] == [[["eval"], [2], [3]], [["eval"]]]
    assert strip(_train_logs(again)) == strip(_train_logs(on_eval))


def test_lr_sweep_moves_w_more_with_a_larger_rate(pair, tmp_path, monkeypatch):
    """training/lr_sweep.py: one cached block of rollouts, the same first updates at each rate."""
    monkeypatch.syspath_prepend(str(ROOT / "training"))
    import lr_sweep

    target, draft = pair
    config = _config(tmp_path, max_steps=16, acceptance_coef=0.5)
    data = dict(train_dataset=_dataset(6), reward_funcs=[_trust_draft_reward(target, draft)])
    cache = tmp_path / "rollouts.pt"
    blocks = lr_sweep.draw_block(config, 3, target, draft, None, cache, **data)
    assert len(blocks) == 3 and all(len(batch) == 4 for _, batch, _ in blocks) and cache.is_file()
    # drawn two steps per sampler call, cached after each, resumed after the first: the same rollouts
    chunked = tmp_path / "chunked.pt"
    first = lr_sweep.draw_block(config, 2, target, draft, None, chunked, chunk_steps=2, **data)
    assert len(first) == 2 and len(torch.load(chunked, weights_only=False)) == 2
    resumed = lr_sweep.draw_block(config, 3, target, draft, None, chunked, chunk_steps=2, **data)
    monkeypatch.setattr(lr_sweep, "DiversedTrainer", None)  # a complete cache is loaded, not drawn again
    again = lr_sweep.draw_block(config, 3, target, draft, None, cache, **data)
    for other in (again, resumed):
        assert [r.completion_ids.tolist() for _, b, _ in other for r in b] == [
            r.completion_ids.tolist() for _, b, _ in blocks for r in b
        ]
    monkeypatch.undo()
    records = lr_sweep.sweep(config, [1e-1, 1e-3], blocks, target, draft, **data)
    # 3 batches x num_iterations 4 = 12 updates per rate, and the head before them
    assert [(r["learning_rate"], r["update"]) for r in records] == [(lr, u) for lr in (1e-1, 1e-3) for u in range(13)]
    big, small = records[:13], records[13:]
    assert big[0]["mean_w"] == small[0]["mean_w"]  # the same initial head
    assert sum(r["moved"] for r in big) > 3 * sum(r["moved"] for r in small) > 0
    lr_sweep.write_report(records, tmp_path / "sweep", "python training/lr_sweep.py ...", 100, 12)
    table = (tmp_path / "sweep" / "sweep.md").read_text()
    assert "| 0.1 |" in table and "| 0.001 |" in table
    assert len((tmp_path / "sweep" / "sweep.jsonl").read_text().splitlines()) == len(records)
    assert (tmp_path / "sweep" / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fit_head_to_weights_learns_a_linear_rule():
    """A rule that is a threshold on one hidden feature is fitted, and holds on rollouts the fit did not see."""
    g = torch.Generator().manual_seed(0)
    h_draft, h_target = torch.randn(3000, 8, generator=g), torch.randn(3000, 16, generator=g)
    rule = (h_target[:, 3] > 0.8).float()  # ~20% "exact" positions, like digits in GSM8K answers
    head = DiversedHead(DiversedHeadConfig(draft_hidden_size=8, target_hidden_size=16))
    metrics = fit_head_to_weights(head, h_draft, h_target, rule, groups=torch.arange(3000) // 30, steps=300)
    held = metrics["held_out"]
    assert held["positions"] == 600 and metrics["fit"]["positions"] == 2400  # 20 of 100 rollouts held out
    assert held["auc"] > 0.98 and held["mean_w_where_rule_high"] > 0.7 and held["mean_w_where_rule_low"] < 0.2
    assert roc_auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])) == 0.75
    assert roc_auc(torch.ones(4), torch.tensor([0, 1, 0, 1])) == 0.5 and roc_auc(torch.ones(2), torch.ones(2)) is None
    with pytest.raises(ValueError, match="one row per position"):
        fit_head_to_weights(head, h_draft[:10], h_target, rule)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        fit_head_to_weights(head, h_draft, h_target, rule * 2)


def test_training_starts_from_a_head_fitted_to_a_rule(pair, tmp_path, monkeypatch):
    """training/imitate_rule.py's pieces on real rollouts of the tiny pair, then RL from the fitted head."""
    monkeypatch.syspath_prepend(str(ROOT / "training"))
    import imitate_rule

    from hf_diversed import TokenClassEnsemble

    target, draft = pair
    ids = _dataset(6)["input_ids"]
    rollouts = collect_rollouts(target, draft, DiversedHead.for_models(target, draft), [torch.tensor(i) for i in ids],
                                max_new_tokens=16, temperature=1.0, num_assistant_tokens=4, seeds=range(6))  # fmt: skip
    torch.save(rollouts, tmp_path / "rollouts.pt")
    loaded = load_rollouts(tmp_path / "rollouts.pt")
    rule = TokenClassEnsemble(frozenset(range(0, 128, 3)), 0.0)
    targets, groups = imitate_rule.rule_targets(rule, loaded)
    top_p, top_q = rollouts_trace(loaded).top_p, rollouts_trace(loaded).top_q
    assert torch.equal(targets, ((top_p % 3 == 0) | (top_q % 3 == 0)).float())
    assert groups.tolist() == [i for i, r in enumerate(loaded) for _ in range(r.num_tokens)]
    head = DiversedHead.for_models(target, draft)
    fit_head_to_weights(head, rollouts_trace(loaded).h_draft, rollouts_trace(loaded).h_target, targets,
                        groups=groups, holdout=0.0, steps=50)  # fmt: skip
    head.save_pretrained(tmp_path / "rule-head")

    config = _config(tmp_path, max_steps=4, init_head=str(tmp_path / "rule-head"))
    trainer = DiversedTrainer(target, draft, config, train_dataset=_dataset(), reward_funcs=[_constant_reward])
    assert _same(_params(trainer.ref_head), _params(head)) and _same(_params(trainer.model), _params(head))
    trainer.train()
    assert _same(_params(DiversedHead.from_pretrained(tmp_path / "rule-head")), _params(head))  # the file is kept
    with pytest.raises(ValueError, match="contradicts the head in `init_head`"):
        DiversedTrainer(target, draft, _config(tmp_path, init_head=str(tmp_path / "rule-head"), head_hidden_size=8),
                        train_dataset=_dataset(), reward_funcs=[_constant_reward])  # fmt: skip
    with pytest.raises(ValueError, match="not both"):
        DiversedTrainer(target, draft, config, head=head, train_dataset=_dataset(), reward_funcs=[_constant_reward])
    old = Rollout.__new__(Rollout)  # as pickled before rollouts held a Trace: per-position fields, no tokens
    old.__dict__.update(completion_ids=loaded[0].completion_ids, p_y=loaded[0].trace.p_y, w_old=loaded[0].trace.w)
    torch.save([old], tmp_path / "old-rollouts.pt")
    with pytest.raises(ValueError, match="draw them again"):
        load_rollouts(tmp_path / "old-rollouts.pt")


def test_a_head_reading_the_next_token_laws_imitates_a_cascade_then_trains(pair, tmp_path, monkeypatch):
    """A cascade's deferral is a function of max p, max q and TV, which rollouts record: a head with
    ``use_distribution_features`` fits it from them, and RL trains such a head (fresh or fitted) on its features."""
    monkeypatch.syspath_prepend(str(ROOT / "training"))
    import imitate_rule

    from hf_diversed import SpecCascade
    from hf_diversed.trainer.rollout import rollout_features

    target, draft = pair
    ids = [torch.tensor(i) for i in _dataset(200)["input_ids"]]
    rollouts = collect_rollouts(target, draft, DiversedHead.for_models(target, draft), ids, max_new_tokens=16,
                                temperature=1.0, num_assistant_tokens=4, seeds=range(200))  # fmt: skip
    rule = SpecCascade("opt", 0.1)
    targets, groups = imitate_rule.rule_targets(rule, rollouts)
    max_p, max_q, tv = rollout_features(rollouts).unbind(-1)
    assert torch.equal(targets, (max_q < max_p - 0.1 * tv).float())
    assert 0.1 < float(targets.mean()) < 0.9, "both sides of the rule should occur, or the fit proves little"
    head = DiversedHead.for_models(target, draft, use_distribution_features=True)
    h_d, h_t = rollouts_trace(rollouts).h_draft, rollouts_trace(rollouts).h_target
    metrics = fit_head_to_weights(head, h_d, h_t, targets, groups=groups, holdout=0.25, steps=300,
                                  learning_rate=5e-2, features=rollout_features(rollouts))  # fmt: skip
    assert metrics["held_out"]["auc"] > 0.95, metrics
    head.save_pretrained(tmp_path / "opt-head")
    trainer = DiversedTrainer(target, draft, _config(tmp_path, max_steps=4, init_head=str(tmp_path / "opt-head")),
                              train_dataset=_dataset(), reward_funcs=[_trust_draft_reward(target, draft)])  # fmt: skip
    trainer.train()
    moved = (trainer.model.out.weight.cpu() - head.out.weight).detach()[0]  # the trainer moved its head to the target
    assert float(moved[-3:].abs().min()) > 0  # the features' weights got gradients too
    fresh = DiversedTrainer(target, draft, _config(tmp_path / "fresh", use_distribution_features=True),
                            train_dataset=_dataset(), reward_funcs=[_constant_reward])  # fmt: skip
    assert fresh.model.config.use_distribution_features
    DiversedHead.for_models(target, draft).save_pretrained(tmp_path / "plain-head")
    with pytest.raises(ValueError, match="contradicts the head in `init_head`"):
        config = _config(tmp_path, init_head=str(tmp_path / "plain-head"), use_distribution_features=True)
        DiversedTrainer(target, draft, config, train_dataset=_dataset(), reward_funcs=[_constant_reward])
    with pytest.raises(ValueError, match="these positions carry none"):
        position_weights(head, h_d, h_t, None)


def test_training_can_start_from_a_speculative_cascade(pair, tmp_path):
    """``init_head="cascade-opt:0.1"``: the first head is ``DiversedHead.from_cascade`` (the cascade, reading the
    next-token laws), and RL moves it from there; ``head_hidden_size`` makes it an MLP set to the same cascade."""
    target, draft = pair
    trainer = DiversedTrainer(target, draft, _config(tmp_path, max_steps=4, init_head="cascade-opt:0.1"),
                              train_dataset=_dataset(), reward_funcs=[_trust_draft_reward(target, draft)])  # fmt: skip
    expected = DiversedHead.from_cascade(target, draft, "opt", 0.1)
    torch.testing.assert_close(trainer.model.out.weight.cpu(), expected.out.weight, atol=0, rtol=0)
    assert trainer.model.config.use_distribution_features and trainer.model.config.task == "gsm8k"
    trainer.train()
    assert float((trainer.model.out.weight.cpu() - expected.out.weight).detach().abs().max()) > 0
    mlp = DiversedTrainer(target, draft, _config(tmp_path, init_head="cascade-opt:0.1", head_hidden_size=8),
                          train_dataset=_dataset(), reward_funcs=[_constant_reward])  # fmt: skip
    assert mlp.model.config.head_hidden_size == 8 and mlp.model.config.use_distribution_features
    torch.testing.assert_close(mlp.model.out.weight[0, :2].cpu(), torch.tensor([50.0, -50.0]), atol=0, rtol=0)
    with pytest.raises(ValueError, match="Unknown SpecCascade rule 'max'"):
        DiversedTrainer(target, draft, _config(tmp_path, init_head="cascade-max:0.1"),
                        train_dataset=_dataset(), reward_funcs=[_constant_reward])  # fmt: skip


def test_imitate_rule_command(tmp_path, monkeypatch, capsys):
    """`python training/imitate_rule.py`: a tokenizer's digit class, a head fitted and saved with its metrics."""
    monkeypatch.syspath_prepend(str(ROOT / "training"))
    import imitate_rule

    from hf_diversed.modeling.hub import load_head

    texts = [f"Question {i}: {i} + {2 * i} = {3 * i} apples, answer {i * 7}." for i in range(200)]
    tokenizer = chat_tokenizer(texts)
    target, draft = chat_model(tokenizer, 0), chat_model(tokenizer, 1, noise=0.3)
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    prompts_ = [tokenizer(t, return_tensors="pt")["input_ids"][0] for t in texts[:8]]
    rollouts = collect_rollouts(target, draft, DiversedHead.for_models(target, draft), prompts_, max_new_tokens=24,
                                temperature=1.0, num_assistant_tokens=4, seeds=range(8))  # fmt: skip
    torch.save(rollouts, tmp_path / "rollouts.pt")
    out = tmp_path / "rule-head"
    assert imitate_rule.main([
        "--rollouts_cache", str(tmp_path / "rollouts.pt"), "--output_dir", str(out), "--target",
        str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--rule", "token-class:digits:0",
        "--holdout", "0.25", "--steps", "30",
    ]) == 0  # fmt: skip
    report = json.loads((out / "imitation.json").read_text())
    assert report["rule"] == "token-class:digits:0" and report["rollouts"] == 8
    assert report["held_out"]["positions"] + report["fit"]["positions"] == sum(r.num_tokens for r in rollouts)
    head = load_head(out, cache=False)
    assert head.config.target_hidden_size == 64 and head.config.target_model == str(tmp_path / "target")
    assert '"rule": "token-class:digits:0"' in capsys.readouterr().out
    args = ["--rollouts_cache", str(tmp_path / "rollouts.pt"), "--target", str(tmp_path / "target"), "--draft",
            str(tmp_path / "draft"), "--holdout", "0.25", "--steps", "30"]  # fmt: skip
    assert imitate_rule.main([*args, "--output_dir", str(tmp_path / "soft"), "--margin", "0.1"]) == 0
    soft = json.loads((tmp_path / "soft" / "imitation.json").read_text())  # fits 0.1 + 0.8 w_rule
    assert soft["fit"]["mean_target"] == pytest.approx(0.1 + 0.8 * report["fit"]["mean_target"], abs=1e-6)
    with pytest.raises(SystemExit, match="--margin must be in"):
        imitate_rule.main([*args, "--output_dir", str(tmp_path / "bad"), "--margin", "0.5"])
    opt = tmp_path / "opt-head"  # a cascade, by a head that reads the next-token laws
    assert imitate_rule.main([*args, "--output_dir", str(opt), "--rule", "cascade-opt:0.1",
                              "--use_distribution_features"]) == 0  # fmt: skip
    assert json.loads((opt / "imitation.json").read_text())["rule"] == "cascade-opt:0.1"
    assert load_head(opt, cache=False).config.use_distribution_features
    with pytest.raises(ValueError, match="Cannot evaluate 'static:0.5'"):
        imitate_rule.main([*args, "--output_dir", str(tmp_path / "bad"), "--rule", "static:0.5"])
    capsys.readouterr()

    # the diagnostics: a fresh head is static (no spread, no correlation), the fitted one follows the rule
    import analyze_head

    DiversedHead.for_models(target, draft).save_pretrained(tmp_path / "fresh")
    assert analyze_head.main([
        "--rollouts_cache", str(tmp_path / "rollouts.pt"), "--heads", f"{tmp_path / 'fresh'},{out}",
        "--rule", "token-class:digits:0", "--target", str(tmp_path / "target"), "--output", str(tmp_path / "a.json"),
    ]) == 0  # fmt: skip
    results = json.loads((tmp_path / "a.json").read_text())
    fresh, fitted = results[str(tmp_path / "fresh")], results[str(out)]
    assert fresh["mean_w"] == pytest.approx(0.5) and fresh["std_w"] == 0 and fresh["corr_w_tv"] is None
    assert fresh["expected_acceptance"] == pytest.approx(fresh["expected_acceptance_static_same_mean_w"])
    tv = rollouts_trace(rollouts).tv.double()
    assert fresh["expected_acceptance"] == pytest.approx(float((1 - 0.5 * tv).mean()))
    assert fitted["std_w"] > 0 and "auc_w_for_rule" in fitted
    assert "| head | mean_w |" in capsys.readouterr().out


def _recorded(p_y, q_y, tv, top_p, w_old=0.5):
    """A recorded rollout with given per-position quantities (no model needed)."""
    from hf_diversed.generation.stats import DiversedStats
    from hf_diversed.generation.trace import Trace
    from hf_diversed.trainer.rollout import Rollout

    n = len(p_y)
    zeros = torch.zeros(n, dtype=torch.long)
    trace = Trace(
        tokens=zeros, p_y=torch.tensor(p_y), q_y=torch.tensor(q_y), tv=torch.tensor(tv), w=torch.full((n,), w_old),
        accepted=torch.ones(n, dtype=torch.bool), top_p=torch.tensor(top_p), top_q=zeros, max_p=torch.ones(n),
        max_q=torch.ones(n), h_draft=torch.zeros(n, 2), h_target=torch.zeros(n, 2),
    )  # fmt: skip
    return Rollout(completion_ids=zeros, trace=trace, stats=DiversedStats())


def test_reward_push_splits_the_first_update_into_reward_and_regularizer():
    """At the drawing head, descent moves w_t along A (p(y) - q(y)) / nu(y) - lambda TV_t: the reward part is
    averaged per class of positions (the rule's exact ones, the rest), with A the step's REINFORCE++ advantage."""
    from hf_diversed.generation.verification import TokenClassEnsemble
    from hf_diversed.trainer.analysis import reward_push
    from hf_diversed.trainer.objective import reinforce_pp_advantages

    rule = TokenClassEnsemble(token_ids={7}, weight=0.0)  # exact where argmax p (or q) is token 7
    won = _recorded([0.6, 0.3, 0.5], [0.2, 0.3, 0.1], [0.4, 0.1, 0.3], [7, 1, 7])  # the target's tokens won
    lost = _recorded([0.2, 0.4], [0.6, 0.4], [0.4, 0.2], [7, 1])  # the draft's token lost
    tie = [_recorded([0.9], [0.1], [0.8], [7]), _recorded([0.1], [0.9], [0.8], [7])]  # equal rewards: A = 0
    steps = [([won, lost], torch.tensor([1.0, 0.0])), (tie, torch.tensor([1.0, 1.0]))]
    out = reward_push(steps, rule, acceptance_coefs=[0.1], resamples=200)

    a = reinforce_pp_advantages(torch.tensor([[1.0], [0.0]])).tolist()
    assert a == pytest.approx([0.5**0.5, -(0.5**0.5)], rel=1e-6)
    exact_pushes = [a[0] * 0.4 / 0.4, a[0] * 0.4 / 0.3, a[1] * -0.4 / 0.4, 0.0, 0.0]  # nu = (p + q) / 2 at w 0.5
    exact, elsewhere = out["rule_exact"], out["elsewhere"]
    assert exact["positions"] == 5 and elsewhere["positions"] == 2
    assert exact["reward_push"] == pytest.approx(sum(exact_pushes) / 5)
    assert exact["mean_tv"] == pytest.approx((0.4 + 0.3 + 0.4 + 0.8 + 0.8) / 5)
    assert exact["lambda_balance"] == pytest.approx(exact["reward_push"] / exact["mean_tv"])
    assert exact["net_push_at_0.1"] == pytest.approx(exact["reward_push"] - 0.1 * exact["mean_tv"])
    assert exact["reward_push_low"] <= exact["reward_push"] <= exact["reward_push_high"]
    assert elsewhere["reward_push"] == 0 and elsewhere["reward_push_low"] == elsewhere["reward_push_high"] == 0
    assert elsewhere["net_push_at_0.1"] == pytest.approx(-0.1 * (0.1 + 0.2) / 2)


def test_reward_signal_command(tmp_path, monkeypatch, capsys):
    """`python training/reward_signal.py` scores a cached block with the task's reward and reports the push."""
    monkeypatch.syspath_prepend(str(ROOT / "training"))
    import reward_signal

    from hf_diversed.evaluation.tasks import extract_gsm8k_answer

    texts = [f"Question {i}: {i} + {2 * i} = {3 * i} apples, answer {i * 7}." for i in range(200)]
    tokenizer = chat_tokenizer(texts)
    target, draft = chat_model(tokenizer, 0), chat_model(tokenizer, 1, noise=0.3)
    target.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    prompts_ = [tokenizer(t, return_tensors="pt")["input_ids"][0] for t in texts[:8]]
    rollouts = collect_rollouts(target, draft, DiversedHead.for_models(target, draft), prompts_, max_new_tokens=24,
                                temperature=1.0, num_assistant_tokens=4, seeds=range(8))  # fmt: skip
    said = [extract_gsm8k_answer(tokenizer.decode(r.completion_ids, skip_special_tokens=True)) for r in rollouts]
    rows = [{"question": t, "answer": f"#### {said[i] if i % 2 == 0 else 'none'}"} for i, t in enumerate(texts[:8])]
    torch.save([(rows[:4], rollouts[:4], 0), (rows[4:], rollouts[4:], 0)], tmp_path / "block.pt")
    args = ["--rollouts_cache", str(tmp_path / "block.pt"), "--rule", "token-class:digits:0", "--target",
            str(tmp_path / "target"), "--output", str(tmp_path / "signal.json")]  # fmt: skip
    assert reward_signal.main(args) == 0
    report = json.loads((tmp_path / "signal.json").read_text())
    assert report["rollouts"] == 8 and report["steps"] == 2
    assert report["mean_reward"] == pytest.approx(sum(s is not None for s in said[::2]) / 8)
    counted = report["rule_exact"].get("positions", 0) + report["elsewhere"].get("positions", 0)
    assert counted == sum(r.num_tokens for r in rollouts)
    assert report["rule_exact"]["positions"] > 0 and report["elsewhere"]["positions"] > 0
    assert "| rule_exact |" in capsys.readouterr().out and report["rule_exact"]["net_push_at_0.1"] is not None
    torch.save(rollouts, tmp_path / "bare.pt")  # rollouts without their prompts cannot be scored
    with pytest.raises(SystemExit, match="holds no prompts to score"):
        reward_signal.main(["--rollouts_cache", str(tmp_path / "bare.pt"), *args[2:]])


def test_reward_validation(pair, tmp_path):
    target, draft = pair
    config = _config(tmp_path, max_steps=4)
    bad_len = DiversedTrainer(target, draft, config, train_dataset=_dataset(), reward_funcs=[lambda p, c, **k: [1.0]])
    with pytest.raises(ValueError, match="returned 1 values for 4 completions"):
        bad_len.train()
    nan = DiversedTrainer(
        target, draft, config, train_dataset=_dataset(), reward_funcs=[lambda p, c, **k: [float("nan")] * len(c)]
    )
    with pytest.raises(ValueError, match="NaN"):
        nan.train()


def test_bad_task_data_and_head_are_named(pair, tmp_path, monkeypatch):
    target, draft = pair
    with pytest.raises(ValueError, match="unknown task 'gsm9k'; valid names: gsm8k"):
        DiversedTrainer(target, draft, _config(tmp_path, task="gsm9k"))
    monkeypatch.setenv("HF_DIVERSED_DATA_DIR", str(tmp_path / "no-data"))
    with pytest.raises(FileNotFoundError, match="no-data"):
        DiversedTrainer(target, draft, _config(tmp_path))
    monkeypatch.delenv("HF_DIVERSED_DATA_DIR")
    wrong = DiversedHead(DiversedHeadConfig(target_hidden_size=64, draft_hidden_size=48))
    with pytest.raises(ValueError, match="hidden sizes 64/48.*models have 64/32"):
        DiversedTrainer(target, draft, _config(tmp_path), head=wrong, train_dataset=_dataset())


def test_config_validation(tmp_path):
    with pytest.raises(ValueError, match="temperature"):
        _config(tmp_path, temperature=0.0)
    with pytest.raises(ValueError, match="rollout_batch_size"):
        _config(tmp_path, rollout_batch_size=0)
    with pytest.raises(ValueError, match="steps_per_generation"):
        _config(tmp_path, steps_per_generation=0)
    with pytest.raises(ValueError, match="set `num_prompts`"):
        _config(tmp_path, per_device_train_batch_size=4)
    with pytest.raises(ValueError, match="set `num_prompts`"):
        _config(tmp_path, gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match="`epsilon` must be in"):
        _config(tmp_path, epsilon=1.5)
    with pytest.raises(ValueError, match="`max_steps` must be > 0"):
        _config(tmp_path, max_steps=-1)


@pytest.mark.parametrize("recipe", ["gsm8k", "code", "summarization"])
def test_cli_parses_recipe_with_overrides(recipe, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "training"))
    import train

    path = ROOT / "training" / "recipes" / f"{recipe}.yaml"
    config = train.parse_config(["--config", str(path), "--max_steps", "2", "--learning_rate", "1e-3"])
    assert isinstance(config, DiversedConfig)
    assert config.max_steps == 2 and config.learning_rate == 1e-3
    assert config.task == {"gsm8k": "gsm8k", "code": "mbpp", "summarization": "cnndm"}[recipe]
    assert (config.warmup_steps, config.lr_scheduler_type, config.num_prompts) == (40, "cosine", 8)
    assert (config.num_iterations, config.epsilon) == (4, 0.2)
    assert (config.max_new_tokens, config.max_grad_norm) == (128, 5.0)
    assert "train" in sys.modules


def test_cli_refuses_a_bad_setting_in_one_line(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "training"))
    import train

    recipe = str(ROOT / "training" / "recipes" / "gsm8k.yaml")
    assert train.main(["--config", recipe, "--per_device_train_batch_size", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "set `num_prompts`" in err and "Traceback" not in err
    assert train.main(["--config", recipe, "--save_steps", "6"]) == 2
    assert "multiple of steps_per_generation x num_iterations = 4" in capsys.readouterr().err
    assert train.main(["--config", recipe, "--ddp_backend", "gloo"]) == 2
    assert "drop it for a single process" in capsys.readouterr().err
    config = train.parse_config(["--config", recipe, "--report_to", "tensorboard,wandb"])
    assert config.report_to == ["tensorboard", "wandb"]


@pytest.mark.parametrize("recipe_name", ["gsm8k-full", "mbpp-full", "cnndm-full", "gsm8k-lenience"])
def test_full_size_recipe_parses_and_validates(recipe_name, monkeypatch):
    """The paper-budget recipes: 800 rollouts, blocks of whole batches, exact resume, evaluation rows never trained on
    (and, for GSM8K, outside Table 1's test rows 0-149)."""
    require_data_dir()
    monkeypatch.syspath_prepend(str(ROOT / "training"))
    import train

    from hf_diversed.evaluation.tasks import get_task, parse_split

    config = train.parse_config(["--config", str(ROOT / "training" / "recipes" / f"{recipe_name}.yaml")])
    batches = config.max_steps // config.num_iterations
    assert batches * config.num_prompts * config.num_generations == 800 and config.num_iterations == 4
    assert config.save_steps % config.updates_per_generation == 0
    assert config.eval_steps % config.updates_per_generation == 0  # evaluations share the next block's sampler call
    assert config.eval_on_start and config.eval_strategy == "steps"
    assert config.steps_per_generation * config.num_prompts <= config.rollout_batch_size
    train_split, train_rows = parse_split(config.train_split)
    eval_split, eval_rows = parse_split(config.eval_split)
    size = len(get_task(config.task).load(eval_split))
    eval_ids = set(range(size)[eval_rows])
    assert len(eval_ids) == config.num_eval_prompts
    if train_split == eval_split:
        assert not eval_ids & set(range(size)[train_rows])
    if config.task == "gsm8k":
        assert config.max_train_prompts == 400 and min(eval_ids) >= 150


def test_budget_recipe_continues_the_cascade_start_head_on_prompts_it_has_not_seen(monkeypatch):
    """gsm8k-budget.yaml, the larger-budget remedy: it starts from the shipped cascade-start head (trained on the
    first 400 training rows) and draws 1,600 rollouts, one each from training rows it never saw, in blocks that fill
    the sampler's 128 rows, saving and evaluating at block boundaries (exact resume) on gsm8k-full's held-out rows."""
    require_data_dir()
    monkeypatch.syspath_prepend(str(ROOT / "training"))
    import train

    from hf_diversed.evaluation.tasks import get_task, parse_split

    config = train.parse_config(["--config", str(ROOT / "training" / "recipes" / "gsm8k-budget.yaml")])
    start = train.parse_config(["--config", str(ROOT / "training" / "recipes" / "gsm8k-full.yaml")])
    assert (ROOT / config.init_head / "model.safetensors").is_file()
    split, rows = parse_split(config.train_split)
    size = len(get_task(config.task).load(split))
    trained_before = set(range(size)[: start.max_train_prompts])
    new = set(range(size)[rows])
    batches = config.max_steps // config.num_iterations
    assert len(new) == batches * config.num_prompts * config.num_generations == 1600 and not new & trained_before
    assert config.steps_per_generation * config.num_prompts == config.rollout_batch_size == 128
    assert config.save_steps % config.updates_per_generation == 0 == config.eval_steps % config.updates_per_generation
    assert (config.eval_split, config.num_eval_prompts) == (start.eval_split, start.num_eval_prompts)


_DISTRIBUTED_SCRIPT = """
import os, sys
import datasets, torch
sys.path.insert(0, {tests!r})
from conftest import build_tiny, prompts
from hf_diversed.trainer import DiversedConfig, DiversedTrainer

torch.set_num_threads(1)
target, draft = build_tiny("llama", 64, 2, 0), build_tiny("llama", 32, 1, 3)
data = datasets.Dataset.from_list([{{"input_ids": ids[0].tolist()}} for ids in prompts(8)])
config = DiversedConfig(task="gsm8k", num_prompts=4, max_new_tokens=8, num_assistant_tokens=4, learning_rate=2e-2,
    warmup_steps=0, max_steps=8, acceptance_coef=1.0, output_dir={out!r}, use_cpu=True,
    ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
    save_strategy="no", disable_tqdm=True)
trainer = DiversedTrainer(target, draft, config, train_dataset=data,
                          reward_funcs=[lambda p, c, **k: [float(len(x)) for x in c]])
trainer.train()
trainer.save_model()
world, rank = trainer.accelerator.num_processes, trainer.accelerator.process_index
head = trainer.accelerator.unwrap_model(trainer.model)
torch.save(head.state_dict(), {out!r} + f"/world{{world}}-rank{{rank}}.pt")
torch.save(trainer.ref_head.state_dict(), {out!r} + f"/world{{world}}-init.pt")
"""


def test_two_processes_take_the_same_updates_as_one(tmp_path):
    """The same global batch (4 prompts) on one process and split over two (accelerate, gloo on CPU): every rank
    ends with the one-process head (up to float rounding of the all-reduce)."""
    import subprocess

    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "run.py"
    script.write_text(_DISTRIBUTED_SCRIPT.format(tests=str(ROOT / "tests"), out=str(out)))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "HF_DIVERSED_TEST_DEVICE": "cpu",
        "PYTHONPATH": str(ROOT),
    }  # this checkout, whatever the editable install points at
    launch = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--multi_gpu"]
    for cmd in ([*launch, "--num_processes", "2", str(script)], [sys.executable, str(script)]):
        result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
    one, rank0, rank1 = (torch.load(out / f"{name}.pt") for name in ("world1-rank0", "world2-rank0", "world2-rank1"))
    assert _same(rank0, rank1)
    assert not _same(one, torch.load(out / "world1-init.pt"))  # the updates moved the head
    for name, value in one.items():
        torch.testing.assert_close(rank0[name], value, atol=1e-5, rtol=1e-4)
    assert (out / "model.safetensors").is_file()


def test_push_to_hub_uploads_the_head_and_its_card(pair, tmp_path, monkeypatch):
    """``push_to_hub`` is the Trainer's: the repository is created at start, and the head's folder (weights, config,
    the generated card, the custom_generate recipe) is uploaded; checkpoints are not. The Hub API is patched."""
    import huggingface_hub

    created, uploads = [], []

    def create_repo(self, repo_id, **kwargs):
        created.append(repo_id)
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, *, repo_id, folder_path, ignore_patterns=None, run_as_future=False, **kwargs):
        from concurrent.futures import Future

        from huggingface_hub.utils import filter_repo_objects

        root = Path(folder_path)
        files = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]
        kept = sorted(filter_repo_objects(files, ignore_patterns=ignore_patterns))
        uploads.append((repo_id, {f: (root / f).read_bytes() for f in kept}))
        info = huggingface_hub.CommitInfo(
            commit_url=f"https://huggingface.co/{repo_id}/commit/0", commit_message="", commit_description="",
            oid="0" * 40,
        )  # fmt: skip
        if not run_as_future:  # the Trainer pushes checkpoints in the background
            return info
        future = Future()
        future.set_result(info)
        return future

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    config = _config(tmp_path, max_steps=8, save_steps=8, push_to_hub=True, hub_model_id="org/diversed-head-tiny",
                     num_eval_prompts=3)  # fmt: skip
    trainer = _trainer(pair, config, eval_dataset=_dataset(3, seed=5))
    assert created == ["org/diversed-head-tiny"]
    trainer.train()
    trainer.push_to_hub()
    repo, files = uploads[-1]
    assert repo == "org/diversed-head-tiny"
    assert {"config.json", "model.safetensors", "README.md", "custom_generate/generate.py"} <= set(files)
    assert not any(f.startswith("checkpoint-") for f in files)
    card = files["README.md"].decode()
    assert "org/diversed-head-tiny" in card and "| trained |" in card and "## Training" in card
    recipe = files["custom_generate/generate.py"].decode()
    assert 'HEAD_REPO_ID = "org/diversed-head-tiny"' in recipe
    pushed = DiversedHead.from_pretrained(tmp_path / "out")
    assert _same(_params(pushed), _params(_head(trainer)))


def test_curve_table_command_reads_a_committed_run(capsys):
    """`python training/curve_table.py RUN`: every held-out evaluation and the training batches' block means of the
    MBPP head's committed log, as its write-up states them (pass@1 0.415 over steps 1-25, 0.409 over all 100)."""
    sys.path.insert(0, str(ROOT / "training"))
    import curve_table

    run = ROOT / "docs/training/mbpp-full/opt0.1-lambda-0.01"
    assert curve_table.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "| 0 | 0.344 | 88.5% | 0.50 | 5.37 | 0.0% |" in out and "| 100 | 0.344 | 87.8% | 0.34 |" in out
    assert "| 1–25 | 200 | 0.415 ± 0.034 | 87.2% | 0.42 | 0.0% |" in out
    assert "| 1–100 (all) | 800 | 0.409 ± 0.019 | 87.7% | 0.34 | 0.5% |" in out
    history = load_history(run / "log_history.jsonl")
    assert curve_table.block_table(history, 50, 8)[-2].startswith("| 51–100 | 400 | 0.385 ± ")
    with pytest.raises(ValueError, match="positive number of steps"):
        curve_table.block_table(history, 0)
    with pytest.raises(SystemExit):
        curve_table.main([str(ROOT / "docs")])
    assert "log_history.jsonl does not exist" in capsys.readouterr().err


def test_compare_heads_command_pairs_two_methods_on_committed_table1_rows(capsys):
    """`python training/compare_heads.py RECORDS FIRST SECOND`: the cascade-start GSM8K head against its cascade and
    against the static-start head on Table 1's 150 rows, as docs/training/gsm8k-full states them."""
    sys.path.insert(0, str(ROOT / "training"))
    import compare_heads

    records, head = str(ROOT / "docs/table1/gsm8k"), "docs/training/gsm8k-full/opt0.1-lambda-0.01"
    assert compare_heads.main([records, head, "cascade-opt:0.1"]) == 0
    out = capsys.readouterr().out
    assert "paired over 150 rows: quality -0.7 [-5.3, +4.0] points, acceptance -0.3 [-0.8, +0.2] points" in out
    assert f"| diversed@{head} | 150 | 38.7 | 85.4% | 0.582 [" in out
    assert compare_heads.main([records, head, "docs/training/gsm8k-full/lambda-0.01"]) == 0
    assert "quality +6.7 [-2.0, +15.3] points, acceptance +2.8 [+1.6, +3.9] points" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        compare_heads.main([records, head, "static:0.42"])
    assert "share no Table 1 row" in capsys.readouterr().err


def test_runs_logged_per_update_and_per_batch_overlay_on_rollout_batches(tmp_path, capsys):
    """A run logged per update (4 updates per rollout batch) is drawn per batch: its first line of each batch, its
    evaluations at the batch they follow; a run logged per batch is unchanged. The overlay command draws both."""
    per_update = [{"step": 0, "split": "eval", "reward": 0.5, "acceptance_rate": 0.8, "mean_w": 0.5}]
    per_update += [{"step": s, "split": "train", "reward": float(s), "acceptance_rate": 0.8, "mean_w": 0.5,
                    "rollout_batch": float((s - 1) // 4)} for s in range(1, 17)]  # fmt: skip
    per_update += [{"step": 8, "split": "eval", "reward": 0.25, "acceptance_rate": 0.9, "mean_w": 0.4}]
    lines = by_rollout_batch(per_update)
    assert [(h["step"], h["reward"]) for h in lines if h["split"] == "train"] == [(1, 1.0), (2, 5.0), (3, 9.0),
                                                                                  (4, 13.0)]  # fmt: skip
    assert [(h["step"], h["reward"]) for h in lines if h["split"] == "eval"] == [(0, 0.5), (2, 0.25)]
    per_batch = [{**h, "step": i + 1} for i, h in enumerate(h for h in lines if h["split"] == "train")]
    assert by_rollout_batch(per_batch) == per_batch
    # The trainer's order: blocks of 2 batches trained 4 times (0, 1, 0, 1, ...), the last block cut by max_steps.
    order = [0, 1] * 4 + [2, 3] * 4 + [4, 5] * 2
    interleaved = [{"step": s, "split": "train", "reward": float(b), "rollout_batch": float(b)}
                   for s, b in enumerate(order, start=1)]  # fmt: skip
    interleaved += [{"step": u, "split": "eval", "reward": 0.0} for u in (0, 8, 16, 20)]
    lines = by_rollout_batch(interleaved)
    assert [(h["step"], h["reward"]) for h in lines if h["split"] == "train"] == [(b + 1, float(b)) for b in range(6)]
    assert [h["step"] for h in lines if h["split"] == "eval"] == [0, 2, 4, 6]

    sys.path.insert(0, str(ROOT / "training"))
    import overlay_curves

    runs = []
    for name, history in (("a", per_update), ("b", per_batch)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "log_history.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
        runs.append(str(tmp_path / name))
    assert overlay_curves.main([*runs, "--labels", "per update,per batch", "--output", str(tmp_path / "o.png")]) == 0
    assert (tmp_path / "o.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit):
        overlay_curves.main([*runs, "--labels", "one", "--output", str(tmp_path / "o.png")])
    assert "give one label per run" in capsys.readouterr().err
