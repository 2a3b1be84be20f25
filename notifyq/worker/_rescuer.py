"""The rescuer: puts back the jobs of workers that died or hung, every heartbeat interval.

A job whose lease ran out (or that has none) goes back to the queue, or ends failed when out of
attempts, or cancelled when its cancel was requested (notifyq.rescue_v3). Only the worker that
leads the maintenance rescues (see notifyq.worker._leadership); SKIP LOCKED keeps two out of
each other's way while the lead moves. It also deletes the idle marks of workers that stopped
refreshing them.
"""

from __future__ import annotations

import logging

import anyio
from anyio.abc import TaskStatus

from notifyq.errors import NotifyQError
from notifyq.worker._leadership import Leadership
from notifyq.worker._ledger import Ledger, WakeReason
from notifyq.worker._stats import Signals, WorkerStats
from notifyq.worker._store import WorkerStore
from notifyq.worker._telemetry import Telemetry

__all__ = ["Rescuer"]

logger = logging.getLogger(__name__)


class Rescuer:
    """Rescues other workers' jobs."""

    def __init__(
        self,
        store: WorkerStore,
        ledger: Ledger,
        telemetry: Telemetry,
        *,
        interval: float,
        stats: WorkerStats,
        signals: Signals,
        leadership: Leadership | None = None,
    ) -> None:
        """Without ``leadership``, it rescues at every interval."""
        self._store = store
        self._leadership = leadership
        self._ledger = ledger
        self._telemetry = telemetry
        self._interval = interval
        self._stats = stats
        self._signals = signals

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Rescues every interval until cancelled."""
        task_status.started()
        while True:
            await anyio.sleep(self._interval)
            if self._leadership is not None and not self._leadership.leading:
                continue
            try:
                await self.rescue()
            except NotifyQError as exc:
                logger.warning("rescue failed: %s", exc)

    async def rescue(self) -> None:
        """One pass."""
        await self._store.prune_waiting()
        rescued = await self._store.rescue_expired()
        if rescued:
            self._stats.rescued += len(rescued)
            self._telemetry.rescued(len(rescued))
            given_back = sum(1 for r in rescued if not r.counted)
            logger.warning(
                "rescued %d job(s) whose worker stopped renewing its lease%s",
                len(rescued),
                f" ({given_back} before their handler was confirmed running: attempt not counted)"
                if given_back
                else "",
            )
            self._ledger.wake.signal(WakeReason.OTHER)
        self._signals.rescue_pass.fire()
