"""Model cards of DIVERSED head repositories, rendered from ``model_cards/diversed_head.md``."""

from __future__ import annotations

import re
from pathlib import Path

CARD_TEMPLATE = Path(__file__).resolve().parents[2] / "model_cards" / "diversed_head.md"
CARD_FIELDS = ("repo_id", "target_model", "draft_model", "vocab_size", "task", "training", "evaluation")


def render_head_card(**values: object) -> str:
    """The README.md of a head repository; ``values`` fill :data:`CARD_FIELDS` (all required)."""
    missing = [name for name in CARD_FIELDS if name not in values]
    if missing:
        raise ValueError(f"render_head_card needs {', '.join(missing)}.")
    if CARD_TEMPLATE.is_file():
        return CARD_TEMPLATE.read_text().format(**values)
    # Installed without the repository's model_cards/ folder: a minimal card with the same facts.
    return (
        f"# DIVERSED ensemble head: {values['task']}\n\nTarget `{values['target_model']}`, draft "
        f'`{values["draft_model"]}`; use `diversed_head="{values["repo_id"]}"`.\n\n'
        f"## Training\n\n{values['training']}\n\n## Evaluation\n\n{values['evaluation']}\n"
    )


def card_section(card: str, title: str) -> str | None:
    """The body of the ``## {title}`` section of a Markdown card (None if absent)."""
    match = re.search(rf"^## {re.escape(title)}[ \t]*\n(.*?)(?=^## |\Z)", card, flags=re.MULTILINE | re.DOTALL)
    return match.group(1).strip() if match else None
