"""The Python client: ``async with notifyq.Queue(url) as q: await q.enqueue("echo", {...})``.

Waits (:meth:`Queue.wait`) are pushed: the first one opens the queue's LISTEN connection, which
every later wait of the queue shares (see :mod:`notifyq.watching`)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any
from uuid import UUID

import anyio
import anyio.to_thread
import psycopg
from psycopg_pool import AsyncConnectionPool

if sys.version_info < (3, 11):  # a builtin from 3.11; anyio installs the backport
    from exceptiongroup import BaseExceptionGroup

from notifyq.bootstrap import require_database
from notifyq.db import connect_kwargs, listen_url, open_pool
from notifyq.errors import JobNotFound, NotifyQError
from notifyq.jobspec import JobOptions, JobSpec
from notifyq.models import EnqueueResult, Job, job_id_of, signal_payload_json, signal_sent
from notifyq.notifier import JOB_CHANNEL, Listener
from notifyq.settings import Settings, explicit_max_attempts
from notifyq.store import Store
from notifyq.tracing import tracing
from notifyq.watching import JobWatcher
from notifyq.workflows import Part, Workflow, WorkflowResult, chain, mapping_spec, plan

if TYPE_CHECKING:
    from typing_extensions import Unpack


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
        self._watcher: JobWatcher | None = None
        self._watching: asyncio.Task[None] | None = None
        self._watcher_lock = anyio.Lock()

    async def __aenter__(self) -> Queue:
        async with contextlib.AsyncExitStack() as stack:
            settings = self._settings
            self._pool = await stack.enter_async_context(
                open_pool(settings, name="client", min_size=1)
            )
            self._store = Store(
                self._pool,
                default_max_attempts=explicit_max_attempts(settings),
                tracing=tracing(settings),
            )
            stack.push_async_callback(self._stop_watching)
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
        conn: psycopg.AsyncConnection[Any] | None = None,
        **options: Unpack[JobOptions],
    ) -> EnqueueResult:
        """Enqueues one job and answers its id, status and whether it was a duplicate. A None
        ``queue`` or ``priority`` takes the task's own default (else "default" and 0).

        With ``depends_on`` (job ids), the job is ``waiting`` until every one of them is
        completed, then queued at once; ``cancelled`` if one of them fails or is cancelled.
        Jobs of one ``(queue, group_key)`` run one at a time, in the order they were enqueued.

        ``options`` are those of :class:`~notifyq.jobspec.JobOptions`. Raises
        :class:`~notifyq.errors.InvalidJob` for a malformed job, and
        :class:`~notifyq.errors.RefusedInput` when ``depends_on`` names an unknown job."""
        spec = JobSpec.create(task, payload, **options)
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
        specs = (job if isinstance(job, JobSpec) else JobSpec.of(job) for job in jobs)
        return await self.store.enqueue_many(specs, conn=conn)

    async def enqueue_workflow(
        self,
        jobs: Workflow | Part | Iterable[Mapping[str, Any]],
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> WorkflowResult:
        """Enqueues a workflow in one transaction (within ``conn``'s when given): jobs that
        name each other by ``ref``, as ``POST /workflows`` takes them (each a mapping with a
        ``ref`` and the keys of :meth:`enqueue`, whose ``depends_on`` names refs or stored job
        ids), or what :func:`~notifyq.chain`, :func:`~notifyq.group` and
        :func:`~notifyq.chord` build. Answers the workflow's id and each ref's job id.

        Raises :class:`~notifyq.errors.InvalidJob`, and stores nothing, for a duplicate or
        unknown ref, a cycle, or a malformed job."""
        if isinstance(jobs, Part):
            jobs = (jobs if isinstance(jobs, Workflow) else chain(jobs)).jobs()
        planned = plan(list(jobs), mapping_spec)
        await self.store.enqueue_many(planned.specs, conn=conn)
        return WorkflowResult(planned.workflow_id, planned.ids)

    async def get(self, job_id: UUID | str) -> Job | None:
        """The job, or None when no job has that id."""
        return await self.store.get_job(job_id_of(job_id))

    async def signal(
        self, job_id: UUID | str, name: str, payload: Mapping[str, Any] | None = None
    ) -> bool:
        """Sends signal ``name`` with ``payload`` (a JSON object; None: ``{}``) to a job, for
        its ``ctx.wait_for_signal(name)``: a job suspended waiting for it runs again as soon as
        this commits. True when sent; False when a signal of that name came first (the first
        wins, this changes nothing). Raises JobNotFound for an unknown job, SignalRefused for
        one that has ended, InvalidJob for a bad name or payload."""
        job_uuid = job_id_of(job_id)
        payload_json = signal_payload_json(name, payload)
        return signal_sent(job_uuid, await self.store.signal_job(job_uuid, name, payload_json))

    async def wait(self, job_id: UUID | str, *, timeout: float = 30.0) -> Job:  # noqa: ASYNC109
        """Waits until the job is completed, failed or cancelled and answers it. Woken by a
        notification when the job changes (the queue's first wait opens its LISTEN
        connection), not by polling.

        Raises TimeoutError after ``timeout`` seconds and JobNotFound for an unknown id."""
        job_uuid = job_id_of(job_id)
        deadline = anyio.current_time() + timeout
        # One look first, outside the deadline (the statement timeout bounds it): a job that has
        # ended is answered even with timeout=0.
        job = await self.store.get_job(job_uuid)
        if job is None:
            raise JobNotFound(f"no job {job_uuid}")
        if job.status.finished:
            return job
        with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
            watcher = await self._job_watcher()
            async with watcher.watch(job_uuid) as changes:
                while True:
                    job = await self.store.get_job(job_uuid)
                    if job is None:
                        raise JobNotFound(f"job {job_uuid} was deleted while waited on")
                    if job.status.finished:
                        return job
                    await changes.wait()

    async def _job_watcher(self) -> JobWatcher:
        """The queue's watcher, started (with its LISTEN connection) on first use, in a task
        of its own: a Queue may be opened and closed by different tasks (a test fixture's setup
        and teardown), which a task group would not allow."""
        async with self._watcher_lock:
            if self._watcher is not None and self._watching and not self._watching.done():
                return self._watcher
            await self._stop_watching()  # one that stopped (its listener met a pooler, say)
            settings = self._settings
            listener = Listener(
                listen_url(settings),
                channels=(JOB_CHANNEL,),
                connect_kwargs=connect_kwargs(settings, "notifyq-client-listener"),
            )
            watcher = JobWatcher(self.store, listener, fallback=settings.poll_interval)
            ready = asyncio.get_running_loop().create_future()

            async def watch() -> None:
                async with anyio.create_task_group() as tg:
                    await tg.start(listener.run)
                    await tg.start(watcher.run)
                    ready.set_result(None)

            self._watching = asyncio.create_task(watch(), name="notifyq-client-watcher")
            await asyncio.wait({ready, self._watching}, return_when=asyncio.FIRST_COMPLETED)
            if not ready.done():
                failed, self._watching = self._watching, None
                # Raises why it could not start (the database is away, a pooler is in
                # between), as itself rather than inside the task group's ExceptionGroup.
                try:
                    failed.result()
                except BaseExceptionGroup as group:
                    raise _sole_cause(group) from None
            self._watcher = watcher
            return watcher

    async def _stop_watching(self) -> None:
        task, self._watching, self._watcher = self._watching, None, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, NotifyQError):
                await task


def _sole_cause(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception a group holds (through nested groups), else the group itself."""
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup) and len(found.exceptions) == 1:
        found = found.exceptions[0]
    return group if isinstance(found, BaseExceptionGroup) else found
