"""The assisted-decoding loop with a pluggable verification rule.

It is transformers' assisted-decoding loop (same drafting, same target forward, same logits processing,
same cache handling, same crops and outputs) with one step swapped: the acceptance of the drafted block
is decided by a :class:`~hf_diversed.generation.verification.VerificationRule`, which for DIVERSED gets a per-position
weight from the ensemble head fed with the draft's and target's last hidden states. One deliberate
difference in drafting: the draft samples from the user's logits processors applied once, where
transformers' drafter applies the sampling warpers (temperature, top-k, top-p, ...) twice.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from ..modeling.draft_vocabulary import pad_draft_logits, padded_draft_vocab_size
from ..modeling.modeling_diversed_head import (
    DiversedHead,
    distribution_features,
    position_weights,
    reads_distribution_features,
)
from ._compat import (
    ALL_CACHE_NAMES,
    GenerateDecoderOnlyOutput,
    StaticCache,
    prepare_attention_mask,
    prepare_position_ids,
    prepare_token_type_ids,
    split_model_outputs,
)
from .candidate_generator import DiversedCandidateGenerator, LastHiddenStateRecorder
from .stats import DiversedStats
from .trace import Trace
from .verification import LossySD, VerificationRule, lenience_overlap


@dataclass
class DecodingSettings:
    """What a DIVERSED ``generate`` call adds to assisted generation (validated by ``api``)."""

    rule: VerificationRule
    head: DiversedHead | None = None
    num_assistant_tokens: int | None = None
    num_assistant_tokens_schedule: str | None = None
    generator: torch.Generator | None = None
    stats: DiversedStats = field(default_factory=DiversedStats)
    entered: bool = False
    # When a list: one Trace per round that emitted drafted positions (see ``_trace_round``).
    trace: list[Trace] | None = None


@dataclass
class DiversedGenerateOutput(GenerateDecoderOnlyOutput):
    """``GenerateDecoderOnlyOutput`` plus ``diversed_stats`` (:class:`DiversedStats`)."""

    diversed_stats: DiversedStats | None = None


def _trace_round(
    target_recorder,
    candidate_generator,
    new_logits,
    candidate_logits,
    valid_tokens,
    num_accepted: int,
    weight,
    tv,
    candidate_length: int,
    lenience: bool = False,
) -> Trace | None:
    """One round's emitted *drafted* positions (accepted drafts and the correction token, after the EOS / length
    crops; never the bonus token) as a :class:`Trace`; None when the round emitted none. The head's inputs are
    recorded when the loop runs a head; S(l) and its slope with ``lenience`` (a lossy rule's trace)."""
    k = min(valid_tokens.shape[1], candidate_length)
    if k <= 0:
        return None
    tokens = valid_tokens[0, :k]
    p = new_logits[0, :k].float().softmax(-1)
    q = candidate_logits[0, :k].float().softmax(-1)
    w = weight[0, :k].detach().float().to(p.device)
    overlap = overlap_slope = None
    if lenience:  # S(l) and its slope, which only a lenience head's trainer reads
        overlap, overlap_slope = (t.detach().cpu() for t in lenience_overlap(p, q, w))
    h_target = h_draft = None
    if target_recorder is not None and candidate_generator.draft_hidden_states is not None:
        h_target = target_recorder.states[-1][0, -candidate_length - 1 : -1][:k].detach().float().cpu()
        h_draft = candidate_generator.draft_hidden_states[0, :k].detach().float().cpu()
    return Trace(
        tokens=tokens.detach().cpu(),
        p_y=p.gather(-1, tokens.view(-1, 1).to(p.device)).squeeze(-1).detach().cpu(),
        q_y=q.gather(-1, tokens.view(-1, 1).to(q.device)).squeeze(-1).detach().cpu(),
        tv=tv[0, :k].detach().float().cpu(),
        w=w.cpu(),
        accepted=torch.arange(k) < num_accepted,
        top_p=p.argmax(-1).detach().cpu(),
        top_q=q.argmax(-1).detach().cpu(),
        max_p=p.amax(-1).detach().cpu(),
        max_q=q.amax(-1).detach().cpu(),
        h_draft=h_draft,
        h_target=h_target,
        overlap=overlap,
        overlap_slope=overlap_slope,
    )


def assisted_decoding(
    model,
    settings: DecodingSettings,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    inputs_tensor: torch.Tensor | None = None,
    assistant_model=None,
    assistant_tokenizer=None,
    tokenizer=None,
    **model_kwargs,
):
    """Drop-in for ``GenerationMixin._assisted_decoding`` (decoder-only, batch size 1)."""
    settings.entered = True
    if not model_kwargs["use_cache"]:
        raise ValueError("assisted generate requires `use_cache=True`")
    if (
        generation_config.cache_implementation in ["static", "hybrid", "sliding_window"]
        or type(model_kwargs.get("past_key_values")) is StaticCache
    ):
        raise ValueError(
            f"cache_implementation={generation_config.cache_implementation!r} is not supported with speculative "
            "decoding: use cache_implementation='static' (full-attention models) or omit it."
        )
    eos_token_id = getattr(generation_config, "_eos_token_tensor", None)
    cache = model_kwargs.get("past_key_values")
    if cache is None:
        raise RuntimeError("assisted decoding requires a cache")
    cache.activate_past_recording()

    candidate_generator = DiversedCandidateGenerator(
        input_ids=input_ids,
        assistant_model=assistant_model,
        generation_config=generation_config,
        model_kwargs=model_kwargs,
        inputs_tensor=inputs_tensor,
        logits_processor=logits_processor,
        num_assistant_tokens=settings.num_assistant_tokens,
        num_assistant_tokens_schedule=settings.num_assistant_tokens_schedule,
        record_hidden_states=settings.head is not None,
        draft_vocab_size=padded_draft_vocab_size(model, assistant_model),
    )
    target_recorder = LastHiddenStateRecorder(model) if settings.head is not None else None
    stats = settings.stats

    do_sample = generation_config.do_sample
    return_dict_in_generate = generation_config.return_dict_in_generate
    output_scores = return_dict_in_generate and generation_config.output_scores
    output_logits = return_dict_in_generate and generation_config.output_logits
    output_attentions = return_dict_in_generate and generation_config.output_attentions
    output_hidden_states = return_dict_in_generate and generation_config.output_hidden_states
    scores = () if output_scores else None
    raw_logits = () if output_logits else None
    decoder_attentions = () if output_attentions else None
    decoder_hidden_states = () if output_hidden_states else None

    batch_size = input_ids.shape[0]
    unfinished_sequences = torch.ones(batch_size, dtype=torch.long, device=input_ids.device)
    this_peer_finished = False
    is_first_iteration = True
    outputs = None
    while model._has_unfinished_sequences(this_peer_finished, synced_gpus, device=input_ids.device):
        cur_len = input_ids.shape[1]

        # 1. Draft.
        candidate_input_ids, candidate_logits = candidate_generator.get_candidates(input_ids)
        candidate_input_ids = candidate_input_ids.to(model.device)
        candidate_length = candidate_input_ids.shape[1] - cur_len

        # 2. One target forward over the draft (candidate_length + 1 logits).
        candidate_kwargs = copy.copy(model_kwargs)
        candidate_kwargs = prepare_attention_mask(candidate_kwargs, candidate_input_ids.shape[1], False)
        candidate_kwargs = prepare_token_type_ids(candidate_kwargs, candidate_input_ids.shape[1])
        if (position_ids := candidate_kwargs.get("position_ids")) is not None and candidate_length > 0:
            new_length = candidate_length + position_ids.shape[-1]
            candidate_kwargs = prepare_position_ids(candidate_kwargs, new_length, False)
        model_inputs = model.prepare_inputs_for_generation(
            candidate_input_ids,
            next_sequence_length=candidate_length + 1 if not is_first_iteration else None,
            is_first_iteration=is_first_iteration,
            **candidate_kwargs,
        )
        if "logits_to_keep" in model_inputs:
            model_inputs["logits_to_keep"] = candidate_length + 1
        with target_recorder if target_recorder is not None else nullcontext():
            outputs = model(**model_inputs)

        new_logits = outputs.logits[:, -candidate_length - 1 :].to(dtype=torch.float32, device=input_ids.device)
        next_token_logits = new_logits.clone()
        if len(logits_processor) > 0:
            for i in range(candidate_length + 1):
                new_logits[:, i, :] = logits_processor(candidate_input_ids[:, : cur_len + i], new_logits[:, i, :])

        # 3. Verify.
        draft_tokens = candidate_input_ids[:, cur_len:]
        if candidate_logits is None:  # nothing drafted (length budget): the rule reduces to sampling p
            candidate_logits = new_logits[:, :0]
        # a padded pair's q over the target's vocabulary (0 on the target-only ids): the rule, the head's features
        # and the trace all read it
        candidate_logits = pad_draft_logits(
            candidate_logits.to(device=new_logits.device, dtype=torch.float32), new_logits.shape[-1]
        )
        head_weight = new_logits.new_ones(input_ids.shape[0], 0) if settings.head is not None else None
        if settings.head is not None and candidate_length > 0:
            h_target = target_recorder.states[-1][0, -candidate_length - 1 : -1]  # (gamma, D_target): batch size 1
            features = None
            if reads_distribution_features(settings.head):
                p_drafted = new_logits[0, :candidate_length].softmax(-1)
                features = distribution_features(p_drafted, candidate_logits[0].softmax(-1))
            h_draft = candidate_generator.draft_hidden_states[0]
            head_weight = position_weights(settings.head, h_draft, h_target, features)[None].to(new_logits.device)
        verdict = settings.rule.verify(
            draft_tokens,
            candidate_logits,
            new_logits,
            do_sample=do_sample,
            head_weight=head_weight,
            generator=settings.generator,
        )
        n_raw = int(verdict.num_accepted[0])
        num_verified = min(n_raw + 1, candidate_length)
        stats.record_round(
            candidate_length,
            n_raw,
            float(verdict.weight[0, :num_verified].sum()),
            float(verdict.tv[0, :num_verified].sum()),
        )
        valid_tokens = verdict.tokens[:, : n_raw + 1]

        # Crop to the length budget and the first EOS (the stats above keep the raw verdict).
        tokens_budget = generation_config.max_length - input_ids.shape[1]
        if valid_tokens.shape[1] > tokens_budget:
            valid_tokens = valid_tokens[:, :tokens_budget]
        if eos_token_id is not None:
            eos_positions = torch.isin(valid_tokens.squeeze(0), eos_token_id.to(valid_tokens.device)).nonzero()
            if eos_positions.numel() > 0:
                valid_tokens = valid_tokens[:, : eos_positions[0].item() + 1]
        n_matches = valid_tokens.shape[1] - 1
        if settings.trace is not None:
            trace = _trace_round(
                target_recorder,
                candidate_generator,
                new_logits,
                candidate_logits,
                valid_tokens,
                n_raw,
                verdict.weight,
                verdict.tv,
                candidate_length,
                lenience=isinstance(settings.rule, LossySD),
            )
            if trace is not None:
                settings.trace.append(trace)

        # 4. Append, roll back the target cache past the accepted prefix, update the draft schedule.
        input_ids = torch.cat((input_ids, valid_tokens), dim=-1)
        if streamer is not None:
            streamer.put(valid_tokens.cpu())
        new_cur_len = input_ids.shape[1]
        outputs.past_key_values.crop(-(candidate_length - n_matches))
        candidate_generator.update_candidate_strategy(input_ids, new_logits, n_matches)
        model_kwargs = model._update_model_kwargs_for_generation(
            outputs, model_kwargs, is_encoder_decoder=False, num_new_tokens=n_matches + 1
        )
        if synced_gpus and this_peer_finished:
            continue

        if return_dict_in_generate:
            added = n_matches + 1
            if output_scores:
                scores += tuple(new_logits[:, i, :] for i in range(added))
            if output_logits:
                raw_logits += tuple(next_token_logits[:, i, :] for i in range(added))
            added = new_cur_len if is_first_iteration else added
            if output_attentions and outputs.attentions[0] is not None:
                decoder_attentions = split_model_outputs(
                    decoder_attentions, outputs.attentions, cur_len, added, is_decoder_attention=True
                )
            if output_hidden_states:
                decoder_hidden_states = split_model_outputs(
                    decoder_hidden_states, outputs.hidden_states, cur_len, added
                )

        unfinished_sequences = unfinished_sequences & ~stopping_criteria(input_ids, scores)
        this_peer_finished = unfinished_sequences.max() == 0
        is_first_iteration = False

    if streamer is not None:
        streamer.end()
    if candidate_generator.schedule == "heuristic":
        candidate_generator.assistant_model.generation_config.num_assistant_tokens = (
            candidate_generator.num_assistant_tokens
        )
    if not return_dict_in_generate:
        return input_ids
    cache_key = next((key for key in ALL_CACHE_NAMES if key in model_kwargs), None)
    return DiversedGenerateOutput(
        sequences=input_ids,
        scores=scores,
        logits=raw_logits,
        attentions=decoder_attentions,
        hidden_states=decoder_hidden_states,
        past_key_values=model_kwargs[cache_key] if cache_key is not None else None,
        diversed_stats=stats,
    )
