"""``generate(..., diversed_head=..., diversed_verifier=...)``: argument validation, once, at the boundary."""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch

from ..modeling.draft_vocabulary import apply_draft_vocabulary, padded_draft_vocab_size
from ..modeling.hub import load_head
from ..modeling.modeling_diversed_head import DiversedHead, head_verification
from . import _compat
from .checks import check_pair
from .decoding import DecodingSettings, assisted_decoding
from .static_loop import static_assisted_decoding
from .stats import DiversedStats
from .verification import Diversed, VerificationRule, parse_rule, rule_for_head

_GENERATE_SIGNATURE = inspect.signature(_compat.original_generate)
_LAST_STATS_ATTR = "_hf_diversed_last_stats"


def _resolve_head(head: Any, target) -> DiversedHead:
    """A head the caller built stays where it is (as an ``assistant_model`` does: the loop moves the hidden states
    to it and its weights back); one loaded here goes to the target's device."""
    if isinstance(head, DiversedHead):
        return head
    if isinstance(head, (str, os.PathLike)):
        return load_head(head).to(target.device)
    raise ValueError(
        f"`diversed_head` expects a repo id, a local path or a DiversedHead, got {type(head).__name__}. "
        f'Pass e.g. diversed_head="org/head-gsm8k".'
    )


def _user_draft_length(bound: dict[str, Any]) -> tuple[int | None, str | None]:
    """``num_assistant_tokens`` (and schedule) passed to this generate call, as kwargs or in its generation_config."""
    kwargs = bound.get("kwargs", {})
    config = bound.get("generation_config")
    values = []
    for name in ("num_assistant_tokens", "num_assistant_tokens_schedule"):
        value = kwargs.get(name, getattr(config, name, None) if config is not None else None)
        values.append(value)
    n, schedule = values
    if n is not None and (not isinstance(n, int) or n < 1):
        raise ValueError(f"`num_assistant_tokens` must be a positive int, got {n!r}. Pass e.g. num_assistant_tokens=5.")
    return n, schedule


def diversed_generate(model, original_generate, *args, **kwargs):
    """Run ``original_generate`` with hf_diversed's assisted-decoding loop and the requested rule."""
    if kwargs.get("custom_generate") is not None:
        # The repository's own generate function runs instead and receives every argument, diversed_head included.
        return original_generate(model, *args, **kwargs)
    head_arg = kwargs.pop("diversed_head", None)
    verifier_arg = kwargs.pop("diversed_verifier", None)
    trace = kwargs.pop("_diversed_trace", None)  # private: a list to receive a Trace per round (rollouts)
    bound = _GENERATE_SIGNATURE.bind_partial(model, *args, **kwargs).arguments
    draft = bound.get("assistant_model")
    if draft is not None:
        apply_draft_vocabulary(draft)  # a draft saved with a trimmed vocabulary proposes from it
    if head_arg is None and verifier_arg is None:
        return original_generate(model, *args, **kwargs)

    extra = bound.get("kwargs", {})
    rule: VerificationRule = (
        parse_rule(verifier_arg, tokenizer=extra.get("tokenizer")) if verifier_arg is not None else Diversed()
    )
    if head_arg is not None and not rule.needs_head:
        raise ValueError(
            f"`diversed_head` is only used by the DIVERSED rule, but `diversed_verifier` selects {rule.spec()!r}. "
            "Drop `diversed_head`, or drop `diversed_verifier` (DIVERSED is the default when a head is given)."
        )
    if rule.needs_head and head_arg is None:
        raise ValueError('The DIVERSED rule needs an ensemble head: pass `diversed_head="org/head-gsm8k"` (or a path).')
    if extra.get("assistant_tokenizer") is not None:
        raise ValueError(
            "Relaxed verification needs target and draft to share one tokenizer; `assistant_tokenizer` "
            "(universal assisted decoding) is not supported. Use a same-tokenizer draft and drop it."
        )
    if extra.get("assistant_ensemble_weight") is not None:
        raise ValueError(
            "`assistant_ensemble_weight` and `diversed_verifier`/`diversed_head` both choose the verification "
            'rule. Use diversed_verifier="static:W" for a static ensemble and drop `assistant_ensemble_weight`.'
        )
    num_beams = extra.get("num_beams", getattr(bound.get("generation_config"), "num_beams", None))
    if num_beams is not None and num_beams > 1:
        raise ValueError(f"Speculative decoding runs one beam; got num_beams={num_beams}. Drop `num_beams`.")
    check_pair(model, draft, None, tokenizer=extra.get("tokenizer"))
    head = _resolve_head(head_arg, model) if head_arg is not None else None
    check_pair(model, draft, head)
    if head is not None:
        rule = rule_for_head(rule, head_verification(head))  # a lenience head runs lossy SD at its l_t
    num_tokens, schedule = _user_draft_length(bound)

    settings = DecodingSettings(
        rule=rule, head=head, num_assistant_tokens=num_tokens, num_assistant_tokens_schedule=schedule, trace=trace
    )
    padded = padded_draft_vocab_size(model, draft) is not None
    with torch.no_grad(), _compat.diversed_call(settings, padded_pair=padded):
        output = original_generate(model, *args, **kwargs)
    if not settings.entered:
        raise RuntimeError(
            "`diversed_head`/`diversed_verifier` were given, but generate did not run assisted decoding with "
            "this call's arguments (e.g. prompt_lookup_num_tokens or assistant_early_exit select another "
            "mode). Remove those arguments."
        )
    setattr(model, _LAST_STATS_ATTR, settings.stats)
    return output


def check_batch_size(input_ids: torch.Tensor) -> None:
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"hf_diversed decodes one sequence at a time (batch size 1, like transformers' assisted generation); "
            f"got batch size {input_ids.shape[0]}. Call generate once per prompt."
        )


def decoding_loop(model, settings: DecodingSettings, input_ids, *args, **kwargs):
    """The dynamic-cache loop, or the static-cache (compiled) one under ``cache_implementation="static"``."""
    check_batch_size(input_ids)
    config = kwargs.get("generation_config", args[2] if len(args) > 2 else None)
    if getattr(config, "cache_implementation", None) == "static":
        return static_assisted_decoding(model, settings, input_ids, *args, **kwargs)
    return assisted_decoding(model, settings, input_ids, *args, **kwargs)


def last_stats(model) -> DiversedStats:
    """Statistics of the last DIVERSED ``generate`` call on ``model`` (also ``output.diversed_stats``)."""
    for candidate in (model, getattr(model, "get_base_model", lambda: None)()):
        stats = getattr(candidate, _LAST_STATS_ATTR, None)
        if stats is not None:
            return stats
    raise ValueError(
        "No DIVERSED generate call has run on this model yet: call "
        "model.generate(..., assistant_model=draft, diversed_head=...) first."
    )
