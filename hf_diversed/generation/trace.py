"""The per-position trace of speculative decoding: what the head saw and what the rule did at each drafted position.

One record type for every producer: the default loop (``generate(..., _diversed_trace=[])``, one :class:`Trace` per
round), the batched sampler (``return_trace=True``, one per sequence, grown with :class:`TraceBuilder`) and the
trainer's rollouts (which hold one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

__all__ = ["Trace", "TraceBuilder"]


@dataclass
class Trace:
    """Per emitted *drafted* position t (accepted drafts and the correction after a rejection, after the EOS and
    length crops; never a bonus token, whose law is p whatever the rule) of one or more rounds, in order.

    At the emitted token y_t: ``p_y`` = p_t(y_t), ``q_y`` = q_t(y_t) (after logits processors), ``tv`` =
    TV(p_t, q_t), ``w`` the mixture weight the rule used, so the rule's law there is
    nu_t(y) = w_t p_t(y) + (1 - w_t) q_t(y) (a lenience head's l_t: the law is then lossy SD's at l_t);
    ``accepted`` whether y_t is an accepted draft (False: the correction); ``top_p`` / ``top_q`` = argmax p_t /
    q_t and ``max_p`` / ``max_q`` their probabilities;
    ``h_draft`` / ``h_target`` the head's inputs (None where the loop ran without a head); ``overlap`` = S_t(w_t) =
    sum_v min(p_t(v), w_t q_t(v)) and ``overlap_slope`` its derivative in w_t (``lenience_overlap``), which a
    lenience head's law at its output l_t = w_t reads (recorded for lossy rules only: None elsewhere).

    Shapes (T,) (``h_*``: (T, D_draft), (T, D_target)); tokens, ``top_*`` int64, ``accepted`` bool, the rest
    float32; detached, on CPU.
    """

    tokens: torch.Tensor
    p_y: torch.Tensor
    q_y: torch.Tensor
    tv: torch.Tensor
    w: torch.Tensor
    accepted: torch.Tensor
    top_p: torch.Tensor
    top_q: torch.Tensor
    max_p: torch.Tensor
    max_q: torch.Tensor
    h_draft: torch.Tensor | None = None
    h_target: torch.Tensor | None = None
    overlap: torch.Tensor | None = None
    overlap_slope: torch.Tensor | None = None

    @property
    def num_positions(self) -> int:
        return int(self.tokens.shape[0])

    def distribution_features(self) -> torch.Tensor:
        """(T, 3) = [max p_t, max q_t, TV(p_t, q_t)], a head's ``distribution_features`` at these positions."""
        return torch.stack([self.max_p, self.max_q, self.tv], dim=-1)

    @classmethod
    def empty(cls, draft_hidden_size: int | None = None, target_hidden_size: int | None = None) -> Trace:
        """No positions (hidden states of the given widths, or None)."""
        builder = TraceBuilder()
        return builder.build(draft_hidden_size, target_hidden_size)

    @classmethod
    def cat(
        cls, parts: Sequence[Trace], draft_hidden_size: int | None = None, target_hidden_size: int | None = None
    ) -> Trace:
        """The positions of ``parts`` in order (hidden states None unless every part has them); the widths shape
        an empty result."""
        if not parts:
            return cls.empty(draft_hidden_size, target_hidden_size)
        out = {}
        for f in fields(cls):
            values = [getattr(part, f.name) for part in parts]
            out[f.name] = None if any(v is None for v in values) else torch.cat(values, 0)
        return cls(**out)


_DTYPES = {
    "tokens": torch.long,
    "p_y": torch.float32,
    "q_y": torch.float32,
    "tv": torch.float32,
    "w": torch.float32,
    "accepted": torch.bool,
    "top_p": torch.long,
    "top_q": torch.long,
    "max_p": torch.float32,
    "max_q": torch.float32,
}
_OPTIONAL = ("overlap", "overlap_slope")  # float32 scalars some producers record


class TraceBuilder:
    """A :class:`Trace` grown one position at a time: Python scalars, and the head's inputs as (D,) rows."""

    def __init__(self) -> None:
        self.columns: dict[str, list] = {name: [] for name in (*_DTYPES, *_OPTIONAL, "h_draft", "h_target")}

    def append(self, **position) -> None:
        """Add one position: every field of :class:`Trace` by name (``h_draft`` / ``h_target`` as (D,) tensors)."""
        for name, value in position.items():
            self.columns[name].append(value)

    def build(self, draft_hidden_size: int | None = None, target_hidden_size: int | None = None) -> Trace:
        """The trace so far; hidden states stacked, or (0, D) empty where the widths are given, else None."""
        values = {name: torch.tensor(self.columns[name], dtype=dtype) for name, dtype in _DTYPES.items()}
        positions = len(self.columns["tokens"])
        for name in _OPTIONAL:  # recorded at every position, or at none (then None, unless there is no position)
            rows = self.columns[name]
            values[name] = torch.tensor(rows, dtype=torch.float32) if rows or not positions else None
        for name, width in (("h_draft", draft_hidden_size), ("h_target", target_hidden_size)):
            rows = self.columns[name]
            if rows:
                values[name] = torch.stack(rows).float()
            else:
                values[name] = torch.zeros(0, width) if width is not None else None
        return Trace(**values)
