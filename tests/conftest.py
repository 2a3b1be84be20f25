"""Fixtures: a real PostgreSQL, a migrated template database, and a fresh clone of it per test.

The server is the one DATABASE_URL names, or an embedded PostgreSQL when it is unset. Every test
that asks for ``db_url`` gets its own database, cloned from the template and dropped afterwards,
both in a thread of their own (one made ahead, dropped behind) so that no test waits for them.
The run holds a lease on the server for each database it makes (notifyq._scratch), so that a
killed run's databases are dropped at the next run's start, and no run drops another's while
it runs, from whichever host.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from notifyq._scratch import ScratchDatabases, drop_orphans
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


@pytest.fixture(scope="session")
def server_url(_server: str) -> str:
    """URL of a database on the test server, for administration (create/drop databases)."""
    url = _server
    try:
        # Only databases that a run marked as its own and no session anywhere still holds:
        # the server may be shared with runs on other hosts, whose pids mean nothing here.
        drop_orphans(url, PREFIX)
    except psycopg.OperationalError as exc:
        pytest.exit(
            f"cannot reach PostgreSQL at {url}: {exc}\n"
            "Start it, or set DATABASE_URL to a server where the tests may create databases.",
            returncode=3,
        )
    return url


@pytest.fixture(scope="session")
def scratch_databases(server_url: str) -> Iterator[ScratchDatabases]:
    """This run's databases on the test server (``nq_test_<pid>_<random>...``), each leased
    by the run until it drops it; what is left at the end is dropped then."""
    with ScratchDatabases(server_url, PREFIX) as scratch:
        yield scratch


@pytest.fixture(scope="session")
def template_db(server_url: str, scratch_databases: ScratchDatabases) -> Iterator[str]:
    """A database migrated once per session, cloned by every test."""
    name = scratch_databases.create("_template")
    url = url_with_dbname(server_url, name)
    asyncio.run(migrate(Settings.load(database_url=url), progress=lambda _: None))
    yield name
    scratch_databases.drop(name)


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

    def __init__(self, scratch: ScratchDatabases, template: str) -> None:
        self._scratch = scratch
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
        name = self._scratch.create(template=self._template)
        with _admin(self._scratch.conninfo) as conn:
            _without_commit_waits(conn, name)
        return name

    def _drop(self, name: str) -> None:
        self._scratch.drop(name)


@pytest.fixture(scope="session")
def _clones(scratch_databases: ScratchDatabases, template_db: str) -> Iterator[_Clones]:
    clones = _Clones(scratch_databases, template_db)
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
def empty_db_url(server_url: str, scratch_databases: ScratchDatabases) -> Iterator[str]:
    """URL of a fresh database with no notifyq schema, for migration tests."""
    name = scratch_databases.create()
    yield url_with_dbname(server_url, name)
    scratch_databases.drop(name)


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


# -- The fault suite's bounds, kept from the other test process's load ---------------------------

#: Test files that keep both cores busy with worker processes (besides the tests marked heavy).
HEAVY_FILES = frozenset(
    {
        "test_bench.py",
        "test_bench_durable.py",
        "test_bench_fair.py",
        "test_bench_horizon.py",
        "test_bench_multihost.py",
        "test_durable_kills.py",
        "test_processes.py",
    }
)


def _turn(item: pytest.Item) -> int | None:
    """The lock a test takes: a fault-suite test (tests/faults, whose recovery times are bounds
    on two cores) runs alone among the heavy tests, which share among themselves."""
    if "faults" in item.path.parts:
        return fcntl.LOCK_EX
    if item.get_closest_marker("heavy") or item.path.name in HEAVY_FILES:
        return fcntl.LOCK_SH
    return None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    """Between the xdist processes of one run, a fault-suite test waits for the heavy tests of
    the other process and they wait for it: a test elsewhere that keeps both cores busy would
    otherwise move the fault suite's recovery times past their bounds. The lock is a file in
    the run's own temporary folder, taken before pytest-timeout's timer starts (the wait is
    not the test's time)."""
    how = _turn(item)
    factory = getattr(item.config, "_tmp_path_factory", None)
    if how is None or factory is None or "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    lock = Path(factory.getbasetemp()).parent / "notifyq-faults-apart.lock"
    with lock.open("a") as handle, contextlib.ExitStack() as held:
        fcntl.flock(handle, how)
        held.callback(fcntl.flock, handle, fcntl.LOCK_UN)
        yield
