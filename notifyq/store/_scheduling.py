"""The reads behind the dashboard's Scheduled and Cron pages, and making a job due now."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.rows import dict_row

from notifyq.store._runner import Runner


class Scheduling(Runner):
    """Jobs due later, periodic ticks and "run now", for :class:`~notifyq.store.Store`."""

    async def scheduled_jobs(
        self,
        *,
        queue: str | None = None,
        task: str | None = None,
        limit: int = 50,
        after: tuple[datetime, UUID] | None = None,
    ) -> list[dict[str, Any]]:
        """Queued jobs due later, soonest first; ``after`` is the (run_at, id) of the last job
        of the page before. Each row carries the database's ``now``."""
        params = {
            "queue": queue,
            "task": task,
            "limit": limit,
            "after_run_at": after[0] if after else None,
            "after_id": after[1] if after else None,
        }
        return await self._all("scheduled_jobs", params, dict_row, what="listing scheduled jobs")

    async def run_job_now(self, job_id: UUID) -> bool:
        """Makes a queued job that is due later due now and wakes its queue's workers; False
        when the job is not queued for later (unknown, due already, or in another status)."""
        queue = await self._value("run_job_now", {"id": job_id}, what="running a job now")
        return queue is not None

    async def periodic_tasks(self, *, limit: int = 500) -> list[dict[str, Any]]:
        """The tasks registered with a cron expression, with their last tick and its job."""
        return await self._all(
            "periodic_tasks", {"limit": limit}, dict_row, what="listing periodic tasks"
        )
