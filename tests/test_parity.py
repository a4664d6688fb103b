"""Parity with transformers' own assisted generation, token for token (same seed, same RNG stream).

- exact SD (``diversed_verifier="exact"``) and a fresh head with init_weight=1 vs native assisted generation;
- static ensemble and a fresh head with init_weight=w vs ``assistant_ensemble_weight=w``;
- with sampling warpers (temperature, top-k, top-p) the two differ by design: hf_diversed's drafter applies them
  once, transformers' twice; the draft's q is checked against the once-warped distribution instead.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import EOS, build_pair, prompts
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hf_diversed import DiversedHead
from hf_diversed.generation import decoding


@pytest.fixture(scope="module")
def pair():
    return build_pair("llama")


def _generate(target, draft, ids, num_tokens, do_sample, seed=123, **kwargs):
    draft.generation_config.num_assistant_tokens = num_tokens
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    torch.manual_seed(seed)
    out = target.generate(ids, assistant_model=draft, max_new_tokens=24, do_sample=do_sample, **kwargs)
    return out.sequences if hasattr(out, "sequences") else out


CASES = [(None, "exact"), (0.3, "static:0.3"), (0.5, "static:0.5"), (0.8, "static:0.8")]


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sample"])
@pytest.mark.parametrize("num_tokens", [2, 5])
@pytest.mark.parametrize("weight, rule", CASES, ids=[c[1] for c in CASES])
def test_rules_match_native(pair, do_sample, num_tokens, weight, rule):
    target, draft = pair
    head = DiversedHead.for_models(target, draft, init_weight=1.0 if weight is None else weight)
    for ids in prompts(3, seed=num_tokens):
        native = _generate(target, draft, ids, num_tokens, do_sample, assistant_ensemble_weight=weight)
        ours = _generate(target, draft, ids, num_tokens, do_sample, diversed_verifier=rule)
        with_head = _generate(target, draft, ids, num_tokens, do_sample, diversed_head=head)
        assert torch.equal(native, ours), f"{rule} differs from transformers"
        assert torch.equal(native, with_head), f"fresh head (w={weight}) differs from transformers"
        assert native.shape[1] > ids.shape[1]


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sample"])
def test_parity_with_repetition_penalty(pair, do_sample):
    """Processors that are not sampling warpers apply to p and q exactly as in transformers: token parity.

    With sampling at T=1, top-k 0, top-p 1 there is no warper, so applying them once (hf_diversed) or twice
    (transformers' drafter) is the same draft distribution.
    """
    target, draft = pair
    options = dict(repetition_penalty=1.3, **(dict(temperature=1.0, top_k=0, top_p=1.0) if do_sample else {}))
    for ids in prompts(2, seed=7):
        native = _generate(target, draft, ids, 4, do_sample, assistant_ensemble_weight=0.5, **options)
        ours = _generate(target, draft, ids, 4, do_sample, diversed_verifier="static:0.5", **options)
        assert torch.equal(native, ours)


def _processors(repetition_penalty=None, temperature=1.0, top_k=0, top_p=1.0) -> LogitsProcessorList:
    """transformers' processors for these options, in generate's order (public classes only)."""
    processors = LogitsProcessorList()
    if repetition_penalty is not None:
        processors.append(RepetitionPenaltyLogitsProcessor(repetition_penalty))
    if temperature != 1.0:
        processors.append(TemperatureLogitsWarper(temperature))
    if top_k:
        processors.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p))
    return processors


def test_draft_samples_with_warpers_applied_once(pair, monkeypatch):
    """With temperature / top-k / top-p, the q of hf_diversed's loop is softmax(processors(draft logits)), the
    target's processors applied once (transformers' own drafter applies the warpers twice).

    Every candidate block's logits are recorded and compared with the processors applied to the draft's logits
    from a plain forward over the drafted sequence. ``pad_token_id=EOS``: otherwise the draft's generate masks
    drafted pad tokens out of its later context (transformers' behaviour), which a plain forward does not.
    """
    target, draft = pair
    options = dict(repetition_penalty=1.2, temperature=0.7, top_k=20, top_p=0.9)
    once = _processors(**options)
    twice = LogitsProcessorList([*once, *once[1:]])  # what transformers' drafter applies
    blocks = []

    class Recording(decoding.DiversedCandidateGenerator):
        def get_candidates(self, input_ids, **kwargs):
            candidate_ids, candidate_logits = super().get_candidates(input_ids, **kwargs)
            if candidate_logits is not None:
                blocks.append((input_ids.shape[1], candidate_ids.clone(), candidate_logits.clone()))
            return candidate_ids, candidate_logits

    monkeypatch.setattr(decoding, "DiversedCandidateGenerator", Recording)
    for ids in prompts(3, seed=7):
        _generate(target, draft, ids, 4, True, diversed_verifier="static:0.5", pad_token_id=EOS, **options)
    assert sum(block[2].shape[1] for block in blocks) >= 40
    differs_from_twice = False
    for cur_len, candidate_ids, candidate_logits in blocks:
        with torch.no_grad():
            raw = draft(candidate_ids).logits.float()
        for i in range(candidate_logits.shape[1]):
            prefix, logits = candidate_ids[:, : cur_len + i], raw[:, cur_len + i - 1]
            expected = once(prefix, logits.clone()).log_softmax(-1)
            actual = candidate_logits[:, i].float().log_softmax(-1)
            support = torch.isfinite(expected)
            assert torch.equal(torch.isfinite(actual), support), (cur_len, i)
            torch.testing.assert_close(actual[support], expected[support], atol=1e-4, rtol=0)
            doubled = twice(prefix, logits.clone()).log_softmax(-1)
            if (
                not torch.equal(torch.isfinite(doubled), support)
                or (doubled[support] - expected[support]).abs().max() > 0.1
            ):
                differs_from_twice = True
    assert differs_from_twice, "once and twice coincide here: the test would not tell them apart"


def test_first_drafted_token_follows_once_tempered_draft(pair):
    """Statistically: the first drafted token's law at temperature 0.5 is softmax(draft logits / 0.5).

    ``diversed_verifier="static:0"`` (w = 0) accepts every draft, so the first new token of a call with
    ``num_assistant_tokens=2, max_new_tokens=2`` is the draft's first token x ~ q. Over M = 1000 seeded calls the
    frequencies of the three buckets {top-1 token, top-2 token, the rest} (under q) must each be within
    t = sqrt(ln(2 * 3 / 1e-4) / (2 M)) = 0.074 of q's: by Hoeffding's inequality and a union bound the chance of a
    false failure is <= 1e-4. The warpers applied twice (T acts as T^2 = 0.25) move some bucket by more than 2t
    (checked), so a sampler at T^2 fails with probability >= 1 - 1e-4.
    """
    target, draft = pair
    ids = prompts(1, seed=0)[0]
    num = 1000
    with torch.no_grad():
        logits = draft(ids).logits[0, -1].float()
    top = (logits / 0.5).softmax(-1).topk(2).indices

    def buckets(probs):
        return torch.stack([probs[top[0]], probs[top[1]], 1 - probs[top].sum()])

    law, law_twice = buckets((logits / 0.5).softmax(-1)), buckets((logits / 0.25).softmax(-1))
    tolerance = math.sqrt(math.log(2 * 3 / 1e-4) / (2 * num))
    assert (law_twice - law).abs().max() > 2 * tolerance
    draft.generation_config.num_assistant_tokens = 2
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    torch.manual_seed(0)
    first = []
    for _ in range(num):
        out = target.generate(
            ids,
            assistant_model=draft,
            diversed_verifier="static:0",
            max_new_tokens=2,
            do_sample=True,
            temperature=0.5,
            top_k=0,
            pad_token_id=EOS,
        )
        first.append(int(out[0, ids.shape[1]]))
    counts = torch.bincount(torch.tensor(first, device=logits.device), minlength=logits.shape[-1]).double() / num
    freq = buckets(counts)
    assert (freq - law.double()).abs().max() <= tolerance, (freq, law, law_twice)


def test_without_diversed_arguments_generate_is_upstream(pair):
    target, draft = pair
    ids = prompts(1)[0]
    torch.manual_seed(0)
    a = target.generate(ids, max_new_tokens=10, do_sample=True)
    from hf_diversed.generation import _compat

    torch.manual_seed(0)
    b = _compat.original_generate(target, ids, max_new_tokens=10, do_sample=True)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="diversed_hed"):
        target.generate(ids, max_new_tokens=4, diversed_hed="x")  # misspelled kwargs still raise upstream
