"""Is a head's w informative? Its weights on recorded drafted positions against what they could track.

At a drafted position the expected acceptance is 1 - w_t TV(p_t, q_t), so a head buys acceptance by lowering w
where TV is high, and keeps quality by keeping w high where the target's choice matters. These diagnostics read a
head's w on the positions of recorded rollouts (their hidden states, TV and both models' most likely tokens) and
relate it to TV, to whether the two models agree on the next token, and to a token-class rule's positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .imitation import roc_auc

__all__ = ["head_diagnostics"]


def _corr(a: torch.Tensor, b: torch.Tensor) -> float | None:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    denominator = float(a.norm() * b.norm())
    return float((a * b).sum()) / denominator if denominator > 0 else None


def _mean(x: torch.Tensor) -> float | None:
    return float(x.mean()) if x.numel() else None


def head_diagnostics(head, rollouts: Sequence, rule=None) -> dict[str, float | None]:
    """The head's w on every drafted position of ``rollouts`` (trainer rollouts or sampler traces) and:

    mean and spread of w; corr(w, TV); mean w where argmax p = argmax q and where not; the expected acceptance
    mean(1 - w TV) beside that of a static head with the same mean w; with a token-class ``rule``, the AUC of w
    for the rule's exact positions and mean w on each side."""
    h_draft = torch.cat([r.h_draft for r in rollouts])
    h_target = torch.cat([r.h_target for r in rollouts])
    tv = torch.cat([r.tv for r in rollouts]).double()
    with torch.no_grad():
        w = head(draft_hidden_states=h_draft[None], target_hidden_states=h_target[None]).weight[0].double()
    out: dict[str, float | None] = {
        "positions": int(w.numel()),
        "mean_w": _mean(w),
        "std_w": float(w.std()) if w.numel() > 1 else None,
        "corr_w_tv": _corr(w, tv),
        "expected_acceptance": _mean(1 - w * tv),
        "expected_acceptance_static_same_mean_w": _mean(1 - w.mean() * tv),
    }
    if all(getattr(r, "top_p", None) is not None for r in rollouts):
        agree = torch.cat([r.top_p == r.top_q for r in rollouts])
        out.update(
            share_agree=_mean(agree.double()),
            mean_w_where_agree=_mean(w[agree]),
            mean_w_where_disagree=_mean(w[~agree]),
            mean_tv_where_agree=_mean(tv[agree]),
            mean_tv_where_disagree=_mean(tv[~agree]),
        )
        if rule is not None:
            exact = torch.cat([rule.weights_from_top(r.top_p, r.top_q) for r in rollouts]) > 0.5
            out.update(
                share_rule_exact=_mean(exact.double()),
                auc_w_for_rule=roc_auc(w, exact),
                mean_w_where_rule_exact=_mean(w[exact]),
                mean_w_elsewhere=_mean(w[~exact]),
            )
    return out
