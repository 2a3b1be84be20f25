"""The dashboard's cron expressions told in words.

The tests here need no database; those that do are in tests/test_dashboard_api.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from notifyq.api.routes.schedule import describe_cron

#: A JSON value nested deeper than notifyq reads (jsonb would take it).
DEEP: Any = 1


for _ in range(120):
    DEEP = [DEEP]


@pytest.mark.parametrize(
    ("cron", "words"),
    [
        ("*/15 * * * *", "every 15 minutes"),
        ("5 * * * *", "every hour at :05"),
        ("0 */6 * * *", "every 6 hours at :00"),
        ("0 9 * * 1-5", "every weekday (Monday to Friday) at 09:00 UTC"),
        ("0 9 * * 1", "every Monday at 09:00 UTC"),
        ("0 0 1 * *", "on day 1 of every month at 00:00 UTC"),
        ("0 0 1 1 *", None),
        ("@daily", "every day at 00:00 UTC"),
    ],
)
def test_common_cron_expressions_are_told_in_words(cron: str, words: str | None) -> None:
    assert describe_cron(cron) == words
