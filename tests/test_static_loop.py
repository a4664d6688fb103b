"""``generate(..., cache_implementation="static")``: the speculative loop on static caches, compiled, same law.

- Greedy, float32: tokens and statistics identical to the dynamic-cache loop for every rule (the head included),
  N in {1, 3, 5}, prompts of several lengths, an EOS mid-round and ``max_new_tokens`` mid-round; eager and
  compiled (Dynamo-traced forwards, and once the inductor). Seeded sampling with warpers: the same tokens too.
- A loop with a deliberate mistake (the draft's cache not rolled back, or the target's logits read one position
  late) breaks that identity.
- Sampling: the first three tokens, the accepted counts per round and the bonus positions follow the dynamic
  loop's laws (two-sample chi-square tests against the batched sampler's draws, which ``test_batched`` ties to
  generate's). Level ALPHA = 2e-6 per comparison, 5 rules x 3 comparisons here (the head's 3 in the default run,
  all with RUN_SLOW=1): a correct loop fails any with probability <= 15 * 2e-6 = 3e-5. The mistake above fails
  them at the same sample size (N_STATIC draws against N_SAMPLER), so the head's run keeps that power.
- After a fully accepted round the draft's first step feeds two tokens: N draft forwards a round, not N + 1.
- Compiled steps are not recompiled after warm-up: across rounds, prompts of other lengths and calls with fewer
  new tokens (the cache is reused when it is large enough).
- Attention reads a window of each cache that grows with the sequence (4·2^k positions here): the same tokens and
  statistics, at most three graphs per window, none again once entered; a window short of the round breaks them.
- What the static loop cannot run is refused in one line naming the fix.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch._dynamo
from conftest import DEVICE, EOS, build_pair, build_tiny, prompts
from laws import LAW_CONFIG, PROMPT, chi2_pvalue, outcomes, random_head, tiny_law_model
from transformers import CompileConfig

from hf_diversed import TokenClassEnsemble, compile_windows
from hf_diversed.generation import _compat, static_loop
from hf_diversed.generation.batched import SampleRequest, sample_batched

ALPHA = 2e-6
RULES = [
    "exact", "static:0.5", "static:0", "lossy:0.7", "cascade-opt:0.1", "cascade-chow:0.3", "diversed",
    TokenClassEnsemble(frozenset(range(3, 40)), 0.2),
]  # fmt: skip


@pytest.fixture(scope="module")
def pair():
    target, draft = build_pair("llama")
    for model in (target, draft):
        model.generation_config.pad_token_id = model.generation_config.eos_token_id
    return target, draft, random_head(target, draft).to(DEVICE)


def _generate(pair, ids, rule, num_tokens, static, **kwargs):
    target, draft, head = pair
    chosen = dict(diversed_head=head) if rule == "diversed" else dict(diversed_verifier=rule)
    if static:
        kwargs["cache_implementation"] = "static"
    out = target.generate(
        ids,
        assistant_model=draft,
        num_assistant_tokens=num_tokens,
        num_assistant_tokens_schedule="constant",
        return_dict_in_generate=True,
        pad_token_id=EOS,
        **chosen,
        **kwargs,
    )
    return out.sequences, out.diversed_stats


def _assert_same(expected, actual, what: str) -> None:
    (tokens_a, stats_a), (tokens_b, stats_b) = expected, actual
    assert torch.equal(tokens_a, tokens_b), f"{what}: tokens differ\n{tokens_a}\n{tokens_b}"
    assert stats_a.accepted_per_round == stats_b.accepted_per_round, f"{what}: accepted per round differ"
    for name in ("num_drafted", "num_accepted", "num_rounds", "num_verified"):
        assert getattr(stats_a, name) == getattr(stats_b, name), f"{what}: {name} differs"
    for name in ("weight_sum", "tv_sum"):  # sums of per-position floats from differently shaped forwards
        assert getattr(stats_a, name) == pytest.approx(getattr(stats_b, name), abs=1e-4), what


def _eos_mid_round(pair, ids, rule, num_tokens) -> int:
    """A token the dynamic loop emits mid-round, used as EOS so that the sequence ends inside a round."""
    tokens, stats = _generate(pair, ids, rule, num_tokens, static=False, do_sample=False, max_new_tokens=20)
    new = tokens[0, ids.shape[1] :].tolist()
    ends, total = set(), 0
    for accepted in stats.accepted_per_round:
        total += accepted + 1
        ends.add(total - 1)
    inside = [i for i in range(2, len(new)) if i not in ends and new[i] not in new[:i]]
    return new[inside[0]] if inside else new[-1]


@pytest.mark.parametrize("num_tokens", [1, 3, 5])
@pytest.mark.parametrize("rule", RULES, ids=str)
def test_greedy_equals_dynamic_loop(pair, rule, num_tokens):
    for i, ids in enumerate(prompts(3, seed=num_tokens)):
        for kwargs in (
            dict(max_new_tokens=19),
            dict(max_new_tokens=20, eos_token_id=_eos_mid_round(pair, ids, rule, num_tokens)),
        ):
            expected = _generate(pair, ids, rule, num_tokens, static=False, do_sample=False, **kwargs)
            actual = _generate(pair, ids, rule, num_tokens, static=True, do_sample=False, **kwargs)
            _assert_same(expected, actual, f"{rule}, N={num_tokens}, prompt {i}, {kwargs}")


@pytest.mark.parametrize("rule", RULES, ids=str)
def test_seeded_sampling_draws_the_dynamic_loops_tokens(pair, rule):
    """Both loops draw the same random numbers in the same order (a multinomial per drafted token, then the rule's
    uniforms and its resample), so with one seed they emit the same tokens, sampling warpers included. (Not where
    the draft proposes an EOS that is rejected: the dynamic loop's draft stops at it, this one drafts on.)"""
    warpers = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=30)
    for i, ids in enumerate(prompts(3, seed=1)):
        torch.manual_seed(i)
        expected = _generate(pair, ids, rule, 3, static=False, **warpers)
        torch.manual_seed(i)
        actual = _generate(pair, ids, rule, 3, static=True, **warpers)
        _assert_same(expected, actual, f"sampled, {rule}, prompt {i}")


@pytest.mark.parametrize("rule", ["exact", "static:0.5", "diversed", "cascade-opt:0.1"])
def test_greedy_compiled_equals_dynamic_loop(pair, rule):
    """Dynamo traces the fixed-shape steps (backend "eager": the graphs without the inductor's code generation)."""
    torch._dynamo.reset()  # compiled entries of other tests' models count towards Dynamo's recompile limit
    config = CompileConfig(backend="eager", mode=None, fullgraph=True, dynamic=False)
    for i, ids in enumerate(prompts(2, seed=7)):
        expected = _generate(pair, ids, rule, 3, static=False, do_sample=False, max_new_tokens=24)
        actual = _generate(pair, ids, rule, 3, static=True, do_sample=False, max_new_tokens=24, compile_config=config)
        _assert_same(expected, actual, f"compiled, {rule}, prompt {i}")


def test_a_fully_accepted_round_costs_the_draft_no_extra_step(pair):
    """At full acceptance (static:0) the draft's cache lacks the round's last draft x_N; the next round's first
    step feeds [x_N, last] at once, so every round runs N_r draft forwards (the tau model's count), not N_r + 1."""
    target, draft, _ = pair
    widths = []
    handle = draft.register_forward_pre_hook(lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]),
                                             with_kwargs=True)  # fmt: skip
    try:
        ids = prompts(1, length=6, seed=2)[0]
        tokens, stats = _generate(pair, ids, "static:0", 3, static=True, do_sample=False, max_new_tokens=24)
    finally:
        handle.remove()
    assert EOS not in tokens[0, ids.shape[1] :].tolist() and stats.num_accepted == stats.num_drafted
    assert widths[0] == ids.shape[1] - 1, widths  # the prefill
    assert len(widths) - 1 == stats.num_drafted == 3 * stats.num_rounds, (widths, stats.num_rounds)
    assert widths[1:].count(2) == stats.num_rounds - 1 and set(widths[1:]) == {1, 2}, widths


@pytest.mark.parametrize("mistake", ["draft-cache-not-rolled-back", "target-logits-one-late"])
def test_a_faulty_loop_breaks_greedy_identity(pair, monkeypatch, mistake):
    target, draft, _ = pair
    _break(monkeypatch, draft, mistake)
    differs = False
    for ids in prompts(3, seed=5):
        expected = _generate(pair, ids, "static:0.5", 3, static=False, do_sample=False, max_new_tokens=24)
        try:
            actual = _generate(pair, ids, "static:0.5", 3, static=True, do_sample=False, max_new_tokens=24)
        except IndexError:  # the stale entries overflow the cache
            differs = True
        else:
            differs |= not torch.equal(expected[0], actual[0])
    assert differs


def _break(monkeypatch, draft, mistake: str) -> None:
    """Deliberate mistakes: the draft's cache keeps rejected drafts, or the target's logits are read one position
    late (p_{t+1} used to verify x_t)."""
    if mistake == "draft-cache-not-rolled-back":
        original = static_loop._Stepper.rewind

        def rewind(self, length):
            if self.model is not draft:
                original(self, length)

        monkeypatch.setattr(static_loop._Stepper, "rewind", rewind)
    else:
        original_call = static_loop._Stepper.__call__

        def call(self, input_ids, eager):
            logits, hidden = original_call(self, input_ids, eager)
            return (logits if self.model is draft else logits.roll(-1, dims=1)), hidden

        monkeypatch.setattr(static_loop._Stepper, "__call__", call)


# ------------------------------------------------------------------------------------- attention windows


def _small_windows(monkeypatch) -> list[int]:
    """Windows of 4·2^k positions (so that tiny generations cross several); returns the windows set, in order."""
    monkeypatch.setattr(_compat, "WINDOW_MIN", 4)
    seen, original = [], _compat.set_static_window

    def record(cache, length):
        window = original(cache, length)
        seen.append(window)
        return window

    monkeypatch.setattr(_compat, "set_static_window", record)
    return seen


@pytest.mark.parametrize("rule", ["exact", "static:0.5", "diversed", "cascade-opt:0.1"])
def test_windows_grow_with_the_sequence_and_keep_its_tokens(pair, monkeypatch, rule):
    """Attention over windows of 4, 8, 16, 32, ... positions (eager, then Dynamo-traced) emits the dynamic loop's
    tokens and statistics, the windows covering each round as the sequence grows."""
    seen = _small_windows(monkeypatch)
    torch._dynamo.reset()
    config = CompileConfig(backend="eager", mode=None, fullgraph=True, dynamic=False)
    for i, ids in enumerate(prompts(2, seed=0)):
        for num_tokens, extra in ((1, {}), (3, {}), (3, dict(compile_config=config))):
            expected = _generate(pair, ids, rule, num_tokens, static=False, do_sample=False, max_new_tokens=30)
            del seen[:]
            actual = _generate(pair, ids, rule, num_tokens, static=True, do_sample=False, max_new_tokens=30, **extra)
            _assert_same(expected, actual, f"windows, {rule}, N={num_tokens}, prompt {i}, {extra}")
            assert len(set(seen)) >= 3, seen  # e.g. 8, 16, 32, then the cache's length


def test_a_window_short_of_the_round_breaks_greedy_identity(pair, monkeypatch):
    """A window that leaves out the round's last position (attention misses the newest keys) changes the tokens."""
    _small_windows(monkeypatch)
    original = static_loop._Stepper.reach
    monkeypatch.setattr(static_loop._Stepper, "reach", lambda self, length: original(self, length - 1))
    monkeypatch.setattr(
        _compat, "static_window", lambda length, max_cache_len, smallest=None: min(length, max_cache_len)
    )
    differs = False
    for ids in prompts(3, seed=5):
        expected = _generate(pair, ids, "static:0.5", 3, static=False, do_sample=False, max_new_tokens=24)
        actual = _generate(pair, ids, "static:0.5", 3, static=True, do_sample=False, max_new_tokens=24)
        differs |= not torch.equal(expected[0], actual[0])
    assert differs


def test_each_window_compiles_once(pair, monkeypatch):
    """Every (window, step shape) is one graph, compiled when a call first runs it and reused after: over calls with
    prompts of other lengths, rules and numbers of new tokens, at most 3 graphs (the draft's one- and two-token
    steps, the verification) per window entered, not one per round or per call."""
    seen = _small_windows(monkeypatch)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    config = CompileConfig(backend="eager", mode=None, fullgraph=True, dynamic=False)
    calls = [
        (ids, rule, new)
        for ids in prompts(3, length=4, seed=9)
        for rule, new in (("exact", 36), ("cascade-opt:0.1", 17))
    ]
    rounds = 0
    for i, (ids, rule, new) in enumerate([(prompts(1, length=5, seed=3)[0], "static:0.5", 40), *calls]):
        expected = _generate(pair, ids, rule, 3, static=False, do_sample=False, max_new_tokens=new)
        actual = _generate(pair, ids, rule, 3, static=True, do_sample=False, max_new_tokens=new, compile_config=config)
        _assert_same(expected, actual, f"windows compiled, call {i}, {rule}, {new} tokens")
        rounds += actual[1].num_rounds
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert len(set(seen)) >= 3 and rounds > 4 * len(set(seen)), (seen, rounds)
    assert 2 <= graphs <= 3 * len(set(seen)), (graphs, sorted(set(seen)))


def test_windows_compiled_ahead_leave_nothing_to_compile(monkeypatch):
    """``hf_diversed.compile_windows`` compiles every window's steps up front: generations of several lengths on
    those caches then compile nothing (the head's variants too)."""
    seen = _small_windows(monkeypatch)
    target, draft = build_pair("llama")  # new models: nothing has run on them yet (no output hooks installed)
    for model in (target, draft):
        model.generation_config.pad_token_id = model.generation_config.eos_token_id
    head = random_head(target, draft).to(DEVICE)
    pair = (target, draft, head)
    torch._dynamo.reset()
    config = CompileConfig(backend="eager", mode=None, fullgraph=True, dynamic=False)
    for with_head in (head, None):
        windows = compile_windows(
            target, draft, max_cache_len=48, num_assistant_tokens=3, compile_config=config, diversed_head=with_head
        )
        assert windows == [8, 16, 32, 48 + 3 + 1], windows
    del seen[:]
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i, ids in enumerate(prompts(2, length=5, seed=0)):
            for rule, new in (("static:0.5", 40), ("diversed", 30)):
                expected = _generate(pair, ids, rule, 3, static=False, do_sample=False, max_new_tokens=new)
                actual = _generate(
                    pair, ids, rule, 3, static=True, do_sample=False, max_new_tokens=new, compile_config=config,
                    max_cache_len=48,
                )  # fmt: skip
                _assert_same(expected, actual, f"compiled ahead, prompt {i}, {rule}")
    assert len(set(seen)) >= 3, seen


# ------------------------------------------------------------------------------------------------ laws

N_STATIC, N_SAMPLER = 1500, 12000
LAW_RULES = ["exact", "static:0.5", "diversed", "lossy:0.7", "cascade-opt:0.3"]


@pytest.fixture(scope="module")
def tiny_pair():
    target, draft = tiny_law_model(0), tiny_law_model(1)  # unrelated weights: TV(p, q) is large, mistakes show
    return target, draft, random_head(target, draft, scale=1.0, seed=1)


def _static_laws(tiny_pair, rule: str) -> dict[str, Counter]:
    target, draft, head = tiny_pair
    chosen = dict(diversed_head=head) if rule == "diversed" else dict(diversed_verifier=rule)
    laws = {"tokens": Counter(), "accepted": Counter(), "bonus": Counter()}
    torch.manual_seed(4321)
    for _ in range(N_STATIC):
        out = target.generate(
            PROMPT,
            assistant_model=draft,
            cache_implementation="static",
            return_dict_in_generate=True,
            **LAW_CONFIG.generate_kwargs(),
            **chosen,
        )
        tokens = out.sequences[0, PROMPT.shape[1] :].tolist()
        for key, value in outcomes(tokens, out.diversed_stats.accepted_per_round).items():
            laws[key][value] += 1
    return laws


def _sampler_laws(tiny_pair, rule: str) -> dict[str, Counter]:
    target, draft, head = tiny_pair
    requests = [
        SampleRequest(PROMPT, rule, head=head if rule == "diversed" else None, seed=s) for s in range(N_SAMPLER)
    ]
    laws = {"tokens": Counter(), "accepted": Counter(), "bonus": Counter()}
    for result in sample_batched(target, draft, requests, LAW_CONFIG, batch_size=2048):
        for key, value in outcomes(result.completion_ids.tolist(), result.stats.accepted_per_round).items():
            laws[key][value] += 1
    return laws


@pytest.mark.parametrize(
    "rule",
    # the head in the default run (the loop's mechanics do not depend on the rule), every rule with RUN_SLOW=1
    [rule if rule == "diversed" else pytest.param(rule, marks=pytest.mark.slow) for rule in LAW_RULES],
)
def test_sampled_laws_match_dynamic_loop(tiny_pair, rule):
    ours, reference = _static_laws(tiny_pair, rule), _sampler_laws(tiny_pair, rule)
    for what in ("tokens", "accepted", "bonus"):
        p_value = chi2_pvalue(reference[what], ours[what])
        assert p_value > ALPHA, f"{rule}: law of {what} differs from generate's (p = {p_value:.2e})"


@pytest.mark.slow
def test_a_faulty_loop_fails_the_law_tests(tiny_pair, monkeypatch):
    _break(monkeypatch, tiny_pair[1], "target-logits-one-late")
    wrong, reference = _static_laws(tiny_pair, "static:0.5"), _sampler_laws(tiny_pair, "static:0.5")
    p_values = {what: chi2_pvalue(reference[what], wrong[what]) for what in ("tokens", "accepted", "bonus")}
    assert min(p_values.values()) < ALPHA, p_values


# ------------------------------------------------------------------------------------------ compilation


@pytest.mark.slow
def test_inductor_compiled_loop_needs_no_recompile_after_warm_up(pair):
    """The first call compiles the draft's one-token step and the target's N + 1 verification (the inductor, as a
    user compiles on a CPU); later calls with other prompts, rules and fewer new tokens reuse both graphs."""
    target, draft, head = pair
    config = CompileConfig(mode="default", fullgraph=True, dynamic=False)
    torch._dynamo.reset()
    first = prompts(1, seed=2)[0]
    expected = _generate(pair, first, "static:0.5", 4, static=False, do_sample=False, max_new_tokens=32)
    warm = _generate(
        pair, first, "static:0.5", 4, static=True, do_sample=False, max_new_tokens=32, compile_config=config
    )
    _assert_same(expected, warm, "inductor, warm-up call")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i, ids in enumerate(prompts(3, length=4, seed=9)):
            for rule, new in (("exact", 30), ("cascade-opt:0.1", 17), ("static:0.5", 8)):
                expected = _generate(pair, ids, rule, 4, static=False, do_sample=False, max_new_tokens=new)
                actual = _generate(
                    pair, ids, rule, 4, static=True, do_sample=False, max_new_tokens=new, compile_config=config
                )
                _assert_same(expected, actual, f"inductor, prompt {i}, {rule}, {new} tokens")


# ------------------------------------------------------------------------------------------------ errors


def test_refusals_name_the_fix(pair):
    target, draft, _ = pair
    ids = prompts(1)[0]
    base = dict(assistant_model=draft, diversed_verifier="static:0.5", cache_implementation="static", max_new_tokens=4)
    cases = [
        (dict(repetition_penalty=1.3), "RepetitionPenaltyLogitsProcessor .logits processors. need the generated text"),
        (dict(num_assistant_tokens_schedule="heuristic"), 'num_assistant_tokens_schedule="constant"'),
        (dict(return_dict_in_generate=True, output_scores=True), "output_scores are not recorded"),
        (dict(attention_mask=torch.ones_like(ids).index_fill_(1, torch.tensor([0], device=ids.device), 0)), "padding"),
    ]
    for extra, message in cases:
        with pytest.raises(ValueError, match=message):
            target.generate(ids, **{**base, **extra})
    with pytest.raises(ValueError, match="omit it"):
        target.generate(ids, **{**base, "cache_implementation": "sliding_window"})
    gemma_target, gemma_draft = build_tiny("gemma3", 64, 2, seed=0), build_tiny("gemma3", 64, 2, seed=1)
    with pytest.raises(ValueError, match="sliding-window layers.*Omit cache_implementation"):
        gemma_target.generate(ids, **{**base, "assistant_model": gemma_draft})
