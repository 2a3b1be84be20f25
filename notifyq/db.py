"""Connections: the pool for queries, the options every connection gets, and the seam where
psycopg's connection errors become :class:`~notifyq.errors.DatabaseUnavailable`.

Every connection notifyq opens is built here, from the settings and a purpose (its
``application_name``): :func:`open_pool` for queries (:func:`open_sync_pool` for blocking code),
:func:`connect` and :func:`connect_sync` for one connection of their own (migrations, the schema
check, grants, a last write before a hard exit), all with the options of
:func:`connect_kwargs`. The listener takes those options too (:mod:`notifyq.notifier`)."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timezone
from typing import Any

import anyio
import psycopg
from psycopg import adapt, pq
from psycopg.abc import AdaptContext, Buffer, Loader
from psycopg.adapt import AdaptersMap
from psycopg.rows import TupleRow
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

from notifyq.errors import (
    QUEUE_FULL_SQLSTATE,
    ConfigurationError,
    DatabaseError,
    DatabaseUnavailable,
    NotifyQError,
    QueueFull,
    RefusedInput,
    SchemaMismatch,
    StatementTimeout,
)
from notifyq.models import decode_stored_json
from notifyq.settings import Settings

logger = logging.getLogger(__name__)

# The password of a URL runs to the last "@": one may hold an unencoded "@" or ":" (libpq would
# misread such a URL, but the message saying so must not show it). A later "@", in a query
# parameter, hides more than the password: the safe way to be wrong.
_PASSWORD_IN_URL = re.compile(r"^([a-z][a-z0-9+.-]*://[^:/?#@]*:).*@", re.IGNORECASE | re.DOTALL)
_PASSWORD_IN_QUERY = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)
# A keyword DSN's value is a word, or quoted with '...' where \' and \\ are escapes.
_PASSWORD_KEYWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'?|\S+)", re.IGNORECASE)


def redact(url: str) -> str:
    """The database URL or keyword DSN (``host=... password=...``) with its password replaced
    by ``***``, for messages and logs."""
    if re.match(r"postgres(ql)?://", url, re.IGNORECASE):
        return _PASSWORD_IN_QUERY.sub(r"\1***", _PASSWORD_IN_URL.sub(r"\1***@", url))
    return _PASSWORD_KEYWORD.sub(r"\1***", url)


def database_url(settings: Settings) -> str:
    """The database URL, or an error that says how to give one."""
    if not settings.database_url:
        raise ConfigurationError(
            "DATABASE_URL is not set: export DATABASE_URL=postgresql://user@host:5432/dbname "
            "(only `notifyq dev` starts an embedded PostgreSQL when it is unset, and prints "
            "its URL)"
        )
    return settings.database_url


async def open_connection(url: str, **kwargs: Any) -> psycopg.AsyncConnection[TupleRow]:
    """``psycopg.AsyncConnection.connect``, shielded from cancellation (the connect timeout
    bounds it): a task cancelled while psycopg builds the connection would drop one that is
    open, for the garbage collector to find. Cancelled meanwhile, the caller's ``async with``
    closes it at its first await."""
    with anyio.CancelScope(shield=True):
        conn = await psycopg.AsyncConnection.connect(url, **kwargs)
    return conn


@contextlib.asynccontextmanager
async def closing(
    conn: psycopg.AsyncConnection[TupleRow],
) -> AsyncIterator[psycopg.AsyncConnection[TupleRow]]:
    """Closes an autocommit connection on exit, cancelled or not. (psycopg's own ``async
    with`` first rolls back, which awaits: a cancelled task skips the close there.)"""
    try:
        yield conn
    finally:
        with anyio.CancelScope(shield=True):
            await conn.close()


def listen_url(settings: Settings) -> str:
    """The URL of a process's LISTEN connection: NOTIFYQ_LISTEN_URL (the server itself, when
    DATABASE_URL goes through a transaction-mode pooler), else DATABASE_URL."""
    return settings.listen_url or database_url(settings)


def connect_kwargs(
    settings: Settings,
    application_name: str,
    *,
    statement_timeout: float | None = None,
    connect_timeout: float | None = None,
) -> dict[str, Any]:
    """Options for every connection: a connect timeout, TCP keepalives that notice a dead peer
    within seconds, a statement timeout so that a stuck query cannot outlive a lease, a
    search_path that no other role can write to, and loaders that survive any stored row.

    ``statement_timeout`` (seconds) defaults to the settings' query timeout; 0 means none, as
    PostgreSQL reads it, for an administrator's statements (a migration may rightly run long).
    ``connect_timeout`` defaults to the settings' connect wait."""
    statement_s = settings.query_timeout if statement_timeout is None else statement_timeout
    connect_s = settings.connect_wait if connect_timeout is None else connect_timeout
    pooled: dict[str, Any] = {}
    if settings.transaction_pooled:
        # A transaction-mode pooler hands each transaction to any server connection, where a
        # statement psycopg prepared on another one does not exist (or is another statement).
        pooled["prepare_threshold"] = None
    return {
        **pooled,
        "autocommit": True,
        "application_name": application_name,
        # libpq counts whole seconds.
        "connect_timeout": max(1, round(connect_s)),
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        # JIT compiles for tens of milliseconds what runs in one: never worth it for a queue.
        # The search_path keeps a role that may create objects in public (anyone, on
        # PostgreSQL 13 and 14) from shadowing a built-in that our statements call.
        "options": f"-c statement_timeout={int(statement_s * 1000)} -c jit=off "
        "-c search_path=pg_catalog,pg_temp",
        "context": safe_adapters(),
    }


async def connect(
    settings: Settings,
    application_name: str,
    *,
    statement_timeout: float | None = None,
    connect_timeout: float | None = None,
) -> psycopg.AsyncConnection[TupleRow]:
    """One new autocommit connection to the settings' database, with the options of
    :func:`connect_kwargs`; the caller closes it (``async with``).

    Raises :class:`~notifyq.errors.ConfigurationError` without a database URL and
    :class:`~notifyq.errors.DatabaseUnavailable`, with the server's reason and what to check,
    when the connection cannot be opened."""
    url = database_url(settings)
    options = connect_kwargs(
        settings,
        application_name,
        statement_timeout=statement_timeout,
        connect_timeout=connect_timeout,
    )
    try:
        return await open_connection(url, **options)
    except psycopg.Error as exc:
        raise _unreachable(url, first_line(exc)) from exc


def connect_sync(
    settings: Settings,
    application_name: str,
    *,
    statement_timeout: float | None = None,
    connect_timeout: float | None = None,
) -> psycopg.Connection[TupleRow]:
    """:func:`connect` for code outside an event loop: a command's one statement, or a last
    write of a process about to exit at once (where a short ``connect_timeout`` and
    ``statement_timeout`` keep the exit quick)."""
    url = database_url(settings)
    options = connect_kwargs(
        settings,
        application_name,
        statement_timeout=statement_timeout,
        connect_timeout=connect_timeout,
    )
    try:
        return psycopg.Connection.connect(url, **options)
    except psycopg.Error as exc:
        raise _unreachable(url, first_line(exc)) from exc


def _unreachable(url: str, reason: str) -> DatabaseUnavailable:
    if "unsupported startup parameter" in reason:
        # PgBouncer's answer to the options every connection sends.
        return DatabaseUnavailable(
            f"cannot connect to {redact(url)}: {reason}: a pooler (PgBouncer) is in between; "
            "add `options` to its ignore_startup_parameters, and set statement_timeout on the "
            "role instead (see docs/how-to/pgbouncer.md)"
        )
    return DatabaseUnavailable(
        f"cannot connect to {redact(url)}: {reason}; check that PostgreSQL is running and "
        "DATABASE_URL is right"
    )


def _prepared_statement_mixup(exc: psycopg.Error) -> bool:
    """Whether an error is what psycopg's prepared statements meet behind a transaction-mode
    pooler: one missing, one already there, or one that is another statement."""
    if exc.sqlstate in ("26000", "42P05"):
        return True
    return exc.sqlstate == "08P01" and "prepared statement" in str(exc)


@functools.cache
def safe_adapters() -> AdaptersMap:
    """psycopg's adapters, except that no stored value can make a read fail: JSON that Python
    cannot decode (nested thousands deep, a number of 5,000 digits: jsonb takes both) loads as
    :class:`~notifyq.models.Undecodable`, and times beyond Python's range ('infinity', the
    year 20000) load as the largest or smallest datetime. Such a value arrives by SQL, where any
    producer may write it; it must fail its job, not the worker or the API that reads it."""
    adapters = AdaptersMap(psycopg.adapters)
    set_json_loads(decode_stored_json, adapters)
    oid = adapters.types["timestamptz"].oid
    for fmt in (pq.Format.TEXT, pq.Format.BINARY):
        base = adapters.get_loader(oid, fmt)
        if base is not None:
            adapters.register_loader(oid, _clamped(base, binary=fmt == pq.Format.BINARY))
    return adapters


_LATEST = datetime.max.replace(tzinfo=timezone.utc)
_EARLIEST = datetime.min.replace(tzinfo=timezone.utc)


def _clamped(base: type[Loader], *, binary: bool) -> type[Loader]:
    """A timestamptz loader that answers the nearest datetime Python holds where ``base`` (a C
    class, which cannot be subclassed) refuses the value."""

    class ClampedTimestamptzLoader(adapt.Loader):
        format = pq.Format.BINARY if binary else pq.Format.TEXT

        def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
            super().__init__(oid, context)
            self._inner = base(oid, context)

        def load(self, data: Buffer) -> datetime:
            try:
                moment: datetime = self._inner.load(data)
            except psycopg.DataError:
                raw = bytes(data)
                if binary:
                    before = int.from_bytes(raw, "big", signed=True) < 0
                else:
                    before = raw.startswith(b"-") or raw.endswith(b"BC")
                return _EARLIEST if before else _LATEST
            return moment

    return ClampedTimestamptzLoader


def is_connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` means the database is unreachable (as opposed to a bad query)."""
    return isinstance(exc, (psycopg.OperationalError, PoolTimeout, OSError)) and not isinstance(
        exc, psycopg.errors.QueryCanceled
    )


@contextlib.contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """The one seam where the driver's errors become notifyq's (see :mod:`notifyq.errors`),
    chained as ``__cause__``: callers handle :class:`~notifyq.errors.NotifyQError` only."""
    try:
        yield
    except NotifyQError:
        raise
    except Exception as exc:
        translated = translated_error(exc, what)
        if translated is None:
            raise
        raise translated from exc


def translated_error(exc: BaseException, what: str) -> NotifyQError | None:
    """The notifyq error that stands for a driver error, or None for an error that is not the
    driver's (a bug of ours, which keeps its own type)."""
    if isinstance(exc, psycopg.Error) and _prepared_statement_mixup(exc):
        return DatabaseUnavailable(
            f"{what}: {first_line(exc)}: DATABASE_URL goes through a transaction-mode pooler "
            "(PgBouncer, Supavisor); set NOTIFYQ_POOLER=transaction (NOTIFYQ_LISTEN_URL "
            "pointing at the server implies it)"
        )
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return StatementTimeout(
            f"{what}: the database did not answer within the statement timeout ({first_line(exc)})"
        )
    if is_connection_error(exc):
        return DatabaseUnavailable(f"{what}: the database is unavailable ({first_line(exc)})")
    if not isinstance(exc, psycopg.Error):
        return None
    code = exc.sqlstate
    if code == QUEUE_FULL_SQLSTATE:
        return QueueFull(f"{what}: {first_line(exc)}", queue=_full_queue(exc))
    if isinstance(
        exc,
        (
            psycopg.errors.UndefinedTable,
            psycopg.errors.UndefinedFunction,
            psycopg.errors.InvalidSchemaName,
        ),
    ):
        return SchemaMismatch(
            f"{what}: {first_line(exc)}: this database has no notifyq schema, or an older one; "
            "run `notifyq migrate`",
            sqlstate=code,
        )
    if isinstance(exc, (psycopg.errors.DataError, psycopg.errors.IntegrityError)):
        return RefusedInput(f"{what}: {first_line(exc)}", sqlstate=code)
    return DatabaseError(f"{what}: the database refused it: {first_line(exc)}", sqlstate=code)


def _full_queue(exc: psycopg.Error) -> str | None:
    """The queue a max_depth refusal names (as a JSON string, sql/022)."""
    found = re.search(r'queue ("(?:[^"\\]|\\.)*") is full', exc.diag.message_primary or "")
    return json.loads(found.group(1)) if found else None


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (psycopg's run over several)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextlib.asynccontextmanager
async def open_pool(
    settings: Settings,
    *,
    name: str,
    min_size: int = 1,
    max_size: int | None = None,
    wait: bool = True,
) -> AsyncIterator[AsyncConnectionPool]:
    """An open pool of autocommit connections to the database; closed on exit.

    With ``wait`` (the default) the pool must connect within the connect timeout or
    DatabaseUnavailable is raised, so a process fails fast when the database is unreachable.
    """
    url = database_url(settings)
    application_name = f"notifyq-{name}"
    if wait:
        # One direct attempt first: it fails at once with the server's own reason, where the
        # pool would retry (and log) until its timeout.
        await _connect_once(settings, application_name)
    pool: AsyncConnectionPool = _Pool(
        url,
        kwargs=connect_kwargs(settings, application_name),
        min_size=min_size,
        max_size=max_size or max(min_size, settings.pool_size),
        open=False,
        name=application_name,
        timeout=settings.connect_wait,
    )
    try:
        await pool.open(wait=wait, timeout=settings.connect_wait + 1)
    except PoolTimeout as exc:
        await pool.close()
        # The server's reason, if one direct attempt gets one; else the pool's.
        await _connect_once(settings, application_name)
        raise _unreachable(url, "timed out") from exc
    try:
        yield pool
    finally:
        await pool.close()


def open_sync_pool(
    settings: Settings, *, name: str, min_size: int = 1, max_size: int | None = None
) -> ConnectionPool:
    """:func:`open_pool` for blocking code (``notifyq.SyncQueue``): an open pool, which the
    caller closes. It must connect within the connect timeout, or DatabaseUnavailable is raised,
    saying why."""
    url = database_url(settings)
    application_name = f"notifyq-{name}"
    connect_sync(settings, application_name).close()
    pool: ConnectionPool = _SyncPool(
        url,
        kwargs=connect_kwargs(settings, application_name),
        min_size=min_size,
        max_size=max_size or max(min_size, settings.pool_size),
        open=False,
        name=application_name,
        timeout=settings.connect_wait,
    )
    try:
        pool.open(wait=True, timeout=settings.connect_wait + 1)
    except PoolTimeout as exc:
        pool.close()
        connect_sync(settings, application_name).close()
        raise _unreachable(url, "timed out") from exc
    return pool


async def _connect_once(settings: Settings, application_name: str) -> None:
    """Opens and closes one connection; raises DatabaseUnavailable, saying why, if it fails."""
    conn = await connect(settings, application_name)
    await conn.close()


#: Longest wait between two attempts of a pool to reconnect. psycopg_pool doubles the wait after
#: each failure, up to its reconnect timeout (5 minutes): after an outage of 3 minutes a pool
#: waited 30 s more before it tried again, while the listener was long back.
MAX_RECONNECT_DELAY = 2.0


class _CappedAttempt(AttemptWithBackoff):
    """psycopg_pool's backoff between reconnection attempts, capped at MAX_RECONNECT_DELAY."""

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, MAX_RECONNECT_DELAY)


class _Pool(AsyncConnectionPool):
    """The pool, reconnecting at least every MAX_RECONNECT_DELAY seconds after an outage, so
    that every part of a process is back within seconds of the database."""

    async def _add_connection(
        self, attempt: AttemptWithBackoff | None, growing: bool = False
    ) -> None:
        if attempt is None:
            attempt = _CappedAttempt(timeout=self.reconnect_timeout)
        await super()._add_connection(attempt, growing)


class _SyncPool(ConnectionPool):
    """:class:`_Pool` for blocking code."""

    def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        if attempt is None:
            attempt = _CappedAttempt(timeout=self.reconnect_timeout)
        super()._add_connection(attempt, growing)
