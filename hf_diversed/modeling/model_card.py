"""Model cards of DIVERSED head repositories, rendered from ``model_cards/diversed_head.md``."""

from __future__ import annotations

import re
from pathlib import Path

CARD_TEMPLATE = Path(__file__).resolve().parents[2] / "model_cards" / "diversed_head.md"
CARD_FIELDS = ("repo_id", "target_model", "draft_model", "vocab_size", "task", "training", "evaluation")

# One real row per task for the card's usage example: GSM8K train row 0, MBPP task 602 (train), HumanEval/0.
_EXAMPLE_ROWS: dict[str, dict[str, object]] = {
    "gsm8k": {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?"
    },
    "mbpp": {
        "text": "Write a python function to find the first repeated character in a given string.",
        "test_list": ['assert first_repeated_char("abcabc") == "a"'],
    },
    "humaneval": {
        "prompt": "from typing import List\n\n\n"
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        '    """ Check if in given list of numbers, are any two numbers closer to each other than\n'
        "    given threshold.\n    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n"
        '    >>> has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)\n    True\n    """\n'
    },
}
_ARTICLE_FIELDS = {"cnndm": "article", "xsum": "document"}
_MARK = "\x00ARTICLE\x00"


def _content_literal(content: str) -> str:
    """A parenthesised Python string literal of ``content``, one source line per line of text."""
    lines = content.splitlines(keepends=True)
    return "(\n" + "".join(f"    {line!r}\n" for line in lines) + ")"


def usage_messages(task: str | None) -> str:
    """Python lines defining ``messages``, a prompt in the format the head for ``task`` was trained on.

    A registered task gets its own prompt (:meth:`Task.build_messages`) on a real row, or, for summarization, on
    an ``article`` read from a file; any other task a placeholder to replace.
    """
    from ..evaluation.tasks import TASKS, get_task

    name = (task or "").lower()
    if name not in TASKS:
        return 'messages = [{"role": "user", "content": "..."}]  # a prompt in the format the head was trained on'
    spec = get_task(name)
    if name in _ARTICLE_FIELDS:
        content = spec.build_messages({_ARTICLE_FIELDS[name]: _MARK}, max_words=0)[0]["content"]
        prefix = content.removesuffix(_MARK)
        words = spec.max_article_words
        return (
            f'article = open("article.txt").read()  # the story to summarize (training cut articles to {words} words)\n'
            f'messages = [{{"role": "user", "content": {_content_literal(prefix)} + article}}]'
        )
    content = spec.build_messages(_EXAMPLE_ROWS[name])[0]["content"]
    return f'messages = [{{"role": "user", "content": {_content_literal(content)}}}]'


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
