"""The goodput model behind the vLLM draft-length policy (pure maths; ``hf_diversed.integrations.vllm.goodput``).

The choice is checked on step costs fitted to the plugin's recorded vLLM phases (docs/vllm/bench, sitting 1: the
target alone at 1, 8 and 32 in flight, exact SD at 1 and 8): no wall clock is read here.
"""

from __future__ import annotations

import json

import pytest
import torch

from hf_diversed.integrations.vllm.goodput import (
    StepCosts,
    StepWork,
    acceptance_estimate,
    batch_size_schedule,
    best_draft_length,
    drafts_to_verify,
    expected_tokens,
    goodput,
)

# c0 + c_target * T from the target alone (133 ms a step at 1 in flight, 534 ms at 32), then c_pass and c_draft
# from exact SD's steps at 1 and 8 in flight (N = 5, acceptance 73.2% and 71.6%): see docs/vllm.md.
RECORDED = StepCosts(c0=0.120, c_target=0.0129, c_pass=0.0275, c_draft=0.0053)


def test_expected_tokens_is_the_mean_of_a_block_that_stops_at_the_first_rejection():
    a, k = 0.8, 5
    # P(exactly j accepted) = a^j (1 - a) for j < k, a^k for j = k; a step emits j + 1 tokens
    mean = sum((j + 1) * a**j * (1 - a) for j in range(k)) + (k + 1) * a**k
    assert expected_tokens(a, k) == pytest.approx(mean)
    assert expected_tokens(a, 0) == 1.0 and expected_tokens(1.0, 4) == 5.0
    with pytest.raises(ValueError, match="probability"):
        expected_tokens(1.5, 2)


def test_acceptance_estimate_is_the_maximum_likelihood_of_stopped_blocks_without_a_prior():
    """Simulated blocks of K = 5 with per-position acceptance 0.8: accepted / (accepted + rejections) converges to
    0.8 (20,000 blocks: standard error about 0.003, the bound is 5 of them)."""
    generator = torch.Generator().manual_seed(0)
    accepted = rejections = 0
    for _ in range(20_000):
        draws = torch.rand(5, generator=generator) < 0.8
        run = int(draws.long().cumprod(0).sum())
        accepted += run
        rejections += int(run < 5)
    assert acceptance_estimate(accepted, rejections, prior=0.5, strength=0.0) == pytest.approx(0.8, abs=0.015)
    assert acceptance_estimate(0, 0, prior=0.6) == 0.6  # no record: the prior


def test_step_costs_fit_recovers_the_coefficients_of_recorded_steps():
    steps = [(StepWork.steady(b, k, draft_runs=k > 0), 0.0) for b in (1, 2, 4, 8, 16, 32) for k in range(6)]
    steps = [(work, RECORDED.seconds(work)) for work, _ in steps]
    fitted = StepCosts.fit(steps)
    for name in ("c0", "c_target", "c_pass", "c_draft"):
        assert getattr(fitted, name) == pytest.approx(getattr(RECORDED, name), rel=1e-6)
    # a coefficient the data pushes below zero is dropped, not returned negative
    negative = [(work, 0.1 + 0.01 * work.target_tokens - 0.001 * work.draft_passes) for work, _ in steps]
    assert min(vars(StepCosts.fit(negative)).values()) >= 0.0
    with pytest.raises(ValueError, match="at least 4"):
        StepCosts.fit(steps[:3])


def test_the_choice_on_recorded_costs_speculates_alone_and_skips_the_draft_under_load():
    # one request at 85% acceptance: 3 drafts, worth 1.45x the target alone (the recorded exact SD ran 1.57x)
    assert best_draft_length([0.85], RECORDED, 5, draft_runs_at_zero=False) == 3
    alone = goodput([0.85], 0, RECORDED, draft_runs=False)
    assert goodput([0.85], 3, RECORDED) / alone == pytest.approx(1.45, abs=0.02)
    # eight or more in flight: no K beats the target alone, so the draft is skipped
    for batch in (8, 16, 32):
        assert best_draft_length([0.85] * batch, RECORDED, 5, draft_runs_at_zero=False) == 0
    # where the draft must run its first pass at K = 0 (vLLM's own K = 0), one draft is the better loss
    assert best_draft_length([0.85] * 8, RECORDED, 5, draft_runs_at_zero=True) == 1
    # and acceptance moves the choice: at 50% one request drafts one token
    assert best_draft_length([0.5], RECORDED, 5, draft_runs_at_zero=False) == 1


def test_a_request_keeps_a_draft_only_while_its_gain_pays_for_the_target_time():
    step = goodput([0.9, 0.3], 3, RECORDED)
    threshold = RECORDED.c_target * step
    assert drafts_to_verify(0.9, 3, RECORDED, step) == sum(0.9**j >= threshold for j in (1, 2, 3))
    assert drafts_to_verify(0.3, 3, RECORDED, step) < drafts_to_verify(0.9, 3, RECORDED, step)
    assert drafts_to_verify(1.0, 3, RECORDED, step) == 3


def test_batch_size_schedule_is_vllms_format_with_ranges_merged(tmp_path):
    schedule = batch_size_schedule(0.85, RECORDED, 5, 64)
    assert schedule[0][:2] == [1, 1] and schedule[-1][1] == 64
    assert all(lo <= hi for lo, hi, _ in schedule)
    assert all(a[1] + 1 == b[0] and a[2] != b[2] for a, b in zip(schedule, schedule[1:], strict=False))
    # vLLM's own K = 0 still runs the draft's first pass, so under load one draft is the lesser loss there
    assert schedule[-1][2] == 1
    path = tmp_path / "costs.json"
    RECORDED.to_json(path)
    assert StepCosts.from_json(path) == RECORDED
    path.write_text(json.dumps({"c0": 1}))
    with pytest.raises(ValueError, match="not a step-cost file"):
        StepCosts.from_json(path)
