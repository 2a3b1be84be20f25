"""A worker's upkeep besides rescue: retention of finished jobs, and queue depth for its own
metrics port."""

from __future__ import annotations

import logging

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus

from notifyq.errors import NotifyQError
from notifyq.metrics import Metrics
from notifyq.models import JobStatus
from notifyq.settings import Settings
from notifyq.worker._leadership import Leadership
from notifyq.worker._store import WorkerStore

__all__ = ["DEPTH_INTERVAL", "DepthReport", "Retention", "prune"]

logger = logging.getLogger(__name__)

#: Seconds between readings of queue depth for a worker's own metrics port.
DEPTH_INTERVAL = 10.0


async def prune(store: WorkerStore, settings: Settings, *, batch: int = 1000) -> int:
    """Deletes finished jobs older than their keep setting, ``batch`` rows per statement;
    answers how many."""
    total = 0
    for status, keep in (
        (JobStatus.COMPLETED, settings.keep_completed),
        (JobStatus.FAILED, settings.keep_failed),
        (JobStatus.CANCELLED, settings.keep_cancelled),
    ):
        if keep is None:
            continue
        while True:
            deleted = await store.prune(status, keep, batch=batch)
            total += deleted
            if deleted < batch:
                break
            await anyio.lowlevel.checkpoint()
    return total


class Retention:
    """Deletes finished jobs past their keep time, in small batches, every
    ``NOTIFYQ_PRUNE_INTERVAL``, so that the hot table stays small. Only the worker that leads
    the maintenance does it (without ``leadership``: this one); SKIP LOCKED keeps two out of
    each other's way while the lead moves."""

    def __init__(
        self, store: WorkerStore, settings: Settings, leadership: Leadership | None = None
    ) -> None:
        self._store = store
        self._settings = settings
        self._leadership = leadership

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Prunes at once, then every interval, until cancelled."""
        task_status.started()
        while True:
            if self._leadership is not None and not self._leadership.leading:
                await anyio.sleep(self._settings.heartbeat)  # ask again when the lead may move
                continue
            try:
                deleted = await prune(self._store, self._settings)
                if deleted:
                    logger.info("retention: deleted %d finished job(s)", deleted)
                await self._store.prune_ticks()
            except NotifyQError as exc:
                logger.warning("retention failed: %s", exc)
            await anyio.sleep(self._settings.prune_interval)


class DepthReport:
    """Reads the queues' depth into a worker's own metrics (``--metrics-port``), which has no
    API to read it when scraped."""

    def __init__(self, store: WorkerStore, metrics: Metrics) -> None:
        self._store = store
        self._metrics = metrics

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Reads at once, then every DEPTH_INTERVAL, until cancelled."""
        task_status.started()
        while True:
            try:
                self._metrics.set_depth(await self._store.queue_stats())
            except NotifyQError as exc:
                logger.warning("reading queue depth failed: %s", exc)
            await anyio.sleep(DEPTH_INTERVAL)
