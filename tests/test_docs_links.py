"""The README and the guides in docs/ link to what is there: every relative link and
image opens a file of the checkout, and every link to a section of a guide names a
heading that guide has. A guide moved, renamed or split (the README was, into five)
fails here instead of leaving a reader at a dead link."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target), outside code spans.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")


def links(page: Path) -> list[str]:
    text = CODE.sub("", FENCE.sub("", page.read_text()))
    return LINK.findall(text)


def anchors(page: Path) -> set[str]:
    """The ids GitHub gives the page's headings: lower case, punctuation dropped,
    spaces as hyphens."""
    text = FENCE.sub("", page.read_text())
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#{1,6} (.+)$", text, re.M)
    }


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_link_of_a_page_opens(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        found = (page.parent / path).resolve() if path else page
        if not found.exists():
            broken.append(f"{target}: no such file")
        elif anchor and found.suffix == ".md" and anchor not in anchors(found):
            broken.append(f"{target}: {found.name} has no heading #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_readme_names_every_guide():
    readme = (ROOT / "README.md").read_text()
    guides = [p.name for p in sorted((ROOT / "docs").glob("*.md"))]
    unnamed = [name for name in guides if f"docs/{name}" not in readme]
    assert not unnamed, f"README.md does not say where to find {unnamed}"
