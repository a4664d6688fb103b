"""Is a head's w informative? Its weights on recorded drafted positions against what they could track.

At a drafted position the expected acceptance is 1 - w_t TV(p_t, q_t), so a head buys acceptance by lowering w
where TV is high, and keeps quality by keeping w high where the target's choice matters. These diagnostics read a
head's w on the positions of recorded rollouts (their hidden states, TV and both models' most likely tokens) and
relate it to TV, to whether the two models agree on the next token, and to a token-class rule's positions.

:func:`reward_push` asks the question before any training: on rollouts with their rewards, which way does the
trainer's loss push w on a rule's exact positions and elsewhere, and how hard, from the task reward and from the
acceptance regularizer? :func:`maximal_coupling` draws the target's and the draft's token at one position together
(the branch pairs of ``training/signal_budget.py``), and :func:`gradient_noise_scale` states how many rollouts a
gradient needs before its signal outweighs its noise.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..modeling.modeling_diversed_head import head_verification, position_weights
from .imitation import roc_auc
from .rollout import rollouts_trace, rule_weights

__all__ = ["gradient_noise_scale", "head_diagnostics", "maximal_coupling", "reward_push"]


def _corr(a: torch.Tensor, b: torch.Tensor) -> float | None:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    denominator = float(a.norm() * b.norm())
    return float((a * b).sum()) / denominator if denominator > 0 else None


def _mean(x: torch.Tensor) -> float | None:
    return float(x.mean()) if x.numel() else None


def head_diagnostics(head, rollouts: Sequence, rule=None) -> dict[str, float | None]:
    """The head's w on every drafted position of ``rollouts`` (trainer rollouts or sampler results) and:

    mean and spread of w; corr(w, TV); mean w where argmax p = argmax q and where not; the expected acceptance
    mean(1 - w TV) beside that of a static head with the same mean w; with a token-class or cascade ``rule``, the
    AUC of w for the rule's exact positions and mean w on each side."""
    if head_verification(head) != "mixture":
        raise ValueError(
            "head_diagnostics reads a mixture head's w (acceptance 1 - w TV); this head sets lossy SD's lenience "
            "(config.verification='lenience'): pass a DIVERSED mixture head."
        )
    trace = rollouts_trace(rollouts)
    tv = trace.tv.double()
    with torch.no_grad():
        w = position_weights(head, trace.h_draft, trace.h_target, trace.distribution_features()).double()
    out: dict[str, float | None] = {
        "positions": int(w.numel()),
        "mean_w": _mean(w),
        "std_w": float(w.std()) if w.numel() > 1 else None,
        "corr_w_tv": _corr(w, tv),
        "expected_acceptance": _mean(1 - w * tv),
        "expected_acceptance_static_same_mean_w": _mean(1 - w.mean() * tv),
    }
    agree = trace.top_p == trace.top_q
    out.update(
        share_agree=_mean(agree.double()),
        mean_w_where_agree=_mean(w[agree]),
        mean_w_where_disagree=_mean(w[~agree]),
        mean_tv_where_agree=_mean(tv[agree]),
        mean_tv_where_disagree=_mean(tv[~agree]),
    )
    if rule is not None:
        exact = rule_weights(rule, rollouts) > 0.5
        out.update(
            share_rule_exact=_mean(exact.double()),
            auc_w_for_rule=roc_auc(w, exact),
            mean_w_where_rule_exact=_mean(w[exact]),
            mean_w_elsewhere=_mean(w[~exact]),
        )
    return out


def reward_push(
    steps: Sequence[tuple[Sequence, torch.Tensor]],
    rule,
    acceptance_coefs: Sequence[float] = (),
    resamples: int = 2000,
    seed: int = 0,
) -> dict[str, dict[str, float | None]]:
    """Which way the trainer's first update pushes w, per class of positions (a token-class ``rule``'s exact
    positions, and elsewhere), on ``steps`` of (rollouts, task rewards) drawn by the head being trained.

    At the drawing head (ratio 1), descent on the trainer's loss moves w_t along
    ``A (p_t(y) - q_t(y)) / nu_t(y) - lambda TV_t`` (times the head's lr and w(1 - w), the same for both terms),
    with A the rollout's REINFORCE++ advantage within its step. Per class: the mean reward push with a 95%
    bootstrap interval over rollouts, the mean TV, the lambda at which the two balance (``lambda_balance`` =
    reward push / TV), and the net push at each of ``acceptance_coefs``. A reward push whose interval holds 0
    means the rewards carry no usable signal about w on that class at this sample size."""
    from .objective import reinforce_pp_advantages

    sums, counts, tvs = [], [], []  # per rollout, per class (exact, elsewhere)
    for rollouts, rewards in steps:
        advantages = reinforce_pp_advantages(rewards.double().view(-1, 1))
        for r, a in zip(rollouts, advantages.tolist(), strict=True):
            t = r.trace
            nu = (t.w * t.p_y + (1 - t.w) * t.q_y).double().clamp_min(torch.finfo(torch.float32).tiny)
            push = a * (t.p_y.double() - t.q_y.double()) / nu
            exact = rule_weights(rule, [r]) > 0.5
            masks = (exact, ~exact)
            sums.append([float(push[m].sum()) for m in masks])
            counts.append([float(m.sum()) for m in masks])
            tvs.append([float(t.tv.double()[m].sum()) for m in masks])
    sums_t, counts_t, tvs_t = (torch.tensor(x, dtype=torch.float64).view(-1, 2) for x in (sums, counts, tvs))
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(sums_t), (resamples, len(sums_t)), generator=generator)
    boot = sums_t[picks].sum(1) / counts_t[picks].sum(1).clamp_min(1)  # (resamples, 2)
    out: dict[str, dict[str, float | None]] = {}
    for c, name in enumerate(("rule_exact", "elsewhere")):
        n = float(counts_t[:, c].sum())
        if n == 0:
            out[name] = {"positions": 0}
            continue
        push, tv = float(sums_t[:, c].sum()) / n, float(tvs_t[:, c].sum()) / n
        low, high = torch.quantile(boot[:, c], torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
        out[name] = {
            "positions": int(n),
            "reward_push": push,
            "reward_push_low": low,
            "reward_push_high": high,
            "mean_tv": tv,
            "lambda_balance": push / tv if tv > 0 else None,
            **{f"net_push_at_{lam:g}": push - lam * tv for lam in acceptance_coefs},
        }
    return out


def maximal_coupling(
    p: torch.Tensor, q: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draws (y_p, y_q) per row, y_p ~ p and y_q ~ q, equal with the largest probability any coupling allows,
    sum_y min(p, q)(y) = 1 - TV(p, q).

    With that probability both are one draw from norm(min(p, q)); otherwise y_p ~ norm(max(p - q, 0)) and
    y_q ~ norm(max(q - p, 0)), whose supports are disjoint, so the pair differs exactly when it is not the common
    draw. ``p``, ``q``: (n, V) rows of probabilities; returns two (n,) int64 tensors."""
    p, q = p.double(), q.double()
    common = torch.minimum(p, q)
    overlap = common.sum(-1)
    tiny = torch.finfo(torch.float64).tiny
    shared = torch.multinomial(common.clamp_min(0) + tiny * (overlap[:, None] <= 0), 1, generator=generator)[:, 0]
    only_p = torch.multinomial((p - q).clamp_min(0) + tiny, 1, generator=generator)[:, 0]
    only_q = torch.multinomial((q - p).clamp_min(0) + tiny, 1, generator=generator)[:, 0]
    same = torch.rand(p.shape[0], dtype=torch.float64, generator=generator) < overlap
    return torch.where(same, shared, only_p), torch.where(same, shared, only_q)


def gradient_noise_scale(grads: torch.Tensor, batch_size: int) -> dict[str, float | None]:
    """How much of a batch gradient is signal, from ``grads`` (n, P): one gradient per rollout, each scaled so that
    a step's gradient is the mean of its ``batch_size`` rollouts'.

    With mu their mean and Sigma their covariance, a step's gradient has signal |mu|^2 and noise tr(Sigma) / B.
    |mu|^2 is estimated without bias by the mean of g_i . g_j over pairs i != j (a 95% interval beside it, from the
    jackknife's standard error); ``noise_scale`` = tr(Sigma) / |mu|^2 is the batch at which they are equal
    (McCandlish et al. 2018's simple noise scale), ``step_snr`` = |mu| / sqrt(tr(Sigma) / B) one step's
    signal-to-noise, and ``steps_for_snr_2`` the number of such steps whose summed gradients reach a
    signal-to-noise of 2 (4 tr(Sigma) / (B |mu|^2)). Where the estimate of |mu|^2 is not positive the gradient
    shows no signal at this n: the three are None."""
    grads = grads.double()
    n = grads.shape[0]
    if n < 3:
        raise ValueError(f"gradient_noise_scale needs at least 3 per-rollout gradients, got {n}.")
    gram = grads @ grads.T  # (n, n): every statistic below comes from it, however many parameters
    total, diagonal, rows = gram.sum(), gram.diagonal(), gram.sum(1)
    signal = float((total - diagonal.sum()) / (n * (n - 1)))
    noise = float((diagonal.sum() - total / n) / (n - 1))  # tr(Sigma_hat)
    left_out = (total - 2 * rows + diagonal - (diagonal.sum() - diagonal)) / ((n - 1) * (n - 2))
    error = float(((n - 1) / n * (left_out - left_out.mean()).pow(2).sum()).sqrt())
    out: dict[str, float | None] = {"rollouts": n, "batch_size": batch_size, "signal": signal,
                                    "signal_low": signal - 1.96 * error, "signal_high": signal + 1.96 * error,
                                    "noise": noise}  # fmt: skip
    found = signal > 0 and noise > 0
    out["noise_scale"] = noise / signal if found else None
    out["step_snr"] = (signal / (noise / batch_size)) ** 0.5 if found else None
    out["steps_for_snr_2"] = 4 * noise / (batch_size * signal) if found else None
    return out
