"""The batched sampler draws sequences with exactly the law of ``generate`` under every rule.

- Greedy, float32: tokens and statistics identical to the real loop, every rule, N in {1, 3, 5} and the
  heuristic schedule, inside a mixed batch (rows leave and join) and at batch size 1.
- Sampling, tiny vocabulary: the joint law of the first three tokens, the accepted counts per round and the
  bonus positions match the real loop's empirical laws (two-sample chi-square homogeneity tests), for exact,
  static, a non-constant head, a head that also reads the next-token laws, lossy and a cascade; a sampler with a
  deliberate mistake fails the same tests.
- Per verified position, acceptance averages 1 - w * TV(p, q).

False failures. Each law comparison is a chi-square test at level ALPHA = 2e-6 (cells with fewer than 25
observations in both samples together are pooled, so the chi-square approximation holds); this file makes
18 of them (3 in the default run: the head with distribution features; all with RUN_SLOW=1, with the deliberate
mistakes that fail at the same sample size), so the chance that a correct sampler fails any is <= 18 * 2e-6 =
3.6e-5 < 1e-4. The acceptance check
is a martingale-difference mean in [-1, 1], bounded by Azuma-Hoeffding: P(|mean| > eps) <= 2 exp(-n eps^2 / 2),
with eps chosen for 1e-6.
"""

from __future__ import annotations

import copy
import math
from collections import Counter

import pytest
import torch
from conftest import build_pair, prompts
from laws import LAW_CONFIG, PROMPT
from laws import chi2_pvalue as _chi2_pvalue
from laws import outcomes as _outcomes
from laws import random_head as _random_head
from laws import tiny_law_model as _tiny

from hf_diversed import DiversedHead, TokenClassEnsemble
from hf_diversed.generation.batched import SamplerConfig, SampleRequest, _Sampler, sample_batched
from hf_diversed.generation.verification import parse_rule

ALPHA = 2e-6
RULES = [
    "exact", "static:0.5", "lossy:0.7", "cascade-opt:0.1", "cascade-chow:0.3", "cascade-diff:0.1", "diversed",
    TokenClassEnsemble(frozenset(range(3, 40)), 0.2),
]  # fmt: skip


def _featured_head(target, draft, scale: float = 0.5, seed: int = 0) -> DiversedHead:
    """A head that also reads max p, max q and TV(p, q), with weights on them large enough to move w."""
    head = DiversedHead.for_models(target, draft, init_weight=0.5, use_distribution_features=True)
    torch.manual_seed(seed)
    with torch.no_grad():
        head.out.weight.normal_(0.0, scale)
        head.out.weight[0, -3:] = torch.tensor([4.0, -4.0, 3.0])
    return head


def _generate(target, draft, ids, config: SamplerConfig, rule: str, head):
    kwargs = dict(diversed_head=head) if rule == "diversed" else dict(diversed_verifier=rule)
    out = target.generate(
        ids, assistant_model=draft, return_dict_in_generate=True, **config.generate_kwargs(), **kwargs
    )
    return out.sequences[0, ids.shape[1] :], out.diversed_stats


@pytest.fixture(scope="module")
def pair():
    target, draft = build_pair("llama")
    for model in (target, draft):
        model.generation_config.pad_token_id = model.generation_config.eos_token_id
    return target, draft, _random_head(target, draft)


def _assert_same(real_tokens, real_stats, result, what: str) -> None:
    assert torch.equal(real_tokens.cpu(), result.completion_ids), f"{what}: tokens differ"
    assert real_stats.accepted_per_round == result.stats.accepted_per_round, f"{what}: accepted per round differ"
    for name in ("num_drafted", "num_accepted", "num_rounds", "num_verified"):
        assert getattr(real_stats, name) == getattr(result.stats, name), f"{what}: {name} differs"
    for name in ("weight_sum", "tv_sum"):  # sums of per-position floats from differently shaped forwards
        assert getattr(real_stats, name) == pytest.approx(getattr(result.stats, name), abs=1e-4), what


@pytest.mark.parametrize("batch_size", [5, 1], ids=["mixed-batch", "batch-1"])
@pytest.mark.parametrize("num_tokens, schedule", [(1, "constant"), (3, "constant"), (5, "constant"), (2, "heuristic")])
def test_greedy_equals_real_loop(pair, num_tokens, schedule, batch_size):
    target, draft, head = pair
    config = SamplerConfig(
        max_new_tokens=20, do_sample=False, num_assistant_tokens=num_tokens,
        num_assistant_tokens_schedule=schedule, repetition_penalty=1.3 if num_tokens == 3 else 1.0,
    )  # fmt: skip
    ids = prompts(3, seed=num_tokens)
    requests = [
        SampleRequest(p, rule, head=head if rule == "diversed" else None, tag=(i, rule))
        for i, p in enumerate(ids)
        for rule in RULES
    ]
    # 24 rows through 5 slots: rows finish, leave and are replaced mid-run, prompts of different lengths mix.
    results = list(sample_batched(target, draft, requests, config, batch_size=batch_size))
    assert sorted(r.index for r in results) == list(range(len(requests)))
    for result in results:
        i, rule = result.tag
        tokens, stats = _generate(target, draft, ids[i], config, rule, head)
        _assert_same(tokens, stats, result, f"prompt {i}, {rule}, N={num_tokens} {schedule}")


def test_draft_on_another_device_than_the_target(pair):
    """As generate allows, the draft may sit on another device (here the CPU, the target on the test device):
    the sampler moves each model's inputs and outputs, and draws what generate draws with that split."""
    target, draft, head = pair
    cpu_draft = copy.deepcopy(draft).cpu()
    config = SamplerConfig(max_new_tokens=16, do_sample=False, num_assistant_tokens=3)
    ids = prompts(2, seed=11)
    requests = [
        SampleRequest(p, r, head=head if r == "diversed" else None, tag=(i, r))
        for i, p in enumerate(ids)
        for r in RULES
    ]
    for result in sample_batched(target, cpu_draft, requests, config, batch_size=4):
        i, rule = result.tag
        tokens, stats = _generate(target, cpu_draft, ids[i], config, rule, head)
        _assert_same(tokens, stats, result, f"prompt {i}, {rule}, draft on the CPU")


def test_a_head_reading_the_next_token_laws(pair):
    """A head with ``use_distribution_features`` (max p, max q, TV at each position): the sampler emits what
    generate emits, and the trace's features give back, through the head, the very w the walk used (what the
    trainer recomputes)."""
    from hf_diversed.modeling.modeling_diversed_head import position_weights
    from hf_diversed.trainer.rollout import collect_rollout

    target, draft, _ = pair
    head = _featured_head(target, draft)
    config = SamplerConfig(max_new_tokens=16, do_sample=False, num_assistant_tokens=3)
    ids = prompts(3, seed=21)
    requests = [SampleRequest(p, "diversed", head=head, tag=i) for i, p in enumerate(ids)]
    for result in sample_batched(target, draft, requests, config, batch_size=2):
        tokens, stats = _generate(target, draft, ids[result.tag], config, "diversed", head)
        _assert_same(tokens, stats, result, f"prompt {result.tag}, featured head")
    sampled = SamplerConfig(max_new_tokens=16, do_sample=True, num_assistant_tokens=3)
    requests = [SampleRequest(p, "diversed", head=head, seed=i) for i, p in enumerate(ids)]
    for result in sample_batched(target, draft, requests, sampled, batch_size=3, return_trace=True):
        t = result.trace
        features = t.distribution_features()
        assert float(t.w.std()) > 0.01  # w moves with the features
        torch.testing.assert_close(position_weights(head, t.h_draft, t.h_target, features), t.w, atol=1e-5, rtol=0)
    torch.manual_seed(0)
    rollout = collect_rollout(target, draft, head, ids[0], max_new_tokens=16, temperature=1.0, num_assistant_tokens=3)
    torch.testing.assert_close(
        position_weights(head, rollout.trace.h_draft, rollout.trace.h_target, rollout.trace.distribution_features()),
        rollout.trace.w, atol=1e-5, rtol=0,
    )  # fmt: skip


@pytest.mark.parametrize("spec", ["cascade-opt:0.1", "cascade-chow:0.9", "cascade-diff:0.01"])
def test_a_head_set_to_a_cascade_decodes_as_the_cascade(pair, spec):
    """``DiversedHead.from_cascade``: sharp enough, the head's w is the cascade's deferral delta in {0, 1} at every
    position, so DIVERSED with it draws, greedy and sampled, exactly what the cascade rule draws (same seeds)."""
    target, draft, _ = pair
    cascade = parse_rule(spec)
    head = DiversedHead.from_cascade(target, draft, cascade.rule, cascade.alpha, sharpness=1e5)
    ids = prompts(4, seed=31)
    for do_sample in (False, True):
        config = SamplerConfig(max_new_tokens=16, do_sample=do_sample, num_assistant_tokens=3)
        requests = [SampleRequest(p, rule, head=head if rule == "diversed" else None, seed=i, tag=(i, str(rule)))
                    for i, p in enumerate(ids) for rule in ("diversed", cascade)]  # fmt: skip
        results = {r.tag: r for r in sample_batched(target, draft, requests, config, batch_size=8, return_trace=True)}
        weights = []
        for i in range(len(ids)):
            as_head, as_rule = results[(i, "diversed")], results[(i, str(cascade))]
            assert torch.equal(as_head.completion_ids, as_rule.completion_ids), f"{spec}, prompt {i}, {do_sample=}"
            torch.testing.assert_close(as_head.trace.w, as_rule.trace.w, atol=0, rtol=0)
            weights.append(as_rule.trace.w)
        assert 0.05 < float(torch.cat(weights).mean()) < 0.95, "both deferral and trust should occur"


def test_greedy_equals_real_loop_at_batch_size_one_with_eos(pair):
    """Sequences that end on EOS (the walk finishes the round so the statistics count what generate verified)."""
    target, draft, head = pair
    eos_seen = 0
    for seed in range(6):
        ids = prompts(1, seed=100 + seed)[0]
        with torch.no_grad():  # an EOS that the target emits early: its most likely third token
            probe = target.generate(ids, max_new_tokens=3, do_sample=False)
        eos = int(probe[0, -1])
        config = SamplerConfig(max_new_tokens=12, do_sample=False, num_assistant_tokens=4, eos_token_id=eos)
        for rule in ("exact", "static:0.3", "diversed"):
            request = SampleRequest(ids, rule, head=head if rule == "diversed" else None)
            (result,) = sample_batched(target, draft, [request], config, batch_size=1)
            tokens, stats = _generate(target, draft, ids, config, rule, head)
            _assert_same(tokens, stats, result, f"seed {seed}, {rule}")
            eos_seen += result.finish_reason == "eos"
    assert eos_seen >= 6


# ------------------------------------------------------------------------------------------------ laws


@pytest.fixture(scope="module")
def tiny_pair():
    target, draft = _tiny(0), _tiny(1)  # unrelated weights: TV(p, q) is large, mistakes show
    return target, draft, _random_head(target, draft, scale=1.0, seed=1)


N_REAL, N_SAMPLER = 1500, 12000


def _rule_and_head(tiny_pair, rule: str):
    """``"diversed+features"``: the DIVERSED rule with a head that reads the next-token laws too."""
    target, draft, head = tiny_pair
    if rule == "diversed+features":
        return "diversed", _featured_head(target, draft, scale=1.0, seed=2)
    return rule, head


def _real_laws(tiny_pair, rule: str) -> dict[str, Counter]:
    target, draft, _ = tiny_pair
    rule, head = _rule_and_head(tiny_pair, rule)
    laws = {"tokens": Counter(), "accepted": Counter(), "bonus": Counter()}
    torch.manual_seed(1234)
    for _ in range(N_REAL):
        tokens, stats = _generate(target, draft, PROMPT, LAW_CONFIG, rule, head)
        for key, value in _outcomes(tokens.tolist(), stats.accepted_per_round).items():
            laws[key][value] += 1
    return laws


def _sampler_laws(tiny_pair, rule: str, sampler_class=_Sampler) -> dict[str, Counter]:
    target, draft, _ = tiny_pair
    rule, head = _rule_and_head(tiny_pair, rule)
    requests = [
        SampleRequest(PROMPT, rule, head=head if rule == "diversed" else None, seed=s) for s in range(N_SAMPLER)
    ]
    sampler = sampler_class(target, draft, LAW_CONFIG, batch_size=2048, return_trace=False)
    laws = {"tokens": Counter(), "accepted": Counter(), "bonus": Counter()}
    for result in sampler.run(requests):
        for key, value in _outcomes(result.completion_ids.tolist(), result.stats.accepted_per_round).items():
            laws[key][value] += 1
    return laws


_REAL_CACHE: dict[str, dict[str, Counter]] = {}


def _real(tiny_pair, rule):
    if rule not in _REAL_CACHE:
        _REAL_CACHE[rule] = _real_laws(tiny_pair, rule)
    return _REAL_CACHE[rule]


@pytest.mark.parametrize(
    "rule",
    # one rule in the default run (the head with distribution features: the widest path), every rule with RUN_SLOW=1
    [*(pytest.param(r, marks=pytest.mark.slow) for r in ("exact", "static:0.5", "diversed")), "diversed+features",
     *(pytest.param(r, marks=pytest.mark.slow) for r in ("lossy:0.7", "cascade-opt:0.3"))],
)  # fmt: skip
def test_sampled_laws_match_real_loop(tiny_pair, rule):
    real, ours = _real(tiny_pair, rule), _sampler_laws(tiny_pair, rule)
    for what in ("tokens", "accepted", "bonus"):
        p_value = _chi2_pvalue(real[what], ours[what])
        assert p_value > ALPHA, f"{rule}: law of {what} differs from generate's (p = {p_value:.2e})"


class _BonusFromQ(_Sampler):
    """Deliberate mistake: the bonus token drawn from q instead of p."""

    def _bonus(self, p, q, z_p, u):
        return super()._bonus(q, p, z_p, u)


class _RoundNotReset(_Sampler):
    """Deliberate mistake: the round counter is not reset when a round ends."""

    def _start_round(self, row):
        k = row.k
        super()._start_round(row)
        row.k = k


@pytest.mark.slow
@pytest.mark.parametrize("mistake", [_BonusFromQ, _RoundNotReset], ids=["bonus-from-q", "round-not-reset"])
def test_a_faulty_sampler_fails_the_law_tests(tiny_pair, mistake):
    real, wrong = _real(tiny_pair, "static:0.5"), _sampler_laws(tiny_pair, "static:0.5", mistake)
    p_values = {what: _chi2_pvalue(real[what], wrong[what]) for what in ("tokens", "accepted", "bonus")}
    assert min(p_values.values()) < ALPHA, p_values


def test_acceptance_is_one_minus_w_tv_per_position(tiny_pair):
    target, draft, head = tiny_pair
    config = SamplerConfig(max_new_tokens=12, do_sample=True, num_assistant_tokens=3)
    for rule in ("static:0.3", "diversed"):
        requests = [SampleRequest(PROMPT, rule, head=head if rule == "diversed" else None, seed=s) for s in range(4000)]
        diffs = []
        for result in sample_batched(target, draft, requests, config, batch_size=1024, return_trace=True):
            t = result.trace
            diffs.append(t.accepted.double() - (1.0 - t.w.double() * t.tv.double()))
        d = torch.cat(diffs)
        eps = math.sqrt(2 * math.log(2 / 1e-6) / d.numel())
        assert abs(float(d.mean())) < eps, (rule, float(d.mean()), eps, d.numel())
        if rule == "diversed":
            assert float(torch.cat([r for r in diffs]).numel()) > 10000


@pytest.mark.slow
@pytest.mark.real_weights
def test_real_pair_greedy_equals_generate():
    """On the real pair in float32 (a GSM8K prompt, three rules sharing one prefill, the bundled GSM8K head), the
    sampler's greedy tokens and counts are generate's. Needs the real pair (`hf-diversed models`)."""
    pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_diversed.evaluation.demo import demo_row
    from hf_diversed.evaluation.real_models import ensure_pair
    from hf_diversed.evaluation.tasks import get_task
    from hf_diversed.modeling.hub import load_head
    from hf_diversed.modeling.pretrained import HEADS_DIR, head_for_task

    target_path, draft_path = ensure_pair()
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_path, dtype=torch.float32).eval()
    draft.generation_config.assistant_confidence_threshold = 0.0
    head = load_head(HEADS_DIR / head_for_task("gsm8k").split("/", 1)[1])  # the bundled head, from disk
    task = get_task("gsm8k")
    messages = task.build_messages(demo_row("gsm8k", 0))  # GSM8K test row 0, shipped with the package
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = ids["input_ids"]
    config = SamplerConfig(max_new_tokens=24, do_sample=False, num_assistant_tokens=5)
    rules = ["exact", "static:0.5", "diversed"]
    requests = [SampleRequest(ids, rule, head=head if rule == "diversed" else None, tag=rule) for rule in rules]
    for result in sample_batched(target, draft, requests, config, batch_size=3):
        tokens, stats = _generate(target, draft, ids, config, result.tag, head)
        _assert_same(tokens, stats, result, f"real pair, {result.tag}")


def test_the_caller_keeps_its_grad_mode_between_results(pair):
    """The sampler decodes without autograd, but a caller that trains between results (or leaves the iterator
    unfinished) does so in its own grad mode."""
    target, draft, _ = pair
    config = SamplerConfig(max_new_tokens=4, do_sample=False, num_assistant_tokens=2)
    results = sample_batched(target, draft, [SampleRequest(p, "exact") for p in prompts(2, seed=3)], config,
                             batch_size=1)  # fmt: skip
    next(results)
    assert torch.is_grad_enabled()
    with torch.no_grad():
        next(results)
        assert not torch.is_grad_enabled()
    assert torch.is_grad_enabled()
