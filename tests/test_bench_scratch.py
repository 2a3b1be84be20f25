"""The bench drops only the scratch databases that it made, or that benches now gone made: never
a live one of a bench on another host sharing the server, never one that no bench made.

The other bench is a process of its own (tests/scratch_host.py) holding one scratch database
made by the harness; this process is the next bench's start (``Scratch.drop_stale``).
"""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

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
    wait_for_file,
    wait_until_gone,
)
from tests.test_bench import _bench_module

HOLD = [sys.executable, "-m", "tests.scratch_host"]


@pytest.fixture
def admin(server_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(server_url, autocommit=True) as conn:
        yield conn


def next_bench_start(server_url: str) -> list[str]:
    """What the next bench's start drops."""
    dropped: list[str] = _bench_module("notifyq_bench.harness").Scratch(server_url).drop_stale()
    return dropped


def test_a_live_bench_on_another_host_keeps_its_database_through_another_benchs_start(
    server_url: str, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    needs_pid_namespaces()
    pid = dead_pid()
    ready, release, log = tmp_path / "ready", tmp_path / "release", tmp_path / "other.log"
    with log.open("w") as out:
        other = on_another_host(
            HOLD,
            pid,
            cwd=ROOT,
            env=child_env(server_url, **{READY: str(ready), RELEASE: str(release)}),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        held_there = wait_for_file(ready, other, log)
        assert held_there["pid"] == pid  # nobody's pid here
        [name] = held_there["databases"]
        assert name.startswith(f"notifyq_bench_{pid}_")

        assert name not in next_bench_start(server_url)

        assert existing(admin, [name]) == {name}
        release.touch()
        assert other.wait(timeout=60) == 0, log.read_text()  # it used it to its end
        assert existing(admin, [name]) == set()  # and dropped it itself
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()


def test_a_killed_benchs_database_is_dropped_by_the_next_benchs_start(
    server_url: str, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    ready, release, log = tmp_path / "ready", tmp_path / "release", tmp_path / "killed.log"
    with log.open("w") as out:
        killed = subprocess.Popen(
            HOLD,
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
    [name], pid = announced["databases"], announced["pid"]
    wait_until_gone(admin, pid)
    assert existing(admin, [name]) == {name}  # left behind

    assert name in next_bench_start(server_url)

    assert named_for(admin, "notifyq_bench_", pid) == set()


def test_a_database_named_like_a_bench_scratch_one_but_not_made_by_a_bench_is_never_dropped(
    server_url: str, admin: psycopg.Connection[Any]
) -> None:
    name = f"notifyq_bench_{dead_pid()}_{secrets.token_hex(4)}_mine"
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        assert name not in next_bench_start(server_url)
        assert existing(admin, [name]) == {name}
    finally:
        admin.execute(  # made by this test
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
