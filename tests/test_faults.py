"""Fault injection with real processes: killed workers, terminated connections, a soak.

These are slow (tens of seconds); `pytest -m "not slow"` skips them, CI runs them.
"""

from __future__ import annotations

import random
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from notifyq.embedded import EmbeddedPostgres
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


def test_soak_kill_and_restart_workers_no_job_lost_only_killed_jobs_rerun(
    db_url: str, tmp_path: Path
) -> None:
    total = 10_000
    runs = tmp_path / "runs.txt"
    env = notifyq_env(
        db_url,
        NOTIFYQ_IMPORT="tests.sample_tasks",
        NQ_RUNS_FILE=str(runs),
        NOTIFYQ_LEASE_SECONDS="3",
        NOTIFYQ_POLL_INTERVAL="1",
        NOTIFYQ_CONCURRENCY="4",
    )
    rng = random.Random(7)
    killed: set[int] = set()
    with processes(tmp_path) as start:
        workers = [start("worker", env=env, name=f"w{i}") for i in range(3)]
        for worker in workers:
            worker.wait_for_output("ready")
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(
                """INSERT INTO notifyq.jobs (task, payload)
                   SELECT 'record_slowly', jsonb_build_object('n', i, 'seconds', 0.005)
                   FROM generate_series(1, %s) i""",
                [total],
            )
        deadline = time.monotonic() + 240
        while count(db_url, "status = 'completed'") < total:
            assert time.monotonic() < deadline, "soak did not finish"
            time.sleep(rng.uniform(1.0, 2.5))
            if count(db_url, "status = 'completed'") >= total:
                break
            victim = rng.randrange(len(workers))
            workers[victim].signal(signal.SIGKILL)
            workers[victim].wait()
            killed.add(workers[victim].pid)
            workers[victim] = start("worker", env=env, name=f"w{victim}")
            # Before it is ready it has no handler for SIGTERM yet: the final stop below would
            # kill a worker restarted just then (exit -15), which is not what it tests.
            workers[victim].wait_for_output("ready")
        for worker in workers:
            worker.signal(signal.SIGTERM)
        assert [w.wait() for w in workers] == [0, 0, 0]
    assert len(killed) >= 3, "the soak should have killed several workers"
    assert count(db_url, "status = 'completed'") == total
    by_job: dict[int, list[int]] = defaultdict(list)
    for n, pid in read_runs(runs):
        by_job[n].append(pid)
    assert sorted(by_job) == list(range(1, total + 1)), "a job never ran"
    for n, pids in by_job.items():
        # Every run but the last must have been cut short by a kill.
        unkilled = [pid for pid in pids if pid not in killed]
        assert len(unkilled) <= 1, f"job {n} ran {len(pids)} times in live workers {pids}"
    reruns = sum(1 for pids in by_job.values() if len(pids) > 1)
    print(f"soak: {len(killed)} kills, {reruns} jobs ran again after a kill")


def test_soak_with_bad_rows_under_kill_9_loses_nothing_and_leaves_nothing_stuck(
    db_url: str, tmp_path: Path
) -> None:
    """10,000 jobs, and among them what a careless or hostile producer sends by SQL: a payload
    no Python can read, a row that names columns only workers may set, a time of 'infinity', and
    a 'processing' row without a lease (made by hand with an UPDATE). Workers are killed at
    random throughout. Every good job completes, the poison fails alone, the refused rows are
    never stored, and no job stays queued or processing; no attempt was counted without its
    handler having run."""
    total = 10_000
    runs = tmp_path / "runs.txt"
    env = notifyq_env(
        db_url,
        NOTIFYQ_IMPORT="tests.sample_tasks",
        NQ_RUNS_FILE=str(runs),
        NOTIFYQ_LEASE_SECONDS="3",
        NOTIFYQ_POLL_INTERVAL="1",
        NOTIFYQ_CONCURRENCY="4",
    )
    rng = random.Random(12)
    killed: set[int] = set()
    with processes(tmp_path) as start, psycopg.connect(db_url, autocommit=True) as conn:
        workers = [start("worker", env=env, name=f"w{i}") for i in range(3)]
        for worker in workers:
            worker.wait_for_output("ready")
        conn.execute(
            """INSERT INTO notifyq.jobs (task, payload)
               SELECT 'record_slowly', jsonb_build_object('n', i, 'seconds', 0.02)
               FROM generate_series(1, %s) i""",
            [total // 2],
        )
        poison = conn.execute(
            "INSERT INTO notifyq.jobs (task, payload) VALUES ('record_slowly', "
            "('{\"n\": ' || repeat('[', 3000) || repeat(']', 3000) || '}')::jsonb) RETURNING id"
        ).fetchone()[0]  # type: ignore[index]
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "INSERT INTO notifyq.jobs (task, payload, status) "
                "VALUES ('record_slowly', '{\"n\": -1}', 'processing')"
            )
        with pytest.raises(psycopg.errors.DatetimeFieldOverflow):
            conn.execute(
                "SELECT notifyq.enqueue('record_slowly', '{\"n\": -2}', run_at => 'infinity')"
            )
        orphan = conn.execute(
            "INSERT INTO notifyq.jobs (task, payload) "
            "VALUES ('record_slowly', jsonb_build_object('n', %s)) RETURNING id",
            [total + 1],
        ).fetchone()[0]  # type: ignore[index]
        conn.execute(
            "UPDATE notifyq.jobs SET status = 'processing', attempt_count = 1 WHERE id = %s",
            [orphan],
        )
        conn.execute(
            """INSERT INTO notifyq.jobs (task, payload)
               SELECT 'record_slowly', jsonb_build_object('n', i, 'seconds', 0.02)
               FROM generate_series(%s::integer, %s::integer) i""",
            [total // 2 + 1, total],
        )
        deadline = time.monotonic() + 300
        while count(db_url, "status IN ('queued', 'processing')") > 0:
            assert time.monotonic() < deadline, "soak did not finish"
            time.sleep(rng.uniform(0.4, 1.2))
            if count(db_url, "status IN ('queued', 'processing')") == 0:
                break
            victim = rng.randrange(len(workers))
            workers[victim].signal(signal.SIGKILL)
            workers[victim].wait()
            killed.add(workers[victim].pid)
            workers[victim] = start("worker", env=env, name=f"w{victim}")
            workers[victim].wait_for_output("ready")
        for worker in workers:
            worker.signal(signal.SIGTERM)
        assert [w.wait() for w in workers] == [0, 0, 0]
        statuses = dict(
            conn.execute("SELECT status, count(*) FROM notifyq.jobs GROUP BY status").fetchall()
        )
        failed = conn.execute(
            "SELECT id, attempt_count, last_error FROM notifyq.jobs WHERE status = 'failed'"
        ).fetchall()
        attempts = dict(
            conn.execute(
                "SELECT (payload ->> 'n')::integer, attempt_count FROM notifyq.jobs "
                "WHERE status = 'completed'"
            ).fetchall()
        )
    assert len(killed) >= 8, "the soak should have killed many workers"
    assert statuses == {"completed": total + 1, "failed": 1}, statuses
    ((failed_id, failed_attempts, error),) = failed
    assert failed_id == poison and failed_attempts == 1
    assert "payload cannot be used" in error
    ran = Counter(n for n, _ in read_runs(runs))
    assert set(ran) == set(range(1, total + 2)), "a job never ran"
    # An attempt counts only when its handler ran: never more attempts than runs.
    over = {n: (attempts[n], ran[n]) for n in attempts if attempts[n] > ran[n]}
    assert not over, f"attempts counted without a run: {list(over.items())[:10]}"
    print(f"soak with bad rows: {len(killed)} kills, {sum(ran.values()) - len(ran)} reruns")


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


@pytest.fixture
def throwaway_cluster_dir() -> Iterator[Path]:
    """A base folder for a PostgreSQL cluster of this test's own (not the shared server, which
    this test stops and starts). As root it cannot be under tmp_path (private to root), as the
    server's unprivileged account must reach it."""
    base = Path(tempfile.mkdtemp(prefix="notifyq-restart-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_postgresql_restart_mid_load_loses_nothing(
    throwaway_cluster_dir: Path, tmp_path: Path
) -> None:
    server = EmbeddedPostgres(throwaway_cluster_dir)
    url = server.acquire()
    restarted: EmbeddedPostgres | None = None
    runs = tmp_path / "runs.txt"
    port = free_port()
    env = notifyq_env(
        url,
        NOTIFYQ_IMPORT="tests.sample_tasks",
        NQ_RUNS_FILE=str(runs),
        NOTIFYQ_POLL_INTERVAL="1",
        NOTIFYQ_LEASE_SECONDS="10",
        NOTIFYQ_CONNECT_TIMEOUT="1",
    )
    accepted: list[int] = []
    answers = Counter[int]()
    during_outage: list[tuple[int, float]] = []
    try:
        with processes(tmp_path) as start:
            api = start("serve", "--port", str(port), env=env, name="serve")
            worker = start("worker", env=env, name="worker")
            api.wait_for_output("Uvicorn running on")
            worker.wait_for_output("ready")
            down = threading.Event()

            def load() -> None:
                with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=15) as client:
                    for n in range(1, 801):
                        began = time.monotonic()
                        answer = client.post(
                            "/jobs", json={"task": "record_slowly", "payload": {"n": n}}
                        )
                        answers[answer.status_code] += 1
                        if answer.status_code == 201:
                            accepted.append(n)
                        elif down.is_set():
                            during_outage.append((answer.status_code, time.monotonic() - began))
                        time.sleep(0.002)

            loader = threading.Thread(target=load)
            loader.start()
            while len(accepted) < 200:
                assert loader.is_alive(), answers
                time.sleep(0.01)
            down.set()
            server.release()  # the last user: stops the server
            # An outage longer than the API's wait for a connection (1 s here): requests get
            # quick 503s, claims and outcome writes fail and are retried.
            deadline = time.monotonic() + 10
            while not during_outage and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
            restarted = EmbeddedPostgres(throwaway_cluster_dir)
            assert restarted.acquire() == url, "the restarted server must keep its port"
            down.clear()
            loader.join(120)
            wait_all_completed(url, len(accepted), 90, api, worker)
            health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
            assert health.status_code == 200, health.text
            api.signal(signal.SIGTERM)
            worker.signal(signal.SIGTERM)
            assert api.wait() == 0, api.output()[-3000:]
            assert worker.wait() == 0, worker.output()[-3000:]
    finally:
        if restarted is not None:
            restarted.release()
        server.release()
    # While the database was away, refusals were quick 503s (never a 500, never a hang).
    assert set(answers) <= {201, 503}, answers
    assert during_outage, "no request met the outage"
    assert all(code == 503 and seconds < 3 for code, seconds in during_outage), during_outage
    ran = Counter(n for n, _ in read_runs(runs))
    assert set(accepted) <= set(ran), "an accepted job never ran"
    assert max(ran.values()) == 1, "a job ran twice though no process crashed"
    print(f"accepted {len(accepted)}, answers {dict(answers)}")
