"""DIVERSED heads for vLLM requests: loaded once per process, checked against the engine's pair, and their weights.

At a drafted position t the head reads the two models' last hidden states, the inputs of their LM heads at the
position whose logits give p_t and q_t (and, for a head with ``use_distribution_features``, max p_t, max q_t and
TV(p_t, q_t) from the laws verification uses), and gives w_t; the request then runs the head's rule with that w_t
(the mixture weight, or a lenience head's l_t), as ``generate`` does. Heads load the way ``generate`` loads them
(:func:`hf_diversed.modeling.hub.load_head`: a Hub id or a local directory, safetensors only, no repository code)
and run in float32 on the target's device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...generation.verification import VerificationRule, rule_for_head
from ...modeling.draft_vocabulary import note_head_draft_vocabulary
from ...modeling.hub import load_head
from ...modeling.modeling_diversed_head import (
    DiversedHead,
    distribution_features,
    head_verification,
    position_weights,
)
from .rules import HEAD_KEY, RuleError

_on_device: dict[tuple[str, str], DiversedHead] = {}


def load(name: str) -> DiversedHead:
    """The head ``name`` (Hub id or local path), loaded once per process; :class:`RuleError` if it cannot load."""
    try:
        return load_head(name)
    except (OSError, ValueError) as err:
        raise RuleError(f'"{HEAD_KEY}": {" ".join(str(err).split())}') from None


def head_rule(rule: VerificationRule, head: DiversedHead) -> VerificationRule:
    """The rule a request with ``head`` runs (:func:`rule_for_head`); :class:`RuleError` names a mismatch."""
    try:
        return rule_for_head(rule, head_verification(head))
    except ValueError as err:
        raise RuleError(str(err)) from None


def check_fits(head: DiversedHead, target_hidden_size: int, draft_hidden_size: int) -> None:
    """Refuse a head built for another pair, as ``generate`` does; warn if it was trained with a trimmed draft
    vocabulary (vLLM's draft proposes from its full vocabulary)."""
    try:
        head.check_pair(target_hidden_size, draft_hidden_size)
    except ValueError as err:
        raise RuleError(str(err)) from None
    note_head_draft_vocabulary(head, None)


def head_on(name: str, device: torch.device) -> DiversedHead:
    """The head ``name`` on ``device`` (a copy per device, so every engine process holds one)."""
    key = (name, str(device))
    if key not in _on_device:
        head = load(name)
        _on_device[key] = head if next(head.parameters()).device == device else _copy_to(head, device)
    return _on_device[key]


def _copy_to(head: DiversedHead, device: torch.device) -> DiversedHead:
    copy = DiversedHead(head.config)
    copy.load_state_dict(head.state_dict())
    return copy.to(device).eval()


def head_weights(
    heads: Sequence[DiversedHead | None],
    num_draft_tokens: Sequence[int],
    p: torch.Tensor,
    q: torch.Tensor,
    h_target: torch.Tensor,
    h_draft: torch.Tensor,
) -> list[torch.Tensor | None]:
    """Per request, the head's w at each of its drafted positions (None for a request without a head).

    Rows are drafted positions, requests one after the other (``num_draft_tokens[i]`` rows for request ``i``):
    ``p``, ``q`` (num_tokens, V) the laws verification uses, ``h_target`` (num_tokens, D_target) and ``h_draft``
    (num_tokens, D_draft) the hidden states from which the target's and the draft's logits at those rows came.
    """
    out: list[torch.Tensor | None] = []
    start = 0
    with torch.no_grad():
        for head, n in zip(heads, num_draft_tokens, strict=True):
            if head is None or n == 0:
                out.append(None)
            else:
                rows = slice(start, start + n)
                features = distribution_features(p[rows], q[rows]) if head.config.use_distribution_features else None
                out.append(position_weights(head, h_draft[rows], h_target[rows], features).float())
            start += n
    return out
