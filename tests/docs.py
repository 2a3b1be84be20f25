"""The code blocks of README.md and of the documentation site (docs/), for the tests that run them
as written.

Every fenced block is either run by a test or marked as not run, on the line right before it:

- ``<!-- run: tests/test_x.py::test_name -->``: that test runs it (it finds the block by its
  first line, or by what it holds); tests/test_docs.py checks that the test exists;
- ``<!-- not run: why -->``: output, a fragment of a file that is tested whole, or a command
  that needs what the test machines lack (Docker, systemd, a deployment's hosts);
- a ``sql`` block without a marker: tests/test_docs.py runs every one of a page, in order, on a
  database of its own.

A block without a marker that is not SQL fails tests/test_docs.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"

_FENCE = re.compile(
    r"(?:^<!-- (?P<marker>(?:not )?run: .*?) -->\n)?^```(?P<lang>[a-z]*)\n(?P<code>.*?)^```$",
    re.M | re.S,
)


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page."""

    page: Path
    line: int
    lang: str
    code: str
    #: ``run: <test>``, ``not run: <why>``, or "" when the block has no marker.
    marker: str

    @property
    def first_line(self) -> str:
        return self.code.split("\n", 1)[0]

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """README.md and every Markdown page of the site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def blocks_of(page: Path, text: str | None = None) -> list[Block]:
    """The fenced blocks of ``page`` (or of ``text``, its Markdown, when given)."""
    text = page.read_text() if text is None else text
    return [
        Block(
            page=page,
            line=text.count("\n", 0, match.start("lang")) + 1,
            lang=match["lang"],
            code=match["code"],
            marker=" ".join((match["marker"] or "").split()),
        )
        for match in _FENCE.finditer(text)
    ]


def blocks(lang: str | None = None) -> list[Block]:
    """Every fenced block of every page (of language ``lang`` when given)."""
    found = [block for page in pages() for block in blocks_of(page)]
    return [block for block in found if lang is None or block.lang == lang]


def doc_block(first_line: str) -> str:
    """The code of the first block, README first, then the site's pages, that starts with
    ``first_line`` (a file name in a comment, say)."""
    for block in blocks():
        if block.code.startswith(first_line):
            return block.code
    raise AssertionError(f"no page has a code block starting with {first_line!r}")
