"""Worker processes, as users run them: ``notifyq worker`` against a real database."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

from tests.helpers import notifyq_env, processes, wait_for_status
from tests.sample_tasks import read_runs


def sync_status(db_url: str, job_id: Any) -> str | None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT status FROM notifyq.jobs WHERE id = %s", [job_id]).fetchone()
    return row[0] if row else None


def test_an_idle_worker_runs_a_psql_insert_well_under_a_second(db_url: str, tmp_path: Path) -> None:
    with processes(tmp_path) as start:
        worker = start("worker", "--poll-interval", "30", env=notifyq_env(db_url))
        worker.wait_for_output("ready")
        insert = (
            "INSERT INTO notifyq.jobs (task, payload) VALUES ('echo', '{\"n\": 1}') RETURNING id"
        )
        began = time.monotonic()
        if shutil.which("psql"):
            out = subprocess.run(
                ["psql", db_url, "-qtAc", insert], check=True, capture_output=True, text=True
            )
            job_id = out.stdout.strip().splitlines()[0]
        else:  # a machine with the embedded server only
            with psycopg.connect(db_url, autocommit=True) as conn:
                job_id = str(conn.execute(insert).fetchone()[0])  # type: ignore[index]
        while sync_status(db_url, job_id) != "completed":
            assert time.monotonic() - began < 5, worker.output()
            time.sleep(0.005)
        elapsed = time.monotonic() - began
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output()
    # psql's own start-up is part of this figure; the worker's share is a few milliseconds. The
    # bound is loose for a loaded CI machine (2.9 s was seen once there, with the whole suite
    # running): a job found by the 30 s poll instead of the notification would fail it.
    assert elapsed < 3.0, f"took {elapsed:.3f}s"


def test_three_worker_processes_run_1500_jobs_each_exactly_once(
    db_url: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs.txt"
    env = notifyq_env(db_url, NQ_RUNS_FILE=str(runs), NOTIFYQ_IMPORT="tests.sample_tasks")
    with processes(tmp_path) as start:
        workers = [start("worker", "--concurrency", "8", env=env) for _ in range(3)]
        for worker in workers:
            worker.wait_for_output("ready")
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(
                """INSERT INTO notifyq.jobs (task, payload)
                   SELECT 'record', jsonb_build_object('n', i) FROM generate_series(1, 1500) i"""
            )
            deadline = time.monotonic() + 60
            while True:
                done = conn.execute(
                    "SELECT count(*) FROM notifyq.jobs WHERE status = 'completed'"
                ).fetchone()[0]  # type: ignore[index]
                if done == 1500:
                    break
                assert time.monotonic() < deadline, f"{done} of 1500 completed"
                time.sleep(0.05)
            per_worker = conn.execute(
                "SELECT worker_id, count(*) FROM notifyq.jobs GROUP BY worker_id"
            ).fetchall()
        for worker in workers:
            worker.signal(signal.SIGTERM)
        assert [worker.wait() for worker in workers] == [0, 0, 0]
    counts = Counter(n for n, _ in read_runs(runs))
    assert sorted(counts) == list(range(1, 1501))
    assert set(counts.values()) == {1}, "some job ran twice"
    assert len(per_worker) >= 2, per_worker


async def test_sigterm_lets_the_running_job_finish_and_exits_zero(
    db_url: str, tmp_path: Path, conn: Any
) -> None:
    env = notifyq_env(db_url, NOTIFYQ_IMPORT="tests.sample_tasks")
    with processes(tmp_path) as start:
        worker = start("worker", env=env)
        worker.wait_for_output("ready")
        cursor = await conn.execute(
            """INSERT INTO notifyq.jobs (task, payload) VALUES ('nap', '{"seconds": 1}')
               RETURNING id"""
        )
        job_id = (await cursor.fetchone())[0]
        await wait_for_status(conn, job_id, "processing")
        worker.signal(signal.SIGTERM)
        # Inserted once the worker has taken the signal in: it must stay queued for another
        # worker. (Inserted right after the kill, it could still be claimed before the signal
        # reached the worker's loop.)
        worker.wait_for_output("stopping")
        cursor = await conn.execute("INSERT INTO notifyq.jobs (task) VALUES ('echo') RETURNING id")
        later = (await cursor.fetchone())[0]
        assert worker.wait(timeout=20) == 0, worker.output()
    row = await wait_for_status(conn, job_id, "completed")
    assert row["result"] == "rested"
    assert sync_status(db_url, later) == "queued"


async def test_a_second_signal_exits_at_once_and_leaves_the_job_to_the_lease(
    db_url: str, tmp_path: Path, conn: Any
) -> None:
    env = notifyq_env(db_url, NOTIFYQ_IMPORT="tests.sample_tasks")
    with processes(tmp_path) as start:
        worker = start("worker", env=env)
        worker.wait_for_output("ready")
        cursor = await conn.execute(
            """INSERT INTO notifyq.jobs (task, payload) VALUES ('nap', '{"seconds": 30}')
               RETURNING id"""
        )
        job_id = (await cursor.fetchone())[0]
        await wait_for_status(conn, job_id, "processing")
        worker.signal(signal.SIGTERM)
        worker.wait_for_output("draining")
        worker.signal(signal.SIGTERM)
        began = time.monotonic()
        code = worker.wait(timeout=10)
        assert time.monotonic() - began < 3
    assert code == 128 + signal.SIGTERM
    row = await wait_for_status(conn, job_id, "processing")
    assert row["lease_expires_at"] is not None  # the lease brings it back
    # Its idle mark went with it: inserts do not keep notifying a dead worker.
    cursor = await conn.execute("SELECT count(*) FROM notifyq.waiting_workers")
    assert (await cursor.fetchone())[0] == 0


async def test_import_registers_the_modules_tasks(db_url: str, tmp_path: Path, conn: Any) -> None:
    runs = tmp_path / "runs.txt"
    await conn.execute(
        """INSERT INTO notifyq.jobs (task, payload) VALUES ('record', '{"n": 42}')"""
    )
    with processes(tmp_path) as start:
        worker = start(
            "worker",
            "--import",
            "tests.sample_tasks",
            "--burst",
            env=notifyq_env(db_url, NQ_RUNS_FILE=str(runs)),
        )
        assert worker.wait() == 0, worker.output()
    cursor = await conn.execute("SELECT name, max_attempts FROM notifyq.tasks ORDER BY name")
    tasks = dict(await cursor.fetchall())
    assert tasks["nap"] == 5 and "record" in tasks and "echo" in tasks
    assert [n for n, _ in read_runs(runs)] == [42]
