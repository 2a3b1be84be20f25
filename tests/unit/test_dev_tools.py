"""The dev extra installs checkers that give the same answer on a new machine as on ours.

A fresh `pip install -e ".[dev]"` takes the newest release that the bounds allow; a new major of
mypy (2.x) once reported new errors, so CI turned red on a new machine with no change of ours.

The tests here need no database; those that do are in tests/test_dev_tools.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


# The tools whose next release can change what a check or a test run reports.
CHECKERS = (
    "mypy",
    "ruff",
    "import-linter",
    "pytest",
    "pytest-asyncio",
    "pytest-timeout",
    "pytest-xdist",
)


def dev_requirements() -> dict[str, Requirement]:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = (Requirement(line) for line in project["optional-dependencies"]["dev"])
    return {requirement.name: requirement for requirement in requirements}


@pytest.mark.parametrize("name", CHECKERS)
def test_each_checker_is_bounded_below_its_next_breaking_release(name: str) -> None:
    requirement = dev_requirements()[name]
    assert any(spec.operator in ("<", "<=", "~=", "==") for spec in requirement.specifier), (
        f"{name} has no upper bound in the dev extra: a new major can break a fresh install"
    )
