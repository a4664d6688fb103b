"""Starting a head from a hand-made rule: fit the head's w to the rule's weights on recorded positions.

A token-class rule sets w_t from both models' most likely next tokens; a head sees only their hidden states. The
models' next-token logits are linear in those (post-norm) states, so a linear head can approximate the rule. This
fits it by minimising the binary cross-entropy between the head's w_t and the rule's w_t over the drafted
positions of recorded rollouts (features from the trainer's rollouts or the sampler's trace), and reports how well
the fit holds on positions it did not see. The fitted head is an ordinary head: RL training can start from it.
"""

from __future__ import annotations

import math

import torch

from ..modeling.modeling_diversed_head import DiversedHead, position_weights

__all__ = ["fit_head_to_weights", "roc_auc"]


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float | None:
    """Area under the ROC curve of ``scores`` for 0/1 ``labels`` (ties count half); None with one class only."""
    labels = labels.bool()
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        return None
    _, inverse, counts = torch.unique(scores.double(), return_inverse=True, return_counts=True)
    last = counts.cumsum(0).double()
    ranks = ((last - counts + 1 + last) / 2)[inverse]  # 1-based ranks, ties averaged
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def _metrics(w: torch.Tensor, target: torch.Tensor) -> dict[str, float | None]:
    eps = 1e-6
    wc = w.clamp(eps, 1 - eps)
    bce = float(-(target * wc.log() + (1 - target) * (1 - wc).log()).mean())
    high = target > 0.5
    return {
        "bce": bce,
        "mean_w": float(w.mean()),
        "mean_target": float(target.mean()),
        "mean_abs_error": float((w - target).abs().mean()),
        "auc": roc_auc(w, high),
        "mean_w_where_rule_high": float(w[high].mean()) if bool(high.any()) else None,
        "mean_w_where_rule_low": float(w[~high].mean()) if bool((~high).any()) else None,
    }


def fit_head_to_weights(
    head: DiversedHead,
    h_draft: torch.Tensor,
    h_target: torch.Tensor,
    target_w: torch.Tensor,
    *,
    groups: torch.Tensor | None = None,
    holdout: float = 0.2,
    steps: int = 400,
    learning_rate: float = 1e-2,
    weight_decay: float = 0.0,
    batch_size: int = 8192,
    seed: int = 0,
    features: torch.Tensor | None = None,
) -> dict[str, dict[str, float | None]]:
    """Fit ``head`` in place so that its w matches ``target_w`` in [0, 1] (binary cross-entropy, AdamW).

    ``h_draft`` (T, D_draft), ``h_target`` (T, D_target), ``target_w`` (T,), and ``features`` (T, 3) for a head
    that reads distribution features. ``groups`` (T,) names the rollout of
    each position: the held-out share ``holdout`` takes whole rollouts (positions of one sequence are alike), so the
    held-out metrics say how the fit carries to new sequences. Returns metrics on the fitted and held-out positions:
    cross-entropy, mean w, mean |w - target|, the AUC of w for the rule's high-w positions, mean w on each side.
    """
    if not (h_draft.shape[0] == h_target.shape[0] == target_w.shape[0]) or target_w.dim() != 1:
        raise ValueError(
            f"fit_head_to_weights needs one row per position: h_draft {tuple(h_draft.shape)}, h_target "
            f"{tuple(h_target.shape)}, target_w {tuple(target_w.shape)}."
        )
    if not 0 <= holdout < 1:
        raise ValueError(f"holdout must be in [0, 1), got {holdout}.")
    target_w = target_w.float()
    if bool(((target_w < 0) | (target_w > 1)).any()):
        raise ValueError("target_w must lie in [0, 1] (the rule's mixture weights).")
    generator = torch.Generator().manual_seed(seed)
    groups = torch.arange(len(target_w)) if groups is None else groups.long()
    names = torch.unique(groups)
    shuffled = names[torch.randperm(len(names), generator=generator)]
    held_names = shuffled[: math.floor(holdout * len(names))]
    held = torch.isin(groups, held_names)
    fit = ~held
    if not bool(fit.any()):
        raise ValueError("Nothing left to fit: lower holdout or record more rollouts.")
    optimizer = torch.optim.AdamW(head.parameters(), lr=learning_rate, weight_decay=weight_decay)
    head.train()
    index = torch.nonzero(fit).squeeze(1)
    for _ in range(steps):
        batch = index[torch.randperm(len(index), generator=generator)[:batch_size]]
        w = position_weights(head, h_draft[batch], h_target[batch], None if features is None else features[batch])
        w = w.clamp(1e-6, 1 - 1e-6)
        t = target_w[batch]
        loss = -(t * w.log() + (1 - t) * (1 - w).log()).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    head.eval()
    with torch.no_grad():
        w = position_weights(head, h_draft, h_target, features)
    out = {"fit": {"positions": int(fit.sum()), **_metrics(w[fit], target_w[fit])}}
    if bool(held.any()):
        out["held_out"] = {"positions": int(held.sum()), **_metrics(w[held], target_w[held])}
    return out
