"""The unit layer: tests that need no PostgreSQL at all, run first and quickly
(``pytest tests/unit``, well under 20 s; CI checks the time).

The database fixtures of tests/conftest.py start a server (or an embedded one) only when a test
asks for one; here none may. A test of this folder that asks for a database, directly or through
another fixture, fails before any fixture is set up (so no server starts): it belongs in tests/,
beside its file's other tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

#: The fixture every database fixture of tests/conftest.py stands on.
SERVER_FIXTURE = "_server"

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any fixture is set up: the server is never started for it.
    if item.path.is_relative_to(HERE) and SERVER_FIXTURE in getattr(item, "fixturenames", ()):
        pytest.fail(
            f"{item.nodeid} asks for a database: tests/unit needs none; move it to tests/",
            pytrace=False,
        )
