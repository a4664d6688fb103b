"""Parity with transformers' own assisted generation, token for token (same seed, same RNG stream).

- exact SD (``diversed_verifier="exact"``) and a fresh head with init_weight=1 vs native assisted generation;
- static ensemble and a fresh head with init_weight=w vs ``assistant_ensemble_weight=w``.
"""

from __future__ import annotations

import pytest
import torch
from conftest import build_pair, prompts

from hf_diversed import DiversedHead


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


def test_parity_with_logits_processors(pair):
    """Temperature / top-k / top-p are applied to p and q exactly as transformers applies them."""
    target, draft = pair
    warpers = dict(temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.2)
    for ids in prompts(2, seed=7):
        native = _generate(target, draft, ids, 4, True, assistant_ensemble_weight=0.5, **warpers)
        ours = _generate(target, draft, ids, 4, True, diversed_verifier="static:0.5", **warpers)
        assert torch.equal(native, ours)


def test_without_diversed_arguments_generate_is_upstream(pair):
    target, draft = pair
    ids = prompts(1)[0]
    torch.manual_seed(0)
    a = target.generate(ids, max_new_tokens=10, do_sample=True)
    from hf_diversed import _compat

    torch.manual_seed(0)
    b = _compat.original_generate(target, ids, max_new_tokens=10, do_sample=True)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="diversed_hed"):
        target.generate(ids, max_new_tokens=4, diversed_hed="x")  # misspelled kwargs still raise upstream
