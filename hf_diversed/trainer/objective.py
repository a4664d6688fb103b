"""The head's RL objective: REINFORCE++ advantages and the PPO clipped surrogate on the law of the emitted token
(nu for a mixture head, lossy SD's for a lenience head), with the acceptance term.

Pure tensor maths; :class:`~hf_diversed.trainer.diversed_trainer.DiversedTrainer` runs the loop around it.
"""

from __future__ import annotations

import torch

from ..generation.verification import LENIENCE_FLOOR

__all__ = [
    "diversed_policy_loss",
    "emitted_prob",
    "lenience_prob",
    "mixture_prob",
    "overlap_near",
    "reinforce_pp_advantages",
    "rejection_prob",
]

# What a lenience head's positions carry beside p(y) and q(y): S(l_old) and dS/dl at the drawing head's l_old.
Lenience = tuple[torch.Tensor, torch.Tensor]


def mixture_prob(w: torch.Tensor, p_y: torch.Tensor, q_y: torch.Tensor) -> torch.Tensor:
    """nu(y) = w p(y) + (1 - w) q(y)."""
    return w * p_y + (1.0 - w) * q_y


def lenience_prob(lenience: torch.Tensor, p_y: torch.Tensor, q_y: torch.Tensor, overlap: torch.Tensor) -> torch.Tensor:
    """Lossy SD's law of the emitted token at lenience l, with S = S(l) = sum_v min(p(v), l q(v)):
    P(y) = min(q(y), p(y) / l) + (1 - S / l) max(0, p(y) - l q(y)) / (1 - S) (accepted draft, else the residual)."""
    tiny = torch.finfo(torch.float32).tiny
    accepted = torch.minimum(q_y, p_y / lenience)
    residual = (p_y - lenience * q_y).clamp_min(0) / (1.0 - overlap).clamp_min(tiny)
    return accepted + (1.0 - overlap / lenience).clamp_min(0) * residual


def overlap_near(lenience: torch.Tensor, lenience_old: torch.Tensor, overlap_old: torch.Tensor, slope: torch.Tensor):
    """S(l) from its value and slope at l_old: the tangent, exact at l_old (so is the gradient there); S is concave,
    so it is an upper bound elsewhere, kept within [0, min(l, 1)] where S lies."""
    tangent = overlap_old + slope * (lenience - lenience_old)
    return torch.minimum(tangent.clamp_min(0), lenience.clamp(max=1.0))


def _lenience(w: torch.Tensor) -> torch.Tensor:
    return w.clamp_min(LENIENCE_FLOOR)  # as DiversedLossy.weights clamps the head's output


def emitted_prob(
    w: torch.Tensor, w_old: torch.Tensor, p_y: torch.Tensor, q_y: torch.Tensor, lenience: Lenience | None = None
) -> torch.Tensor:
    """The law of the emitted token y at each position when the head outputs ``w``: nu(y) for a mixture head; for a
    lenience head (``lenience`` = S and dS/dl at the drawing head's ``w_old``) lossy SD's, S(w) by
    :func:`overlap_near`."""
    if lenience is None:
        return mixture_prob(w, p_y, q_y)
    overlap_old, slope = lenience
    new, old = _lenience(w), _lenience(w_old)
    return lenience_prob(new, p_y, q_y, overlap_near(new, old, overlap_old, slope))


def rejection_prob(
    w: torch.Tensor, w_old: torch.Tensor, tv: torch.Tensor, lenience: Lenience | None = None
) -> torch.Tensor:
    """The probability that a drafted position is rejected: w TV(p, q) for a mixture head, 1 - S(l) / l for a
    lenience head (S as in :func:`emitted_prob`)."""
    if lenience is None:
        return w * tv
    overlap_old, slope = lenience
    new, old = _lenience(w), _lenience(w_old)
    return 1.0 - overlap_near(new, old, overlap_old, slope) / new


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
    lenience: Lenience | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate on the per-token ratio P_theta(y) / P_theta_old(y) of the emitted token's law, plus
    lambda * mean(rejection probability).

    All inputs are (T,) over the emitted drafted positions; ``advantages`` is the sequence advantage broadcast to
    its tokens. For a mixture head P = nu and the rejection probability is w * TV(p, q), so *minimising*
    ``acceptance_coef * mean(w * TV)`` lowers w where p and q differ, which raises acceptance; for a lenience head
    (``lenience`` given, :func:`emitted_prob`) P is lossy SD's law and the rejection probability 1 - S(l) / l, which
    lowers l. Sums are divided by ``normalizer`` (default: the number of positions given), e.g. this process's share
    of the positions of a batch split over data-parallel processes.
    """
    eps = torch.finfo(torch.float32).tiny
    prob = emitted_prob(w, w_old, p_y, q_y, lenience).clamp_min(eps)
    prob_old = emitted_prob(w_old, w_old, p_y, q_y, lenience).clamp_min(eps)
    ratio = prob / prob_old
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * advantages
    n = normalizer if normalizer is not None else max(w.numel(), 1)
    policy_loss = -torch.minimum(unclipped, clipped).sum() / n
    regularizer = rejection_prob(w, w_old, tv, lenience).sum() / n
    loss = policy_loss + acceptance_coef * regularizer
    clip_frac = ((ratio - 1.0).abs() > clip_eps).float().sum() / n
    return loss, {
        "policy_loss": float(policy_loss.detach()),
        "wtv": float(regularizer.detach()),
        "clip_frac": float(clip_frac),
    }
