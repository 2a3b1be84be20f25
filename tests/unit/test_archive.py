"""The archive's settings and arithmetic: off unless set, a negative age refused (in one line
from the command too), and an archived day kept as long as the longest keep.

The tests here need no database; those that do are in tests/test_archive.py.
"""

from __future__ import annotations

import sys

import anyio
import pytest

from notifyq.errors import ConfigurationError
from notifyq.settings import Settings
from notifyq.worker._maintenance import archive_keep
from tests.helpers import (
    ROOT,
    notifyq_env,
)

DAY = 86_400.0


def test_the_archive_is_off_unless_set_and_refuses_a_negative_age(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings.load().archive_after is None
    monkeypatch.setenv("NOTIFYQ_ARCHIVE_AFTER", "")
    assert Settings.load().archive_after is None
    monkeypatch.setenv("NOTIFYQ_ARCHIVE_AFTER", "3600")
    assert Settings.load().archive_after == 3600
    assert Settings.load(archive_after=60).archive_after == 60  # the CLI flag wins
    monkeypatch.setenv("NOTIFYQ_ARCHIVE_AFTER", "-1")
    with pytest.raises(ConfigurationError, match="NOTIFYQ_ARCHIVE_AFTER"):
        Settings.load()


def test_an_archived_day_is_kept_as_long_as_the_longest_keep() -> None:
    keeps = {"keep_completed": DAY, "keep_failed": 30 * DAY, "keep_cancelled": 2 * DAY}
    assert archive_keep(Settings(**keeps)) == 30 * DAY
    # One status kept for good (failed jobs are, by default): archived days too.
    assert archive_keep(Settings(**{**keeps, "keep_failed": None})) is None


async def test_a_negative_archive_flag_is_one_line() -> None:
    done = await anyio.run_process(
        [sys.executable, "-m", "notifyq", "worker", "--archive-after", "-5"],
        env=notifyq_env("postgresql://nobody@127.0.0.1:1/none"),
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 2
    assert "--archive-after" in done.stderr.decode()
