"""Enqueueing from Django: in the transaction of Django's own connection, so that
``transaction.atomic()`` decides for the job as for the rows written with it.

:func:`enqueue`, :func:`enqueue_many` and :func:`enqueue_workflow` check their jobs as
:class:`notifyq.SyncQueue` does and write them with the same statements
(:class:`~notifyq.store.SyncStore`), on Django's connection (``NOTIFYQ["DATABASE"]``, a psycopg
3 ``Connection`` since Django 4.2) and never on one of their own: a web process opens no
connection for notifyq, and a test database has no session of notifyq's that would keep the
test runner from dropping it. :func:`queue` is the process's SyncQueue, made on first use, for
what needs a connection of its own (``get``, ``wait``, or a job that should commit at once).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from psycopg_pool import ConnectionPool

from notifyq.django._settings import database_alias, notifyq_settings
from notifyq.jobspec import JobOptions, JobSpec
from notifyq.models import EnqueueResult
from notifyq.settings import explicit_max_attempts
from notifyq.store import SyncStore
from notifyq.sync_client import SyncQueue
from notifyq.tracing import tracing
from notifyq.workflows import Part, Workflow, WorkflowResult, chain, mapping_spec, plan

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "enqueue",
    "enqueue_many",
    "enqueue_workflow",
    "forget_queue",
    "psycopg_connection",
    "queue",
]

R = TypeVar("R")

_lock = threading.Lock()
_queue: SyncQueue | None = None
_store: SyncStore | None = None
_close_at_exit = False


def queue() -> SyncQueue:
    """The process's SyncQueue on notifyq's database, made on first use (and closed at exit):
    for ``get`` and ``wait``, and for jobs that commit on their own (its pool opens on its
    first call). :func:`forget_queue` closes it; a test suite that reads jobs through it calls
    that before the test database is dropped (``addClassCleanup(forget_queue)``)."""
    global _queue, _close_at_exit
    with _lock:
        if _queue is None:
            _queue = SyncQueue(settings=notifyq_settings())
            if not _close_at_exit:
                atexit.register(forget_queue)
                _close_at_exit = True
        return _queue


def forget_queue() -> None:
    """Closes the process's SyncQueue (its pool and LISTEN connection); the next use makes a
    new one from the settings as they are then. Called when a test changes NOTIFYQ or
    DATABASES."""
    global _queue, _store
    with _lock:
        old, _queue, _store = _queue, None, None
    if old is not None:
        old.close()


def psycopg_connection() -> psycopg.Connection[Any]:
    """Django's connection to notifyq's database (``NOTIFYQ["DATABASE"]``) as the psycopg 3
    ``Connection`` it is, opened if it was not. Inside ``transaction.atomic()`` it is in that
    transaction; outside, in autocommit."""
    alias = database_alias()
    wrapper = connections[alias]
    if wrapper.vendor != "postgresql":
        raise ImproperlyConfigured(
            f"notifyq enqueues in Django's transaction only on PostgreSQL; DATABASES[{alias!r}] "
            f"is {wrapper.vendor}: use notifyq.django.queue().enqueue(...), which "
            "commits on its own"
        )
    wrapper.ensure_connection()
    conn = wrapper.connection
    if not isinstance(conn, psycopg.Connection):
        raise ImproperlyConfigured(
            "notifyq enqueues in Django's transaction with psycopg 3 (Django 4.2 or later); "
            f"DATABASES[{alias!r}] runs on {type(conn).__module__}: pip install "
            "'psycopg[binary]', or use notifyq.django.queue().enqueue(...), which "
            "commits on its own"
        )
    return conn


def enqueue(
    task: str, payload: Mapping[str, Any] | None = None, **options: Unpack[JobOptions]
) -> EnqueueResult:
    """Enqueues a job in the current transaction of Django's connection: inside
    ``transaction.atomic()`` the job exists once the block commits, and never if it rolls
    back; outside, it commits at once. Arguments, answers and errors are those of
    :meth:`notifyq.SyncQueue.enqueue`."""
    spec = JobSpec.create(task, payload, **options)
    return _in_transaction(lambda store, conn: store.enqueue(spec, conn=conn))


def enqueue_many(jobs: Iterable[JobSpec | Mapping[str, Any]]) -> list[EnqueueResult]:
    """Enqueues many jobs in the current transaction of Django's connection, all or none, as
    :meth:`notifyq.SyncQueue.enqueue_many` does (each job a JobSpec or a mapping with the keys
    of :func:`enqueue` and ``task``, ``payload``)."""
    specs = (job if isinstance(job, JobSpec) else JobSpec.of(job) for job in jobs)
    return _in_transaction(lambda store, conn: store.enqueue_many(specs, conn=conn))


def enqueue_workflow(jobs: Part | Iterable[Mapping[str, Any]]) -> WorkflowResult:
    """Enqueues a workflow (what :func:`notifyq.chain`, :func:`notifyq.group` and
    :func:`notifyq.chord` build, or jobs naming each other by ``ref``) in the current
    transaction of Django's connection, as :meth:`notifyq.SyncQueue.enqueue_workflow` does."""
    if isinstance(jobs, Part):
        jobs = (jobs if isinstance(jobs, Workflow) else chain(jobs)).jobs()
    planned = plan(list(jobs), mapping_spec)
    _in_transaction(lambda store, conn: store.enqueue_many(planned.specs, conn=conn))
    return WorkflowResult(planned.workflow_id, planned.ids)


def _producer() -> SyncStore:
    """The statements of a producer, run only on connections the caller passes: its pool is
    never opened."""
    global _store
    with _lock:
        if _store is None:
            settings = notifyq_settings()
            _store = SyncStore(
                ConnectionPool("", open=False),
                default_max_attempts=explicit_max_attempts(settings),
                tracing=tracing(settings),
            )
        return _store


def _in_transaction(write: Callable[[SyncStore, psycopg.Connection[Any]], R]) -> R:
    conn = psycopg_connection()
    wrapper = connections[database_alias()]
    try:
        return write(_producer(), conn)
    except Exception:
        # Django did not run the statement, so it does not know what it left behind; tell it,
        # as it tells itself after a query of its own failed: an aborted transaction must be
        # rolled back, not written on, and a broken connection replaced.
        if wrapper.in_atomic_block and (
            conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        ):
            wrapper.needs_rollback = True
        if conn.broken or conn.closed:
            wrapper.errors_occurred = True
        raise
