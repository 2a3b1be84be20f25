"""The code blocks a user pastes, for the tests that run them as written: README.md's and the
documentation site's (see :mod:`tests.docs`, which finds them)."""

from __future__ import annotations

from tests.docs import README, doc_block

__all__ = ["README", "readme_block"]


def readme_block(first_line: str) -> str:
    """The code of the block, in README.md or a page of the site, that starts with
    ``first_line`` (a file name in a comment, say)."""
    return doc_block(first_line)
