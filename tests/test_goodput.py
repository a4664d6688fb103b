"""The goodput model behind the vLLM draft-length policy (pure maths; ``hf_diversed.integrations.vllm.goodput``).

The choice is checked on the real pair's recorded engine steps (docs/vllm/policy/calibration-steps.jsonl: vLLM's CPU
backend, bf16, the draft's K cycled from step to step at 1 to 32 requests in flight): no wall clock is read here.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from hf_diversed.integrations.vllm.calibrate import decoding_steps
from hf_diversed.integrations.vllm.goodput import (
    StepCosts,
    StepWork,
    acceptance_estimate,
    batch_size_schedule,
    best_draft_length,
    drafts_to_verify,
    expected_tokens,
    goodput,
    skipping_cost,
    worth_catching_up,
)

STEP_LOG = Path(__file__).resolve().parents[1] / "docs" / "vllm" / "policy" / "calibration-steps.jsonl"
SERVED_COSTS = STEP_LOG.with_name("step_costs.json")  # the fit the load runs of docs/vllm/load were served with
LONG_LOG = STEP_LOG.with_name("calibration-steps-256tok.jsonl")  # 256 tokens a request, each step with its batch


@pytest.fixture(scope="module")
def recorded():
    """Step costs fitted to the recorded steps, and their mean relative error."""
    steps = decoding_steps(STEP_LOG, num_draft=5)
    costs = StepCosts.fit(steps)
    return costs, sum(abs(costs.seconds(w) - s) / s for w, s in steps) / len(steps)


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


def test_step_costs_fit_recovers_the_coefficients_and_knees_of_known_costs():
    known = StepCosts(c0=0.04, c_target=0.019, c_pass=0.07, c_draft=0.003, k_target=6, k_draft=8)
    works = [StepWork.steady(b, k, draft_runs=k > 0) for b in (1, 2, 4, 8, 16, 32) for k in range(6)]
    works += [StepWork(b, (3 * b, 2 * b, b)) for b in (1, 3, 5, 12)]  # catch-up passes: other shapes
    fitted = StepCosts.fit((work, known.seconds(work)) for work in works)
    assert (fitted.k_target, fitted.k_draft) == (6, 8)
    for name in ("c0", "c_target", "c_pass", "c_draft"):
        assert getattr(fitted, name) == pytest.approx(getattr(known, name), rel=1e-6, abs=1e-9)
    # a coefficient the data pushes below zero is dropped, not returned negative
    negative = [(work, 0.1 + 0.01 * work.target_tokens - 0.001 * len(work.draft_passes)) for work in works]
    fitted = StepCosts.fit(negative)
    assert min(getattr(fitted, name) for name in ("c0", "c_target", "c_pass", "c_draft")) >= 0.0
    with pytest.raises(ValueError, match="at least 4"):
        StepCosts.fit([(works[0], 1.0)] * 3)


def test_the_choice_on_recorded_steps_speculates_alone_and_skips_the_draft_under_load(recorded):
    costs, error = recorded
    assert error < 0.1  # the model fits the engine's own steps within 10% on average
    # one request at 85% acceptance: a few drafts, worth more than 1.2x the target alone
    k = best_draft_length([0.85], costs, 5, draft_runs_at_zero=False)
    assert 2 <= k <= 4
    assert goodput([0.85], k, costs) / goodput([0.85], 0, costs, draft_runs=False) > 1.2
    # four or more in flight: no K beats the target alone, so the draft is skipped
    for batch in (4, 8, 16, 32):
        assert best_draft_length([0.85] * batch, costs, 5, draft_runs_at_zero=False) == 0
    # where the draft must run its first pass at K = 0 (vLLM's own K = 0), one draft is the lesser loss
    assert best_draft_length([0.85] * 8, costs, 5, draft_runs_at_zero=True) == 1
    # and acceptance moves the choice: at 50% one request is better off without drafts
    assert best_draft_length([0.5], costs, 5, draft_runs_at_zero=False) == 0


def test_drafting_again_after_skipped_steps_must_save_more_than_the_catch_up_costs():
    """R (1 / G_0 - 1 / G_k) > c_pass + c_draft max(M, k_draft), on the costs the load runs were served with: a
    request alone near its start catches up on its prompt; a draining batch of three near their ends (docs/vllm/load,
    k0/f1-ba: acceptance 95.7%, 131-token prompts, 256-token budgets) does not catch up on whole prefixes."""
    costs = StepCosts.from_json(SERVED_COSTS)
    assert best_draft_length([0.957], costs, 5, draft_runs_at_zero=False) > 0
    assert worth_catching_up([0.957], 3, costs, remaining_tokens=250, missed_tokens=131)
    rates = [0.957] * 3
    k = best_draft_length(rates, costs, 5, draft_runs_at_zero=False)
    assert k > 0  # the steady model drafts at three requests, as the policy did there
    assert not worth_catching_up(rates, k, costs, remaining_tokens=3 * 50, missed_tokens=3 * (131 + 200))
    # the boundary: the remaining tokens at which the saving equals the catch-up pass
    saving = 1 / goodput(rates, 0, costs, draft_runs=False) - 1 / goodput(rates, k, costs)
    boundary = costs.draft_pass(993) / saving
    assert worth_catching_up(rates, k, costs, int(boundary) + 1, 993)
    assert not worth_catching_up(rates, k, costs, int(boundary), 993)
    # nothing missed (the draft ran every step) or nothing drafted: no transition to pay for
    assert worth_catching_up(rates, k, costs, 0, 0) and worth_catching_up(rates, 0, costs, 0, 993)


def test_a_request_keeps_a_draft_only_while_its_gain_pays_for_the_target_time(recorded):
    costs, _ = recorded
    step = goodput([0.9, 0.3], 3, costs)
    threshold = costs.c_target * step
    assert drafts_to_verify(0.9, 3, costs, step) == sum(0.9**j >= threshold for j in (1, 2, 3))
    assert drafts_to_verify(0.3, 3, costs, step) < drafts_to_verify(0.9, 3, costs, step)
    assert drafts_to_verify(1.0, 3, costs, step) == 3


def test_batch_size_schedule_is_vllms_format_with_ranges_merged(recorded, tmp_path):
    costs, _ = recorded
    schedule = batch_size_schedule(0.85, costs, 5, 64)
    assert schedule[0][0] == 1
    assert schedule[-1][1] == 64 and all(lo <= hi for lo, hi, _ in schedule)
    assert all(a[1] + 1 == b[0] and a[2] != b[2] for a, b in zip(schedule, schedule[1:], strict=False))
    # vLLM's own K = 0 still runs the draft's first pass, so under load one draft is the lesser loss there
    assert schedule[-1][2] == 1
    path = tmp_path / "costs.json"
    costs.to_json(path)
    assert StepCosts.from_json(path) == costs
    path.write_text(json.dumps({"c0": 1}))
    with pytest.raises(ValueError, match="not a step-cost file"):
        StepCosts.from_json(path)


def test_calibration_refits_recorded_step_logs_without_an_engine(tmp_path, capsys):
    """``calibrate --from-step-logs``: the decoding steps of the logs given, fitted as a calibration's own are; a
    missing log is named in one line."""
    from hf_diversed.integrations.vllm import calibrate

    out = tmp_path / "costs.json"
    assert calibrate.main(["--from-step-logs", str(STEP_LOG), "--output", str(out)]) == 0
    assert _same(StepCosts.from_json(out), StepCosts.fit(decoding_steps(STEP_LOG, num_draft=5)))
    record = json.loads(out.read_text())
    assert record["engine"]["step_logs"] == [str(STEP_LOG)] and record["fit"]["steps"] > 100
    with pytest.raises(SystemExit):
        calibrate.main(["--from-step-logs", str(tmp_path / "none.jsonl"), "--output", str(out)])
    assert "no step log at" in capsys.readouterr().err


def test_measured_steady_steps_set_the_ratio_of_their_batch_and_k():
    """r(B, K) makes a steady step cost its measured median; other batches are interpolated, the nearest measured
    one beyond them, and a K never measured keeps the model's seconds."""
    known = StepCosts(c0=0.1, c_target=0.01, c_pass=0.05, c_draft=0.002)
    steps = [(StepWork.steady(b, 2), known.seconds(StepWork.steady(b, 2)) * r) for b, r in ((2, 1.2), (6, 0.8))]
    steps = steps * 3 + [(StepWork.steady(4, 1), 9.0)] * 2  # below MIN_STEADY: no ratio
    steps.append((StepWork(12, (16, 4)), 5.0))  # its batch unknown: not a steady step
    costs = known.with_steady_ratios(steps)
    assert costs.steady_ratios == ((2, 2, pytest.approx(1.2)), (6, 2, pytest.approx(0.8)))
    assert costs.steady_seconds(2, 2) == pytest.approx(steps[0][1])
    assert costs.ratio(4, 2) == pytest.approx(1.0) and costs.ratio(1, 2) == pytest.approx(1.2)
    assert costs.ratio(32, 2) == pytest.approx(0.8) and costs.ratio(4, 1) == 1.0
    assert StepWork.steady(4, 0, draft_runs=False).steady_k() == 0 and StepWork(8, (12,), 4).steady_k() == 1
    assert StepWork(8, (12, 4), 4).steady_k() is None  # verifies one draft, proposes two: a change of K


def test_the_choice_on_the_engines_measured_steps_at_served_lengths():
    """On the real pair's 256-token calibration (docs/vllm/policy/calibration-steps-256tok.jsonl): the fitted form
    alone drafts at 4 in flight, where the engine's own steady steps (4 requests: 0.17 s plain, 0.37 s with one
    draft) make the target's step the faster at 85% acceptance; one request still drafts, 6 or more skip the draft."""
    steps = decoding_steps(LONG_LOG, num_draft=5)
    costs = StepCosts.fit(steps)
    form = dataclasses.replace(costs, steady_ratios=())
    assert best_draft_length([0.85] * 4, form, 5, draft_runs_at_zero=False) == 1
    assert best_draft_length([0.85] * 4, costs, 5, draft_runs_at_zero=False) == 0
    measured = sorted(s for w, s in steps if w.batch == 4 and w.steady_k() == 0)
    assert costs.steady_seconds(4, 0, draft_runs=False) == pytest.approx(measured[(len(measured) - 1) // 2])
    assert best_draft_length([0.85], costs, 5, draft_runs_at_zero=False) >= 2
    for batch in (6, 8, 16, 32):
        assert best_draft_length([0.946] * batch, costs, 5, draft_runs_at_zero=False) == 0
    assert _same(StepCosts.from_json(LONG_LOG.with_name("step_costs-256tok.json")), costs)


def _same(a: StepCosts, b: StepCosts) -> bool:
    """Equal costs up to the last digits a least-squares solve may move between runs."""
    flat = [[*(getattr(c, f) for f in ("c0", "c_target", "c_pass", "c_draft", "k_target", "k_draft")),
             *(x for row in c.steady_ratios for x in row)] for c in (a, b)]  # fmt: skip
    return flat[0] == pytest.approx(flat[1], rel=1e-9)


class _Request:
    """What the policy's lookup reads of a running request."""

    def __init__(self, request_id: str, left: int):
        self.request_id, self.max_tokens, self.num_output_tokens = request_id, 256, 256 - left
        self.sampling_params = None  # exact SD

    def is_finished(self) -> bool:
        return False


def test_a_dip_of_the_batch_pays_no_catch_up_and_a_lasting_one_pays_it_once_waiting_has_cost_as_much():
    """The lookup the scheduler asks for K, on the real pair's 256-token costs: four requests run plain (their
    drafts missed 200 tokens each); one ends and for a step three run, where drafting pays and the catch-up repays
    itself over their remaining tokens, yet a dip that short pays no catch-up (ski rental). Three for good: K stays
    0 until the plain steps have lost what the catch-up costs, c_pass + c_draft * 600, then drafting starts."""
    from hf_diversed.integrations.vllm._scheduling import Policy, _Acceptances, _Lookup

    costs = StepCosts.from_json(LONG_LOG.with_name("step_costs-256tok.json"))
    policy = Policy(costs=costs, prior=0.9, prior_strength=1e12)
    scheduler = type("Scheduler", (), {})()
    scheduler.running = [_Request(f"r{i}", 200) for i in range(4)]
    lookup = _Lookup(scheduler, policy, _Acceptances(policy, {}), max_k=5)
    lookup.missed = {f"r{i}": 200 for i in range(4)}
    assert lookup[4] == 0
    scheduler.running = scheduler.running[:3]
    k = best_draft_length([0.9] * 3, costs, 5, draft_runs_at_zero=False)
    assert k > 0 and worth_catching_up([0.9] * 3, k, costs, 3 * 200, 600)  # what the policy did before
    assert lookup[3] == 0 and lookup.waited == pytest.approx(skipping_cost([0.9] * 3, k, costs))
    scheduler.running.append(_Request("r4", 256))
    lookup.missed["r4"] = 150
    assert lookup[4] == 0 and lookup.waited == 0.0  # back to four: nothing to draft for, the wait starts afresh
    scheduler.running = scheduler.running[:3]
    waits = costs.draft_pass(600) / skipping_cost([0.9] * 3, k, costs)
    chosen = [lookup[3] for _ in range(int(waits) + 2)]
    assert chosen == [0] * (int(waits) + 1) + [k] and lookup.waited == 0.0
