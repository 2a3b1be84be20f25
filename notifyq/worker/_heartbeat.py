"""The heartbeat: keeps alive what this worker holds, every ``NOTIFYQ_HEARTBEAT_INTERVAL``.

Each beat renews the leases of the jobs held and confirms those whose handler runs (a rescue
then counts their attempt: notifyq.beat_v1); stops a handler whose job another worker took
over, and one whose cancel was requested (which covers a cancel notification that was lost);
and keeps the worker's idle mark from expiring while it waits.
"""

from __future__ import annotations

import logging

import anyio
from anyio.abc import TaskStatus

from notifyq.errors import NotifyQError
from notifyq.worker._ledger import CancelReason, Ledger
from notifyq.worker._producer import IdleMark
from notifyq.worker._stats import Signals, WorkerStats
from notifyq.worker._store import WorkerStore

__all__ = ["Heartbeat"]

logger = logging.getLogger(__name__)


class Heartbeat:
    """Renews one worker's leases and idle mark."""

    def __init__(
        self,
        store: WorkerStore,
        ledger: Ledger,
        idle: IdleMark,
        *,
        worker_id: str,
        interval: float,
        lease: float,
        stats: WorkerStats,
        signals: Signals,
    ) -> None:
        self._store = store
        self._ledger = ledger
        self._idle = idle
        self._worker_id = worker_id
        self._interval = interval
        self._lease = lease
        self._stats = stats
        self._signals = signals

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Beats every interval until cancelled; a beat that fails is logged, the next one
        comes at its time."""
        task_status.started()
        while True:
            await anyio.sleep(self._interval)
            try:
                await self.beat()
            except NotifyQError as exc:
                logger.warning("heartbeat failed: %s", exc)

    async def beat(self) -> None:
        """One heartbeat."""
        await self._idle.refresh()
        held = self._ledger.held()
        if held:
            redone = self._ledger.redone_count
            still = await self._store.beat(
                self._worker_id, held, self._ledger.confirmed(), self._lease
            )
            for job_id, cancel_requested in still.items():
                if cancel_requested:
                    self._ledger.cancel(job_id, CancelReason.REQUESTED)
            if self._ledger.redone_count != redone:
                # A claim came back under a fence this worker had while the beat ran (a crash
                # of the server undid it): the answer may predate it. The next beat decides.
                self._signals.heartbeat.fire()
                return
            for item in held:
                if item.job_id not in still and self._ledger.lose(item) is not None:
                    self._stats.lost += 1
                    logger.warning(
                        "job %s: lease lost (another worker rescued it); cancelling this attempt",
                        item.job_id,
                    )
        self._signals.heartbeat.fire()
