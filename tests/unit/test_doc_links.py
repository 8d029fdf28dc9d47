"""Every relative link of README.md and docs/*.md resolves: the file exists, and a `#fragment` names a
heading of that Markdown file as GitHub slugs it (text moved between pages must take its links along)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# [text](target) and <img src="target">; code blocks and spans are left out before matching
LINK = re.compile(r"\]\(([^)\s]+)\)|<img [^>]*src=\"([^\"]+)\"")


def prose(page: Path) -> str:
    """The page without fenced blocks and code spans, where brackets are code, not links."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped but - and _, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2 as on GitHub."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*$", text, flags=re.M):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(page: Path) -> list[str]:
    links = (a or b for a, b in LINK.findall(prose(page)))
    return [link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:", link)]


def test_the_slug_is_githubs():
    assert slug("The Kimi-family demo (`make demo DEMO=kimi`)") == "the-kimi-family-demo-make-demo-demokimi"
    assert slug("Outputs (`results/{run}/`)") == "outputs-resultsrun"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for link in relative_links(page):
        path, _, fragment = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.is_file():
            broken.append(f"{link}: no file {target}")
        elif fragment and target.suffix == ".md" and fragment not in anchors(target):
            broken.append(f"{link}: no heading with anchor #{fragment} in {target.name}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_readme_links_the_docs_and_the_report_picture():
    links = set(relative_links(REPO / "README.md"))
    assert {"docs/overview.md", "docs/demo.md", "docs/report-front.png"} <= links
