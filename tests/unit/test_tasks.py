"""Task definitions refused when wrong, and the ticks of a cron expression.

The tests here need no database; those that do are in tests/test_tasks.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from notifyq.errors import TaskError
from notifyq.tasks import make_task
from notifyq.worker._periodic import ticks as _ticks


def test_bad_task_definitions_are_refused() -> None:
    async def two_payloads(a: dict[str, Any], b: dict[str, Any], c: int) -> None: ...

    async def fine(payload: dict[str, Any]) -> None: ...

    with pytest.raises(TaskError, match="must take the payload"):
        make_task(two_payloads)
    with pytest.raises(TaskError, match="cron expression"):
        make_task(fine, cron="every tuesday")
    with pytest.raises(TaskError, match="max_concurrency"):
        make_task(fine, max_concurrency=0)
    with pytest.raises(TaskError, match="rate_limit"):
        make_task(fine, rate_limit=-1)


def test_ticks_of_a_cron_expression() -> None:
    start = datetime(2026, 11, 30, 12, 3, 10, tzinfo=timezone.utc)
    ticks = _ticks("*/5 * * * *", start, start + timedelta(minutes=12))
    assert [t.minute for t in ticks] == [5, 10, 15]
    assert _ticks("*/5 * * * *", start, start) == []
    assert len(_ticks("* * * * *", start, start + timedelta(days=1))) == 100
