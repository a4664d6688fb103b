"""A draft that proposes from a trimmed vocabulary: only its LM head's rows for K kept token ids are computed.

The draft's distribution stays on the full vocabulary, with zero mass outside the kept ids:

    q_K(x) = q(x) / q(kept)  for x in kept,   q_K(x) = 0 otherwise,

i.e. the softmax of the kept logits (the other logits are -inf). Every verification rule then reads q_K where
it read q: exact SD still outputs exactly p (the residual norm(max(0, p - q_K)) restores the mass of the
dropped ids), the relaxed rules mix p with q_K, and the DIVERSED head reads the same hidden states (trimming
changes the LM head only).

Saved like any model: ``trim_draft_vocabulary`` records the kept ids in ``config.diversed_draft_vocabulary``
and leaves the weights untouched, so ``save_pretrained`` writes an ordinary checkpoint whose config carries
the set; hf_diversed trims the head in memory when such a draft enters ``generate`` or the batched sampler
(``apply_draft_vocabulary``). Without hf_diversed the checkpoint loads and runs with its full vocabulary.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import logging
import zlib
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

logger = logging.getLogger(__name__)

CONFIG_KEY = "diversed_draft_vocabulary"
_WARNED: set[tuple[str | None, str | None]] = set()  # (head's, draft's) vocabularies already warned about


class TrimmedLMHead(nn.Module):
    """LM head computing only the rows of ``keep_ids``; the other logits are -inf.

    ``weight`` (and ``bias``) are the original head's parameters, shared, so the state dict (and weight tying
    with the input embeddings) is the untrimmed model's; the kept rows are a non-persistent copy.
    """

    def __init__(self, head: nn.Module, keep_ids: torch.Tensor):
        super().__init__()
        self.weight = head.weight
        self.bias = head.bias
        self.vocab_size = head.weight.shape[0]
        keep_ids = keep_ids.to(device=head.weight.device, dtype=torch.long)
        self.register_buffer("keep_ids", keep_ids, persistent=False)
        self.register_buffer("rows", head.weight.detach()[keep_ids].clone(), persistent=False)
        bias = head.bias.detach()[keep_ids].clone() if head.bias is not None else None
        self.register_buffer("rows_bias", bias, persistent=False)

    @property
    def in_features(self) -> int:
        return self.rows.shape[1]

    @property
    def out_features(self) -> int:
        return self.vocab_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        kept = nn.functional.linear(hidden, self.rows, self.rows_bias)
        logits = kept.new_full((*kept.shape[:-1], self.vocab_size), float("-inf"))
        return logits.index_copy_(-1, self.keep_ids, kept)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, kept={self.keep_ids.numel()} of {self.vocab_size}"


# ------------------------------------------------------------------------------------------------ the kept set


def encode_ids(ids: torch.Tensor, vocab_size: int) -> str:
    """The set as a zlib-compressed bitmask over the vocabulary (bit i of byte j is id 8j+i), base64."""
    mask = np.zeros(vocab_size, dtype=bool)
    mask[np.asarray(ids)] = True
    return base64.b64encode(zlib.compress(np.packbits(mask, bitorder="little").tobytes(), 9)).decode("ascii")


def decode_ids(text: str, vocab_size: int) -> torch.Tensor:
    """Inverse of :func:`encode_ids`: the sorted kept ids."""
    return _decoded(text, vocab_size).clone()


@functools.lru_cache(maxsize=8)
def _decoded(text: str, vocab_size: int) -> torch.Tensor:
    # cached: generate and the sampler check a draft's record once per call / request
    bits = np.frombuffer(zlib.decompress(base64.b64decode(text)), dtype=np.uint8)
    mask = np.unpackbits(bits, count=vocab_size, bitorder="little").astype(bool)
    return torch.from_numpy(np.flatnonzero(mask)).long()


def fingerprint(ids: torch.Tensor) -> str:
    """Short digest of a kept set (the head's provenance records which draft vocabulary it was trained with)."""
    data = ",".join(map(str, sorted(ids.tolist()))).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def count_tokens(corpus: Iterable[str], tokenizer) -> Counter:
    """How often each token id occurs in the texts of ``corpus`` (tokenized without special tokens)."""
    texts = list(corpus)
    for text in texts:
        if not isinstance(text, str):
            raise ValueError(f"`corpus` must yield strings (texts to count tokens on), got {type(text).__name__}.")
    counts: Counter = Counter()
    for start in range(0, len(texts), 256):
        for ids in tokenizer(texts[start : start + 256], add_special_tokens=False)["input_ids"]:
            counts.update(ids)
    return counts


def _always_kept(model, tokenizer) -> set[int]:
    """EOS/pad/BOS ids of the model and its generation config, and the tokenizer's special and added tokens."""
    ids: set[int] = set()
    for config in (model.config.get_text_config(), getattr(model, "generation_config", None)):
        for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
            value = getattr(config, name, None) if config is not None else None
            if value is not None:
                ids.update([value] if isinstance(value, int) else value)
    if tokenizer is not None:
        ids.update(tokenizer.all_special_ids)
        ids.update(getattr(tokenizer, "added_tokens_decoder", {}).keys())
    return ids


# ------------------------------------------------------------------------------------------------ public


def trim_draft_vocabulary(
    draft,
    *,
    keep: Iterable[int] | torch.Tensor | None = None,
    size: int | None = None,
    corpus: Iterable[str] | None = None,
    tokenizer=None,
    source: str | None = None,
):
    """Let ``draft`` propose only from a set of token ids; returns ``draft``, trimmed in place.

    Either ``keep`` (the ids) or ``size=K`` with ``corpus`` (texts) and ``tokenizer``: the K ids most frequent
    in the corpus; where the corpus has fewer than K distinct ids, the rest are the lowest unseen ids (a BPE
    vocabulary is ordered by merge, roughly by frequency in the tokenizer's own corpus). EOS, pad, BOS and the
    tokenizer's special tokens are always kept (``size`` counts them).
    The set is recorded in ``draft.config.diversed_draft_vocabulary``, so ``draft.save_pretrained(dir)``
    saves it; the weights are unchanged. ``source`` describes the corpus in that record.

    Drafting from the trimmed set changes q to q_K (q renormalised on the kept ids): exact SD still outputs p;
    the relaxed rules mix p with q_K.
    """
    head = _linear_head(draft)
    vocab_size = head.weight.shape[0]
    if (keep is None) == (size is None):
        raise ValueError(
            "Pass exactly one of `keep` (the token ids to keep) or `size` (how many of the corpus' most frequent "
            "ids to keep, with `corpus=` texts and `tokenizer=`)."
        )
    always = _always_kept(draft, tokenizer)
    if keep is not None:
        if corpus is not None:
            raise ValueError("`corpus` only ranks ids for `size=K`; with `keep=` ids, drop `corpus`.")
        ids = torch.as_tensor(list(keep) if not isinstance(keep, torch.Tensor) else keep, dtype=torch.long).flatten()
        if ids.numel() == 0:
            raise ValueError("`keep` is empty: pass the token ids the draft may propose.")
        bad = ids[(ids < 0) | (ids >= vocab_size)]
        if bad.numel():
            raise ValueError(
                f"`keep` holds ids outside the draft's vocabulary [0, {vocab_size}): {bad[:5].tolist()}. "
                "Pass ids of this draft's tokenizer."
            )
        kept = set(ids.tolist()) | always
        description = source or "given ids"
    else:
        if not isinstance(size, int) or not 0 < size <= vocab_size:
            raise ValueError(f"`size` must be an int in [1, {vocab_size}] (the draft's vocabulary), got {size!r}.")
        if corpus is None or tokenizer is None:
            raise ValueError(
                "`size=K` keeps the K ids most frequent in a corpus: pass `corpus=` (an iterable of texts, e.g. the "
                "task's train split; `hf-diversed trim-draft --task gsm8k` builds it) and the draft's `tokenizer=`."
            )
        counts = count_tokens(corpus, tokenizer)
        if not counts:
            raise ValueError("`corpus` has no tokens: pass texts of the task the draft will serve.")
        kept = {i for i in always if i < vocab_size}
        if len(kept) > size:
            raise ValueError(f"`size={size}` is smaller than the {len(kept)} special tokens always kept; raise it.")
        ranked = [token for token, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
        for token in itertools.chain(ranked, range(vocab_size)):  # unseen ids follow in id (BPE merge) order
            if len(kept) == size:
                break
            if token < vocab_size:
                kept.add(token)
        description = source or f"{sum(counts.values())} tokens counted"
    ids = torch.tensor(sorted(i for i in kept if i < vocab_size), dtype=torch.long)
    record = {"size": int(ids.numel()), "vocab_size": vocab_size, "source": description,
              "fingerprint": fingerprint(ids), "ids": encode_ids(ids, vocab_size)}  # fmt: skip
    setattr(draft.config, CONFIG_KEY, record)
    _install(draft, ids, force=True)
    return draft


def draft_vocabulary_ids(model) -> torch.Tensor | None:
    """The kept ids recorded in ``model``'s config (sorted), or None for a draft with its full vocabulary."""
    record = _record(model)
    return decode_ids(record["ids"], int(record["vocab_size"])) if record is not None else None


def draft_vocabulary_fingerprint(model) -> str | None:
    record = _record(model)
    return record.get("fingerprint") if record is not None else None


def apply_draft_vocabulary(model) -> torch.Tensor | None:
    """Trim ``model``'s LM head in memory to the ids its config records (idempotent); returns them, or None."""
    record = _record(model)
    if record is None:
        return None
    linear = _linear_head(model)
    vocab_size = linear.weight.shape[0]
    if int(record["vocab_size"]) != vocab_size:
        raise ValueError(
            f"The draft's config records a trimmed vocabulary for {record['vocab_size']} ids, but its LM head has "
            f"{vocab_size} rows. Trim this draft again with hf_diversed.trim_draft_vocabulary, or delete "
            f"`{CONFIG_KEY}` from its config.json."
        )
    ids = decode_ids(record["ids"], vocab_size)
    _install(model, ids, force=False)
    return ids


def check_draft_vocabulary(target, draft, head=None) -> None:
    """A trimmed draft's ids must index the target's vocabulary; a head trained with another draft vocabulary
    still applies (it reads hidden states, which trimming leaves alone) but was fitted to another q: warn."""
    ids = draft_vocabulary_ids(draft)
    target_vocab = target.config.get_text_config().vocab_size
    if ids is not None and ids.numel() and int(ids.max()) >= target_vocab:
        raise ValueError(
            f"The draft's trimmed vocabulary holds ids up to {int(ids.max())}, but the target's vocabulary has "
            f"{target_vocab} ids. Trim the draft with the target's tokenizer (ids < {target_vocab})."
        )
    if head is not None:
        note_head_draft_vocabulary(head, draft_vocabulary_fingerprint(draft))


def note_head_draft_vocabulary(head, current: str | None) -> None:
    """Warn (once per pair of vocabularies) when ``head`` was trained with another draft vocabulary than
    ``current`` (a fingerprint; None: the full vocabulary)."""
    trained_with = getattr(head.config, "draft_vocabulary", None)
    if trained_with != current and (trained_with, current) not in _WARNED:
        _WARNED.add((trained_with, current))
        logger.warning(
            "The DIVERSED head was trained with %s and the draft proposes from %s. The head reads hidden states, "
            "which trimming does not change, so it applies; its weights were fitted to the other draft "
            "distribution. Train a head with this draft (training/train.py --draft DIR) for the best trade-off.",
            "the full draft vocabulary" if trained_with is None else f"trimmed draft vocabulary {trained_with}",
            "its full vocabulary" if current is None else f"trimmed vocabulary {current}",
        )


# ------------------------------------------------------------------------------------------------ padded pairs
# A draft whose vocabulary is a prefix of the target's: one tokenizer, and the target's extra embedding rows are
# padding (Qwen2.5 7B and up have 152,064 ids, 0.5B-3B 151,936; Gemma 3 4B and up 262,208, 1B 262,144). The draft
# never proposes a target-only id, so its law over the target's vocabulary is
#
#     q_pad(x) = q(x)  for x < V_draft,   q_pad(x) = 0  for V_draft <= x < V_target,
#
# and every rule reads q_pad where it reads q: exact SD still outputs p over all V_target ids (the residual
# norm(max(0, p - q_pad)) carries p's mass on the target-only ids), the mixtures mix p with q_pad, and the head's
# features (max p, max q, TV) are those of p and q_pad.


def padded_draft_vocab_size(target, draft) -> int | None:
    """The draft's vocabulary size V_draft when it is a strict prefix of the target's (a padded pair), else None.

    Only the sizes are compared: that the draft's ids mean the target's tokens (one tokenizer) is the caller's
    promise; ``generation.checks.check_pair`` refuses a draft whose vocabulary is larger than the target's."""
    target_vocab = target.config.get_text_config().vocab_size
    draft_vocab = draft.config.get_text_config().vocab_size
    return draft_vocab if draft_vocab < target_vocab else None


def pad_draft_logits(draft_logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The draft's logits (..., V_draft) over the target's vocabulary (..., ``vocab_size``): -inf on the
    target-only ids, so their softmax is q_pad. Unchanged when the widths already agree."""
    extra = vocab_size - draft_logits.shape[-1]
    if extra == 0:
        return draft_logits
    if extra < 0:
        raise ValueError(
            f"The draft scores {draft_logits.shape[-1]} ids and the target {vocab_size}: a draft may only propose "
            "ids of the target's vocabulary. Use a draft that shares the target's tokenizer."
        )
    return torch.nn.functional.pad(draft_logits, (0, extra), value=float("-inf"))


def draft_input_ids(input_ids: torch.Tensor, draft_vocab_size: int | None) -> torch.Tensor:
    """``input_ids`` as the draft reads them: a target-only id (>= V_draft, which only the target can emit) becomes
    V_draft - 1, a row the draft can embed (in Qwen2.5's padded pairs itself padding). The draft's q is whatever it
    computes from its context, so the verification stays exact; ``None`` (one vocabulary) changes nothing."""
    if draft_vocab_size is None:
        return input_ids
    return input_ids.clamp(max=draft_vocab_size - 1)


# ------------------------------------------------------------------------------------------------ internals


def _record(model) -> dict[str, Any] | None:
    config = model.config
    record = getattr(config, CONFIG_KEY, None)
    if record is None and hasattr(model, "get_base_model"):  # a PEFT-wrapped draft
        record = getattr(model.get_base_model().config, CONFIG_KEY, None)
    if record is not None and not (isinstance(record, dict) and {"ids", "vocab_size", "size"} <= record.keys()):
        raise ValueError(
            f"`config.{CONFIG_KEY}` is malformed (expected the record hf_diversed.trim_draft_vocabulary writes). "
            "Trim the draft again or delete the entry from its config.json."
        )
    return record


def _owner(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _current_head(model) -> nn.Module | None:
    return _owner(model).get_output_embeddings()


def _linear_head(model) -> nn.Linear:
    head = _current_head(model)
    if isinstance(head, TrimmedLMHead):
        return head
    if not isinstance(head, nn.Linear):
        raise ValueError(
            f"{type(_owner(model)).__name__}'s LM head is {type(head).__name__}, not an nn.Linear; a trimmed "
            "draft vocabulary needs a causal LM with a linear output embedding."
        )
    return head


def _install(model, ids: torch.Tensor, force: bool) -> None:
    owner = _owner(model)
    head = _linear_head(model)
    if not force and isinstance(head, TrimmedLMHead) and torch.equal(head.keep_ids.cpu(), ids):
        return
    owner.set_output_embeddings(TrimmedLMHead(head, ids))
