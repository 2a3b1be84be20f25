"""Connections: the pool for queries, the options every connection gets, and the seam where
psycopg's connection errors become :class:`~notifyq.errors.DatabaseUnavailable`."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from notifyq.errors import ConfigurationError, DatabaseUnavailable
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
            "DATABASE_URL is not set: export DATABASE_URL=postgresql://user@host:5432/dbname"
        )
    return settings.database_url


def connect_kwargs(settings: Settings, application_name: str) -> dict[str, Any]:
    """Options for every connection: a connect timeout, TCP keepalives that notice a dead peer
    within seconds, and a statement timeout so that a stuck query cannot outlive a lease."""
    timeout_ms = int(settings.query_timeout * 1000)
    return {
        "autocommit": True,
        "application_name": application_name,
        "connect_timeout": max(1, round(settings.connect_wait)),
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        # JIT compiles for tens of milliseconds what runs in one: never worth it for a queue.
        "options": f"-c statement_timeout={timeout_ms} -c jit=off",
    }


def is_connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` means the database is unreachable (as opposed to a bad query)."""
    return isinstance(exc, (psycopg.OperationalError, PoolTimeout, OSError)) and not isinstance(
        exc, psycopg.errors.QueryCanceled
    )


@contextlib.contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Turns connection-level failures inside the block into DatabaseUnavailable."""
    try:
        yield
    except DatabaseUnavailable:
        raise
    except Exception as exc:
        if is_connection_error(exc):
            raise DatabaseUnavailable(
                f"{what}: the database is unavailable ({first_line(exc)})"
            ) from exc
        raise


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
    if wait:
        # One direct attempt first: it fails at once with the server's own reason, where the
        # pool would retry (and log) until its timeout.
        reason = await _why_unreachable(url, settings)
        if reason is not None:
            raise DatabaseUnavailable(
                f"cannot connect to {redact(url)}: {reason}; check that PostgreSQL is running "
                "and DATABASE_URL is right"
            )
    pool: AsyncConnectionPool = AsyncConnectionPool(
        url,
        kwargs=connect_kwargs(settings, f"notifyq-{name}"),
        min_size=min_size,
        max_size=max_size or max(min_size, settings.pool_size),
        open=False,
        name=f"notifyq-{name}",
        timeout=settings.connect_wait,
    )
    try:
        await pool.open(wait=wait, timeout=settings.connect_wait + 1)
    except PoolTimeout as exc:
        await pool.close()
        reason = await _why_unreachable(url, settings) or "timed out"
        raise DatabaseUnavailable(
            f"cannot connect to {redact(url)}: {reason}; check that PostgreSQL is running and "
            "DATABASE_URL is right"
        ) from exc
    try:
        yield pool
    finally:
        await pool.close()


async def _why_unreachable(url: str, settings: Settings) -> str | None:
    """Why one direct connection attempt fails, or None when it succeeds."""
    try:
        conn = await psycopg.AsyncConnection.connect(
            url, connect_timeout=max(1, round(settings.connect_wait))
        )
    except Exception as exc:
        return first_line(exc)
    await conn.close()
    return None
