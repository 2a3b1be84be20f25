"""Fixtures: a real PostgreSQL, a migrated template database, and a fresh clone of it per test.

The server is the one DATABASE_URL names, or an embedded PostgreSQL when it is unset. Every test
that asks for ``db_url`` gets its own database, cloned from the template and dropped afterwards,
both in a thread of their own (one made ahead, dropped behind) so that no test waits for them;
databases left by a killed run are dropped at the next one.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg import sql

from notifyq.migrations import migrate
from notifyq.settings import Settings
from tests.helpers import url_with_dbname

PREFIX = "nq_test_"


@pytest.fixture(scope="session")
def _server() -> Iterator[str]:
    """DATABASE_URL when it is set; else an embedded PostgreSQL for the session, so the suite
    needs no server of its own."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    from notifyq.embedded import EmbeddedPostgres

    with EmbeddedPostgres() as server:
        yield server.url


def _admin(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True, connect_timeout=5)


def _drop_stale_databases(conn: psycopg.Connection[Any]) -> None:
    """Drops databases of earlier runs whose process is gone."""
    rows = conn.execute(
        "SELECT datname FROM pg_database WHERE datname LIKE %s", [PREFIX + "%"]
    ).fetchall()
    for (name,) in rows:
        try:
            pid = int(name[len(PREFIX) :].split("_", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _alive(pid):
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture(scope="session")
def server_url(_server: str) -> str:
    """URL of a database on the test server, for administration (create/drop databases)."""
    url = _server
    try:
        with _admin(url) as conn:
            _drop_stale_databases(conn)
    except psycopg.OperationalError as exc:
        pytest.exit(
            f"cannot reach PostgreSQL at {url}: {exc}\n"
            "Start it, or set DATABASE_URL to a server where the tests may create databases.",
            returncode=3,
        )
    return url


@pytest.fixture(scope="session")
def template_db(server_url: str) -> Iterator[str]:
    """A database migrated once per session, cloned by every test."""
    name = f"{PREFIX}{os.getpid()}_template"
    with _admin(server_url) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = url_with_dbname(server_url, name)
    asyncio.run(migrate(Settings.load(database_url=url), progress=lambda _: None))
    yield name
    with _admin(server_url) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def _without_commit_waits(conn: psycopg.Connection[Any], name: str) -> None:
    """A test's database commits without waiting for its WAL flush (synchronous_commit off,
    for connections to it only): the suite makes thousands of commits, and what it checks never
    depends on surviving a crash of the server, which keeps running (the tests that restart
    one use a throwaway cluster of their own)."""
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(sql.Identifier(name))
    )


class _Clones:
    """The tests' databases, cloned from the template one ahead of the test that takes it and
    dropped behind it, by one thread: creating and dropping a database take about 0.3 s
    together (a checkpoint's worth of writes), a third of the suite's time when each test
    waited for them. One thread, so the server does one of them at a time."""

    def __init__(self, server_url: str, template: str) -> None:
        self._server_url = server_url
        self._template = template
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-databases")
        self._next: Future[str] = self._thread.submit(self._create)
        self._drops: list[Future[None]] = []

    def take(self) -> str:
        """A fresh clone of the template (made earlier), and the next one begun."""
        name = self._next.result()
        self._next = self._thread.submit(self._create)
        return name

    def give_back(self, name: str) -> None:
        """Drops ``name`` when the thread gets to it."""
        self._drops = [drop for drop in self._drops if not drop.done()]
        self._drops.append(self._thread.submit(self._drop, name))

    def close(self) -> None:
        """Drops the spare clone and waits for every drop (raising a drop's error)."""
        spare = self._next.result()
        self._drops.append(self._thread.submit(self._drop, spare))
        self._thread.shutdown(wait=True)
        for drop in self._drops:
            drop.result()

    def _create(self) -> str:
        name = f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}"
        with _admin(self._server_url) as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(self._template)
                )
            )
            _without_commit_waits(conn, name)
        return name

    def _drop(self, name: str) -> None:
        with _admin(self._server_url) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture(scope="session")
def _clones(server_url: str, template_db: str) -> Iterator[_Clones]:
    clones = _Clones(server_url, template_db)
    try:
        yield clones
    finally:
        clones.close()


@pytest.fixture
def db_url(server_url: str, _clones: _Clones) -> Iterator[str]:
    """URL of a fresh, migrated database of this test's own."""
    name = _clones.take()
    yield url_with_dbname(server_url, name)
    _clones.give_back(name)


@pytest.fixture
def empty_db_url(server_url: str) -> Iterator[str]:
    """URL of a fresh database with no notifyq schema, for migration tests."""
    name = f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}"
    with _admin(server_url) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield url_with_dbname(server_url, name)
    with _admin(server_url) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture
def settings(db_url: str) -> Settings:
    """Settings for this test's database, with short timings so that tests run fast."""
    return Settings.load(
        database_url=db_url,
        poll_interval=30,
        lease_seconds=30,
        auto_migrate=False,
        retry_base=0.05,
        retry_cap=0.2,
    )


@pytest.fixture
async def conn(db_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """An autocommit connection to this test's database."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as connection:
        yield connection
