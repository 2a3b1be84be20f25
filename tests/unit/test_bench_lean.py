"""The lean floor, the reference of every figure of the storage issue, is the reference text's
SQL to the letter.

The tests here need no database; those that do are in tests/test_bench_lean.py.
"""

from __future__ import annotations

import re

import pytest

from tests.helpers import ROOT
from tests.test_bench import _bench_module

#: The reference text, beside the checkout where the project's shared files are laid.
LEAN_TEXT = ROOT.parent / "shared" / "floor" / "LEAN.md"


def _words(sql: str) -> list[str]:
    """SQL without its comments, as a list of tokens: layout is not part of the reference."""
    lines = [line.split("--", 1)[0] for line in sql.splitlines()]
    return re.findall(r"\w+|[^\w\s]", "\n".join(lines))


def test_the_lean_floor_is_the_reference_texts_sql_to_the_letter() -> None:
    if not LEAN_TEXT.exists():
        pytest.skip("the reference text is not beside this checkout")
    (block,) = re.findall(r"```sql\n(.*?)```", LEAN_TEXT.read_text(), re.DOTALL)
    lean = _bench_module("notifyq_bench.lean")
    assert _words(lean.SCHEMA + lean.STATEMENT) == _words(block)
