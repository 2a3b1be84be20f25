"""The blocking client: ``notifyq.SyncQueue(url)``, for code without an event loop (Django and
Flask views, scripts, threads).

It has the methods of :class:`notifyq.Queue` with the same arguments, answers and errors: jobs
are checked by the same code (:class:`~notifyq.models.JobSpec`, :func:`~notifyq.workflows.plan`)
and written by the same statements (:class:`~notifyq.store.SyncStore`). One SyncQueue may be
shared by every thread of a process. It holds a small psycopg_pool ``ConnectionPool``, opened on
first use (or by ``with``), and from the first :meth:`SyncQueue.wait` one LISTEN connection, in
a thread of its own, that tells the waiting threads when their job changes (:class:`_Waits`, the
blocking twin of :class:`notifyq.watching.JobWatcher`, with the same watch rows).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from notifyq.bootstrap import require_database
from notifyq.client import _as_uuid, _spec_from_mapping, _workflow_spec
from notifyq.db import (
    connect_kwargs,
    first_line,
    is_connection_error,
    listen_url,
    open_sync_pool,
    redact,
)
from notifyq.errors import ConfigurationError, DatabaseUnavailable, JobNotFound, NotifyQError
from notifyq.models import EnqueueResult, Job, JobSpec
from notifyq.notifier import JOB_CHANNEL, POOLED, PROBE_CHANNEL, PROBE_WAIT
from notifyq.settings import Settings, explicit_max_attempts
from notifyq.store import SyncStore
from notifyq.tracing import tracing
from notifyq.watching import WATCH_TTL
from notifyq.workflows import Part, Workflow, WorkflowResult, chain, plan

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
        self._waits: _Waits | None = None

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
        """Stops the LISTEN thread and closes the pool; the queue cannot be used after."""
        with self._lock:
            self._closed = True
            waits, self._waits = self._waits, None
            pool, self._pool, self._store = self._pool, None, None
        if waits is not None:
            waits.stop()
        if pool is not None:
            pool.close()

    def enqueue(
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
        depends_on: Iterable[UUID | str] | None = None,
        group_key: str | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> EnqueueResult:
        """Enqueues one job and answers its id, status and whether it was a duplicate, as
        :meth:`notifyq.Queue.enqueue` does (same arguments, same defaults, same errors:
        :class:`~notifyq.errors.InvalidJob` for a malformed job,
        :class:`~notifyq.errors.RefusedInput` when ``depends_on`` names an unknown job)."""
        spec = JobSpec.create(
            task,
            payload,
            queue=queue,
            priority=priority,
            delay=delay,
            run_at=run_at,
            dedup_key=dedup_key,
            max_attempts=max_attempts,
            depends_on=depends_on,
            group_key=group_key,
        )
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
        specs = (job if isinstance(job, JobSpec) else _spec_from_mapping(job) for job in jobs)
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
        planned = plan(list(jobs), _workflow_spec)
        self._opened().enqueue_many(planned.specs, conn=_callers(conn))
        return WorkflowResult(planned.workflow_id, planned.ids)

    def get(self, job_id: UUID | str) -> Job | None:
        """The job, or None when no job has that id."""
        return self._opened().get_job(_as_uuid(job_id))

    def wait(self, job_id: UUID | str, *, timeout: float = 30.0) -> Job:
        """Blocks until the job is completed, failed or cancelled and answers it. Woken by a
        notification when the job changes (the queue's first wait opens its LISTEN
        connection), not by polling.

        Raises TimeoutError after ``timeout`` seconds (a statement under way when they run out
        still ends first, within the statement timeout) and JobNotFound for an unknown id."""
        job_uuid = _as_uuid(job_id)
        deadline = time.monotonic() + timeout
        store = self._opened()
        job = store.get_job(job_uuid)
        if job is None:
            raise JobNotFound(f"no job {job_uuid}")
        if job.status.finished:
            return job
        waits = self._started_waits(store, deadline)
        with waits.watch(job_uuid) as changes:
            while True:
                job = store.get_job(job_uuid)
                if job is None:
                    raise JobNotFound(f"job {job_uuid} was deleted while waited on")
                if job.status.finished:
                    return job
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"job {job_uuid} did not finish within {timeout} s")
                changes.wait(min(remaining, waits.fallback))

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

    def _started_waits(self, store: SyncStore, deadline: float) -> _Waits:
        """The queue's waits, their LISTEN thread started on first use (and again after one
        that stopped: its first connection failed, or met a pooler)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this SyncQueue is closed")
            waits = self._waits
            if waits is None or waits.stopped:
                waits = self._waits = _Waits(store, self._settings)
        waits.ready(deadline - time.monotonic())
        return waits


def _callers(conn: psycopg.Connection[Any] | None) -> psycopg.Connection[Any] | None:
    # An AsyncConnection would take every statement and run none of them.
    if conn is not None and not isinstance(conn, psycopg.Connection):
        raise TypeError(
            f"conn= takes a psycopg Connection, not {type(conn).__name__} "
            "(for an AsyncConnection, use notifyq.Queue)"
        )
    return conn


class _Changes:
    """One waiter's view of one job: :meth:`wait` returns when the job may have changed."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def changed(self) -> None:
        """The job may have changed (a notification, or a reconnect of the listener)."""
        self._event.set()

    def wait(self, timeout: float) -> bool:
        """Blocks until the job may have changed (True), for at most ``timeout`` seconds."""
        changed = self._event.wait(timeout)
        if changed:
            # Cleared before the caller reads the job: a change told after this is told again.
            self._event.clear()
        return changed


class _Waits:
    """The waits of one SyncQueue on jobs: one LISTEN connection (channel ``notifyq_job``) in a
    thread of its own, fanned out to the waiting threads.

    The protocol is :class:`notifyq.watching.JobWatcher`'s: the first waiter of a job registers
    a watch row (``watch_v1``, after LISTEN is live: a change committed later is announced, one
    in flight is seen by the next read), the thread refreshes the rows while anyone waits and
    registers them again after a reconnect, then tells every waiter to look (what was announced
    meanwhile is gone), and the last waiter of a job removes its row. Waiters also look every
    ``fallback`` seconds (the poll interval), as a last resort."""

    def __init__(
        self,
        store: SyncStore,
        settings: Settings,
        *,
        probe_interval: float = 5.0,
        max_backoff: float = 2.0,
    ) -> None:
        self.id = f"{socket.gethostname()}:{secrets.token_hex(4)}"
        #: Seconds between looks at a waited job when no notification comes.
        self.fallback = settings.poll_interval
        self._store = store
        self._url = listen_url(settings)
        # The listener only waits: no statement timeout.
        self._kwargs = connect_kwargs(settings, "notifyq-client-listener", statement_timeout=0)
        self._ttl = WATCH_TTL
        self._probe_interval = probe_interval
        self._max_backoff = max_backoff
        #: Guards the waiters (the LISTEN thread hands notifications to them).
        self._lock = threading.Lock()
        #: Held while a watch row is registered or removed: the second waiter of a job waits
        #: for the first one's row, and a row removed by a job's last waiter cannot remove the
        #: row of the next one.
        self._rows = threading.Lock()
        self._waiters: dict[UUID, set[_Changes]] = {}
        self._started = threading.Event()
        self._error: NotifyQError | None = None
        self._stopping = threading.Event()
        # The thread waits on the connection and on this socket, which stop() writes to.
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._thread = threading.Thread(target=self._run, name="notifyq-sync-listener", daemon=True)
        self._thread.start()

    @property
    def stopped(self) -> bool:
        """Whether the LISTEN thread has ended (it reconnects for ever once it started)."""
        return not self._thread.is_alive()

    def ready(self, timeout: float) -> None:
        """Blocks until LISTEN is live. Raises why the thread could not start (the database is
        away: DatabaseUnavailable; a transaction-mode pooler: ConfigurationError), or
        TimeoutError after ``timeout`` seconds."""
        if not self._started.wait(max(timeout, 0)):
            raise TimeoutError("the LISTEN connection of the SyncQueue is not open yet")
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        """Ends the LISTEN thread and closes its connection."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_writer.send(b"\0")
        self._thread.join(10)

    @contextlib.contextmanager
    def watch(self, job_id: UUID) -> Iterator[_Changes]:
        """Waits on ``job_id`` for the duration of the block: read the job after entering it,
        and again after each ``changes.wait()``. Raises DatabaseUnavailable when the watch
        cannot be registered."""
        changes = _Changes()
        with self._rows:
            with self._lock:
                waiters = self._waiters.setdefault(job_id, set())
                first = not waiters
                waiters.add(changes)
            try:
                if first:
                    self._store.watch(self.id, job_id, self._ttl)
            except BaseException:
                self._leave(job_id, waiters, changes)
                raise
        try:
            yield changes
        finally:
            with self._rows:
                if self._leave(job_id, waiters, changes):
                    with contextlib.suppress(NotifyQError):
                        self._store.unwatch(self.id, [job_id])

    def _leave(self, job_id: UUID, waiters: set[_Changes], changes: _Changes) -> bool:
        """Removes a waiter; True when it was the job's last."""
        with self._lock:
            waiters.discard(changes)
            if waiters or self._waiters.get(job_id) is not waiters:
                return False
            del self._waiters[job_id]
            return True

    def _tell(self, job_id: UUID | None = None) -> None:
        """Tells the waiters of ``job_id`` (of every job, for None) to look at their job."""
        with self._lock:
            if job_id is None:
                everyone = [c for waiters in self._waiters.values() for c in waiters]
            else:
                everyone = list(self._waiters.get(job_id, ()))
        for changes in everyone:
            changes.changed()

    def _refresh(self) -> None:
        with self._lock:
            job_ids = list(self._waiters)
        if job_ids:
            try:
                self._store.refresh_watches(self.id, job_ids, self._ttl)
            except NotifyQError as exc:
                logger.warning("could not refresh %d job watch(es): %s", len(job_ids), exc)

    # -- the LISTEN thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._listen_until_stopped()
        finally:
            self._wake_reader.close()
            self._wake_writer.close()

    def _listen_until_stopped(self) -> None:
        """Listens until stopped; reconnects for ever once the first LISTEN was live."""
        backoff = 0.1
        while not self._stopping.is_set():
            try:
                conn = psycopg.Connection.connect(self._url, **self._kwargs)
            except psycopg.OperationalError as exc:
                if not self._started.is_set():
                    self._fail(
                        DatabaseUnavailable(
                            f"cannot open the LISTEN connection to {redact(self._url)}: "
                            f"{first_line(exc)}"
                        )
                    )
                    return
                logger.warning(
                    "sync listener: reconnect failed (%s); retrying in %.1fs",
                    first_line(exc),
                    backoff,
                )
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, self._max_backoff)
                continue
            try:
                with conn:
                    self._listen(conn)
                    backoff = 0.1
                    self._started.set()
                    # Registered again (a crash empties unlogged tables), then every waiter
                    # looks: what was announced while the listener was away is gone.
                    self._refresh()
                    self._tell()
                    self._receive(conn)
            except ConfigurationError as exc:
                self._fail(exc)
                return
            except Exception as exc:
                if not is_connection_error(exc):
                    logger.exception("sync listener: stopped by an unexpected error")
                    self._fail(DatabaseUnavailable(f"the LISTEN thread stopped: {exc}"))
                    return
                logger.warning("sync listener: connection lost (%s); reconnecting", first_line(exc))
            finally:
                # The waiters look at their jobs every fallback interval until it is back.
                self._tell()

    def _fail(self, error: NotifyQError) -> None:
        """Ends the thread: a waiter that asks for it next raises ``error``, and the queue
        starts another one."""
        self._error = error
        self._started.set()
        self._tell()

    def _listen(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(JOB_CHANNEL)))
        row = conn.execute(
            "SELECT pg_catalog.array_agg(c) FROM pg_catalog.pg_listening_channels() AS c"
        ).fetchone()
        if not row or JOB_CHANNEL not in (row[0] or ()):
            raise ConfigurationError(f"LISTEN did not take effect on this connection: {POOLED}")
        self._prove_delivery(conn)

    def _prove_delivery(self, conn: psycopg.Connection[Any]) -> None:
        """notifyq.notifier.Listener's proof that notifications reach this connection: one
        sent from another connection must arrive while this one is idle."""
        token = secrets.token_hex(8)
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(PROBE_CHANNEL)))
        try:
            kwargs = {**self._kwargs, "application_name": "notifyq-listener-probe"}
            with psycopg.Connection.connect(self._url, **kwargs) as other:
                other.execute("SELECT pg_catalog.pg_notify(%s, %s)", [PROBE_CHANNEL, token])
            deadline = time.monotonic() + PROBE_WAIT
            while (left := deadline - time.monotonic()) > 0:
                # Closed at once when left early: the generator holds the connection's lock.
                with contextlib.closing(conn.notifies(timeout=left)) as arrived:
                    for notify in arrived:
                        if notify.channel != PROBE_CHANNEL:
                            self._notified(notify.payload)
                        elif notify.payload == token:
                            return
            raise ConfigurationError(
                f"a notification sent to this LISTEN connection did not arrive within "
                f"{PROBE_WAIT:g} s: {POOLED}"
            )
        finally:
            conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(PROBE_CHANNEL)))

    def _receive(self, conn: psycopg.Connection[Any]) -> None:
        """Hands notifications to the waiters until stopped; refreshes the watch rows every
        third of their lifetime, and probes the connection when nothing came for a while, so
        that a dead TCP connection cannot pass for a quiet one."""
        next_refresh = time.monotonic() + self._ttl / 3
        with selectors.DefaultSelector() as selector:
            selector.register(conn.fileno(), selectors.EVENT_READ)
            selector.register(self._wake_reader, selectors.EVENT_READ)
            while not self._stopping.is_set():
                # What has arrived, also while the probe ran: never blocks.
                for notify in conn.notifies(timeout=0):
                    self._notified(notify.payload)
                now = time.monotonic()
                if now >= next_refresh:
                    self._refresh()
                    next_refresh = now + self._ttl / 3
                quiet = not selector.select(min(self._probe_interval, next_refresh - now))
                if quiet:
                    conn.execute("SELECT 1")

    def _notified(self, payload: str) -> None:
        try:
            job_id = UUID(payload)
        except ValueError:
            return  # not ours: someone else's NOTIFY on the channel
        self._tell(job_id)
