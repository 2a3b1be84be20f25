"""The Django files the README shows are the ones the tests run.

The tests here need no database; those that do are in tests/test_django.py.
"""

from __future__ import annotations

import pytest

from tests.helpers import ROOT
from tests.readme import readme_block

pytest.importorskip("django")


PROJECT = ROOT / "tests" / "django_project"


@pytest.mark.parametrize("path", ["shop/tasks.py", "shop/views.py"])
def test_the_readmes_django_files_are_the_tested_ones(path: str) -> None:
    block = readme_block(f"# {path}\n")
    assert block.split("\n", 1)[1] == (PROJECT / path).read_text()
