"""Retries, dead letters, the circuit breaker and the timeout hierarchy."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx

from notifyq.api import create_app
from notifyq.builtins import worker_registry
from notifyq.models import Failure, JobStatus
from notifyq.retry import CircuitBreaker
from notifyq.settings import Settings
from notifyq.store import Store
from notifyq.tasks import Registry, make_task
from notifyq.worker import Worker
from tests.helpers import (
    ROOT,
    insert_in_state,
    job_row,
    notifyq_env,
    processes,
    running_worker,
    wait_for_status,
    wait_until,
)


async def test_retries_wait_longer_every_attempt(settings: Settings, conn: Any) -> None:
    job_id = (
        await (
            await conn.execute(
                "INSERT INTO notifyq.jobs (task, max_attempts) VALUES ('fail', 4) RETURNING id"
            )
        ).fetchone()
    )[0]
    growing = settings.model_copy(update={"retry_base": 0.1, "retry_factor": 2, "retry_cap": 10})
    async with running_worker(growing):
        row = await wait_for_status(conn, job_id, "failed", timeout=20)
    times = [e["at"] for e in row["errors"]]
    assert len(times) == 4
    gaps = [(psycopg_ts(b) - psycopg_ts(a)).total_seconds() for a, b in itertools.pairwise(times)]
    # Backoff ceilings 0.1, 0.2, 0.4 s; each wait is at least half its ceiling.
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1 and gaps[2] >= 0.2, gaps
    assert gaps[2] > gaps[0], gaps


def psycopg_ts(text: str) -> Any:
    """A time of the errors history, in PostgreSQL's JSON form: its fraction of a second may
    have fewer than six digits, which Python 3.10's fromisoformat refuses."""
    from datetime import datetime

    head, dot, rest = text.partition(".")
    if dot:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[:digits].ljust(6, '0')[:6]}{rest[digits:]}"
    return datetime.fromisoformat(text)


async def test_breaker_opens_for_all_workers_then_a_probe_closes_it(
    settings: Settings, conn: Any, db_url: str
) -> None:
    healthy = False
    calls = 0

    async def flaky(payload: dict[str, Any]) -> str:
        nonlocal calls
        calls += 1
        if not healthy:
            raise ConnectionError("downstream is down")
        return "ok"

    tasks = worker_registry(
        Registry([make_task(flaky, breaker=CircuitBreaker(threshold=3, cooldown=1.5))])
    )
    cursor = await conn.execute(
        """INSERT INTO notifyq.jobs (task, max_attempts, payload)
           SELECT 'flaky', 50, jsonb_build_object('i', i) FROM generate_series(1, 5) i
           RETURNING id"""
    )
    ids = [row[0] for row in await cursor.fetchall()]
    serial = settings.model_copy(update={"concurrency": 1, "retry_base": 0.01, "retry_cap": 0.01})

    async def breaker_state() -> str:
        cursor = await conn.execute(
            """SELECT CASE WHEN breaker_open_until IS NULL THEN 'closed'
                           WHEN breaker_open_until > now() THEN 'open' ELSE 'half_open' END
               FROM notifyq.tasks WHERE name = 'flaky'"""
        )
        return str((await cursor.fetchone())[0])

    async with running_worker(serial, tasks), running_worker(serial, tasks):
        await wait_until(lambda: _equals(breaker_state(), "open"), timeout=10)
        opened_at_calls = calls
        app = create_app(serial.model_copy(update={"run_worker": False}))
        async with app.router.lifespan_context(app), _client(app) as client:
            listed = (await client.get("/tasks")).json()
        flaky_info = next(t for t in listed if t["name"] == "flaky")
        assert flaky_info["breaker"]["threshold"] == 3
        assert flaky_info["breaker"]["state"] == "open"
        # While it is open, neither worker claims the task; only attempts already running
        # when it opened (one per worker at most) still end.
        await wait_until(lambda: _equals(breaker_state(), "half_open"), timeout=10)
        assert calls <= opened_at_calls + 2
        healthy = True
        for job_id in ids:
            await wait_for_status(conn, job_id, "completed", timeout=15)
        assert await breaker_state() == "closed"


async def _equals(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost")


async def test_dead_letters_are_kept_listed_and_retried(
    settings: Settings, conn: Any, db_url: str
) -> None:
    cursor = await conn.execute(
        """INSERT INTO notifyq.jobs (task, queue, max_attempts, payload)
           SELECT 'fail', q, 1, '{"message": "nope"}'
           FROM unnest(ARRAY['a', 'a', 'b']) q RETURNING id"""
    )
    ids = [row[0] for row in await cursor.fetchall()]
    await Worker(settings, burst=True).run()
    app = create_app(settings.model_copy(update={"run_worker": False}))
    async with app.router.lifespan_context(app), _client(app) as client:
        page = (await client.get("/jobs", params={"status": "failed", "queue": "a"})).json()
        assert {job["job_id"] for job in page["jobs"]} == {str(i) for i in ids[:2]}
        assert all(job["error"].startswith("RuntimeError: nope") for job in page["jobs"])
        answer = await client.post(f"/jobs/{ids[0]}/retry")
        assert answer.status_code == 200 and answer.json()["status"] == "queued"
        assert answer.json()["attempt_count"] == 0
        again = await client.post(f"/jobs/{ids[0]}/retry")
        assert again.status_code == 409
        missing = await client.post("/jobs/00000000-0000-0000-0000-000000000000/retry")
        assert missing.status_code == 404
    # The CLI requeues all failed jobs of the task.
    done = await anyio.run_process(
        [sys.executable, "-m", "notifyq", "retry", "--task", "fail", "--status", "failed"],
        env=notifyq_env(db_url),
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "requeued 2 job(s)" in done.stdout.decode()
    cursor = await conn.execute("SELECT count(*) FROM notifyq.jobs WHERE status = 'queued'")
    assert (await cursor.fetchone())[0] == 3
    row = await job_row(conn, ids[1])
    assert row is not None and len(row["errors"]) == 1  # the history survives the retry


async def test_pages_of_jobs_follow_the_cursor(settings: Settings, conn: Any) -> None:
    await conn.execute(
        "INSERT INTO notifyq.jobs (task) SELECT 'nobody' FROM generate_series(1, 25)"
    )
    app = create_app(settings.model_copy(update={"run_worker": False}))
    seen: list[str] = []
    async with app.router.lifespan_context(app), _client(app) as client:
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 10, **({"cursor": cursor} if cursor else {})}
            page = (await client.get("/jobs", params=params)).json()
            seen += [job["job_id"] for job in page["jobs"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        bad = await client.get("/jobs", params={"cursor": "garbage!"})
        assert bad.status_code == 422
        too_many = await client.get("/jobs", params={"limit": 100_000})
        assert too_many.status_code == 422
    assert len(seen) == 25 == len(set(seen))


async def test_store_requeues_in_batches(settings: Settings, conn: Any) -> None:
    await insert_in_state(conn, "x", count=2500, status="'failed'", finished_at="now()")
    async with _pool(settings) as pool:
        assert await Store(pool).retry_jobs(task="x", batch=1000) == 2500


def _pool(settings: Settings) -> Any:
    from notifyq.db import open_pool

    return open_pool(settings, name="test")


def test_an_inconsistent_timeout_hierarchy_is_one_line_of_error(db_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "notifyq", "worker"],
        env=notifyq_env(db_url, NOTIFYQ_LEASE_SECONDS="3", NOTIFYQ_HEARTBEAT_INTERVAL="2"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "NOTIFYQ_HEARTBEAT_INTERVAL" in lines[0] and "third" in lines[0]


async def test_sigterm_past_the_grace_requeues_the_job_at_once(
    db_url: str, tmp_path: Path, conn: Any
) -> None:
    env = notifyq_env(db_url, NOTIFYQ_IMPORT="tests.sample_tasks", NOTIFYQ_SHUTDOWN_GRACE="0.5")
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
        assert worker.wait(timeout=15) == 0, worker.output()
    row = await job_row(conn, job_id)
    assert row is not None
    assert (row["status"], row["attempt_count"], row["lease_expires_at"]) == ("queued", 0, None)


async def test_a_lease_of_three_seconds_keeps_a_long_job(settings: Settings, conn: Any) -> None:
    async def long(payload: dict[str, Any]) -> str:
        await anyio.sleep(4)  # longer than the lease: only the heartbeat keeps it
        return "kept"

    short = settings.model_copy(update={"lease_seconds": 3})
    cursor = await conn.execute("INSERT INTO notifyq.jobs (task) VALUES ('long') RETURNING id")
    job_id = (await cursor.fetchone())[0]
    tasks = worker_registry(Registry([make_task(long)]))
    async with running_worker(short, tasks), running_worker(short, tasks) as rescuer:
        row = await wait_for_status(conn, job_id, "completed", timeout=15)
    assert (row["result"], row["attempt_count"]) == ("kept", 1)
    assert rescuer.stats.rescued == 0


async def test_a_failure_with_a_newer_duplicate_queued_is_not_retried(
    settings: Settings, conn: Any
) -> None:
    """The newer job with the same dedup_key replaces the failed one, which says so; a retryable
    failure without such a duplicate goes back to the queue."""
    await conn.execute(
        "INSERT INTO notifyq.jobs (task, dedup_key, max_attempts) VALUES ('x', 'k', 3), "
        "('x', NULL, 3)"
    )
    async with _pool(settings) as pool:
        store = Store(pool)
        claimed = await store.claim(worker_id="w", tasks=["x"], queues=None, limit=2, lease=30)
        assert len(claimed) == 2
        cursor = await conn.execute(
            "INSERT INTO notifyq.jobs (task, dedup_key) VALUES ('x', 'k') RETURNING id"
        )
        newer = (await cursor.fetchone())[0]
        written = await store.fail(
            "w", [Failure(job.id, job.attempt, "boom", True, 5.0) for job in claimed]
        )
    cursor = await conn.execute(
        "SELECT id, status, last_error, worker_id, run_at > now() FROM notifyq.jobs "
        "WHERE id = ANY(%s) ORDER BY dedup_key NULLS LAST",
        [[job.id for job in claimed]],
    )
    rows = await cursor.fetchall()
    assert rows[0][1:] == (
        "failed",
        f"boom\nnot retried: job {newer} with the same dedup_key is queued and replaces it",
        "w",
        False,
    )
    assert rows[1][1:] == ("queued", "boom", None, True)
    assert written == {rows[0][0]: JobStatus.FAILED, rows[1][0]: JobStatus.QUEUED}
