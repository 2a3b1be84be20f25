"""Submitting jobs: one, or many in one transaction (within the caller's when given)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from itertools import count, islice
from typing import Any
from uuid import UUID

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import kwargs_row, tuple_row

from notifyq.jobspec import JobSpec, options
from notifyq.models import EnqueueResult, JobStatus
from notifyq.store._runner import Conn, Runner

#: Jobs per statement of enqueue_many. Sent in one pipeline, chunks of 250 moved 1,000 jobs
#: x1.35 as fast as one statement did; smaller chunks added statements for no gain.
ENQUEUE_CHUNK = 250

#: The row factory of the enqueue statements.
RESULT = kwargs_row(EnqueueResult.of)


class Submitting(Runner):
    """The enqueue statements of :class:`~notifyq.store.Store`."""

    async def enqueue(self, spec: JobSpec, *, conn: Conn | None = None) -> EnqueueResult:
        """Enqueues one job with the duplicate rule; in ``conn``'s transaction when given."""
        with self._tracing.send((spec,), batch=False) as span:
            query, params = enqueue_statement(spec, self._default_max_attempts, span.context)
            result = await self._one(query, params, RESULT, what="enqueue", conn=conn)
            assert result is not None, "an enqueue answers a row"
            span.sent((result,), ((spec,),))
        return result

    async def enqueue_many(
        self, specs: Iterable[JobSpec], *, conn: Conn | None = None
    ) -> list[EnqueueResult]:
        """Enqueues many jobs in one transaction (within ``conn``'s when given); one result per
        spec, in order. ``specs`` may be lazy, and may raise (InvalidJob, say): then nothing
        is stored.

        Up to ENQUEUE_CHUNK jobs go as one statement. A larger batch goes as one statement per
        chunk, in one pipeline: each chunk is sent as soon as ``specs`` has yielded it, so that
        PostgreSQL inserts it while the next one is validated and encoded. One span for the
        whole batch, whose trace context every job keeps."""
        batch = Batch(specs, self._default_max_attempts)
        if batch.empty:
            return []
        with self._tracing.send(batch.chunks[0], batch=True) as span:
            batch.trace_context = span.context
            results = await self._enqueue_batch(batch, conn)
            span.sent(results, batch.chunks)
        return results

    async def _enqueue_batch(self, batch: Batch, conn: Conn | None) -> list[EnqueueResult]:
        if batch.small:
            name, chunk, params = batch.first()
            rows = await self._all(name, params, tuple_row, what="enqueue", conn=conn)
            return many_results(name, chunk, rows)

        async def on(c: Conn) -> list[EnqueueResult]:
            sent = []
            if opens_a_transaction(c):
                await c.execute("SELECT 1")  # see opens_a_transaction
            async with c.transaction(), c.pipeline():
                for name, chunk, params in batch.statements():
                    cursor = c.cursor(row_factory=tuple_row)
                    await cursor.execute(self._q[name], params)
                    sent.append((name, chunk, cursor))
                results = []
                for name, chunk, cursor in sent:
                    results += many_results(name, chunk, await cursor.fetchall())
            return results

        return await self._on_connection(on, what="enqueue", conn=conn)


def opens_a_transaction(c: psycopg.BaseConnection[Any]) -> bool:
    """Whether ``c.transaction()`` would begin and commit a transaction of its own: on a
    caller's connection (not autocommit) before its transaction's first statement. A batch must
    be a savepoint in the caller's transaction instead, or a rollback of theirs would keep it;
    any statement begins theirs, as their own next one would."""
    return not c.autocommit and c.info.transaction_status == TransactionStatus.IDLE


class Batch:
    """The statements of one ``enqueue_many``: the specs taken ENQUEUE_CHUNK at a time, as
    they are sent, and kept, so that a retry on another connection sends the chunks taken so
    far again before taking more."""

    def __init__(self, specs: Iterable[JobSpec], fallback: int | None) -> None:
        self._pending = iter(specs)
        self._fallback = fallback
        #: The chunks taken so far (the first one at once).
        self.chunks = [list(islice(self._pending, ENQUEUE_CHUNK))]
        #: The trace context every job of the batch keeps (JSON text), or None.
        self.trace_context: str | None = None

    @property
    def empty(self) -> bool:
        """Whether there is no job at all."""
        return not self.chunks[0]

    @property
    def small(self) -> bool:
        """Whether the jobs fit in one chunk: one statement, no pipeline."""
        return len(self.chunks[0]) < ENQUEUE_CHUNK

    def first(self) -> tuple[str, list[JobSpec], dict[str, Any]]:
        """The first chunk's query name, jobs and parameters."""
        return next(self.statements())

    def statements(self) -> Iterator[tuple[str, list[JobSpec], dict[str, Any]]]:
        """Each chunk's query name, jobs and parameters, in order, taking more specs as
        needed."""
        for index in count():
            if index == len(self.chunks):
                chunk = list(islice(self._pending, ENQUEUE_CHUNK))
                if not chunk:
                    return
                self.chunks.append(chunk)
            name, params = many_statement(self.chunks[index], self._fallback, self.trace_context)
            yield name, self.chunks[index], params


def enqueue_statement(
    spec: JobSpec, fallback: int | None, trace_context: str | None = None
) -> tuple[str, dict[str, Any]]:
    """The query that enqueues one job, and its parameters: a plain INSERT without a dedup key,
    a task to resolve in SQL, dependencies, a group or a trace context; else
    ``notifyq.enqueue_v5``. ``fallback`` is the max_attempts of a job whose submission and task
    set none; ``trace_context`` the JSON text of the trace context it keeps."""
    # A traced job goes through enqueue_v5 (SECURITY DEFINER): the plain INSERT names only the
    # columns a producer role of an earlier version was granted.
    if spec.plain and trace_context is None:
        return "enqueue_plain", _spec_params(spec) | {"fallback": fallback}
    return "enqueue", _spec_params(spec) | {"fallback": fallback, "trace_context": trace_context}


def many_statement(
    specs: list[JobSpec], fallback: int | None, trace_context: str | None = None
) -> tuple[str, dict[str, Any]]:
    """The query that enqueues ``specs`` in one statement (see :func:`many_results`), and its
    parameters: one array per option, named as the option; ``trace_context`` is kept by every
    one of them (see :func:`enqueue_statement`)."""
    params: dict[str, Any] = {
        "tasks": [s.task for s in specs],
        "payloads": [s.payload_json for s in specs],
        "fallback": fallback,
    }
    if trace_context is not None or not all(s.plain for s in specs):
        for name, option in options().items():
            values = [option.to_sql(s.options.get(name)) for s in specs]
            # An array of arrays must be rectangular: a job's ids go as the text of its array.
            params[name] = _sparse([_array_text(v) for v in values] if option.many else values)
        return "enqueue_many", params | {
            "workflow_ids": _sparse([s.workflow_id for s in specs]),
            "ids": _sparse([s.id for s in specs]),
            "trace_context": trace_context,
            "refs": _sparse([s.ref for s in specs]),
        }
    # No duplicates to look for and every task known: one INSERT ... SELECT, which answers
    # the ids in input order. A column that no job sets goes as one NULL.
    for name, option in options().items():
        if option.plain:
            params[name] = _sparse([s.options.get(name) for s in specs])
    return "enqueue_many_plain", params


def many_results(query: str, specs: list[JobSpec], rows: list[Any]) -> list[EnqueueResult]:
    """The results of ``specs``, from the rows of the statement that enqueued them: one per job
    (enqueue_many: ord, job_id, duplicate, status, run_at, created_at), or one for them all
    (enqueue_many_plain: now, count, ids in input order)."""
    if query == "enqueue_many":
        return [EnqueueResult(r[1], JobStatus(r[3]), r[2], r[4], r[5]) for r in rows]
    now: datetime = rows[0][0]
    ids: list[UUID] = rows[0][2]
    return [
        EnqueueResult(
            job_id,
            JobStatus.QUEUED,
            False,
            spec.run_at or (now + timedelta(seconds=spec.delay) if spec.delay else now),
            now,
        )
        for job_id, spec in zip(ids, specs, strict=True)
    ]


def _array_text(ids: list[UUID] | None) -> str | None:
    """The text of a uuid[] (an array of arrays must be rectangular, an array of texts not)."""
    return "{" + ",".join(map(str, ids)) + "}" if ids else None


def _sparse(values: list[Any]) -> list[Any] | None:
    """``values``, or None when every one is None (one NULL instead of an array of them)."""
    return None if values.count(None) == len(values) else values


def _spec_params(spec: JobSpec) -> dict[str, Any]:
    return {
        "task": spec.task,
        "payload": spec.payload_json,
        **dict(spec.sql_params()),
        "workflow_id": spec.workflow_id,
        "id": spec.id,
    }
