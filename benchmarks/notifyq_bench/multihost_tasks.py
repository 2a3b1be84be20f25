"""The handler of the ``multihost`` scenario's partition run (``notifyq worker --import
notifyq_bench.multihost_tasks``): it sleeps, and writes down every run it makes.

Each run appends one line to ``$NOTIFYQ_BENCH_RUNLOG/<pid>.runs`` on the local disk, which the
worker "hosts" (network namespaces) share with the bench: job id, worker id, start and end
(wall clock) and a token that the result carries too. The bench reads every run from there,
including those whose completion the database discarded, and the token in the row says which
run's completion it kept. Importing this module registers the task and does nothing else.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import IO, Any

from notifyq.context import JobContext
from notifyq.tasks import task

RUN = "bench_multihost_run"
RUNLOG_ENV = "NOTIFYQ_BENCH_RUNLOG"

_log: IO[str] | None = None


def _runlog() -> IO[str]:
    global _log
    if _log is None:
        folder = os.environ.get(RUNLOG_ENV) or "."
        _log = open(os.path.join(folder, f"{os.getpid()}.runs"), "a", buffering=1)
    return _log


@task(RUN)
async def bench_multihost_run(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Sleeps ``payload["ms"]`` milliseconds (20 by default), then records the run."""
    token = uuid.uuid4().hex[:12]
    started = time.time()
    await asyncio.sleep(float(payload.get("ms", 20)) / 1000)
    ended = time.time()
    _runlog().write(f"{ctx.job_id} {ctx.worker_id} {started:.6f} {ended:.6f} {token}\n")
    return {"t": started, "w": ctx.worker_id, "r": token}
