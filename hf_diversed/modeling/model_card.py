"""Model cards of DIVERSED head repositories, rendered from ``model_cards/diversed_head.md`` (package data)."""

from __future__ import annotations

import re
from pathlib import Path

CARD_TEMPLATE = Path(__file__).resolve().parent / "model_cards" / "diversed_head.md"
CARD_FIELDS = ("repo_id", "target_model", "draft_model", "vocab_size", "task", "weights", "training", "evaluation")

USAGE_DIR = CARD_TEMPLATE.parent / "usage"  # <task>.py: the lines defining `messages` in the task's prompt format


def usage_messages(task: str | None) -> str:
    """Python lines defining ``messages`` and ``max_new_tokens`` for the card's usage example:
    ``model_cards/usage/<task>.py`` (a prompt in the format the head for ``task`` was trained on, and the length it
    was trained at), or a placeholder for a task without one."""
    name = (task or "").lower()
    path = USAGE_DIR / f"{name}.py"
    if re.fullmatch(r"[a-z0-9_-]+", name) and path.is_file():
        return path.read_text().rstrip("\n")
    return (
        'messages = [{"role": "user", "content": "..."}]  # a prompt in the format the head was trained on\n'
        "max_new_tokens = 256"
    )


# What the head's output sets (its config's ``verification``), as the card says it.
RULE_SENTENCES = {
    "mixture": "a weight w_t in [0, 1]; the target verifies against nu_t = w_t * p_t + (1 - w_t) * q_t (acceptance "
    "1 - w_t * TV(p_t, q_t)).",
    "lenience": "lossy SD's lenience l_t in (0, 1] (a lenience head): a drafted x is accepted with probability "
    "min(1, p_t(x) / (l_t q_t(x))), and a rejection resamples from norm(max(0, p_t - l_t q_t)).",
}
CUSTOM_GENERATE = {
    "mixture": CARD_TEMPLATE.parent / "custom_generate.md",  # the repository's standalone generate, how to call it
    "lenience": "This head sets lossy SD's lenience, which the standalone `custom_generate` of head repositories "
    "does not run: install hf-diversed as above.",
}


def render_head_card(verification: str = "mixture", **values: object) -> str:
    """The README.md of a head repository; ``values`` fill :data:`CARD_FIELDS` (all required); ``verification`` is
    the head config's (what its output sets)."""
    missing = [name for name in CARD_FIELDS if name not in values]
    if missing:
        raise ValueError(f"render_head_card needs {', '.join(missing)}.")
    section = CUSTOM_GENERATE[verification]
    section = section.read_text().rstrip("\n") if isinstance(section, Path) else section
    text = CARD_TEMPLATE.read_text().replace("{custom_generate}", section)
    return text.format(messages=usage_messages(str(values["task"] or "")), rule=RULE_SENTENCES[verification], **values)


def weights_sentence(training_weights: dict | None) -> str:
    """The card's sentence on which weights of the pair a head was trained and measured on."""
    records = [(role, (training_weights or {}).get(role)) for role in ("target", "draft")]
    if not all(record for _, record in records):
        return "not recorded."
    if all(record.get("weights") == "gguf" for _, record in records):
        hashes = ", ".join(
            f"{role} `{record.get('gguf_file')}` sha256 `{record.get('sha256')}`" for role, record in records
        )
        quant = "/".join(sorted({str(record.get("quantization")) for _, record in records}))
        return (
            f"the {quant} GGUF copies of these models (4-bit quantized, dequantized to float32; {hashes}), not "
            "their original weights: its behaviour on the original weights has not been measured."
        )
    return "; ".join(f"{role}: {record.get('name_or_path') or record.get('hub_id')} ({record.get('weights')})"
                     for role, record in records) + "."  # fmt: skip


def card_section(card: str, title: str) -> str | None:
    """The body of the ``## {title}`` section of a Markdown card (None if absent)."""
    match = re.search(rf"^## {re.escape(title)}[ \t]*\n(.*?)(?=^## |\Z)", card, flags=re.MULTILINE | re.DOTALL)
    return match.group(1).strip() if match else None
