"""The head's RL objective: REINFORCE++ advantages and the PPO clipped surrogate on nu, with the acceptance term.

Pure tensor maths; :class:`~hf_diversed.trainer.diversed_trainer.DiversedTrainer` runs the loop around it.
"""

from __future__ import annotations

import torch

__all__ = ["diversed_policy_loss", "mixture_prob", "reinforce_pp_advantages"]


def mixture_prob(w: torch.Tensor, p_y: torch.Tensor, q_y: torch.Tensor) -> torch.Tensor:
    """nu(y) = w p(y) + (1 - w) q(y)."""
    return w * p_y + (1.0 - w) * q_y


def reinforce_pp_advantages(grouped: torch.Tensor, everything: torch.Tensor | None = None) -> torch.Tensor:
    """REINFORCE++ advantages of this process's rewards ``grouped`` (prompts, generations), flattened.

    A = (r - b) / std(r - b) with b the mean of the prompt's generations (one generation: the mean of the whole
    step); the std is over ``everything``, the step's rewards on all processes (default: ``grouped``)."""
    everything = grouped if everything is None else everything
    if grouped.shape[1] > 1:
        centered_all = everything - everything.mean(1, keepdim=True)
        centered = grouped - grouped.mean(1, keepdim=True)
    else:
        centered_all = everything - everything.mean()
        centered = grouped - everything.mean()
    std = centered_all.std() if centered_all.numel() > 1 else torch.tensor(0.0)
    return (centered / (std + 1e-8)).view(-1)


def diversed_policy_loss(
    w: torch.Tensor,
    w_old: torch.Tensor,
    p_y: torch.Tensor,
    q_y: torch.Tensor,
    tv: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_eps: float,
    acceptance_coef: float,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate on the per-token ratio nu_theta / nu_theta_old, plus lambda * mean(w * TV).

    All inputs are (T,) over the emitted drafted positions; ``advantages`` is the sequence advantage
    broadcast to its tokens. Acceptance probability at a drafted position is 1 - w * TV(p, q), so
    *minimising* ``acceptance_coef * mean(w * TV)`` lowers w where p and q differ, which raises acceptance.
    Sums are divided by ``normalizer`` (default: the number of positions given), e.g. this process's share of the
    positions of a batch split over data-parallel processes.
    """
    eps = torch.finfo(torch.float32).tiny
    nu = mixture_prob(w, p_y, q_y).clamp_min(eps)
    nu_old = mixture_prob(w_old, p_y, q_y).clamp_min(eps)
    ratio = nu / nu_old
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * advantages
    n = normalizer if normalizer is not None else max(w.numel(), 1)
    policy_loss = -torch.minimum(unclipped, clipped).sum() / n
    regularizer = (w * tv).sum() / n
    loss = policy_loss + acceptance_coef * regularizer
    clip_frac = ((ratio - 1.0).abs() > clip_eps).float().sum() / n
    return loss, {
        "policy_loss": float(policy_loss.detach()),
        "wtv": float(regularizer.detach()),
        "clip_frac": float(clip_frac),
    }
