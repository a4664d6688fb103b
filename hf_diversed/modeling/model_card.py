"""Model cards of DIVERSED head repositories, rendered from ``model_cards/diversed_head.md``."""

from __future__ import annotations

import re
from pathlib import Path

CARD_TEMPLATE = Path(__file__).resolve().parents[2] / "model_cards" / "diversed_head.md"
CARD_FIELDS = ("repo_id", "target_model", "draft_model", "vocab_size", "task", "training", "evaluation")

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


def render_head_card(**values: object) -> str:
    """The README.md of a head repository; ``values`` fill :data:`CARD_FIELDS` (all required)."""
    missing = [name for name in CARD_FIELDS if name not in values]
    if missing:
        raise ValueError(f"render_head_card needs {', '.join(missing)}.")
    if CARD_TEMPLATE.is_file():
        return CARD_TEMPLATE.read_text().format(messages=usage_messages(str(values["task"] or "")), **values)
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
