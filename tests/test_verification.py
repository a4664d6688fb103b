"""Verification rules: the output law each rule states, in closed form and by seeded Monte-Carlo.

Monte-Carlo tolerances use the Bretagnolle-Huber-Carol bound P(TV(emp, law) >= eps) <= 2^V exp(-2 N eps^2):
V = 8, N = 200_000, eps = 0.007 gives <= 8e-7 odds of a false failure per check; acceptance rates use
Hoeffding, P(|rate - expected| >= 0.006) <= 2 exp(-2 N 0.006^2) ~ 1.1e-6. The seeds are fixed anyway.
"""

from __future__ import annotations

import math

import pytest
import torch

from hf_diversed import Diversed, ExactSD, LossySD, SpecCascade, StaticEnsemble, TokenClassEnsemble, parse_rule
from hf_diversed.generation.verification import (
    DiversedLossy,
    lenience_overlap,
    parse_token_class_rule,
    rule_for_head,
)
from hf_diversed.modeling.distances import total_variation

V, N, EPS, ACC_EPS = 8, 200_000, 0.007, 0.006

RULES = [
    ExactSD(),
    StaticEnsemble(0.3),
    StaticEnsemble(0.8),
    Diversed(),
    LossySD(0.5),
    DiversedLossy(),  # l_t = 0.35 from the "head"
    SpecCascade("chow", 0.4),
    SpecCascade("diff", 0.1),
    SpecCascade("opt", 0.5),
    TokenClassEnsemble(frozenset({0, 3}), 0.2),
    TokenClassEnsemble(frozenset({5}), 0.6),
]


def _dists(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, generator=g) * 1.5, torch.randn(V, generator=g) * 1.5  # target, draft logits


def _expected_law(rule, p, q, w):
    """The law each docstring states, written independently of the implementation."""
    if isinstance(rule, LossySD):
        lenience = w if isinstance(rule, DiversedLossy) else rule.lenience  # a lenience head's l_t is its output
        beta = torch.minimum(q, p / lenience).sum()
        res = (p - lenience * q).clamp_min(0)
        return torch.minimum(q, p / lenience) + (1 - beta) * res / res.sum()
    return w * p + (1 - w) * q  # every mixture rule: pi = w p + (1 - w) q


def _weight(rule, p, q):
    head_weight = torch.tensor([[0.35]])
    return rule.weights(p.view(1, 1, V), q.view(1, 1, V), head_weight).view(())


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.spec())
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_closed_form_law_matches_stated_law(rule, seed):
    zp, zq = _dists(seed)
    p, q = zp.softmax(-1), zq.softmax(-1)
    w = _weight(rule, p, q)
    law = rule.output_law(p.view(1, 1, V), q.view(1, 1, V), w.view(1, 1)).view(V)
    torch.testing.assert_close(law, _expected_law(rule, p, q, w), atol=1e-6, rtol=0)
    assert math.isclose(float(law.sum()), 1.0, abs_tol=1e-6)


@pytest.mark.parametrize("rule", [r for r in RULES if not isinstance(r, LossySD)], ids=lambda r: r.spec())
@pytest.mark.parametrize("seed", [0, 1])
def test_acceptance_is_one_minus_w_tv(rule, seed):
    zp, zq = _dists(seed)
    p, q = zp.softmax(-1), zq.softmax(-1)
    w = _weight(rule, p, q)
    accept = rule.acceptance_probability(p.view(1, 1, V), q.view(1, 1, V), w.view(1, 1)).view(())
    assert math.isclose(float(accept), float(1 - w * total_variation(p, q)), abs_tol=1e-6)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.spec())
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_verification_against_the_exact_target_is_the_rule(rule, seed):
    """Exact SD handed t = rule.exact_target(p, q, w) (what an engine that verifies exactly, vLLM, is given)
    accepts with the rule's ratio and resamples from the rule's residual, so it has the rule's law."""
    zp, zq = _dists(seed)
    p, q = zp.softmax(-1).view(1, 1, V), zq.softmax(-1).view(1, 1, V)
    w = _weight(rule, p.view(V), q.view(V)).view(1, 1)
    t = rule.exact_target(p, q, w)
    exact_ratio = (t / q).clamp(max=1.0)
    torch.testing.assert_close(exact_ratio, rule.acceptance_ratio(p, q, w.unsqueeze(-1)).clamp(max=1.0))
    if float(rule.acceptance_probability(p, q, w)) < 1.0 - 1e-6:  # else nothing is ever resampled (e.g. w = 0)
        exact_residual, residual = (t - q).clamp_min(0), rule.residual(p, q, w)
        torch.testing.assert_close(exact_residual / exact_residual.sum(), residual / residual.sum())


def _monte_carlo(rule, seed: int):
    """Run verify on N independent one-token drafts (the batch is the sample)."""
    zp, zq = _dists(seed)
    g = torch.Generator().manual_seed(1000 + seed)
    draft_logits = zq.expand(N, 1, V)
    target_logits = torch.stack([zp, torch.randn(V, generator=g)]).expand(N, 2, V)
    draft_tokens = torch.multinomial(zq.softmax(-1).expand(N, V), 1, generator=g)  # x ~ q, (N, 1)
    head_weight = torch.full((N, 1), 0.35)
    verdict = rule.verify(
        draft_tokens, draft_logits, target_logits, do_sample=True, head_weight=head_weight, generator=g
    )
    p, q = zp.softmax(-1), zq.softmax(-1)
    return verdict, p, q, _weight(rule, p, q)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.spec())
def test_monte_carlo_output_law(rule):
    verdict, p, q, w = _monte_carlo(rule, seed=3)
    first = verdict.tokens[:, 0]  # the accepted draft or the resampled token
    empirical = torch.bincount(first, minlength=V).double() / N
    law = _expected_law(rule, p, q, w).double()
    assert 0.5 * (empirical - law).abs().sum() < EPS
    expected_accept = float(rule.acceptance_probability(p.view(1, 1, V), q.view(1, 1, V), w.view(1, 1)))
    assert abs(float(verdict.num_accepted.double().mean()) - expected_accept) < ACC_EPS


def test_bonus_token_comes_from_p():
    """A fully accepted block (draft = target) is followed by a sample of p at the last row."""
    zq = torch.zeros(V)
    bonus_logits = torch.randn(V, generator=torch.Generator().manual_seed(4)) * 2
    target_logits = torch.stack([zq, bonus_logits]).expand(N, 2, V)
    g = torch.Generator().manual_seed(5)
    draft_tokens = torch.multinomial(zq.softmax(-1).expand(N, V), 1, generator=g)
    verdict = StaticEnsemble(0.5).verify(draft_tokens, zq.expand(N, 1, V), target_logits, do_sample=True, generator=g)
    assert bool((verdict.num_accepted == 1).all())  # p = q: always accepted
    empirical = torch.bincount(verdict.tokens[:, 1], minlength=V).double() / N
    assert 0.5 * (empirical - bonus_logits.softmax(-1).double()).abs().sum() < EPS


def test_residual_falls_back_to_p_when_empty():
    """If max(0, pi - q) is all zero (p = q on a rejected row) the resample comes from p."""
    p = torch.tensor([0.5, 0.5, 0.0, 0.0]).log()
    rule = ExactSD()
    law = rule.output_law(p.softmax(-1).view(1, 1, 4), p.softmax(-1).view(1, 1, 4), torch.ones(1, 1))
    torch.testing.assert_close(law.view(4), p.softmax(-1))


def test_greedy_verdicts():
    # position 0: p favours 2, q favours 3; position 1: both favour 5.
    p = torch.full((1, 3, V), -5.0)
    p[0, 0, 2], p[0, 0, 3], p[0, 1, 5], p[0, 2, 7] = 3.0, 2.9, 4.0, 4.0
    q = torch.full((1, 2, V), -5.0)
    q[0, 0, 3], q[0, 1, 5] = 4.0, 4.0
    draft = torch.tensor([[3, 5]])
    exact = ExactSD().verify(draft, q, p, do_sample=False)
    assert exact.num_accepted.tolist() == [0] and exact.tokens[0, 0].item() == 2  # correction argmax p
    mixed = StaticEnsemble(0.5).verify(draft, q, p, do_sample=False)  # argmax nu at pos 0 is 3
    assert mixed.num_accepted.tolist() == [2] and mixed.tokens[0, 2].item() == 7  # bonus argmax p
    lenient = LossySD(0.5).verify(draft, q, p, do_sample=False)  # p(3) >= 0.5 max p
    assert lenient.num_accepted.tolist() == [2]
    strict = LossySD(1.0).verify(draft, q, p, do_sample=False)
    assert strict.num_accepted.tolist() == [0] and strict.tokens[0, 0].item() == 2


def test_cascade_deferral_rules():
    p = torch.tensor([[[0.9, 0.1], [0.5, 0.5]]])
    q = torch.tensor([[[0.6, 0.4], [0.95, 0.05]]])
    assert SpecCascade("chow", 0.3).weights(p, q, None).tolist() == [[1.0, 0.0]]  # max q < 0.7
    assert SpecCascade("diff", 0.2).weights(p, q, None).tolist() == [[1.0, 0.0]]  # 0.6 < 0.9 - 0.2
    assert SpecCascade("opt", 0.5).weights(p, q, None).tolist() == [[1.0, 0.0]]  # 0.6 < 0.9 - 0.5 * 0.3


def test_static_ensemble_ratio_is_bitwise_transformers_expression():
    """The accept test compares against transformers' own float expression 1.0 - w + w * (p / q)."""
    g = torch.Generator().manual_seed(0)
    p_x, q_x = torch.rand(1000, generator=g), torch.rand(1000, generator=g) + 1e-3
    for w in (0.1, 0.3, 0.5, 0.8, 0.9):
        ours = StaticEnsemble(w).acceptance_ratio(p_x, q_x, torch.full_like(p_x, w))
        assert torch.equal(ours, 1.0 - w + w * (p_x / q_x))


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("exact", ExactSD()),
        ("diversed", Diversed()),
        ("diversed-lossy", DiversedLossy()),
        ("static:0.5", StaticEnsemble(0.5)),
        ("lossy:0.7", LossySD(0.7)),
        ("cascade-chow:0.2", SpecCascade("chow", 0.2)),
        ("cascade:0.2", SpecCascade("opt", 0.2)),
    ],
)
def test_parse_rule(spec, expected):
    assert parse_rule(spec) == expected
    assert parse_rule(expected.spec()) == expected


@pytest.mark.parametrize(
    "bad, message",
    [
        ("static:1.5", "must be in \\[0, 1\\]"),
        ("lossy:0", "lenience l must be in \\(0, 1\\]"),
        ("cascade-foo:0.1", "Unknown SpecCascade rule"),
        ("cascade-opt:-1", "alpha must be in"),
        ("typical", "Unknown verification rule"),
        ("static:abc", "non-numeric"),
        (3, "expects a rule name"),
    ],
)
def test_bad_rules_raise_with_fix(bad, message):
    with pytest.raises(ValueError, match=message):
        parse_rule(bad)


def test_a_head_runs_its_own_rule():
    """ "diversed" with a head means the head's rule: the mixture for a mixture head, lossy SD at l_t for a lenience
    head; "diversed-lossy" with a mixture head is refused; rules without a head are left alone."""
    mixture = Diversed()
    assert rule_for_head(mixture, "mixture") is mixture  # engines group equal rows by the rule object
    assert rule_for_head(mixture, "lenience") == DiversedLossy()
    assert rule_for_head(mixture, "lenience") is rule_for_head(Diversed(), "lenience")
    assert rule_for_head(DiversedLossy(), "lenience") == DiversedLossy()
    assert rule_for_head(StaticEnsemble(0.5), "lenience") == StaticEnsemble(0.5)
    with pytest.raises(ValueError, match="needs a lenience head"):
        rule_for_head(DiversedLossy(), "mixture")


def test_lenience_head_output_is_clamped_to_a_positive_lenience():
    """l_t = 0 would accept every token the target can emit with ratio p / 0: the head's output is floored."""
    p = q = torch.full((1, 2, V), 1.0 / V)
    w = DiversedLossy().weights(p, q, torch.tensor([[0.0, 1.5]]))
    assert float(w[0, 0]) > 0 and float(w[0, 1]) == 1.0
    with pytest.raises(ValueError, match="diversed_head"):
        DiversedLossy().weights(p, q, None)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lenience_overlap_is_the_accepted_mass_and_its_slope(seed):
    """S(l) = sum min(p, l q): lossy SD at l accepts with S / l, its residual has mass 1 - S, and dS/dl matches a
    finite difference (S is piecewise linear: a small step stays on one piece for these draws)."""
    zp, zq = _dists(seed)
    p, q = zp.softmax(-1), zq.softmax(-1)
    for lenience in (0.05, 0.35, 0.8, 1.0):
        l_t = torch.tensor(lenience)
        overlap, slope = lenience_overlap(p, q, l_t)
        accept = LossySD(lenience).acceptance_probability(p.view(1, 1, V), q.view(1, 1, V), torch.ones(1, 1))
        assert math.isclose(float(overlap / l_t), float(accept), abs_tol=1e-6)
        assert math.isclose(float(1 - overlap), float(LossySD(lenience).residual(p, q, l_t).sum()), abs_tol=1e-6)
        h = 1e-4
        below, _ = lenience_overlap(p, q, l_t - h)
        assert math.isclose(float(slope), float((overlap - below) / h), abs_tol=2e-3)
    at_one, _ = lenience_overlap(p, q, torch.tensor(1.0))
    assert math.isclose(float(at_one), float(1 - total_variation(p, q)), abs_tol=1e-6)


def test_token_class_weight_is_exact_where_a_class_token_is_likely():
    """w_t = 1 where argmax p_t or argmax q_t is in the class, the rule's w elsewhere."""
    rule = TokenClassEnsemble(frozenset({2, 5}), 0.25)
    p = torch.tensor([[0.1, 0.1, 0.6, 0.2, 0, 0, 0, 0], [0.7, 0.1, 0.1, 0.1, 0, 0, 0, 0], [0.9, 0, 0, 0, 0, 0.1, 0, 0]])
    q = torch.tensor([[0.9, 0.1, 0, 0, 0, 0, 0, 0], [0.1, 0.1, 0.1, 0.1, 0, 0.6, 0, 0], [0.9, 0, 0, 0, 0, 0.1, 0, 0]])
    p, q = p.unsqueeze(0), q.unsqueeze(0)  # (B=1, gamma=3, V=8): argmax p in the class, argmax q in it, neither
    assert rule.weights(p, q, None).tolist() == [[1.0, 1.0, 0.25]]
    assert rule.spec() == "token-class:ids:0.25"
    with pytest.raises(ValueError, match="non-empty"):
        TokenClassEnsemble(frozenset(), 0.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        TokenClassEnsemble(frozenset({1}), 1.5)


def test_token_class_from_a_tokenizer_and_as_a_generate_argument(llama_pair):
    from conftest import chat_tokenizer

    tokenizer = chat_tokenizer(["The answer is 42 and 7 apples cost 3.50 dollars, 100 in all."])
    rule = parse_rule("token-class:digits:0.1", tokenizer=tokenizer)
    assert isinstance(rule, TokenClassEnsemble) and rule.weight == 0.1 and rule.label == "digits"
    assert rule.token_ids == {i for i in range(len(tokenizer)) if any(c.isdigit() for c in tokenizer.decode([i]))}
    assert rule.spec() == "token-class:digits:0.1" and len(rule.token_ids) >= 10
    assert parse_rule("token-class:digits", tokenizer=tokenizer).weight == 0.0
    assert parse_token_class_rule("token-class:digits:0.1", tokenizer) == rule
    with pytest.raises(ValueError, match="Expected a token-class rule"):
        parse_token_class_rule("static:0.5", tokenizer)
    with pytest.raises(ValueError, match="tokenizer="):
        parse_rule("token-class:digits:0")
    with pytest.raises(ValueError, match="unknown token class"):
        parse_rule("token-class:vowels:0", tokenizer=tokenizer)
    with pytest.raises(ValueError, match="Unknown token class"):
        TokenClassEnsemble.from_tokenizer(tokenizer, "vowels")

    target, draft = llama_pair  # vocabulary 128: the chat tokenizer's first 128 ids stand in
    ids = torch.tensor([[5, 17, 42, 9]], device=target.device)
    small = TokenClassEnsemble(frozenset(i for i in rule.token_ids if i < 128) or frozenset({3}), 0.1)
    out = target.generate(
        ids, assistant_model=draft, diversed_verifier=small, max_new_tokens=12, do_sample=False,
        return_dict_in_generate=True,
    )  # fmt: skip
    assert out.sequences.shape[1] > ids.shape[1] and 0.1 <= out.diversed_stats.mean_weight <= 1.0
    with pytest.raises(ValueError, match="tokenizer="):
        target.generate(ids, assistant_model=draft, diversed_verifier="token-class:digits:0", max_new_tokens=4)
