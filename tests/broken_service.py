"""Fault injection for tests: imported by a `notifyq serve` or `notifyq worker` that a test
starts (``--import tests.broken_service``), it makes the worker's housekeeping duty raise, as a
bug in a service would. NQ_BREAK_TIMES says how many workers of the process fail that way
(default: every one)."""

from __future__ import annotations

import os

from notifyq.worker import Worker

_housekeep = Worker._housekeep
_left = int(os.environ.get("NQ_BREAK_TIMES", "-1"))


async def _broken(self: Worker) -> None:
    global _left
    if _left == 0:
        await _housekeep(self)
        return
    _left -= 1
    raise RuntimeError("a bug in a service")


Worker._housekeep = _broken  # type: ignore[method-assign]
