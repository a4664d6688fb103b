"""On-policy rollouts of DIVERSED speculative decoding, with the per-token features the trainer needs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..generation.batched import SamplerConfig, SampleRequest, sample_batched
from ..generation.stats import DiversedStats
from ..generation.trace import Trace
from ..modeling.modeling_diversed_head import DiversedHead

__all__ = [
    "Rollout",
    "collect_rollout",
    "collect_rollouts",
    "load_rollouts",
    "rollout_features",
    "rollouts_trace",
    "rule_weights",
]


@dataclass
class Rollout:
    """One DIVERSED generation: its completion ``completion_ids`` (L,), its statistics, why it stopped
    (``finish_reason``: "eos", it ended on its own, or "length", cut at ``max_new_tokens``), and its
    :class:`~hf_diversed.generation.trace.Trace`: per emitted drafted position t the head's inputs and the
    quantities that define the head's policy nu_t(y) = w_t p_t(y) + (1 - w_t) q_t(y) at the emitted token y_t
    (``trace.w`` is the drawing head's w, the trainer's w_old).
    """

    completion_ids: torch.Tensor
    trace: Trace
    stats: DiversedStats
    finish_reason: str | None = None

    @property
    def num_tokens(self) -> int:
        """Traced positions T."""
        return self.trace.num_positions

    @property
    def cut(self) -> bool:
        """True when the sequence was cut at ``max_new_tokens`` rather than ending on an EOS."""
        return self.finish_reason == "length"


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
    traces: list[Trace] = []
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
        out = target.generate(input_ids, assistant_model=draft, diversed_head=head, _diversed_trace=traces, **kwargs)
    completion = out.sequences[0, input_ids.shape[1] :].detach().cpu()
    eos = kwargs.get("eos_token_id", target.generation_config.eos_token_id)
    eos = set() if eos is None else {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}
    ended = completion.numel() > 0 and int(completion[-1]) in eos
    return Rollout(
        completion_ids=completion,
        trace=Trace.cat(traces, head.config.draft_hidden_size, head.config.target_hidden_size),
        stats=out.diversed_stats,
        finish_reason="eos" if ended else "length",
    )


def collect_rollouts(
    target,
    draft,
    head: DiversedHead | Sequence[DiversedHead],
    prompts: Sequence[torch.Tensor],
    *,
    max_new_tokens: int,
    temperature: float,
    num_assistant_tokens: int,
    seeds: Sequence[int],
    batch_size: int = 32,
    eos_token_id: int | Sequence[int] | None = None,
) -> list[Rollout]:
    """One rollout per prompt, drawn by the batched law-exact sampler
    (:func:`hf_diversed.generation.batched.sample_batched`).

    Each rollout has the law of :func:`collect_rollout` on its prompt (``generate`` with ``pad_token_id`` the
    first EOS id) and the same per-token features; ``batch_size`` rows are decoded together. ``prompts`` are
    token ids without padding, (1, L) or (L,) each; repeat a prompt for several generations (they share one
    prefill). ``seeds`` gives each rollout its own generator: a rollout depends on its prompt, seed and head
    only, not on the batch it fell in nor on the global random state. ``temperature`` 0 decodes greedily.
    ``eos_token_id`` defaults to the target's generation config, as ``generate``. ``head`` is one head for every
    prompt or one per prompt (rollouts of several heads then share the batch). Returned in prompt order.
    The draft's ``generation_config.assistant_confidence_threshold`` must be 0 (the sampler raises otherwise).
    """
    prompts, seeds = list(prompts), [int(s) for s in seeds]
    if len(seeds) != len(prompts):
        raise ValueError(f"collect_rollouts needs one seed per prompt, got {len(seeds)} for {len(prompts)} prompts.")
    heads = list(head) if isinstance(head, Sequence) else [head] * len(prompts)
    if len(heads) != len(prompts):
        raise ValueError(f"collect_rollouts needs one head, or one per prompt; got {len(heads)} for {len(prompts)}.")
    if eos_token_id is None:
        eos_token_id = target.generation_config.eos_token_id
    if isinstance(eos_token_id, Sequence):
        eos_token_id = tuple(int(e) for e in eos_token_id) or None
    do_sample = temperature > 0
    config = SamplerConfig(
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        temperature=float(temperature) if do_sample else 1.0,
        top_k=0,
        top_p=1.0,
        num_assistant_tokens=num_assistant_tokens,
        eos_token_id=eos_token_id,
    )
    requests = [
        SampleRequest(prompt_ids=torch.as_tensor(ids).reshape(-1), rule="diversed", head=h, seed=seed)
        for ids, seed, h in zip(prompts, seeds, heads, strict=True)
    ]
    out: list[Rollout | None] = [None] * len(requests)
    with torch.no_grad():
        for result in sample_batched(target, draft, requests, config, batch_size=batch_size, return_trace=True):
            out[result.index] = Rollout(result.completion_ids, result.trace, result.stats, result.finish_reason)
    return out


def load_rollouts(path) -> list[Rollout]:
    """Rollouts saved with ``torch.save``: a list of them, or ``training/lr_sweep.py``'s blocks of (rows, rollouts,
    age). The file is unpickled: load only files you wrote."""
    data = torch.load(path, weights_only=False)
    rollouts = [r for _, batch, _ in data for r in batch] if data and isinstance(data[0], tuple) else list(data)
    if any("trace" not in vars(r) for r in rollouts):  # pickled before rollouts held a Trace (no tokens, no verdicts)
        raise ValueError(
            f"{path} holds rollouts drawn by an earlier hf-diversed, without per-position tokens and verdicts; draw "
            "them again with this version (training/lr_sweep.py with a new --rollouts_cache)."
        )
    return rollouts


def rollouts_trace(rollouts: Sequence) -> Trace:
    """Every traced position of ``rollouts`` (or of the sampler's results: anything holding a ``trace``), in
    order, as one :class:`Trace`."""
    return Trace.cat([r.trace for r in rollouts])


def rollout_features(rollouts: Sequence) -> torch.Tensor:
    """Every position's distribution features [max p, max q, TV], (sum T, 3) in rollout order."""
    return rollouts_trace(rollouts).distribution_features() if rollouts else torch.zeros(0, 3)


def rule_weights(rule, rollouts: Sequence) -> torch.Tensor:
    """A hand-made rule's w at every position of ``rollouts`` (sum T,), from what they record: a token-class
    rule's from both models' most likely tokens, a speculative cascade's delta from max p, max q and TV."""
    from ..generation.verification import SpecCascade, TokenClassEnsemble

    if not isinstance(rule, (TokenClassEnsemble, SpecCascade)):
        raise ValueError(
            f"Cannot evaluate {rule.spec()!r} on recorded rollouts: its w is not a function of what they record. "
            "Use a token-class rule (token-class:digits:0) or a cascade (cascade-opt:0.1)."
        )
    trace = rollouts_trace(rollouts)
    if isinstance(rule, TokenClassEnsemble):
        return rule.weights_from_top(trace.top_p, trace.top_q)
    return rule.weights_from_stats(trace.max_p, trace.max_q, trace.tv)
