"""Every relative link in README.md, docs/*.md and the record folders' README.md files under docs/ resolves: to an
existing file, and for ``#anchor`` links into a Markdown file, to one of its headings (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "docs").glob("*/**/README.md")),  # the record folders' measurement logs
    REPO / "benchmarks" / "README.md",
]
# [text](target) and ![alt](target), the target up to a space (an optional "title") or the closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.MULTILINE)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")


def _prose(text: str) -> str:
    """The page without code blocks and code spans, where a bracket is code, not a link."""
    return CODE.sub("", FENCE.sub("", text))


def links(text: str) -> list[str]:
    prose = _prose(text)
    return LINK.findall(prose) + REFERENCE.findall(prose)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped (hyphens and underscores kept),
    spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link keeps its text
    text = re.sub(r"[`*]", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of ``page``'s headings, a repeated heading numbered as GitHub does (x, x-1, x-2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = anchor(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken(page: Path) -> list[str]:
    """The relative links of ``page`` that point nowhere, each with why."""
    problems = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # https:, mailto:, ...
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and resolved.is_file() and fragment not in anchors(resolved):
            problems.append(f"{target}: no heading #{fragment} there")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    assert broken(page) == []


def test_the_check_sees_a_broken_link_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Static cache, compiled\n\n## Limits\n\n## Limits\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md) [ok](other.md#static-cache-compiled) [ok](other.md#limits-1) [ok](#top) ![ok](other.md)\n"
        "[web](https://example.org/x.md) `[code](nowhere.md)`\n\n# Top\n\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere)\n\n```\n[fenced](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    assert [problem.split(":")[0] for problem in broken(page)] == ["missing.md", "other.md#nowhere"]
