"""A lenience head: a DIVERSED head whose output sets lossy SD's lenience l_t per position instead of the weight w_t.

- ``DiversedHeadConfig(verification="lenience")``: checked, saved and loaded; "diversed" with such a head runs
  :class:`DiversedLossy` in ``generate``, the static loop and the batched sampler, and a fresh one (l_t = init_weight
  everywhere) draws exactly what lossy SD at that l draws, token for token under the same seed.
- A head whose l_t varies: the batched sampler emits what ``generate`` emits, and the trace records the l_t it used
  with S_t(l_t) = sum_v min(p_t, l_t q_t) and its slope (what the trainer's law reads).
- The trainer's law of the emitted token equals the rule's closed form at l_old, its gradient in l there is the
  exact one, and the acceptance term lowers l; a run with the acceptance term alone lowers mean l and raises
  acceptance.
- What does not run a lenience head refuses it in one line: the standalone ``custom_generate``, the head diagnostics.

The law of a drafted position at l_t (closed form and Monte-Carlo) is in ``test_verification.py``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from conftest import build_pair, build_tiny, prompts

from hf_diversed import DiversedHead, DiversedHeadConfig
from hf_diversed.generation.batched import SamplerConfig, SampleRequest, sample_batched
from hf_diversed.generation.verification import DiversedLossy, lenience_overlap
from hf_diversed.modeling.modeling_diversed_head import position_weights
from hf_diversed.trainer import DiversedConfig, DiversedTrainer
from hf_diversed.trainer.objective import diversed_policy_loss, emitted_prob, lenience_prob, rejection_prob

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pair():
    target, draft = build_pair("llama")
    for model in (target, draft):
        model.generation_config.pad_token_id = model.generation_config.eos_token_id
    return target, draft


def _lenience_head(target, draft, init: float = 0.5, scale: float = 0.0, seed: int = 0) -> DiversedHead:
    """A lenience head: fresh (l_t = init everywhere) for ``scale`` 0, else with a random output layer."""
    head = DiversedHead.for_models(target, draft, init_weight=init, verification="lenience")
    torch.manual_seed(seed)
    with torch.no_grad():
        head.out.weight.normal_(0.0, scale)
    return head.eval()


def test_the_config_names_what_the_head_sets_and_keeps_it(pair, tmp_path):
    target, draft = pair
    head = _lenience_head(target, draft, init=0.2)
    head.save_pretrained(tmp_path)
    assert DiversedHead.from_pretrained(tmp_path).config.verification == "lenience"
    assert DiversedHeadConfig().verification == "mixture"  # the paper's head, and every head saved before
    with pytest.raises(ValueError, match="`verification` must be one of 'mixture', 'lenience'"):
        DiversedHeadConfig(verification="lossy")


def _generate(target, draft, ids, seed: int, **rule):
    torch.manual_seed(seed)
    out = target.generate(
        ids, assistant_model=draft, do_sample=True, max_new_tokens=24, num_assistant_tokens=4, top_k=0,
        return_dict_in_generate=True, **rule,
    )  # fmt: skip
    return out.sequences[0, ids.shape[1] :], out.diversed_stats


@pytest.mark.parametrize("static", [False, True], ids=["dynamic-cache", "static-cache"])
def test_a_fresh_lenience_head_is_lossy_sd_token_for_token(pair, static):
    target, draft = pair
    head = _lenience_head(target, draft, init=0.3)
    extra = {"cache_implementation": "static"} if static else {}
    for i, ids in enumerate(prompts(3, seed=4)):
        tokens, stats = _generate(target, draft, ids, seed=i, diversed_head=head, **extra)
        lossy, lossy_stats = _generate(target, draft, ids, seed=i, diversed_verifier="lossy:0.3", **extra)
        assert torch.equal(tokens, lossy)
        assert stats.accepted_per_round == lossy_stats.accepted_per_round
    config = SamplerConfig(max_new_tokens=24, do_sample=True, num_assistant_tokens=4)
    ids = prompts(4, seed=5)
    ours = sample_batched(target, draft, [SampleRequest(p, "diversed", head=head, seed=i) for i, p in enumerate(ids)],
                          config, batch_size=4)  # fmt: skip
    lossy = sample_batched(target, draft, [SampleRequest(p, "lossy:0.3", seed=i) for i, p in enumerate(ids)], config,
                           batch_size=4)  # fmt: skip
    for a, b in zip(ours, lossy, strict=True):
        assert torch.equal(a.completion_ids, b.completion_ids)


def test_a_varying_lenience_head_draws_in_the_sampler_what_generate_draws_and_traces_it(pair):
    target, draft = pair
    head = _lenience_head(target, draft, init=0.4, scale=0.5, seed=2)
    config = SamplerConfig(max_new_tokens=20, do_sample=False, num_assistant_tokens=3)
    ids = prompts(3, seed=6)
    for result in sample_batched(target, draft, [SampleRequest(p, "diversed", head=head, tag=i) for i, p in
                                                 enumerate(ids)], config, batch_size=2):  # fmt: skip
        out = target.generate(ids[result.tag], assistant_model=draft, diversed_head=head, return_dict_in_generate=True,
                              **config.generate_kwargs())  # fmt: skip
        assert torch.equal(out.sequences[0, ids[result.tag].shape[1] :].cpu(), result.completion_ids)
        assert out.diversed_stats.accepted_per_round == result.stats.accepted_per_round
    sampled = SamplerConfig(max_new_tokens=20, do_sample=True, num_assistant_tokens=3)
    requests = [SampleRequest(p, "diversed", head=head, seed=i) for i, p in enumerate(ids)]
    for result in sample_batched(target, draft, requests, sampled, batch_size=3, return_trace=True):
        t = result.trace
        assert float(t.w.std()) > 0.01  # l_t moves
        torch.testing.assert_close(position_weights(head, t.h_draft, t.h_target).clamp_min(1e-3), t.w, atol=1e-5,
                                   rtol=0)  # fmt: skip
        # S_t(l_t) / l_t is the acceptance probability at t, in (0, 1]; the slope is a probability mass
        # (float32 sums over the vocabulary: 1e-5 of rounding)
        assert ((t.overlap >= 0) & (t.overlap <= t.w + 1e-5)).all(), (t.overlap, t.w)
        assert ((t.overlap_slope >= 0) & (t.overlap_slope <= 1 + 1e-5)).all(), t.overlap_slope


def test_traces_of_generate_and_of_the_sampler_record_the_same_overlap(pair):
    from hf_diversed.trainer.rollout import collect_rollout, collect_rollouts

    target, draft = pair
    head = _lenience_head(target, draft, init=0.4, scale=0.5, seed=3)
    ids = prompts(1, seed=7)[0]
    real = collect_rollout(target, draft, head, ids, max_new_tokens=16, temperature=0, num_assistant_tokens=3)
    (batched,) = collect_rollouts(target, draft, head, [ids], max_new_tokens=16, temperature=0, num_assistant_tokens=3,
                                  seeds=[0])  # fmt: skip
    for name in ("w", "overlap", "overlap_slope"):
        torch.testing.assert_close(getattr(real.trace, name), getattr(batched.trace, name), atol=1e-5, rtol=0)


def _laws(seed: int, n: int = 5, vocab: int = 11):
    g = torch.Generator().manual_seed(seed)
    p = (torch.randn(n, vocab, generator=g) * 2).softmax(-1)
    q = (torch.randn(n, vocab, generator=g) * 2).softmax(-1)
    return p, q


@pytest.mark.parametrize("seed", [0, 1])
def test_the_trainers_law_is_lossy_sds_with_its_exact_gradient_at_the_drawing_head(seed):
    p, q = _laws(seed)
    l_old = torch.tensor([0.05, 0.2, 0.45, 0.8, 1.0])
    law = DiversedLossy().output_law(p[:, None], q[:, None], l_old[:, None])[:, 0]  # (n, V)
    overlap, slope = lenience_overlap(p, q, l_old)
    y = torch.arange(p.shape[-1])
    for token in y.tolist():
        prob = emitted_prob(l_old, l_old, p[:, token], q[:, token], (overlap, slope))
        torch.testing.assert_close(prob, law[:, token], atol=1e-6, rtol=0)
    # d/dl of the law at l_old: the tangent's autograd against a central difference of the exact law
    token = 3
    l_var = l_old[:4].clone().requires_grad_(True)  # l = 1 sits on S's kink at TV's support
    emitted_prob(l_var, l_old[:4], p[:4, token], q[:4, token], (overlap[:4], slope[:4])).sum().backward()
    h = 1e-4

    def exact(lenience):
        s, _ = lenience_overlap(p[:4].double(), q[:4].double(), lenience.double())
        return lenience_prob(lenience.double(), p[:4, token].double(), q[:4, token].double(), s)

    numeric = (exact(l_old[:4] + h) - exact(l_old[:4] - h)) / (2 * h)
    torch.testing.assert_close(l_var.grad.double(), numeric, atol=2e-3, rtol=2e-3)


def test_the_acceptance_term_lowers_the_lenience_and_raises_acceptance():
    p, q = _laws(2)
    l_old = torch.full((5,), 0.6)
    overlap, slope = lenience_overlap(p, q, l_old)
    lenience = l_old.clone().requires_grad_(True)
    loss, parts = diversed_policy_loss(
        lenience, l_old, p[:, 0], q[:, 0], torch.zeros(5), torch.zeros(5), clip_eps=0.2, acceptance_coef=1.0,
        lenience=(overlap, slope),
    )  # fmt: skip
    loss.backward()
    assert (lenience.grad > 0).all()  # descent lowers l
    lower = (lenience - 0.1 * lenience.grad).detach()
    accept = 1 - rejection_prob(l_old, l_old, None, (overlap, slope))
    accept_lower = 1 - rejection_prob(lower, lower, None, lenience_overlap(p, q, lower))
    assert (accept_lower > accept).all()
    assert parts["wtv"] == pytest.approx(float(rejection_prob(l_old, l_old, None, (overlap, slope)).mean()))


def test_training_a_lenience_head_with_the_acceptance_term_alone_lowers_l(tmp_path):
    import datasets

    target, draft = build_tiny("llama", hidden=64, layers=2, seed=0), build_tiny("llama", hidden=32, layers=1, seed=3)
    config = DiversedConfig(
        task="gsm8k", num_prompts=4, max_new_tokens=12, num_assistant_tokens=4, learning_rate=2e-2, warmup_steps=0,
        lr_scheduler_type="constant", max_steps=24, num_iterations=4, save_strategy="no", seed=0, disable_tqdm=True,
        output_dir=str(tmp_path / "out"), acceptance_coef=1.0, verification="lenience", init_weight=0.6,
        num_eval_prompts=6,
    )  # fmt: skip
    data = datasets.Dataset.from_list([{"input_ids": ids[0].tolist()} for ids in prompts(8, seed=0)])
    evals = datasets.Dataset.from_list([{"input_ids": ids[0].tolist()} for ids in prompts(6, seed=1)])
    trainer = DiversedTrainer(target, draft, config, train_dataset=data, eval_dataset=evals,
                              reward_funcs=[lambda prompts, completions, **kw: [1.0] * len(completions)])  # fmt: skip
    assert trainer.ref_head.config.verification == "lenience"
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert logs[-1]["mean_w"] < logs[0]["mean_w"]  # mean l
    trained, untrained = trainer.eval_metrics["trained"], trainer.eval_metrics["untrained"]
    assert untrained["mean_w"] == pytest.approx(0.6)
    assert trained["mean_w"] < untrained["mean_w"]
    assert trained["acceptance_rate"] > untrained["acceptance_rate"]
    trainer.save_model()  # the head, and a card that says what it sets; no standalone recipe, which runs mixtures only
    out = Path(config.output_dir)
    assert DiversedHead.from_pretrained(out).config.verification == "lenience"
    card = (out / "README.md").read_text()
    assert "lossy SD's lenience l_t" in card and "custom_generate=" not in card
    assert not (out / "custom_generate").exists()


def test_what_runs_only_mixture_heads_refuses_a_lenience_head_in_one_line(pair):
    from hf_diversed.trainer.analysis import head_diagnostics

    target, draft = pair
    head = _lenience_head(target, draft)
    with pytest.raises(ValueError, match="sets lossy SD's lenience"):
        head_diagnostics(head, [])
    spec = importlib.util.spec_from_file_location("cg_lenience", REPO / "hf_diversed/custom_generate/generate.py")
    cg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cg)
    with pytest.raises(ValueError, match="is a lenience head") as err:
        cg.EnsembleHead(head.config.to_dict(), head.state_dict())
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="needs a lenience head"):
        target.generate(prompts(1)[0], assistant_model=draft, diversed_head=DiversedHead.for_models(target, draft),
                        diversed_verifier="diversed-lossy", max_new_tokens=4)  # fmt: skip


def test_the_vllm_plugin_runs_a_lenience_heads_rule_and_model_runner_v2_refuses_it(pair):
    """A request names the head (and "diversed" or "diversed-lossy"); the plugin runs the head's rule, lossy SD at
    l_t through exact verification against t = p / l_t (Model Runner V1); Model Runner V2, whose kernels normalise
    the target law, refuses it in one line, as it refuses lossy SD."""
    from types import SimpleNamespace

    from hf_diversed.generation.verification import Diversed
    from hf_diversed.integrations.vllm import Request, RuleError, _mrv2, requested
    from hf_diversed.integrations.vllm.heads import head_rule

    target, draft = pair
    lenient, mixture = _lenience_head(target, draft), DiversedHead.for_models(target, draft)
    assert requested({"diversed_head": "org/h", "diversed_verifier": "diversed-lossy"}) == Request(
        "diversed-lossy", "org/h"
    )
    with pytest.raises(RuleError, match="needs an ensemble head"):
        requested({"diversed_verifier": "diversed-lossy"})
    assert head_rule(Diversed(), lenient) == DiversedLossy() and head_rule(Diversed(), mixture) == Diversed()
    with pytest.raises(RuleError, match="needs a lenience head"):
        head_rule(DiversedLossy(), mixture)
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(method="draft_model"), parallel_config=SimpleNamespace()
    )
    reason = _mrv2.refusal("diversed", head_rule(Diversed(), lenient), "org/h", config)
    assert reason is not None and "t = p / l" in reason and "\n" not in reason
    assert _mrv2.refusal("diversed", head_rule(Diversed(), mixture), "org/h", config) is None
