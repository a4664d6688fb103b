"""Which rule a vLLM request runs, and the target law that vLLM's exact verification must be handed to run it.

Pure tensor maths over hf-diversed's rules (:mod:`hf_diversed.generation.verification`); the engine glue is in
``_compat``. A request names its rule in ``SamplingParams(extra_args={"diversed_verifier": "static:0.5"})``; the
server default is ``additional_config={"diversed_verifier": ...}`` (``vllm serve --additional-config``); without
either a request verifies exactly, as vLLM does.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ...generation.verification import ExactSD, VerificationRule, parse_rule, parse_token_class_spec

VERIFIER_KEY = "diversed_verifier"


class RuleError(ValueError):
    """A request's rule cannot run; the message names the fix. vLLM answers it as a bad request (HTTP 400)."""


def requested_spec(extra_args: Mapping[str, Any] | None, default: str | None) -> str:
    """The rule a request asks for: ``extra_args["diversed_verifier"]``, else the server default, else exact."""
    value = (extra_args or {}).get(VERIFIER_KEY)
    if value is None:
        value = default if default is not None else "exact"
    if not isinstance(value, str):
        raise RuleError(
            f'extra_args["{VERIFIER_KEY}"] must be a rule name such as "static:0.5", got {type(value).__name__}.'
        )
    return value.strip()


def needs_tokenizer(spec: str) -> bool:
    return parse_token_class_spec(spec) is not None


@functools.lru_cache(maxsize=256)
def _parse(spec: str, tokenizer: Any) -> VerificationRule:
    return parse_rule(spec, tokenizer=tokenizer)


def resolve_rule(spec: str, tokenizer: Any = None) -> VerificationRule:
    """The rule for ``spec`` (parsed once per spec and tokenizer); :class:`RuleError` names what is wrong.

    The DIVERSED rule needs the learned head, which this integration does not run yet: it is refused.
    """
    try:
        rule = _parse(spec, tokenizer)
    except ValueError as err:
        raise RuleError(str(err)) from None
    if rule.needs_head:
        raise RuleError(
            f"Rule {spec!r}: the learned DIVERSED head does not run inside vLLM yet; pick a rule that needs no head, "
            'e.g. "static:0.5" or "cascade-opt:0.1".'
        )
    return rule


def is_exact(rule: VerificationRule) -> bool:
    return isinstance(rule, ExactSD)


def exact_targets(
    rules: Sequence[VerificationRule], num_draft_tokens: Sequence[int], p: torch.Tensor, q: torch.Tensor
) -> torch.Tensor:
    """Per drafted token, the law t that exact verification must use so each request runs its own rule.

    ``p`` and ``q`` are ``(num_tokens, V)``: the target's and the draft's next-token laws at every drafted position,
    requests one after the other (``num_draft_tokens[i]`` rows for request ``i``, whose rule is ``rules[i]``).
    Returns ``(num_tokens, V)``: ``rule.exact_target(p, q, rule.weights(p, q))`` for each request's rows (exact
    SD's rows are ``p`` unchanged).
    """
    t = p.clone()
    start = 0
    for rule, n in zip(rules, num_draft_tokens, strict=True):
        if n and not is_exact(rule):
            p_i, q_i = p[start : start + n].unsqueeze(0), q[start : start + n].unsqueeze(0)  # (1, n, V)
            w = rule.weights(p_i, q_i, None).to(p.dtype)  # (1, n)
            t[start : start + n] = rule.exact_target(p_i, q_i, w)[0]
        start += n
    return t
