"""Distances between next-token laws, in one place: the head's features and the verification rules both read them."""

from __future__ import annotations

import torch


def total_variation(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """TV(p, q) = 1/2 * sum_v |p(v) - q(v)| over the last dimension."""
    return 0.5 * (p - q).abs().sum(-1)
