"""The periodic enqueuer: enqueues the jobs of ``@periodic`` (cron) tasks on their ticks.

Every worker tries every tick; the tick's row in notifyq.periodic_ticks lets exactly one of them
enqueue it. Ticks are computed on the database's clock, so workers agree even when their own
clocks drift, and cron expressions are read in UTC whatever the server's time zone.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

import anyio
from anyio.abc import TaskStatus
from cronsim import CronSim

from notifyq.errors import NotifyQError
from notifyq.tasks import Task
from notifyq.worker._store import WorkerStore

__all__ = ["PeriodicEnqueuer", "ticks"]

logger = logging.getLogger(__name__)


def ticks(cron: str, after: datetime, until: datetime) -> list[datetime]:
    """The ticks of ``cron`` in (after, until], at most 100 (a long outage is not replayed)."""
    found: list[datetime] = []
    for tick in CronSim(cron, after):
        if tick > until or len(found) == 100:
            break
        if tick > after:
            found.append(tick)
    return found[-100:]


class PeriodicEnqueuer:
    """Enqueues the ticks of ``tasks`` (those with a cron expression)."""

    def __init__(self, store: WorkerStore, tasks: Sequence[Task]) -> None:
        self._store = store
        self._tasks = [task for task in tasks if task.cron]
        self._last: dict[str, datetime] = {}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Enqueues ticks as they come, until cancelled."""
        task_status.started()
        while True:
            try:
                pause = await self.enqueue_due()
            except NotifyQError as exc:
                logger.warning("periodic scheduling failed: %s", exc)
                pause = 5.0
            await anyio.sleep(min(max(pause, 0.05), 60.0))

    async def enqueue_due(self) -> float:
        """Enqueues the ticks since the last pass; answers the seconds until the next one."""
        now = (await self._store.database_now()).astimezone(timezone.utc)
        for task in self._tasks:
            assert task.cron is not None
            # On start, the latest tick of the last minute still counts: a worker that
            # restarts right after a tick does not lose it (the row dedups).
            since = self._last.get(task.name, now - timedelta(minutes=1))
            for tick in ticks(task.cron, since, now):
                job_id = await self._store.enqueue_tick(
                    task.name, tick, json.dumps(task.cron_payload)
                )
                if job_id is not None:
                    logger.info(
                        "periodic %s: enqueued tick %s as job %s",
                        task.name,
                        tick.isoformat(),
                        job_id,
                    )
                self._last[task.name] = tick
        upcoming = min(next(iter(CronSim(t.cron or "", now))) for t in self._tasks)
        return (upcoming - now).total_seconds()
