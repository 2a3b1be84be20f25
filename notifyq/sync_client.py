"""The blocking client: ``notifyq.SyncQueue(url)``, for code without an event loop (Django and
Flask views, scripts, threads).

It has the methods of :class:`notifyq.Queue` with the same arguments, answers and errors: jobs
are checked by the same code (:class:`~notifyq.jobspec.JobSpec`, :func:`~notifyq.workflows.plan`)
and written by the same statements (:class:`~notifyq.store.SyncStore`). One SyncQueue may be
shared by every thread of a process. It holds a small psycopg_pool ``ConnectionPool``, opened on
first use (or by ``with``). Its waits are :meth:`notifyq.Queue.wait` itself: the first one
starts an event loop in a thread of its own (anyio's blocking portal) with a
:class:`notifyq.Queue` in it, whose one LISTEN connection and job watcher serve every waiting
thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any
from uuid import UUID

import anyio
import psycopg
from anyio.from_thread import BlockingPortal
from psycopg_pool import ConnectionPool

from notifyq.bootstrap import require_database
from notifyq.client import Queue
from notifyq.db import (
    open_sync_pool,
)
from notifyq.jobspec import JobOptions, JobSpec
from notifyq.models import EnqueueResult, Job, job_id_of, signal_payload_json, signal_sent
from notifyq.settings import Settings, explicit_max_attempts
from notifyq.store import SyncStore
from notifyq.tracing import tracing
from notifyq.workflows import Part, Workflow, WorkflowResult, chain, mapping_spec, plan

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["SyncQueue"]

logger = logging.getLogger(__name__)


class SyncQueue:
    """A blocking handle on a notifyq database for submitting and reading jobs, safe to share
    between threads.

    Its pool opens on first use, or by ``with SyncQueue(url) as q:``; :meth:`close` (or the end
    of the ``with`` block) closes it. Without a URL it uses DATABASE_URL, and refuses to run
    without one, as :class:`notifyq.Queue` does. Every ``enqueue`` takes ``conn=``: a psycopg
    (sync) ``Connection`` of the caller, in which case the job is written in the caller's
    transaction and becomes visible, and wakes workers, only when it commits.
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
        self._lock = threading.Lock()
        self._closed = False
        self._pool: ConnectionPool | None = None
        self._store: SyncStore | None = None
        #: Guards the start and the end of the waits' event loop.
        self._waits_lock = threading.Lock()
        self._portal: contextlib.ExitStack | None = None
        self._waits: tuple[BlockingPortal, Queue] | None = None

    def __enter__(self) -> SyncQueue:
        self._opened()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stops the waits' event loop (and its LISTEN connection) and closes the pool; the
        queue cannot be used after."""
        with self._lock:
            self._closed = True
            pool, self._pool, self._store = self._pool, None, None
        with self._waits_lock:
            stack, self._portal, self._waits = self._portal, None, None
        if stack is not None:
            stack.close()
        if pool is not None:
            pool.close()

    def enqueue(
        self,
        task: str,
        payload: Mapping[str, Any] | None = None,
        *,
        conn: psycopg.Connection[Any] | None = None,
        **options: Unpack[JobOptions],
    ) -> EnqueueResult:
        """Enqueues one job and answers its id, status and whether it was a duplicate, as
        :meth:`notifyq.Queue.enqueue` does (same arguments, same defaults, same errors:
        :class:`~notifyq.errors.InvalidJob` for a malformed job,
        :class:`~notifyq.errors.RefusedInput` when ``depends_on`` names an unknown job)."""
        spec = JobSpec.create(task, payload, **options)
        return self._opened().enqueue(spec, conn=_callers(conn))

    def enqueue_many(
        self,
        jobs: Iterable[JobSpec | Mapping[str, Any]],
        *,
        conn: psycopg.Connection[Any] | None = None,
    ) -> list[EnqueueResult]:
        """Enqueues many jobs in one transaction, all or none, waiting on the database once;
        answers one result per job, in order. Each job is a :class:`JobSpec` or a mapping with
        the keys of :meth:`enqueue`."""
        store = self._opened()
        specs = (job if isinstance(job, JobSpec) else JobSpec.of(job) for job in jobs)
        return store.enqueue_many(specs, conn=_callers(conn))

    def enqueue_workflow(
        self,
        jobs: Workflow | Part | Iterable[Mapping[str, Any]],
        *,
        conn: psycopg.Connection[Any] | None = None,
    ) -> WorkflowResult:
        """Enqueues a workflow in one transaction (within ``conn``'s when given), as
        :meth:`notifyq.Queue.enqueue_workflow` does: jobs that name each other by ``ref``, or
        what :func:`~notifyq.chain`, :func:`~notifyq.group` and :func:`~notifyq.chord` build.
        Answers the workflow's id and each ref's job id; raises
        :class:`~notifyq.errors.InvalidJob`, and stores nothing, for a duplicate or unknown
        ref, a cycle, or a malformed job."""
        if isinstance(jobs, Part):
            jobs = (jobs if isinstance(jobs, Workflow) else chain(jobs)).jobs()
        planned = plan(list(jobs), mapping_spec)
        self._opened().enqueue_many(planned.specs, conn=_callers(conn))
        return WorkflowResult(planned.workflow_id, planned.ids)

    def get(self, job_id: UUID | str) -> Job | None:
        """The job, or None when no job has that id."""
        return self._opened().get_job(job_id_of(job_id))

    def signal(
        self, job_id: UUID | str, name: str, payload: Mapping[str, Any] | None = None
    ) -> bool:
        """Sends signal ``name`` to a job, as :meth:`notifyq.Queue.signal` does: True when
        sent, False when a signal of that name came first."""
        job_uuid = job_id_of(job_id)
        payload_json = signal_payload_json(name, payload)
        return signal_sent(job_uuid, self._opened().signal_job(job_uuid, name, payload_json))

    def wait(self, job_id: UUID | str, *, timeout: float = 30.0) -> Job:
        """Blocks until the job is completed, failed or cancelled and answers it, as
        :meth:`notifyq.Queue.wait` does (it is that wait, run in the queue's event loop):
        woken by a notification when the job changes, not by polling.

        Raises TimeoutError after ``timeout`` seconds and JobNotFound for an unknown id."""
        job_uuid = job_id_of(job_id)
        portal, queue = self._started_waits()
        return portal.call(partial(queue.wait, job_uuid, timeout=timeout))

    def _opened(self) -> SyncStore:
        """The store, its pool opened on first use."""
        store = self._store
        if store is not None:
            return store
        with self._lock:
            if self._closed:
                raise RuntimeError("this SyncQueue is closed")
            if self._store is None:
                self._pool = open_sync_pool(self._settings, name="client", min_size=1)
                self._store = SyncStore(
                    self._pool,
                    default_max_attempts=explicit_max_attempts(self._settings),
                    tracing=tracing(self._settings),
                )
            return self._store

    def _started_waits(self) -> tuple[BlockingPortal, Queue]:
        """The event loop of the waits and the Queue in it, started on first use."""
        with self._waits_lock:
            if self._closed:
                raise RuntimeError("this SyncQueue is closed")
            if self._waits is None:
                with contextlib.ExitStack() as stack:
                    portal = _daemon_portal(stack)
                    queue = Queue(settings=self._settings, pool_size=2)
                    stack.enter_context(portal.wrap_async_context_manager(queue))
                    self._portal, self._waits = stack.pop_all(), (portal, queue)
            return self._waits


def _daemon_portal(stack: contextlib.ExitStack) -> BlockingPortal:
    """An event loop in a daemon thread, and the portal that calls into it from others; the
    loop is stopped when ``stack`` closes.

    Not anyio's start_blocking_portal: its thread is not a daemon, so a script that never
    closed its SyncQueue would hang at exit, waiting for the loop to end. A plain callback, not
    a generator, so that nothing runs when the queue is merely collected at exit."""
    started: Future[BlockingPortal] = Future()

    async def serve() -> None:
        async with BlockingPortal() as portal:
            started.set_result(portal)
            await portal.sleep_until_stopped()

    def run() -> None:
        try:
            anyio.run(serve)
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)

    thread = threading.Thread(target=run, name="notifyq-sync-waits", daemon=True)
    thread.start()
    portal = started.result()

    def stop() -> None:
        with contextlib.suppress(RuntimeError):  # the loop has ended already
            portal.start_task_soon(portal.stop)
        thread.join(timeout=10)

    stack.callback(stop)
    return portal


def _callers(conn: psycopg.Connection[Any] | None) -> psycopg.Connection[Any] | None:
    # An AsyncConnection would take every statement and run none of them.
    if conn is not None and not isinstance(conn, psycopg.Connection):
        raise TypeError(
            f"conn= takes a psycopg Connection, not {type(conn).__name__} "
            "(for an AsyncConnection, use notifyq.Queue)"
        )
    return conn
