"""On-policy rollouts of DIVERSED speculative decoding, with the per-token features the trainer needs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .modeling_diversed_head import DiversedHead
from .stats import DiversedStats

__all__ = ["Rollout", "collect_rollout"]


@dataclass
class Rollout:
    """One DIVERSED generation and, per emitted *drafted* position t (accepted drafts and correction tokens;
    bonus tokens are not included, their law is p whatever the head), the head's inputs and the quantities
    that define the head's policy nu_t(y) = w_t p_t(y) + (1 - w_t) q_t(y) at the emitted token y_t.

    Shapes: ``completion_ids`` (L,), ``h_draft`` (T, D_draft), ``h_target`` (T, D_target), ``p_y``, ``q_y``,
    ``tv``, ``w_old`` (T,); float32 on CPU.
    """

    completion_ids: torch.Tensor
    h_draft: torch.Tensor
    h_target: torch.Tensor
    p_y: torch.Tensor
    q_y: torch.Tensor
    tv: torch.Tensor
    w_old: torch.Tensor
    stats: DiversedStats

    @property
    def num_tokens(self) -> int:
        return int(self.p_y.shape[0])


def collect_rollout(
    target,
    draft,
    head: DiversedHead,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    num_assistant_tokens: int,
    **generate_kwargs,
) -> Rollout:
    """Generate once with ``target.generate(..., assistant_model=draft, diversed_head=head)`` and trace it.

    ``input_ids`` is one prompt, shape (1, L) or (L,). ``temperature`` > 0 samples (the on-policy law);
    0 decodes greedily. Models run under ``torch.no_grad``.
    """
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    input_ids = input_ids.to(target.device)
    trace: list[dict] = []
    do_sample = temperature > 0
    kwargs = dict(
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        num_assistant_tokens=num_assistant_tokens,
        return_dict_in_generate=True,
        attention_mask=torch.ones_like(input_ids),
    )
    if do_sample:
        kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
    if target.generation_config.pad_token_id is None and "pad_token_id" not in generate_kwargs:
        eos = target.generation_config.eos_token_id
        kwargs["pad_token_id"] = eos[0] if isinstance(eos, list) else eos
    kwargs.update(generate_kwargs)
    with torch.no_grad():
        out = target.generate(input_ids, assistant_model=draft, diversed_head=head, _diversed_trace=trace, **kwargs)
    completion = out.sequences[0, input_ids.shape[1] :].detach().cpu()
    dt, dd = head.config.target_hidden_size, head.config.draft_hidden_size

    def cat(key: str, width: int | None = None) -> torch.Tensor:
        parts = [entry[key] for entry in trace]
        if parts:
            return torch.cat(parts, 0)
        return torch.zeros((0, width) if width is not None else (0,), dtype=torch.float32)

    return Rollout(
        completion_ids=completion,
        h_draft=cat("h_draft", dd),
        h_target=cat("h_target", dt),
        p_y=cat("p_y"),
        q_y=cat("q_y"),
        tv=cat("tv"),
        w_old=cat("w"),
        stats=out.diversed_stats,
    )
