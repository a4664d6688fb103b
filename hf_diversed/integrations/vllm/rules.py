"""Which rule a vLLM request runs, and the target law that vLLM's exact verification must be handed to run it.

Pure tensor maths over hf-diversed's rules (:mod:`hf_diversed.generation.verification`); the engine glue is in
``_compat``. A request names its rule in ``SamplingParams(extra_args={"diversed_verifier": "static:0.5"})`` and/or
its DIVERSED head in ``extra_args={"diversed_head": "org/head"}`` (a head alone selects the DIVERSED rule, as in
``generate``); the server defaults are the same keys in ``additional_config`` (``vllm serve --additional-config``);
without any a request verifies exactly, as vLLM does.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...generation.verification import ExactSD, VerificationRule, parse_rule, parse_token_class_spec

VERIFIER_KEY = "diversed_verifier"
HEAD_KEY = "diversed_head"
HEAD_RULES = ("diversed", "diversed-lossy")  # the rules a head sets: its mixture weight, or its lenience


class RuleError(ValueError):
    """A request's rule cannot run; the message names the fix. vLLM answers it as a bad request (HTTP 400)."""


@dataclass(frozen=True)
class Request:
    """What a request runs: its rule's spec and, for DIVERSED, the head's Hub id or local path."""

    spec: str
    head: str | None = None


def _text(value: Any, key: str, example: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise RuleError(f'extra_args["{key}"] must be a non-empty string such as {example!r}, got {value!r}.')
    return value.strip()


def requested(extra_args: Mapping[str, Any] | None, defaults: Mapping[str, Any] | None = None) -> Request:
    """The rule and head a request asks for: its own ``extra_args``, else the server's defaults, else exact SD.

    A head without a rule selects DIVERSED, in a request as in the defaults; the default head also serves the
    requests that ask for ``"diversed"`` without naming a head (so a server may default to another rule and still
    hold a head for those). A request's head beside another rule, or DIVERSED without any head, is a
    :class:`RuleError`.
    """
    extra, defaults = extra_args or {}, defaults or {}
    spec = _text(extra.get(VERIFIER_KEY), VERIFIER_KEY, "static:0.5")
    head = _text(extra.get(HEAD_KEY), HEAD_KEY, "org/head-gsm8k")
    if spec is None and head is None:
        spec = _text(defaults.get(VERIFIER_KEY), VERIFIER_KEY, "static:0.5")
    if head is None and (spec is None or spec.lower() in HEAD_RULES):
        head = _text(defaults.get(HEAD_KEY), HEAD_KEY, "org/head-gsm8k")
    if spec is None:
        spec = "diversed" if head is not None else "exact"
    if head is not None and spec.lower() not in HEAD_RULES:
        raise RuleError(
            f'"{HEAD_KEY}" is only used by the DIVERSED rule, but "{VERIFIER_KEY}" selects {spec!r}: drop one '
            f"(a head alone selects DIVERSED)."
        )
    if head is None and spec.lower() in HEAD_RULES:
        raise RuleError(f'The DIVERSED rule needs an ensemble head: add "{HEAD_KEY}": "org/head-gsm8k" (or a path).')
    return Request(spec, head)


def needs_tokenizer(spec: str) -> bool:
    return parse_token_class_spec(spec) is not None


@functools.lru_cache(maxsize=256)
def _parse(spec: str, tokenizer: Any) -> VerificationRule:
    return parse_rule(spec, tokenizer=tokenizer)


def resolve_rule(spec: str, tokenizer: Any = None) -> VerificationRule:
    """The rule for ``spec`` (parsed once per spec and tokenizer); :class:`RuleError` names what is wrong."""
    try:
        return _parse(spec, tokenizer)
    except ValueError as err:
        raise RuleError(str(err)) from None


def is_exact(rule: VerificationRule) -> bool:
    return isinstance(rule, ExactSD)


def exact_targets(
    rules: Sequence[VerificationRule],
    num_draft_tokens: Sequence[int],
    p: torch.Tensor,
    q: torch.Tensor,
    head_weights: Sequence[torch.Tensor | None] | None = None,
) -> torch.Tensor:
    """Per drafted token, the law t that exact verification must use so each request runs its own rule.

    ``p`` and ``q`` are ``(num_tokens, V)``: the target's and the draft's next-token laws at every drafted position,
    requests one after the other (``num_draft_tokens[i]`` rows for request ``i``, whose rule is ``rules[i]``);
    ``head_weights[i]`` is the head's ``(num_draft_tokens[i],)`` weights for a DIVERSED request (else None).
    Returns ``(num_tokens, V)``: ``rule.exact_target(p, q, rule.weights(p, q, head_weight))`` for each request's
    rows (exact SD's rows are ``p`` unchanged).
    """
    t = p.clone()
    start = 0
    head_weights = head_weights if head_weights is not None else [None] * len(rules)
    for rule, n, head_w in zip(rules, num_draft_tokens, head_weights, strict=True):
        if n and not is_exact(rule):
            p_i, q_i = p[start : start + n].unsqueeze(0), q[start : start + n].unsqueeze(0)  # (1, n, V)
            w = rule.weights(p_i, q_i, None if head_w is None else head_w.view(1, n)).to(p.dtype)  # (1, n)
            t[start : start + n] = rule.exact_target(p_i, q_i, w)[0]
        start += n
    return t


def exact_targets_by_row(
    rules: Sequence[VerificationRule],
    rule_of_row: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    head_weights: Sequence[torch.Tensor | None] | None = None,
) -> torch.Tensor:
    """Per row, the law t that exact verification must use: ``rules[k].exact_target`` where ``rule_of_row == k``,
    ``p`` itself where it is -1 (exact SD, and the rows that are not drafted positions).

    The same laws as :func:`exact_targets`, laid out for an engine that knows each row's rule on the device but not
    how many rows each request has (vLLM's Model Runner V2): each rule's t is computed over every row and kept on its
    own rows, so nothing waits for the device. ``p``, ``q`` are ``(num_rows, V)``; ``head_weights[k]`` is the
    ``(num_rows,)`` w of rule k's head (DIVERSED), else None.
    """
    t = p
    head_weights = head_weights if head_weights is not None else [None] * len(rules)
    for k, (rule, head_w) in enumerate(zip(rules, head_weights, strict=True)):
        if is_exact(rule):
            continue
        p_k, q_k = p.unsqueeze(0), q.unsqueeze(0)  # (1, rows, V): the rules' (batch, position) layout
        w = rule.weights(p_k, q_k, None if head_w is None else head_w.view(1, -1)).to(p.dtype)
        t = torch.where((rule_of_row == k).unsqueeze(-1), rule.exact_target(p_k, q_k, w)[0], t)
    return t
