"""The bench's ``horizon`` scenario runs end to end in its quick size: a stream of stamp jobs on
a PostgreSQL cluster of its own while a REPEATABLE READ session pins the xmin horizon, with its
figures in the JSON, and the cluster and the worker gone afterwards. Speed is not asserted.

The tests of this that need no database are in tests/unit/test_bench_horizon.py.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from notifyq.settings import DEFAULT_LOCAL_URL
from tests.test_bench import _bench_env

FIGURES = (
    "horizon.first.p99",
    "horizon.last.p99",
    "horizon.p99_growth",
    "horizon.backlog.max",
    "horizon.backlog.end",
    "horizon.dead_tuples",
    "horizon.rate",
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _children_of(pids: set[int]) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        # The parent pid is the second field after the command, which is in parentheses.
        parent = int(text.rsplit(")", 1)[1].split()[1])
        if parent in pids:
            found.append(int(stat.parent.name))
    return found


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_quick_horizon_scenario_streams_jobs_under_a_pinned_xmin_and_cleans_up(
    tmp_path: Path,
) -> None:
    url = os.environ.get("DATABASE_URL") or DEFAULT_LOCAL_URL
    out = tmp_path / "out.json"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "notifyq", "bench", "--quick", "--quiet"),
            *("--scenario", "horizon", "--json", str(out)),
        ],
        cwd=tmp_path,
        env=_bench_env(DATABASE_URL=url),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())
    assert results["meta"]["failed"] == []
    figures = {f["key"]: f for f in results["figures"]}
    for key in FIGURES:
        assert len(figures[key]["values"]) == 1  # --quick runs it once
        assert math.isfinite(figures[key]["median"]) and figures[key]["median"] >= 0
    first, last = figures["horizon.first.p99"]["median"], figures["horizon.last.p99"]["median"]
    assert 0 < first < 60_000 and 0 < last < 60_000
    assert figures["horizon.p99_growth"]["values"] == [last / first]
    assert figures["horizon.p99_growth"]["target"] is not None
    assert figures["horizon.backlog.end"]["target"] is not None
    assert figures["horizon.backlog.end"]["median"] <= figures["horizon.backlog.max"]["median"]
    assert 300 <= figures["horizon.rate"]["median"] <= 1_100

    (run,) = results["scenarios"]["horizon"]["runs"]
    assert run["jobs"] == 30_000
    assert run["statuses"] == {"completed": 30_000}
    assert run["never_started"] == 0
    assert run["settings"]["autovacuum"] == "on"
    assert run["settings"]["synchronous_commit"] == "on"
    # The snapshot held one xmin from the first job to the last, while others came and went.
    assert run["xmin_at_start"]["xmin"] is not None
    assert run["xmin_at_end"]["xmin"] == run["xmin_at_start"]["xmin"]
    assert run["xmin_at_end"]["age"] > 1_000
    assert figures["horizon.dead_tuples"]["median"] > 0
    assert len(run["backlog_per_s"]) >= 29

    server = run["server"]
    assert not _alive(server["postmaster_pid"])
    assert not _alive(run["worker_pid"])
    assert _children_of({server["postmaster_pid"], run["worker_pid"]}) == []
    assert not Path(server["folder"]).exists()
    assert not _listening(server["port"])
    scratch = results["meta"]["scratch_databases"]
    with psycopg.connect(url, autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)", [scratch]
        ).fetchall()
    assert left == []
