"""Reading and managing jobs, queues and tasks: what the API, the CLI and the client run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from psycopg.rows import dict_row, kwargs_row, scalar_row, tuple_row

from notifyq.models import Cancelled, Job, JobStatus, Retried
from notifyq.store._runner import Runner

_JOB = kwargs_row(Job.of)
_CANCELLED = kwargs_row(Cancelled.of)
_RETRIED = kwargs_row(Retried.of)
_EXTENT = ("scanned", "last_created", "last_id")

#: Why an archived job does not go back: the archive is read-only history; a job that should
#: run again is enqueued again (its payload is in the archive).
ARCHIVED_REFUSAL = "it is archived; an archived job does not go back: enqueue it again"

#: What a bulk action does, and the statement that does it.
BulkAction = Literal["retry", "cancel", "delete"]
_BULK_QUERIES: dict[str, str] = {
    "retry": "bulk_retry_jobs",
    "cancel": "bulk_cancel_jobs",
    "delete": "bulk_delete_jobs",
}


@dataclass(frozen=True, slots=True)
class JobFilter:
    """The filters of a search or a bulk action; ``contains`` is JSON text (an object) that
    the payload must contain (jsonb ``@>``), checked by :func:`~notifyq.models.encode_json`."""

    queue: str | None = None
    task: str | None = None
    group_key: str | None = None
    contains: str | None = None

    def params(self) -> dict[str, Any]:
        """The statements' parameters for these filters."""
        return {
            "queue": self.queue,
            "task": self.task,
            "group_key": self.group_key,
            "contains": self.contains,
        }


@dataclass(frozen=True, slots=True)
class Searched:
    """One page of a bounded search: the matching jobs, how many rows were looked at, and the
    (created_at, id) of the last one (None when none was)."""

    jobs: list[Job]
    scanned: int
    last: tuple[datetime, UUID] | None


@dataclass(frozen=True, slots=True)
class BulkDone:
    """What one bounded step of a bulk action did: jobs changed, running jobs whose workers
    were asked to stop them (cancel only), candidates looked at, and the last one's id."""

    changed: int
    stopping: int
    scanned: int
    last: UUID | None


class Managing(Runner):
    """The reads and the operators' statements of :class:`~notifyq.store.Store`."""

    async def get_job(self, job_id: UUID) -> Job | None:
        """The job, from notifyq.jobs or else the archive (``Job.archived``), or None."""
        return await self._one("get_job", {"id": job_id}, _JOB, what="reading a job")

    async def signal_job(self, job_id: UUID, name: str, payload_json: str) -> str:
        """Sends signal ``name`` to a job (see notifyq.signal_v1): ``sent``, ``duplicate`` (one
        of that name came first), ``unknown``, ``final`` (the job has ended) or ``too_many``."""
        params = {"job_id": job_id, "name": name, "payload": payload_json}
        return str(await self._value("signal_job", params, what="sending a signal"))

    async def get_archived_job(self, job_id: UUID) -> Job | None:
        """The job if it is in the archive (NOTIFYQ_ARCHIVE_AFTER), else None."""
        params = {"id": job_id}
        return await self._one("get_archived_job", params, _JOB, what="reading an archived job")

    async def list_jobs(
        self,
        *,
        status: JobStatus | None = None,
        queue: str | None = None,
        task: str | None = None,
        group_key: str | None = None,
        limit: int = 50,
        after: tuple[datetime, UUID] | None = None,
    ) -> list[Job]:
        """Jobs newest first; ``after`` is the (created_at, id) of the last job of the page
        before."""
        params = {
            "status": status.value if status else None,
            "queue": queue,
            "task": task,
            "group_key": group_key,
            "limit": limit,
            "after_created": after[0] if after else None,
            "after_id": after[1] if after else None,
        }
        return await self._all("list_jobs", params, _JOB, what="listing jobs")

    async def search_jobs(
        self,
        where: JobFilter,
        *,
        status: JobStatus | None = None,
        limit: int = 50,
        scan: int = 5000,
        after: tuple[datetime, UUID] | None = None,
    ) -> Searched:
        """Jobs newest first matching ``where`` (its payload containment included) among at
        most ``scan`` rows after ``after``: a bounded search, to go on from ``last``."""
        params = {
            **where.params(),
            "status": status.value if status else None,
            "limit": limit,
            "scan": scan,
            "after_created": after[0] if after else None,
            "after_id": after[1] if after else None,
        }
        rows = await self._all("search_jobs", params, dict_row, what="searching jobs")
        if not rows:  # the statement answers one row at least
            return Searched([], 0, None)
        scanned, last_created, last_id = (rows[0][key] for key in _EXTENT)
        jobs = [
            Job.from_row({k: v for k, v in row.items() if k not in _EXTENT})
            for row in rows
            if row["id"] is not None
        ]
        last = None if last_created is None else (last_created, last_id)
        return Searched(jobs, scanned, last)

    async def count_matching(
        self, where: JobFilter, *, statuses: list[JobStatus], scan: int = 100_000
    ) -> tuple[int, int]:
        """How many jobs in ``statuses`` match ``where``, and how many rows were looked at
        (at most ``scan``: the count is exact when fewer were)."""
        params = {**where.params(), "statuses": [s.value for s in statuses], "scan": scan}
        row = await self._one("count_matching_jobs", params, tuple_row, what="counting jobs")
        assert row is not None, "count_matching_jobs answers one row"
        return row[0], row[1]

    async def bulk_jobs(
        self,
        action: BulkAction,
        where: JobFilter,
        *,
        statuses: list[JobStatus],
        limit: int = 500,
        after: UUID | None = None,
    ) -> BulkDone:
        """One bounded step of a bulk retry, cancel or delete: at most ``limit`` candidates
        in id order after ``after``; the caller goes on from ``last`` while ``scanned`` is
        ``limit``."""
        params = {
            **where.params(),
            "statuses": [s.value for s in statuses],
            "limit": limit,
            "after": after or UUID(int=0),
        }
        query = _BULK_QUERIES[action]
        row = await self._one(query, params, tuple_row, what=f"bulk {action} of jobs")
        assert row is not None, f"{query} answers one row"
        return BulkDone(row[0], row[1], row[2], row[3])

    async def queue_conditions(self, queues: Sequence[str]) -> list[dict[str, Any]]:
        """For each of ``queues``: due jobs of tasks no worker registered (and their names),
        due tasks whose breaker is open, and the idle workers listening on it."""
        params = {"queues": list(queues)}
        return await self._all("queue_conditions", params, dict_row, what="reading queue states")

    async def minute_stats(self, *, minutes: int = 60, fill: int = 10) -> list[dict[str, Any]]:
        """Jobs completed, failed and cancelled per minute over the last ``minutes`` and the
        minute under way (``partial``), oldest first; counts up to ``fill`` minutes not stored
        yet (the others answer None until a later call)."""
        params = {"minutes": minutes, "fill": fill}
        return await self._all("minute_stats", params, dict_row, what="reading minute counts")

    async def counted_since(self) -> datetime | None:
        """When the minutes have anything to count: notifyq's install in this database, or the
        oldest finished job if older (None: not installed)."""
        since: datetime | None = await self._value(
            "counted_since", None, what="reading minute counts"
        )
        return since

    async def list_workers(self, *, limit: int = 500) -> list[dict[str, Any]]:
        """The workers listening (idle) or running jobs, with up to 20 of their jobs each."""
        return await self._all("list_workers", {"limit": limit}, dict_row, what="listing workers")

    async def workflow_jobs(self, workflow_id: UUID, *, limit: int = 10_000) -> list[Job]:
        """The jobs of a workflow, oldest first (none for an unknown id)."""
        params = {"workflow_id": workflow_id, "limit": limit}
        return await self._all("workflow_jobs", params, _JOB, what="reading a workflow")

    async def watch(self, watcher: str, job_id: UUID, ttl: float) -> bool:
        """Asks for the changes of a job to be announced (channel ``notifyq_job``) for ``ttl``
        seconds, on behalf of ``watcher`` (one per process); once this returns, a read of the
        job sees every change that was not announced. False: no such job."""
        params = {"watcher": watcher, "id": job_id, "ttl": ttl}
        return bool(await self._value("watch_job", params, what="watching a job"))

    async def refresh_watches(self, watcher: str, job_ids: list[UUID], ttl: float) -> None:
        """Keeps the watches of ``watcher`` on these jobs alive for ``ttl`` more seconds."""
        params = {"watcher": watcher, "ids": job_ids, "ttl": ttl}
        await self._execute("refresh_watches", params, what="refreshing watches")

    async def unwatch(self, watcher: str, job_ids: list[UUID]) -> None:
        """Stops :meth:`watch` of these jobs."""
        await self._execute(
            "unwatch_jobs", {"watcher": watcher, "ids": job_ids}, what="unwatching jobs"
        )

    async def ping(self) -> None:
        """Raises DatabaseUnavailable unless the database answers."""
        await self._value("ping", None, what="health check")

    async def schema_version(self) -> int | None:
        """The newest applied migration."""
        version: int | None = await self._value(
            "schema_version", None, what="reading the schema version"
        )
        return version

    async def cancel_job(self, job_id: UUID) -> Cancelled | None:
        """Cancels a queued job (or a running one that no live worker holds), or asks the
        worker of a running one to stop it; None: no such job."""
        found = await self._one("cancel_job", {"id": job_id}, _CANCELLED, what="cancelling a job")
        if found is None and (archived := await self.get_archived_job(job_id)) is not None:
            return Cancelled(archived.status, archived.status)  # finished: nothing to cancel
        return found

    async def delete_job(self, job_id: UUID) -> bool:
        """Deletes a finished job; False when it is not finished or unknown, or while a job
        that has not started depends on it."""
        deleted = await self._value("delete_job", {"id": job_id}, what="deleting a job")
        return deleted is not None

    async def retry_job(self, job_id: UUID) -> Retried | None:
        """Requeues one failed or cancelled job (waiting, while jobs it depends on have not
        finished); the answer says its status now and, if it did not go back, why. None: no
        such job."""
        found = await self._one("retry_job", {"id": job_id}, _RETRIED, what="retrying a job")
        if found is None and (archived := await self.get_archived_job(job_id)) is not None:
            return Retried(archived.status, ARCHIVED_REFUSAL)
        return found

    async def retry_jobs(
        self,
        *,
        status: JobStatus = JobStatus.FAILED,
        queue: str | None = None,
        task: str | None = None,
        batch: int = 1000,
    ) -> int:
        """Requeues every job in ``status`` (failed or cancelled) matching the filters, in
        batches; answers how many."""
        if status not in (JobStatus.FAILED, JobStatus.CANCELLED):
            raise ValueError("only failed or cancelled jobs can be retried")
        params: dict[str, Any] = {
            "status": status.value,
            "queue": queue,
            "task": task,
            "limit": batch,
            "after": UUID(int=0),
        }
        total: int = 0
        while True:
            row = await self._one("retry_jobs", params, tuple_row, what="retrying jobs")
            assert row is not None, "retry_jobs answers one row"
            retried: int = row[0]
            scanned, last = row[1], row[2]
            total += retried
            if scanned < batch:
                return total
            params["after"] = last

    async def queue_stats(
        self,
        *,
        exact_below: int = 200_000,
        sample_percent: float = 2.0,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Counts by status per queue (completed ones estimated on a large table), the oldest
        due job's wait, last minute's throughput, and the queue's switches; by name, the
        queues after ``after`` only and ``limit`` of them at most when given."""
        params = {
            "exact_below": exact_below,
            "sample_percent": sample_percent,
            "after": after,
            "limit": limit,
        }
        return await self._all("queue_stats", params, dict_row, what="counting jobs")

    async def configure_queue(
        self,
        queue: str,
        *,
        paused: bool | None = None,
        rate_limit: float | None = None,
        notify: bool | None = None,
        max_depth: int | None = None,
    ) -> None:
        """Changes a queue's switches; None leaves one as it is (a rate limit or a max_depth
        of 0 removes it)."""
        params = {
            "queue": queue,
            "paused": paused,
            "rate_limit": rate_limit,
            "notify": notify,
            "max_depth": max_depth,
        }
        await self._all("configure_queue", params, scalar_row, what="configuring a queue")

    async def set_fair_weight(self, fair_key: str, weight: float) -> None:
        """Gives ``fair_key`` this share of the fair claims (1 to 1000; a key without one
        weighs 1)."""
        params = {"fair_key": fair_key, "weight": weight}
        await self._execute("set_fair_weight", params, what="setting a fair key's weight")

    async def unset_fair_weight(self, fair_key: str) -> None:
        """Gives ``fair_key`` back the default weight, 1."""
        params = {"fair_key": fair_key}
        await self._execute("unset_fair_weight", params, what="removing a fair key's weight")

    async def fair_weights(self, limit: int = 100) -> list[dict[str, Any]]:
        """The weights set (``fair_key``, ``weight``, ``updated_at``), heaviest first."""
        params = {"limit": limit}
        return await self._all("fair_weights", params, dict_row, what="reading fair weights")

    async def fair_keys(self, limit: int = 20) -> list[dict[str, Any]]:
        """The keys with the most jobs queued or running (``queue``, ``fair_key``, ``queued``,
        ``running``, ``weight``), at most ``limit`` (1 to 100)."""
        params = {"limit": limit}
        return await self._all("fair_keys", params, dict_row, what="counting fair keys")

    async def table_tuples(self) -> list[dict[str, Any]]:
        """Live and dead row versions of notifyq's busy tables (``table``, ``live``, ``dead``,
        ``vacuumed_at``), from PostgreSQL's statistics."""
        return await self._all("table_tuples", None, dict_row, what="reading table statistics")

    async def listener_connections(self) -> list[dict[str, Any]]:
        """The LISTEN connections of notifyq's processes on this database, with their state."""
        return await self._all("listener_connections", None, dict_row, what="reading listeners")

    async def health_overview(self) -> dict[str, Any]:
        """Schema version, notification queue usage, autovacuum, expired leases, the
        maintenance leader, workers, and grants that overstep (see the query)."""
        row = await self._one("health_overview", None, dict_row, what="reading the health")
        assert row is not None  # one row, always
        return row

    async def list_tasks(self) -> list[dict[str, Any]]:
        """The registered tasks with their breaker state."""
        return await self._all("list_tasks", None, dict_row, what="listing tasks")
