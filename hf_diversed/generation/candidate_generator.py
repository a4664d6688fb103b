"""Draft side of DIVERSED: transformers' assisted drafting, plus the draft's last hidden states."""

from __future__ import annotations

import torch
from torch import nn

from ..modeling.draft_vocabulary import draft_input_ids
from ._compat import (
    AssistedCandidateGenerator,
    CandidateGenerator,
    apply_draft_warpers_once,
    draft_with_config_only,
)


class LastHiddenStateRecorder:
    """Context manager recording the input of a model's output embedding (its LM head).

    That input is the last, post-norm hidden state at exactly the positions whose logits the forward
    computes, so no extra forward pass and no ``output_hidden_states`` are needed.
    """

    def __init__(self, model: nn.Module):
        module = model.get_output_embeddings()
        if module is None:
            raise ValueError(
                f"{type(model).__name__} has no output embedding (LM head) to read hidden states from; "
                "DIVERSED needs causal LMs with `get_output_embeddings()`."
            )
        self.module = module
        self.states: list[torch.Tensor] = []
        self._handle = None

    def _hook(self, module, args, kwargs):
        hidden = args[0] if args else next(iter(kwargs.values()))
        self.states.append(hidden.detach())

    def __enter__(self) -> LastHiddenStateRecorder:
        self.states = []
        self._handle = self.module.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()
        self._handle = None


class DiversedCandidateGenerator(CandidateGenerator):
    """Drafts with transformers' ``AssistedCandidateGenerator`` and keeps the draft's last hidden states.

    After ``get_candidates``, ``draft_hidden_states`` is ``(B, gamma, D_draft)``: row t is the hidden state
    at the position that predicts drafted token t (it depends on the context only). Drafting, its
    randomness, logits processors and ``num_assistant_tokens`` schedules are transformers' own, with one
    change: the draft samples from the target's logits processors (sampling warpers included) applied once to
    its logits, where transformers' drafter applies the warpers twice (see ``_compat.apply_draft_warpers_once``).
    ``num_assistant_tokens`` / ``num_assistant_tokens_schedule``, when given, override the draft model's
    generation config for this call. ``draft_vocab_size`` (a padded pair's V_draft): the draft reads the
    target-only ids of its context as ``draft_vocabulary.draft_input_ids`` maps them.
    """

    def __init__(
        self,
        input_ids: torch.LongTensor,
        assistant_model: nn.Module,
        generation_config,
        model_kwargs: dict,
        inputs_tensor: torch.Tensor | None = None,
        logits_processor=None,
        *,
        num_assistant_tokens: int | None = None,
        num_assistant_tokens_schedule: str | None = None,
        record_hidden_states: bool = True,
        draft_vocab_size: int | None = None,
    ):
        self.drafter = AssistedCandidateGenerator(
            input_ids=input_ids,
            assistant_model=assistant_model,
            generation_config=generation_config,
            model_kwargs=model_kwargs,
            inputs_tensor=inputs_tensor,
            logits_processor=logits_processor,
        )
        apply_draft_warpers_once(self.drafter)
        draft_with_config_only(self.drafter)  # generation kwargs beside a config: a deprecation warning
        if num_assistant_tokens is not None:
            self.drafter.num_assistant_tokens = num_assistant_tokens
        if num_assistant_tokens_schedule is not None:
            self.drafter.assistant_generation_config.num_assistant_tokens_schedule = num_assistant_tokens_schedule
        self.recorder = LastHiddenStateRecorder(assistant_model) if record_hidden_states else None
        self.draft_hidden_states: torch.Tensor | None = None
        self.draft_vocab_size = draft_vocab_size

    @property
    def assistant_model(self) -> nn.Module:
        return self.drafter.assistant_model

    @property
    def num_assistant_tokens(self) -> int:
        return self.drafter.num_assistant_tokens

    @property
    def schedule(self) -> str:
        return self.drafter.assistant_generation_config.num_assistant_tokens_schedule

    def get_candidates(self, input_ids: torch.LongTensor, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
        if self.draft_vocab_size is not None:  # the draft drafts after its reading of the context
            candidate_ids, candidate_logits = self._get_candidates(draft_input_ids(input_ids, self.draft_vocab_size))
            drafted = candidate_ids[:, input_ids.shape[1] :].to(input_ids.device)
            return torch.cat([input_ids, drafted], dim=1), candidate_logits
        return self._get_candidates(input_ids)

    def _get_candidates(self, input_ids: torch.LongTensor) -> tuple[torch.LongTensor, torch.Tensor | None]:
        if self.recorder is None:
            return self.drafter.get_candidates(input_ids)
        with self.recorder:
            candidate_ids, candidate_logits = self.drafter.get_candidates(input_ids)
        steps = self.recorder.states
        self.draft_hidden_states = torch.cat([h[:, -1:] for h in steps], dim=1) if steps else None
        return candidate_ids, candidate_logits

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int):
        self.drafter.update_candidate_strategy(input_ids, scores, num_matches)
