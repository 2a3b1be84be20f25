"""Single faults on the test's own database of the shared server (which they never stop): a
worker killed while it holds a job, every backend terminated under HTTP load. The scenarios
that stop, kill or fail over a server run on clusters of their own (the other files here).

These are slow (tens of seconds); `pytest -m "not slow"` skips them, CI runs them.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.faults.cluster import free_port
from tests.helpers import Process, notifyq_env, processes
from tests.sample_tasks import read_runs

pytestmark = pytest.mark.slow


def count(db_url: str, where: str = "true") -> int:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM notifyq.jobs WHERE {where}").fetchone()
    return int(row[0]) if row else 0


def wait_all_completed(db_url: str, total: int, timeout: float, *watch: Process) -> None:
    deadline = time.monotonic() + timeout
    while (done := count(db_url, "status = 'completed'")) < total:
        if time.monotonic() > deadline:
            logs = "\n".join(p.output()[-3000:] for p in watch)
            raise AssertionError(f"{done} of {total} jobs completed after {timeout}s\n{logs}")
        time.sleep(0.1)


def test_a_job_of_a_killed_worker_is_completed_by_another(db_url: str, tmp_path: Path) -> None:
    env = notifyq_env(db_url, NOTIFYQ_IMPORT="tests.sample_tasks", NOTIFYQ_LEASE_SECONDS="3")
    with processes(tmp_path) as start, psycopg.connect(db_url, autocommit=True) as conn:
        doomed = start("worker", env=env, name="doomed")
        doomed.wait_for_output("ready")
        job_id = conn.execute(
            """INSERT INTO notifyq.jobs (task, payload) VALUES ('nap', '{"seconds": 1.5}')
               RETURNING id"""
        ).fetchone()[0]  # type: ignore[index]
        deadline = time.monotonic() + 10
        # Killed once a heartbeat confirmed the handler running: its attempt counts (one lost
        # before that is given back: tests/test_attempts.py).
        while count(db_url, "status = 'processing' AND heartbeat_at IS NOT NULL") == 0:
            assert time.monotonic() < deadline, doomed.output()
            time.sleep(0.01)
        doomed.signal(signal.SIGKILL)
        doomed.wait()
        survivor = start("worker", env=env, name="survivor")
        began = time.monotonic()
        wait_all_completed(db_url, 1, 20, survivor)
        row = conn.execute(
            "SELECT attempt_count, worker_id, errors FROM notifyq.jobs WHERE id = %s", [job_id]
        ).fetchone()
    assert row is not None
    attempts, holder, errors = row
    assert attempts == 2
    assert holder and holder.split(":")[1] == str(survivor.pid)
    assert "lease expired" in errors[0]["error"]
    # Lease 3 s plus a beat of the rescuer, plus the job's own 1.5 s.
    assert time.monotonic() - began < 10


def test_terminating_every_backend_mid_load_loses_no_accepted_job(
    db_url: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs.txt"
    port = free_port()
    env = notifyq_env(
        db_url,
        NOTIFYQ_IMPORT="tests.sample_tasks",
        NQ_RUNS_FILE=str(runs),
        NOTIFYQ_POLL_INTERVAL="1",
    )
    accepted: list[int] = []
    refused = Counter[int]()
    with processes(tmp_path) as start:
        api = start("serve", "--port", str(port), env=env, name="serve")
        worker = start("worker", env=env, name="worker")
        api.wait_for_output("Uvicorn running on")
        worker.wait_for_output("ready")
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
                for n in range(1, 1501):
                    if stop.is_set():
                        break
                    answer = client.post("/jobs", json={"task": "record", "payload": {"n": n}})
                    if answer.status_code == 201:
                        accepted.append(n)
                    else:
                        refused[answer.status_code] += 1

        loader = threading.Thread(target=load)
        loader.start()
        try:
            for _ in range(4):
                time.sleep(0.4)
                with psycopg.connect(db_url, autocommit=True) as conn:
                    conn.execute(
                        """SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                           WHERE datname = current_database() AND pid <> pg_backend_pid()"""
                    )
        finally:
            loader.join(120)
            stop.set()
        assert accepted, f"nothing accepted; refusals {refused}"
        assert set(refused) <= {503}, refused
        wait_all_completed(db_url, len(accepted), 60, api, worker)
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
        assert health.status_code == 200, health.text
        api.signal(signal.SIGTERM)
        worker.signal(signal.SIGTERM)
        assert api.wait() == 0, api.output()[-3000:]
        assert worker.wait() == 0, worker.output()[-3000:]
    ran = Counter(n for n, _ in read_runs(runs))
    assert set(accepted) <= set(ran), "an accepted job never ran"
    assert max(ran.values()) == 1, "a job ran twice though no process crashed"
    print(f"accepted {len(accepted)}, refused {dict(refused)}")
