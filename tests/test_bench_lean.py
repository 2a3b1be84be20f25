"""The lean floor, the reference of every figure of the storage issue, is the reference text's
SQL to the letter and runs as it says; the ``lean`` scenario reports notifyq against it.

Speed is not asserted here: only that the reference is the one defined, and that the scenario
measures both sides and divides by the right one.

The tests of this that need no database are in tests/unit/test_bench_lean.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from notifyq.settings import DEFAULT_LOCAL_URL
from tests.test_bench import _bench_env, _bench_module


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_lean_floor_claims_a_batch_a_statement_and_stamps_its_pickups(
    empty_db_url: str, tmp_path: Path
) -> None:
    # 120 jobs, one loop of 50 slots: claims of 50, 50 and 20, each batch marked done by the
    # statement that claims the next; the jobs whose payload has a key print their stamp.
    lean = _bench_module("notifyq_bench.lean")
    harness = _bench_module("notifyq_bench.harness")
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(lean.SCHEMA.encode())
        children = harness.Children(tmp_path)
        try:
            loop = children.start(
                "lean",
                [sys.executable, "-m", "notifyq_bench.lean", empty_db_url, "--slots", "50"],
                _bench_env(),
            )
            loop.wait_for(r"\bready\b", timeout=30)
            conn.execute(
                "INSERT INTO lean_jobs (payload) SELECT CASE WHEN g <= 3 "
                "THEN jsonb_build_object('k', 'key' || g) ELSE '{}' END "
                "FROM generate_series(1, 120) AS g"
            )

            def all_done() -> bool:
                row = conn.execute("SELECT count(*) FROM lean_jobs WHERE status = 'done'")
                return row.fetchone() == (120,)

            harness.poll_until(all_done, 30.0, "the lean floor to finish 120 jobs")
            loop.wait_for(r"stamp key3 ", timeout=10)
            loop.check_alive()
        finally:
            children.stop_all()
        rows = conn.execute("SELECT started_at, finished_at FROM lean_jobs").fetchall()
    claims: dict[object, int] = {}
    for started, _ in rows:
        claims[started] = claims.get(started, 0) + 1
    assert sorted(claims.values()) == [20, 50, 50]
    stamped = re.findall(r"^stamp (\S+) ", loop.log_path.read_text(), re.MULTILINE)
    assert sorted(stamped) == ["key1", "key2", "key3"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_lean_scenario_divides_every_figure_by_the_lean_floor_of_its_round(
    tmp_path: Path,
) -> None:
    url = os.environ.get("DATABASE_URL") or DEFAULT_LOCAL_URL
    out = tmp_path / "out.json"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "notifyq", "bench", "--quick", "--quiet"),
            *("--scenario", "lean", "--json", str(out)),
        ],
        cwd=tmp_path,
        env=_bench_env(DATABASE_URL=url),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())
    assert results["meta"]["failed"] == []
    figures = {f["key"]: f for f in results["figures"]}
    raw = results["scenarios"]["lean"]
    for key, field in (
        ("one", "jobs_per_s"),
        ("two", "jobs_per_s"),
        ("single", "jobs_per_s"),
        ("bulk", "jobs_per_s"),
        ("idle", "p99_ms"),
        ("burst", "p99_ms"),
    ):
        ours = [run[field] for run in raw["notifyq"][key]]
        floor = [run[field] for run in raw["lean"][key]]
        assert ours and floor and all(value > 0 for value in ours + floor)
        name = {"idle": "idle_p99", "burst": "burst_p99"}.get(key, key)
        assert figures[f"lean.{name}"]["floor"] == floor
        ratio = figures[f"lean.{name}_vs_lean"]
        assert ratio["values"] == [a / b for a, b in zip(ours, floor, strict=True)]
        assert ratio["target"] is not None
    # Both sides' WAL and commits a job were measured on the same drains.
    for side in ("lean", "notifyq"):
        (one,) = raw[side]["one"]
        assert one["wal_bytes_per_job"] > 0
        assert one["commits_per_job"] > 0
    assert figures["lean.wal_vs_lean"]["target"] == {"op": "<=", "value": 2.0}
