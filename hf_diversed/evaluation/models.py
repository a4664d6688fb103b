"""Loading a target/draft pair by name (Hub ids, local paths, or the GGUF copies): one path for the demo, the bench,
training and the benchmarks."""

from __future__ import annotations

import torch


def load_pair(target_name: str, draft_name: str, dtype: torch.dtype, weights: str | None = None):
    """Load (tokenizer, target, draft) in eval mode; ``weights`` picks the source of a Hub id's weights
    (:mod:`.weights`); a draft saved with a trimmed vocabulary proposes from it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..modeling.draft_vocabulary import apply_draft_vocabulary
    from .weights import resolve_model

    target_path, draft_path = resolve_model(target_name, weights), resolve_model(draft_name, weights)
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    target = AutoModelForCausalLM.from_pretrained(target_path, dtype=dtype).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_path, dtype=dtype).eval()
    apply_draft_vocabulary(draft)  # a draft saved by `hf-diversed trim-draft` proposes from its kept ids
    return tokenizer, target, draft
