"""A test run drops only the scratch databases that it made, or that runs now gone made: never a
live one of another host sharing the server, never one that no run made.

Each test starts the runs it needs as processes of their own (tests/scratch_host.py): a run's
start is the ``server_url`` fixture, which cleans up after runs that are gone.
"""

from __future__ import annotations

import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from notifyq._scratch import ScratchDatabases, drop_orphans, held, lease_key, marker
from tests.conftest import PREFIX
from tests.helpers import ROOT
from tests.scratch_host import (
    READY,
    RELEASE,
    child_env,
    dead_pid,
    existing,
    named_for,
    needs_pid_namespaces,
    on_another_host,
    pytest_argv,
    start_run,
    wait_for_file,
    wait_until_gone,
)


@pytest.fixture
def admin(server_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(server_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def made_here(admin: psycopg.Connection[Any]) -> Iterator[list[str]]:
    """Names of databases a test makes by hand, dropped after it if they are still there (each
    was made by the test, so the test drops it)."""
    names: list[str] = []
    yield names
    for name in names:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def wait_until_free(conn: psycopg.Connection[Any], names: list[str], timeout: float = 10) -> None:
    """Waits until no session holds the lease of any of ``names`` (a killed client's backend
    notices its closed socket soon after, not at once)."""
    deadline = time.monotonic() + timeout
    while any(held(conn, name) for name in names):
        assert time.monotonic() < deadline, "a lease outlived its run"
        time.sleep(0.02)


def test_a_live_run_on_another_host_keeps_its_databases_through_another_runs_start(
    server_url: str, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    needs_pid_namespaces()
    pid = dead_pid()
    ready, release, log = tmp_path / "ready", tmp_path / "release", tmp_path / "other.log"
    with log.open("w") as out:
        other = on_another_host(
            pytest_argv("test_holds_its_databases"),
            pid,
            cwd=ROOT,
            env=child_env(server_url, **{READY: str(ready), RELEASE: str(release)}),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        held_there = wait_for_file(ready, other, log)
        # Its pid, which no process here has: a check of local pids takes that run for dead.
        assert held_there["pid"] == pid
        databases = held_there["databases"]

        run = start_run(server_url)

        assert run.returncode == 0, run.stdout + run.stderr
        assert existing(admin, databases) == set(databases)
        release.touch()
        assert other.wait(timeout=60) == 0, log.read_text()  # it used them to its end
        assert existing(admin, databases) == set()  # and dropped them itself
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()


def test_a_killed_runs_databases_are_dropped_by_the_next_runs_start(
    server_url: str, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    ready, release, log = tmp_path / "ready", tmp_path / "release", tmp_path / "killed.log"
    with log.open("w") as out:
        killed = subprocess.Popen(
            pytest_argv("test_holds_its_databases"),
            cwd=ROOT,
            env=child_env(server_url, **{READY: str(ready), RELEASE: str(release)}),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        announced = wait_for_file(ready, killed, log)
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    databases, pid = announced["databases"], announced["pid"]
    # Killed, maybe while it made the next test's database ahead of time (the clones are).
    wait_until_gone(admin, pid)
    assert existing(admin, databases) == set(databases)  # left behind

    run = start_run(server_url)

    assert run.returncode == 0, run.stdout + run.stderr
    assert named_for(admin, PREFIX, pid) == set()  # those and any made ahead


def test_a_database_whose_lease_is_held_on_another_host_is_kept_until_its_run_ends(
    server_url: str, admin: psycopg.Connection[Any], made_here: list[str]
) -> None:
    # Made by a run elsewhere, which holds its lease: here, the pid in its name is nobody's.
    name = f"{PREFIX}{dead_pid()}_{secrets.token_hex(4)}_elsewhere"
    with psycopg.connect(server_url, autocommit=True) as owner:
        owner.execute("SELECT pg_advisory_lock(%s)", [lease_key(name)])
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        made_here.append(name)
        admin.execute(
            sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                sql.Identifier(name), sql.Literal(marker(name))
            )
        )

        assert name not in drop_orphans(server_url, PREFIX)
        assert existing(admin, [name]) == {name}
    wait_until_free(admin, [name])

    assert name in drop_orphans(server_url, PREFIX)
    assert existing(admin, [name]) == set()


def test_a_database_named_like_a_scratch_one_but_not_made_by_a_run_is_never_dropped(
    server_url: str, admin: psycopg.Connection[Any], made_here: list[str]
) -> None:
    stem = f"{PREFIX}{dead_pid()}_{secrets.token_hex(4)}"
    comments = {
        f"{stem}_uncommented": None,
        f"{stem}_commented": "the accounts of 2026",
        # A scratch database's comment copied onto another database is not its mark.
        f"{stem}_copied": marker(f"{stem}_template"),
    }
    for name, comment in comments.items():
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        made_here.append(name)
        if comment is not None:
            admin.execute(
                sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                    sql.Identifier(name), sql.Literal(comment)
                )
            )

    dropped = drop_orphans(server_url, PREFIX)

    assert not set(dropped) & set(made_here)
    assert existing(admin, made_here) == set(made_here)


def test_a_run_holds_the_lease_of_a_database_before_it_exists(server_url: str) -> None:
    seen: list[bool] = []
    with ScratchDatabases(server_url, PREFIX) as scratch:
        make = scratch._make

        def make_and_look(name: str, template: str | None) -> bool:
            with psycopg.connect(server_url, autocommit=True) as other:
                seen.append(held(other, name))
            return make(name, template)

        scratch._make = make_and_look  # type: ignore[method-assign]
        name = scratch.create("_leased")
        assert seen == [True]
        with psycopg.connect(server_url, autocommit=True) as other:
            assert held(other, name)
        assert name not in drop_orphans(server_url, PREFIX)
    with psycopg.connect(server_url, autocommit=True) as other:
        assert not held(other, name)
        assert existing(other, [name]) == set()


def test_a_run_whose_lease_connection_is_lost_takes_its_leases_again(server_url: str) -> None:
    with ScratchDatabases(server_url, PREFIX) as scratch:
        first = scratch.create("_first")
        with psycopg.connect(server_url, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", [lease_pid(scratch)])
            wait_until_free(other, [first])

            second = scratch.create("_second")  # notices, and renews every lease

            assert held(other, first) and held(other, second)
            dropped = drop_orphans(server_url, PREFIX)
            assert first not in dropped and second not in dropped
            assert existing(other, [first, second]) == {first, second}


def test_a_run_drops_no_database_it_did_not_make(server_url: str) -> None:
    with ScratchDatabases(server_url, PREFIX) as scratch, pytest.raises(ValueError):
        scratch.drop("postgres")


def lease_pid(scratch: ScratchDatabases) -> int:
    lease = scratch._lease
    assert lease is not None
    return lease.info.backend_pid
