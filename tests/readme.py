"""The README's code blocks, for the tests that run them as written."""

from __future__ import annotations

import re

from tests.helpers import ROOT

README = ROOT / "README.md"


def readme_block(first_line: str) -> str:
    """The code of the README's fenced block that starts with ``first_line`` (a file name in
    a comment, say)."""
    for match in re.finditer(r"^```[a-z]+\n(.*?)^```$", README.read_text(), re.M | re.S):
        if match.group(1).startswith(first_line):
            return match.group(1)
    raise AssertionError(f"README.md has no code block starting with {first_line!r}")
