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


def check_pair(target, draft, head: DiversedHead | None, tokenizer=None) -> None:
    """Decoder-only models over one tokenizer, and a head built for their hidden sizes; each failure names the fix.

    The draft's vocabulary is the target's, or a prefix of it (a padded pair: the target's extra rows are padding,
    and the rules read the draft's law with zeros there, ``draft_vocabulary.pad_draft_logits``). A larger draft
    vocabulary is refused: the draft could propose ids the target lacks. With ``tokenizer`` (the call's), a padded
    draft must cover it."""
    if draft is None:
        raise ValueError(
            "`diversed_head` / `diversed_verifier` need a draft model: pass `assistant_model=draft` "
            "(a smaller causal LM with the target's tokenizer)."
        )
    if target.config.is_encoder_decoder or draft.config.is_encoder_decoder:
        raise ValueError("hf_diversed supports decoder-only (causal LM) target and draft models, not encoder-decoders.")
    check_draft_vocabulary(target, draft, None)  # a trimmed draft's ids must index the target's vocabulary
    t_cfg, d_cfg = target.config.get_text_config(), draft.config.get_text_config()
    if d_cfg.vocab_size > t_cfg.vocab_size:
        raise ValueError(
            f"The target has vocab_size={t_cfg.vocab_size} and the draft {d_cfg.vocab_size}: relaxed verification "
            "mixes the two laws over the target's vocabulary, which must hold the draft's (one tokenizer; a draft "
            "may have fewer ids, the target's extra rows being padding). Use a draft that shares the target's "
            "tokenizer (same family, e.g. Qwen2.5-Coder-0.5B for Qwen2.5-Coder-1.5B)."
        )
    if tokenizer is not None and d_cfg.vocab_size < t_cfg.vocab_size and len(tokenizer) > d_cfg.vocab_size:
        raise ValueError(
            f"The tokenizer has {len(tokenizer)} tokens but the draft's vocabulary only {d_cfg.vocab_size} ids (the "
            f"target's {t_cfg.vocab_size}): a draft with fewer ids than the target must share its tokenizer. Use a "
            "draft of the target's family (e.g. Qwen2.5-0.5B for Qwen2.5-7B)."
        )
    if head is not None:
        head.check_pair(t_cfg.hidden_size, d_cfg.hidden_size)
        check_draft_vocabulary(target, draft, head)
