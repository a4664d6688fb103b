"""The speed model's cost measurements (``hf_diversed.evaluation.bench.costs``) on tiny models: what they time."""

from __future__ import annotations

import time

import pytest
import torch
from conftest import build_pair, prompts
from transformers import CompileConfig

from hf_diversed.evaluation.bench.costs import measure_compiled_costs, round_seconds_at_full_acceptance

PREFILL_SECONDS = 1.0


@pytest.fixture(scope="module")
def pair():
    target, draft = build_pair("llama")
    for model in (target, draft):  # no EOS: every call runs its full length, so the rounds are known
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
    return target, draft


def _slow_prefill(model, seconds: float):
    """A forward pre-hook that sleeps on every call of more than 4 tokens: the prompt's forward (the prompt has 6),
    not the steps (1 token) nor the verifications (N + 1 = 3)."""

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] > 4:
            time.sleep(seconds)

    return model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_round_at_full_acceptance_leaves_the_prefill_out(pair, static):
    """The round's seconds are a marginal, (T(k) − T(k/2)) / (its rounds − theirs): a prefill that takes a second
    adds nothing to them (timed as a whole call over its rounds it would add 1 s / 8 rounds)."""
    target, draft = pair
    extra = {"cache_implementation": "static", "disable_compile": True} if static else {}
    ids = prompts(1, length=6)[0]
    handle = _slow_prefill(target, PREFILL_SECONDS)
    try:
        seconds = round_seconds_at_full_acceptance(target, draft, ids, 2, 24, repeats=1, **extra)
    finally:
        handle.remove()
    assert 0 < seconds < PREFILL_SECONDS / 8 / 2, seconds


@pytest.mark.slow
def test_compiled_costs_are_timed_on_the_cache_length_asked_for(pair, monkeypatch):
    """``measure_compiled_costs(cache_len=L)`` times the static loop's forwards on caches of L positions (a step
    attends over a window of its static cache that the length caps), and transformers' compiled target alone on a
    cache of L too."""
    from transformers import StaticCache

    target, draft = pair
    lengths = []
    real_init = StaticCache.__init__

    def recording_init(self, *args, **kwargs):
        lengths.append(kwargs.get("max_cache_len"))
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(StaticCache, "__init__", recording_init)
    torch._dynamo.reset()
    config = CompileConfig(mode="default", fullgraph=True, dynamic=False)
    costs = measure_compiled_costs(target, draft, prompts(1, length=6)[0], 2, config, repeats=1, cache_len=96)
    assert costs["c"] > 0 and costs["v"]["2"] > 0
    assert lengths and all(length >= 96 for length in lengths), lengths
