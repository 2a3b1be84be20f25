"""Durable steps across ``kill -9``: worker processes killed while they run three-step jobs,
again and again, and no step that was recorded runs again (tests/sample_tasks.three_steps)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psycopg

from tests.helpers import notifyq_env, processes


def test_kill_9_during_three_step_jobs_never_runs_a_recorded_step_again(
    db_url: str, tmp_path: Path
) -> None:
    jobs = 40
    env = notifyq_env(
        db_url,
        NOTIFYQ_IMPORT="tests.sample_tasks",
        NOTIFYQ_LEASE_SECONDS="3",
        NOTIFYQ_POLL_INTERVAL="1",
        NOTIFYQ_CONCURRENCY="8",
    )
    with psycopg.connect(db_url, autocommit=True) as conn, processes(tmp_path) as start:
        conn.execute("CREATE TABLE durable_runs (job_id uuid, name text, at timestamptz)")
        conn.execute(
            "INSERT INTO notifyq.jobs (task, payload)"
            " SELECT 'three_steps', '{\"seconds\": 0.05}' FROM generate_series(1, %s)",
            [jobs],
        )

        def runs() -> int:
            row = conn.execute("SELECT count(*) FROM durable_runs").fetchone()
            return int(row[0]) if row else 0

        for round_ in range(3):
            doomed = start("worker", env=env, name=f"doomed{round_}")
            doomed.wait_for_output("ready")
            target = runs() + 12
            deadline = time.monotonic() + 30
            while runs() < target:
                assert time.monotonic() < deadline, doomed.output()
                time.sleep(0.005)
            doomed.signal(signal.SIGKILL)  # mid-step: steps take 50 ms, 8 at a time
            doomed.wait()
        survivor = start("worker", env=env, name="survivor")
        deadline = time.monotonic() + 60
        while conn.execute(
            "SELECT count(*) FROM notifyq.jobs WHERE task = 'three_steps' AND status = 'completed'"
        ).fetchone() != (jobs,):
            assert time.monotonic() < deadline, survivor.output()
            time.sleep(0.05)
        survivor.signal(signal.SIGTERM)
        assert survivor.wait() == 0, survivor.output()
        again = conn.execute(
            """SELECT count(*) FROM durable_runs AS r
               JOIN notifyq.job_steps AS s ON s.job_id = r.job_id AND s.name = r.name
               WHERE s.kind = 'step' AND r.at > s.finished_at"""
        ).fetchone()
        results = conn.execute(
            "SELECT DISTINCT result FROM notifyq.jobs WHERE task = 'three_steps'"
        ).fetchall()
        steps = conn.execute(
            "SELECT count(*) FROM notifyq.job_steps WHERE kind = 'step'"
        ).fetchone()
        interrupted = conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM durable_runs GROUP BY job_id, name"
            " HAVING count(*) > 1) AS r"
        ).fetchone()
        conn.execute("DROP TABLE durable_runs")
    assert again == (0,)  # no recorded step ran again
    assert results == [(["one", "two", "three"],)]
    assert steps == (3 * jobs,)
    # The kills did cut steps: those ran again (they had not been recorded).
    assert interrupted is not None and interrupted[0] >= 1
