"""The seam between notifyq and its database: named queries run with typed rows, on a pooled
connection or the caller's, and the driver's errors translated once into notifyq's."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar
from uuid import UUID

import psycopg
from psycopg.rows import AsyncRowFactory, tuple_row
from psycopg_pool import AsyncConnectionPool

from notifyq.db import translate_errors
from notifyq.queries import load_queries
from notifyq.tracing import NO_TRACING, Tracing

T = TypeVar("T")
R = TypeVar("R")
Row = TypeVar("Row")

Params = dict[str, Any] | None
Conn = psycopg.AsyncConnection[Any]

#: Most rows one batch statement writes (see Runner._in_chunks).
WRITE_CHUNK = 100
#: Runs of a statement on pooled connections that PostgreSQL rolled back to break a deadlock
#: (or a serialization failure): it never took effect, so it is run again.
ROLLBACK_TRIES = 3


class Keyed(Protocol):
    """An item of a batch write: it names the job it is about."""

    @property
    def job_id(self) -> UUID: ...


K = TypeVar("K", bound=Keyed)

#: The sort key of a batch: its job id as an int, the order of UUIDs, compared in C (a key
#: function and UUID.__lt__ were two Python calls per item).
_JOB_ID_INT = operator.attrgetter("job_id.int")


def _field_names(cls: type[Any]) -> tuple[bytes, ...]:
    """A dataclass's field names as a result holds its column names: reading them there is a C
    call a column, where ``cursor.description`` builds a Column object (several Python calls)
    for each."""
    return tuple(field.name.encode() for field in dataclasses.fields(cls))


def _check_columns(cursor: Any, expected: tuple[bytes, ...], what: str) -> None:
    """Raises TypeError, naming the statement's columns and ``what`` they should be, unless the
    columns of ``cursor``'s result are ``expected``, in order."""
    result = cursor.pgresult
    count = result.nfields if result is not None else 0
    if tuple(map(result.fname, range(count))) != expected:
        names = tuple(column.name for column in cursor.description or ())
        raise TypeError(f"the columns {names} do not match {what}")


def fields_row(cls: type[T]) -> AsyncRowFactory[T]:
    """A row factory for a dataclass whose fields are the statement's columns, in order: the
    names are checked once per statement (a query that drifts from the type fails at once,
    naming both), and each row is built positionally (``class_row`` builds a dict per row: a
    microsecond a claimed job)."""
    encoded = _field_names(cls)

    def per_statement(cursor: Any) -> Callable[[Sequence[Any]], T]:
        _check_columns(cursor, encoded, f"the fields of {cls.__name__}")
        return lambda values: cls(*values)

    return per_statement


def fields_and_row(cls: type[T], extra: str) -> AsyncRowFactory[tuple[T | None, Any]]:
    """Like :func:`fields_row`, for a statement whose columns are ``cls``'s fields and then
    ``extra``: each row answers ``(cls(...), extra)``, but a row whose first column is null
    answers ``(None, extra)`` (a statement that sends one more answer after its rows)."""
    fields = _field_names(cls)
    encoded = (*fields, extra.encode())
    count = len(fields)

    def per_statement(cursor: Any) -> Callable[[Sequence[Any]], tuple[T | None, Any]]:
        _check_columns(cursor, encoded, f"{cls.__name__}'s and {extra}")

        def row(values: Sequence[Any]) -> tuple[T | None, Any]:
            if values[0] is None:
                return None, values[count]
            return cls(*values[:count]), values[count]

        return row

    return per_statement


class Runner:
    """Runs notifyq's named queries (sql/queries.sql) against ``pool``.

    Every runner fetches typed rows through a psycopg row factory and names what it does
    (``what``), which the errors carry: a driver error leaves as a
    :class:`~notifyq.errors.NotifyQError` (:func:`notifyq.db.translate_errors`), so callers
    never handle psycopg's own."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        default_max_attempts: int | None = None,
        tracing: Tracing = NO_TRACING,
    ) -> None:
        """``default_max_attempts`` applies to jobs whose submission and task set none; None
        leaves it to the database's default (``notifyq.settings``). ``tracing`` makes the span
        of each enqueue and the trace context its jobs keep (see :mod:`notifyq.tracing`)."""
        self._pool = pool
        self._q = load_queries()
        self._default_max_attempts = default_max_attempts
        self._tracing = tracing

    async def _all(
        self,
        name: str,
        params: Params,
        row: AsyncRowFactory[Row],
        *,
        what: str,
        conn: Conn | None = None,
    ) -> list[Row]:
        """Every row of query ``name``."""
        query = self._q[name]

        async def on(c: Conn) -> list[Row]:
            cursor = c.cursor(row_factory=row)
            await cursor.execute(query, params)
            return await cursor.fetchall()

        return await self._on_connection(on, what=what, conn=conn)

    async def _one(
        self,
        name: str,
        params: Params,
        row: AsyncRowFactory[Row],
        *,
        what: str,
        conn: Conn | None = None,
    ) -> Row | None:
        """The first row of query ``name``, or None."""
        query = self._q[name]

        async def on(c: Conn) -> Row | None:
            cursor = c.cursor(row_factory=row)
            await cursor.execute(query, params)
            return await cursor.fetchone()

        return await self._on_connection(on, what=what, conn=conn)

    async def _value(self, name: str, params: Params, *, what: str) -> Any:
        """The first column of the first row of query ``name`` (None without a row)."""
        # A tuple row: scalar_row costs three Python calls, and a worker asks for a value
        # (its idle mark, the next run_at) every time it goes idle.
        row = await self._one(name, params, tuple_row, what=what)
        return None if row is None else row[0]

    async def _execute(self, name: str, params: Params, *, what: str) -> None:
        """Runs query ``name`` for its effect."""
        query = self._q[name]

        async def on(c: Conn) -> None:
            await c.execute(query, params)

        await self._on_connection(on, what=what, conn=None)

    async def _in_chunks(
        self,
        name: str,
        items: Sequence[K],
        params_of: Callable[[Sequence[K]], dict[str, Any]],
        row: AsyncRowFactory[Row],
        *,
        what: str,
    ) -> list[Row]:
        """Runs a batch statement over ``items`` at most WRITE_CHUNK at a time, so that no
        statement holds the row locks of a large batch for long. Items go in job id order: two
        statements that lock the same rows lock them in the same order, and cannot deadlock."""
        items = sorted(items, key=_JOB_ID_INT)
        rows: list[Row] = []
        for start in range(0, len(items), WRITE_CHUNK):
            chunk = items[start : start + WRITE_CHUNK]
            rows += await self._all(name, params_of(chunk), row, what=what)
        return rows

    async def _on_connection(
        self, on: Callable[[Conn], Awaitable[R]], *, what: str, conn: Conn | None
    ) -> R:
        """``on(conn)``, else ``on`` a pooled connection. On a pooled connection that the
        server had closed while it sat idle (a restart, pg_terminate_backend), the statement
        never ran, so it is run again on another one, up to the size of the pool; so is one that
        PostgreSQL rolled back to break a deadlock, up to ROLLBACK_TRIES times."""
        with translate_errors(what):
            if conn is not None:
                return await on(conn)
            tries = (self._pool.max_size or 1) + 1
            for attempt in range(1, tries + 1):
                pooled: Conn | None = None
                try:
                    async with self._pool.connection() as pooled:
                        return await on(pooled)
                except psycopg.Error as exc:
                    if run_again(exc, attempt, tries, pooled):
                        continue
                    raise
        raise AssertionError("unreachable")


def run_again(
    exc: psycopg.Error,
    attempt: int,
    tries: int,
    pooled: psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None,
) -> bool:
    """Whether a statement that failed with ``exc`` on a pooled connection (its ``attempt``-th
    run of at most ``tries``) is run again on another one: it never took effect, because
    PostgreSQL rolled it back to break a deadlock (up to ROLLBACK_TRIES runs), or because the
    server had closed the connection while it sat idle in the pool."""
    if isinstance(exc, psycopg.errors.TransactionRollback):
        return attempt < ROLLBACK_TRIES
    if isinstance(exc, psycopg.OperationalError):
        return attempt < tries and pooled is not None and pooled.broken
    return False
