"""The speed model's cost measurements (``hf_diversed.evaluation.bench.costs``) on tiny models: what they time.

No test here reads the wall clock: each hands the measurement a simulated clock (one that advances by a fixed cost
per forward, or by a second per reading) and asserts on the arithmetic."""

from __future__ import annotations

import pytest
import torch
from conftest import build_pair, prompts
from transformers import CompileConfig

from hf_diversed.evaluation.bench.costs import measure_compiled_costs, round_seconds_at_full_acceptance

PREFILL_SECONDS, VERIFY_SECONDS, DRAFT_STEP_SECONDS = 1000.0, 1.0, 1 / 64


@pytest.fixture(scope="module")
def pair():
    target, draft = build_pair("llama")
    for model in (target, draft):  # no EOS: every call runs its full length, so the rounds are known
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
    return target, draft


class ForwardClock:
    """A simulated clock: each forward of a hooked model advances it by that model's cost, ``prefill`` for a call
    of more than 4 tokens (the prompt has 6; with the first draft, 8), ``step`` for the others (1 token, or N + 1 = 3
    in a verification)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def charge(self, model, prefill: float, step: float):
        def hook(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            self.now += prefill if ids.shape[1] > 4 else step

        return model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_round_at_full_acceptance_leaves_the_prefill_out(pair, static):
    """The round's seconds are a marginal, (T(k) − T(k/2)) / (its rounds − theirs): at full acceptance a round is
    N draft steps and one verification, and the prefill adds nothing (timed as a whole call over its rounds it
    would add its cost / 8 rounds)."""
    target, draft = pair
    extra = {"cache_implementation": "static", "disable_compile": True} if static else {}
    ids = prompts(1, length=6)[0]
    clock = ForwardClock()
    handles = [clock.charge(target, PREFILL_SECONDS, VERIFY_SECONDS), clock.charge(draft, 0.0, DRAFT_STEP_SECONDS)]
    try:
        seconds = round_seconds_at_full_acceptance(target, draft, ids, 2, 24, repeats=1, clock=clock, **extra)
    finally:
        for handle in handles:
            handle.remove()
    assert seconds == pytest.approx(2 * DRAFT_STEP_SECONDS + VERIFY_SECONDS)


def test_the_fastest_call_counts_so_a_disturbed_one_does_not():
    """Another process on the machine only adds time: a cost is the fastest of the timed calls."""
    from hf_diversed.evaluation.bench.costs import _fastest_time, fastest_interleaved

    clock = ForwardClock()
    delays = iter([0.2, 0.3, 0.05, 0.2, 0.4])  # four calls disturbed, one clean

    def call():
        clock.now += next(delays)

    assert _fastest_time(call, repeats=5, clock=clock) == pytest.approx(0.05)
    delays = iter([0.2, 1.0, 0.1, 3.0])  # round-robin: a, b, a, b
    assert fastest_interleaved({"a": call, "b": call}, repeats=2, clock=clock) == pytest.approx({"a": 0.1, "b": 1.0})


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
    ticks = iter(range(10**6))  # each reading one second later: every timed call takes 1 s
    costs = measure_compiled_costs(
        target, draft, prompts(1, length=6)[0], 2, config, repeats=1, cache_len=96, clock=lambda: next(ticks)
    )
    assert (costs["c"], costs["v"]["2"], costs["target_alone_seconds_per_token"]) == (1.0, 1.0, 1 / 16)
    assert lengths and all(length >= 96 for length in lengths), lengths
