"""Progress reports of running handlers, written coalesced: :class:`ProgressWriter`.

``ctx.progress(...)`` may be called from the event loop or from the thread of a plain-function
handler, as often as a loop turns. It only stores the job's latest report and wakes this
writer, which writes what it holds in one statement (fenced by the claim, like every outcome)
and then waits :data:`PROGRESS_INTERVAL` before it writes again: the first report after a
quiet spell is visible at once, and a tight loop costs the database a few statements a second
per worker, however many jobs report."""

from __future__ import annotations

import asyncio
import logging
import threading
from uuid import UUID

import anyio
from anyio.abc import TaskStatus

from notifyq.errors import NotifyQError
from notifyq.models import Progress
from notifyq.worker._stats import WorkerStats
from notifyq.worker._store import WorkerStore

__all__ = ["PROGRESS_INTERVAL", "ProgressWriter"]

logger = logging.getLogger("notifyq.worker")

#: Least time between two progress writes of one worker.
PROGRESS_INTERVAL = 0.25


class ProgressWriter:
    """Writes the progress its jobs report, at most once per ``interval``."""

    def __init__(
        self,
        store: WorkerStore,
        *,
        worker_id: str,
        stats: WorkerStats,
        interval: float = PROGRESS_INTERVAL,
    ) -> None:
        self._store = store
        self._stats = stats
        self._worker_id = worker_id
        self._interval = interval
        self._latest: dict[UUID, Progress] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._wanted = asyncio.Event()

    def report(self, job_id: UUID, claim: int, fraction: float | None, message: str | None) -> None:
        """Keeps the latest report of ``job_id``'s attempt under ``claim`` (from any thread)
        and wakes the writer. An attempt's context reports here through a ``partial`` of the
        job's id and claim (see :class:`~notifyq.worker._executor.Executor`)."""
        with self._lock:
            self._latest[job_id] = Progress(job_id, claim, fraction, message)
        self._wake()

    def _wake(self) -> None:
        loop = self._loop
        if loop is None:
            return  # not running: reports wait for nothing
        if threading.get_ident() == self._loop_thread:
            self._wanted.set()
        else:
            loop.call_soon_threadsafe(self._wanted.set)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Writes reports as they come, until cancelled."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wanted = asyncio.Event()
        task_status.started()
        try:
            while True:
                await self._wanted.wait()
                self._wanted.clear()
                await self.flush()
                await anyio.sleep(self._interval)
        finally:
            self._loop = None

    async def flush(self) -> None:
        """Writes the latest report of each job; a report that cannot be written is dropped
        (progress is advice: the next report, or the job's end, says more)."""
        with self._lock:
            batch = list(self._latest.values())
            self._latest.clear()
        if not batch:
            return
        try:
            await self._store.report_progress(self._worker_id, batch)
            self._stats.progress_writes += 1
        except NotifyQError as exc:
            logger.warning("could not record the progress of %d job(s): %s", len(batch), exc)
