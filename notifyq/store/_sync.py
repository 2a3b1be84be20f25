"""The store for blocking code (``notifyq.SyncQueue``): the producer's statements of
:class:`~notifyq.store.Store`, run on a psycopg_pool ``ConnectionPool`` or on the caller's psycopg
``Connection``.

Nothing here decides anything of its own: the queries are the named ones of ``sql/queries.sql``,
their parameters and answers come from the functions the async store uses
(:mod:`notifyq.store._submit`), pooled connections are retried by the same rule
(:func:`~notifyq.store._runner.run_again`) and the driver's errors translated at the same seam.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from uuid import UUID

import psycopg
from psycopg.rows import RowFactory, kwargs_row, scalar_row, tuple_row
from psycopg_pool import ConnectionPool

from notifyq.db import translate_errors
from notifyq.jobspec import JobSpec
from notifyq.models import EnqueueResult, Job
from notifyq.queries import load_queries
from notifyq.store._runner import Params, run_again
from notifyq.store._submit import (
    RESULT,
    Batch,
    enqueue_statement,
    many_results,
    opens_a_transaction,
)
from notifyq.tracing import NO_TRACING, Tracing

__all__ = ["SyncConn", "SyncStore"]

R = TypeVar("R")
Row = TypeVar("Row")

SyncConn = psycopg.Connection[Any]

_JOB = kwargs_row(Job.of)


class SyncStore:
    """Runs the statements of a producer (enqueue, read, watch a job) against ``pool``, or in
    the transaction of a connection the caller passes."""

    def __init__(
        self,
        pool: ConnectionPool,
        *,
        default_max_attempts: int | None = None,
        tracing: Tracing = NO_TRACING,
    ) -> None:
        """``default_max_attempts`` applies to jobs whose submission and task set none; None
        leaves it to the database's default (``notifyq.settings``). ``tracing``: as the async
        store's."""
        self._pool = pool
        self._q = load_queries()
        self._default_max_attempts = default_max_attempts
        self._tracing = tracing

    def enqueue(self, spec: JobSpec, *, conn: SyncConn | None = None) -> EnqueueResult:
        """Enqueues one job with the duplicate rule; in ``conn``'s transaction when given."""
        with self._tracing.send((spec,), batch=False) as span:
            query, params = enqueue_statement(spec, self._default_max_attempts, span.context)
            result = self._one(query, params, RESULT, what="enqueue", conn=conn)
            assert result is not None, "an enqueue answers a row"
            span.sent((result,), ((spec,),))
        return result

    def enqueue_many(
        self, specs: Iterable[JobSpec], *, conn: SyncConn | None = None
    ) -> list[EnqueueResult]:
        """Enqueues many jobs in one transaction (within ``conn``'s when given), as
        :meth:`notifyq.store.Store.enqueue_many` does: one statement up to ENQUEUE_CHUNK jobs,
        else one per chunk in one pipeline, each sent as soon as ``specs`` has yielded it."""
        batch = Batch(specs, self._default_max_attempts)
        if batch.empty:
            return []
        with self._tracing.send(batch.chunks[0], batch=True) as span:
            batch.trace_context = span.context
            results = self._enqueue_batch(batch, conn)
            span.sent(results, batch.chunks)
        return results

    def _enqueue_batch(self, batch: Batch, conn: SyncConn | None) -> list[EnqueueResult]:
        if batch.small:
            name, chunk, params = batch.first()
            rows = self._all(name, params, tuple_row, what="enqueue", conn=conn)
            return many_results(name, chunk, rows)

        def on(c: SyncConn) -> list[EnqueueResult]:
            sent = []
            if opens_a_transaction(c):
                c.execute("SELECT 1")  # see opens_a_transaction
            with c.transaction(), c.pipeline():
                for name, chunk, params in batch.statements():
                    cursor = c.cursor(row_factory=tuple_row)
                    cursor.execute(self._q[name], params)
                    sent.append((name, chunk, cursor))
                results = []
                for name, chunk, cursor in sent:
                    results += many_results(name, chunk, cursor.fetchall())
            return results

        return self._on_connection(on, what="enqueue", conn=conn)

    def get_job(self, job_id: UUID) -> Job | None:
        """The job, from notifyq.jobs or else the archive (``Job.archived``), or None."""
        return self._one("get_job", {"id": job_id}, _JOB, what="reading a job")

    def signal_job(self, job_id: UUID, name: str, payload_json: str) -> str:
        """As :meth:`notifyq.store.Store.signal_job`."""
        params = {"job_id": job_id, "name": name, "payload": payload_json}
        row = self._one("signal_job", params, tuple_row, what="sending a signal")
        return str(row[0]) if row is not None else "unknown"

    def watch(self, watcher: str, job_id: UUID, ttl: float) -> bool:
        """As :meth:`notifyq.store.Store.watch`: once this returns, a read of the job sees every
        change that was not announced. False: no such job."""
        params = {"watcher": watcher, "id": job_id, "ttl": ttl}
        return bool(self._one("watch_job", params, scalar_row, what="watching a job"))

    def refresh_watches(self, watcher: str, job_ids: list[UUID], ttl: float) -> None:
        """Keeps the watches of ``watcher`` on these jobs alive for ``ttl`` more seconds
        (registering them again if they are gone)."""
        params = {"watcher": watcher, "ids": job_ids, "ttl": ttl}
        self._all("refresh_watches", params, tuple_row, what="refreshing watches")

    def unwatch(self, watcher: str, job_ids: list[UUID]) -> None:
        """Stops :meth:`watch` of these jobs."""
        params = {"watcher": watcher, "ids": job_ids}
        self._all("unwatch_jobs", params, tuple_row, what="unwatching jobs")

    def _all(
        self,
        name: str,
        params: Params,
        row: RowFactory[Row],
        *,
        what: str,
        conn: SyncConn | None = None,
    ) -> list[Row]:
        """Every row of query ``name``."""
        query = self._q[name]

        def on(c: SyncConn) -> list[Row]:
            return c.cursor(row_factory=row).execute(query, params).fetchall()

        return self._on_connection(on, what=what, conn=conn)

    def _one(
        self,
        name: str,
        params: Params,
        row: RowFactory[Row],
        *,
        what: str,
        conn: SyncConn | None = None,
    ) -> Row | None:
        """The first row of query ``name``, or None."""
        query = self._q[name]

        def on(c: SyncConn) -> Row | None:
            return c.cursor(row_factory=row).execute(query, params).fetchone()

        return self._on_connection(on, what=what, conn=conn)

    def _on_connection(self, on: Callable[[SyncConn], R], *, what: str, conn: SyncConn | None) -> R:
        """``on(conn)``, else ``on`` a pooled connection, run again on another one when
        :func:`~notifyq.store._runner.run_again` says so."""
        with translate_errors(what):
            if conn is not None:
                return on(conn)
            tries = (self._pool.max_size or 1) + 1
            for attempt in range(1, tries + 1):
                pooled: SyncConn | None = None
                try:
                    with self._pool.connection() as pooled:
                        return on(pooled)
                except psycopg.Error as exc:
                    if run_again(exc, attempt, tries, pooled):
                        continue
                    raise
        raise AssertionError("unreachable")
