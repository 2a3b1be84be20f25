"""Fault injection for tests: imported by a `notifyq serve` or `notifyq worker` that a test
starts (``--import tests.broken_service``), it makes the worker's retention service raise, as a
bug in a service would. NQ_BREAK_TIMES says how many workers of the process fail that way
(default: every one)."""

from __future__ import annotations

import os
from typing import Any

import anyio

from notifyq.worker._maintenance import Retention

_run = Retention.run
_left = int(os.environ.get("NQ_BREAK_TIMES", "-1"))


async def _broken(self: Retention, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    global _left
    if _left == 0:
        await _run(self, task_status=task_status)
        return
    _left -= 1
    task_status.started()  # it fails once running, not while the worker starts
    await anyio.sleep(0.1)
    raise RuntimeError("a bug in a service")


Retention.run = _broken  # type: ignore[method-assign]
