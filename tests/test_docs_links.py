"""The docs are a user guide that links into studies/ for the evidence, so the links must hold.

* every docs/*.md page stays at most 400 lines (the evidence goes to studies/, the page links it);
* every relative link in README.md, docs/, studies/ and bench/NOTES.md reaches a file, and its ``#anchor``, where it has one,
  a heading of that page as GitHub slugs it (a page split in two breaks "see above" links silently otherwise).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "studies").rglob("*.md")),
         ROOT / "bench" / "NOTES.md"]
# [text](target) outside code; an image's ![alt](target) too
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def slugs(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces to hyphens, and a
    repeated heading numbered ``-1``, ``-2``, ..."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", page.read_text()), flags=re.M):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def links(page: Path) -> list[str]:
    text = CODE.sub("", FENCE.sub("", page.read_text()))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]  # http:, https:, mailto: are not ours


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_every_docs_page_is_at_most_400_lines(page):
    assert len(page.read_text().splitlines()) <= 400


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in slugs(file):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"
