"""Another host's test run, for the scratch database tests (tests/test_scratch.py and
tests/test_bench_scratch.py): not collected with the suite, run by them in a process of its own.

``test_holds_its_databases`` is a run that is alive: it tells the parent which databases it
holds, then waits until the parent says it may finish; :func:`hold_a_bench_database` is the
same for a bench run. ``test_starts`` is a run's start, which drops what runs that are gone
left behind. :func:`on_another_host` starts a command in a pid
namespace of its own, with a pid that no process of this host has: to a check of local pids
it looks dead while it runs, as a run on another host sharing the server would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from notifyq._scratch import application_name
from tests.helpers import ROOT

#: Where a run holding its databases writes their names, and the file it waits for.
READY = "NQ_SCRATCH_HOST_READY"
RELEASE = "NQ_SCRATCH_HOST_RELEASE"


# -- run in the child -----------------------------------------------------------------------------


def test_holds_its_databases(db_url: str, template_db: str) -> None:
    announce([str(conninfo_to_dict(db_url)["dbname"]), template_db])
    wait_for_release()
    with psycopg.connect(db_url) as conn:  # still there, for the whole run
        conn.execute("SELECT 1")


def test_starts(server_url: str) -> None:
    """Nothing but a run's start (the ``server_url`` fixture's cleanup)."""


def hold_a_bench_database() -> None:
    """A bench run (``python -m tests.scratch_host``, with the bench importable): one scratch
    database of the bench's, held until the parent lets it finish, then dropped."""
    from notifyq_bench.harness import Scratch

    scratch = Scratch(os.environ["DATABASE_URL"])
    try:
        url = scratch.create("_host")
        announce([str(conninfo_to_dict(url)["dbname"])])
        wait_for_release()
        with psycopg.connect(url) as conn:
            conn.execute("SELECT 1")
    finally:
        assert scratch.drop_all() == []


def announce(databases: list[str]) -> None:
    """Tells the parent this run's pid and the databases it holds."""
    ready = Path(os.environ[READY])
    partial = ready.with_suffix(".partial")
    partial.write_text(json.dumps({"pid": os.getpid(), "databases": databases}))
    partial.rename(ready)


def wait_for_release(timeout: float = 90) -> None:
    release = Path(os.environ[RELEASE])
    deadline = time.monotonic() + timeout
    while not release.exists():
        assert time.monotonic() < deadline, "the parent test never let this run finish"
        time.sleep(0.02)


# -- used by the parent ---------------------------------------------------------------------------


def child_env(server_url: str, **extra: str) -> dict[str, str]:
    """The environment of another run on ``server_url``: this checkout's notifyq, tests and
    bench importable."""
    env = {**os.environ, "DATABASE_URL": server_url, **extra}
    path = (str(ROOT), str(ROOT / "benchmarks"), env.get("PYTHONPATH", ""))
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    return env


def pytest_argv(test: str) -> list[str]:
    """A test run of one test of this file: one process (no xdist), nothing cached, and
    pytest-benchmark off as in the suite's own options."""
    return [
        sys.executable,
        "-m",
        "pytest",
        "-o",
        "addopts=",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:benchmark",
        "-q",
        f"{Path(__file__).relative_to(ROOT)}::{test}",
    ]


def start_run(server_url: str) -> subprocess.CompletedProcess[str]:
    """Runs a test run's start to its end, in a process of its own."""
    return subprocess.run(
        pytest_argv("test_starts"),
        cwd=ROOT,
        env=child_env(server_url),
        capture_output=True,
        text=True,
        timeout=90,
    )


def dead_pid(avoid: set[int] | None = None) -> int:
    """A pid that no process of this host has (near the top of the range, where pids are
    reached last)."""
    top = int(Path("/proc/sys/kernel/pid_max").read_text())
    for pid in range(top - 1, 300, -1):
        if avoid and pid in avoid:
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    raise AssertionError("no free pid")


def needs_pid_namespaces() -> None:
    """Skips the test unless this process may make pid namespaces (root, util-linux's
    unshare) and choose pids in them (ns_last_pid)."""
    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare: another host is a pid namespace here")
    if not Path("/proc/sys/kernel/ns_last_pid").exists():
        pytest.skip("the kernel does not let a pid namespace choose its next pid")


def on_another_host(argv: list[str], pid: int, **popen: Any) -> subprocess.Popen[str]:
    """Starts ``argv`` in a new pid namespace as pid ``pid`` of that namespace; it and every
    process in the namespace are killed when the returned process (unshare) is."""
    unshare = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
    # The shell is pid 1 there; the next pid it hands out is the one after ns_last_pid.
    script = 'echo "$0" > /proc/sys/kernel/ns_last_pid && { "$@" & wait "$!"; }'
    return subprocess.Popen(
        [*unshare, "sh", "-c", script, str(pid - 1), *argv],
        text=True,
        **popen,
    )


def wait_for_file(path: Path, proc: subprocess.Popen[Any], log: Path, timeout: float = 60) -> Any:
    """The JSON ``proc`` writes to ``path``; fails if ``proc`` exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the other run exited first:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"the other run did not write {path.name}"
        time.sleep(0.02)
    return json.loads(path.read_text())


def wait_until_gone(conn: psycopg.Connection[Any], pid: int, timeout: float = 30) -> None:
    """Waits until no session of the killed run ``pid`` is left on the server: each one's
    backend ends when it notices the closed socket, one in the middle of a CREATE DATABASE only
    after it (its leases went with their sessions)."""
    names = [application_name(purpose, pid) for purpose in ("lease", "create", "drop", "cleanup")]
    deadline = time.monotonic() + timeout
    while conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY(%s)", [names]
    ).fetchone() != (0,):
        assert time.monotonic() < deadline, f"sessions of the killed run {pid} outlived it"
        time.sleep(0.02)


def named_for(conn: psycopg.Connection[Any], prefix: str, pid: int) -> set[str]:
    """Databases named as a run ``pid``'s scratch databases are."""
    pattern = f"{prefix}{pid}_".replace("_", "\\_") + "%"
    rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [pattern])
    return {name for (name,) in rows.fetchall()}


def existing(conn: psycopg.Connection[Any], names: list[str]) -> set[str]:
    rows = conn.execute(
        "SELECT datname FROM pg_database WHERE datname = ANY(%s)", [names]
    ).fetchall()
    return {name for (name,) in rows}


if __name__ == "__main__":
    hold_a_bench_database()
