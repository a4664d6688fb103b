"""What a target / draft pair and a call must satisfy, shared by ``generate``'s loops and the batched sampler."""

from __future__ import annotations

from ..modeling.draft_vocabulary import check_draft_vocabulary
from ..modeling.modeling_diversed_head import DiversedHead

# Processors that act on each row of scores alone and never read the generated tokens (the static loop applies them
# to a block of rows at once).
CONTEXT_FREE_PROCESSORS = frozenset(
    {
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "MinPLogitsWarper",
        "TypicalLogitsWarper",
        "EpsilonLogitsWarper",
        "EtaLogitsWarper",
        "LogitNormalization",
    }
)


def check_pair(target, draft, head: DiversedHead | None) -> None:
    """Decoder-only models over one vocabulary (relaxed rules mix p and q token by token), and a head built for
    their hidden sizes; each failure names the fix."""
    if draft is None:
        raise ValueError(
            "`diversed_head` / `diversed_verifier` need a draft model: pass `assistant_model=draft` "
            "(a smaller causal LM with the target's tokenizer)."
        )
    if target.config.is_encoder_decoder or draft.config.is_encoder_decoder:
        raise ValueError("hf_diversed supports decoder-only (causal LM) target and draft models, not encoder-decoders.")
    check_draft_vocabulary(target, draft, None)  # a trimmed draft's ids must index the target's vocabulary
    t_cfg, d_cfg = target.config.get_text_config(), draft.config.get_text_config()
    if t_cfg.vocab_size != d_cfg.vocab_size:
        raise ValueError(
            f"Relaxed verification mixes target and draft distributions over one vocabulary, but the target has "
            f"vocab_size={t_cfg.vocab_size} and the draft {d_cfg.vocab_size}. Use a draft model that shares the "
            "target's tokenizer (same family, e.g. Qwen2.5-Coder-0.5B for Qwen2.5-Coder-1.5B)."
        )
    if head is not None:
        head.check_pair(t_cfg.hidden_size, d_cfg.hidden_size)
        check_draft_vocabulary(target, draft, head)
