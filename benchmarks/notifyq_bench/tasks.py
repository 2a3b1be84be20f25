"""The handlers the bench's workers run (``notifyq worker --import notifyq_bench.tasks``).

Importing this module registers them with ``@notifyq.task`` and does nothing else.
"""

from __future__ import annotations

import time
from typing import Any

from notifyq.tasks import task

#: Task names, also used by the scenarios that enqueue them.
NOOP = "bench_noop"
STAMP = "bench_stamp"


@task(NOOP)
async def bench_noop(payload: dict[str, Any]) -> None:
    """Does nothing: the throughput scenarios measure the queue, not the handler."""


@task(STAMP)
async def bench_stamp(payload: dict[str, Any]) -> dict[str, float]:
    """Answers the wall-clock time at which it started. The result is written by the worker's
    batched completion anyway, so carrying the stamp there costs the measurement nothing."""
    return {"t": time.time()}
