"""The Python client: ``async with notifyq.Queue(url) as q: await q.enqueue("echo", {...})``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any
from uuid import UUID

import anyio
import anyio.to_thread
import psycopg
from psycopg_pool import AsyncConnectionPool

from notifyq.bootstrap import require_database
from notifyq.db import open_pool
from notifyq.errors import InvalidJob, JobNotFound
from notifyq.models import EnqueueResult, Job, JobSpec
from notifyq.settings import Settings, explicit_max_attempts
from notifyq.store import Store

_SPEC_KEYS = {
    "task",
    "payload",
    "queue",
    "priority",
    "run_at",
    "delay",
    "dedup_key",
    "max_attempts",
}


class Queue:
    """A handle on a notifyq database for submitting and reading jobs.

    Open it with ``async with``; it holds a small connection pool. Without a URL it uses
    DATABASE_URL (``notifyq dev`` prints the URL of its embedded server). Every ``enqueue`` takes
    ``conn=``: a psycopg ``AsyncConnection`` of the caller, in which case the job is written in
    the caller's transaction and becomes visible, and wakes workers, only when it commits.
    """

    def __init__(
        self,
        database_url: str | None = None,
        *,
        settings: Settings | None = None,
        pool_size: int = 4,
    ) -> None:
        if settings is None:
            settings = Settings.load(database_url=database_url)
        elif database_url is not None:
            settings = settings.model_copy(update={"database_url": database_url})
        # No embedded server here: a forgotten DATABASE_URL must fail, not enqueue into a
        # job store that no worker reads.
        self._settings = require_database(settings).model_copy(update={"pool_size": pool_size})
        self._pool: AsyncConnectionPool | None = None
        self._store: Store | None = None
        self._stack: contextlib.AsyncExitStack | None = None

    async def __aenter__(self) -> Queue:
        async with contextlib.AsyncExitStack() as stack:
            settings = self._settings
            self._pool = await stack.enter_async_context(
                open_pool(settings, name="client", min_size=1)
            )
            self._store = Store(self._pool, default_max_attempts=explicit_max_attempts(settings))
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack, self._store = self._stack, None, None
        if stack is not None:
            await stack.__aexit__(exc_type, exc, tb)

    @property
    def store(self) -> Store:
        """The store behind this queue (operations beyond enqueue and read)."""
        if self._store is None:
            raise RuntimeError("use the Queue inside `async with Queue(...) as q:`")
        return self._store

    async def enqueue(
        self,
        task: str,
        payload: Mapping[str, Any] | None = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        dedup_key: str | None = None,
        max_attempts: int | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> EnqueueResult:
        """Enqueues one job and answers its id, status and whether it was a duplicate. A None
        ``queue`` or ``priority`` takes the task's own default (else "default" and 0).

        Raises :class:`~notifyq.errors.InvalidJob` for a malformed job."""
        spec = JobSpec.create(
            task,
            payload,
            queue=queue,
            priority=priority,
            delay=delay,
            run_at=run_at,
            dedup_key=dedup_key,
            max_attempts=max_attempts,
        )
        return await self.store.enqueue(spec, conn=conn)

    async def enqueue_many(
        self,
        jobs: Iterable[JobSpec | Mapping[str, Any]],
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> list[EnqueueResult]:
        """Enqueues many jobs in one transaction, all or none, waiting on the database once;
        answers one result per job, in order. Each job is a :class:`JobSpec` or a mapping with
        the keys of :meth:`enqueue`."""
        # Built as the store takes them: a large batch's first jobs are inserted while the
        # rest are still being checked. An invalid one stores none.
        specs = (job if isinstance(job, JobSpec) else _spec_from_mapping(job) for job in jobs)
        return await self.store.enqueue_many(specs, conn=conn)

    async def get(self, job_id: UUID | str) -> Job | None:
        """The job, or None when no job has that id."""
        return await self.store.get_job(_as_uuid(job_id))

    async def wait(self, job_id: UUID | str, *, timeout: float = 30.0) -> Job:  # noqa: ASYNC109
        """Waits until the job is completed, failed or cancelled and answers it.

        Raises TimeoutError after ``timeout`` seconds and JobNotFound for an unknown id."""
        job_uuid = _as_uuid(job_id)
        delay = 0.01
        with anyio.fail_after(timeout):
            while True:
                job = await self.store.get_job(job_uuid)
                if job is None:
                    raise JobNotFound(f"no job {job_uuid}")
                if job.status.finished:
                    return job
                await anyio.sleep(delay)
                delay = min(delay * 1.5, 0.5)


def _as_uuid(job_id: UUID | str) -> UUID:
    if isinstance(job_id, UUID):
        return job_id
    try:
        return UUID(str(job_id))
    except ValueError:
        raise InvalidJob(f"{job_id!r} is not a job id (a UUID)") from None


def _spec_from_mapping(job: Mapping[str, Any]) -> JobSpec:
    unknown = set(job) - _SPEC_KEYS
    if unknown:
        raise InvalidJob(f"unknown job field(s): {', '.join(sorted(unknown))}")
    if "task" not in job:
        raise InvalidJob("each job needs a task")
    return JobSpec.create(
        job["task"],
        job.get("payload"),
        queue=job.get("queue"),
        priority=job.get("priority"),
        run_at=job.get("run_at"),
        delay=job.get("delay"),
        dedup_key=job.get("dedup_key"),
        max_attempts=job.get("max_attempts"),
    )
