"""Backpressure (issue 29, part 4): a queue's optional ``max_depth`` bounds its jobs not yet
started (waiting or queued), and an enqueue past it is refused on every path: a plain INSERT and
``notifyq.enqueue`` in SQL (SQLSTATE NQ429, the queue named), ``Queue`` and ``SyncQueue``
(``notifyq.QueueFull``), the API (429 with Retry-After). Nothing of a refused statement is
stored; a queue without a bound, and every other queue, take jobs as before."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import psycopg
import pytest

import notifyq
from notifyq import Queue, QueueFull, SyncQueue
from notifyq.api import create_app
from notifyq.settings import Settings
from tests.helpers import ROOT, notifyq_env, running_worker, wait_for_status


def set_max_depth(db_url: str, queue: str, depth: int) -> None:
    """``notifyq queue QUEUE --max-depth DEPTH``, as an operator runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "notifyq", "queue", queue, "--max-depth", str(depth)],
        env=notifyq_env(db_url),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    if depth:
        assert f"max {depth}" in done.stdout, done.stdout


def depth(db_url: str, queue: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM ONLY notifyq.jobs WHERE queue = %s "
            "AND status IN ('waiting', 'queued')",
            [queue],
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_sql_inserts_past_max_depth_are_refused_naming_the_queue(db_url: str) -> None:
    set_max_depth(db_url, "mail", 3)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO notifyq.jobs (task, queue) VALUES ('echo', 'mail'), ('echo', 'mail')"
        )
        # A statement that would pass the bound is refused whole: none of its rows is stored.
        with pytest.raises(psycopg.Error, match='queue "mail" is full') as refused:
            conn.execute(
                "INSERT INTO notifyq.jobs (task, queue) "
                "SELECT 'echo', 'mail' FROM generate_series(1, 2)"
            )
        assert refused.value.sqlstate == "NQ429"
        assert refused.value.diag.message_hint is not None
        assert "--max-depth" in refused.value.diag.message_hint
        conn.execute("SELECT notifyq.enqueue('echo', '{}', queue => 'mail')")
        with pytest.raises(psycopg.Error, match='queue "mail" is full') as refused:
            conn.execute("SELECT notifyq.enqueue('echo', '{}', queue => 'mail')")
        assert refused.value.sqlstate == "NQ429"
        # Other queues are not bound, and a queue whose bound is removed takes jobs again.
        conn.execute(
            "INSERT INTO notifyq.jobs (task, queue) SELECT 'echo', 'other' "
            "FROM generate_series(1, 10)"
        )
    assert depth(db_url, "mail") == 3
    set_max_depth(db_url, "mail", 0)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO notifyq.jobs (task, queue) VALUES ('echo', 'mail')")
    assert depth(db_url, "mail") == 4


async def test_a_queue_takes_jobs_again_as_workers_drain_it(
    settings: Settings, db_url: str, conn: Any
) -> None:
    set_max_depth(db_url, "default", 2)
    async with Queue(settings=settings) as q:
        first = await q.enqueue("echo", {"n": 1})
        second = await q.enqueue("echo", {"n": 2})
        with pytest.raises(QueueFull) as full:
            await q.enqueue("echo", {"n": 3})
        assert full.value.queue == "default" and full.value.sqlstate == "NQ429"
        with pytest.raises(QueueFull):
            await q.enqueue_many([{"task": "echo"}])
        async with running_worker(settings):
            for job in (first, second):
                await wait_for_status(conn, job.job_id, "completed", timeout=10)
        await q.enqueue("echo", {"n": 3})


def test_sync_queue_raises_queue_full(db_url: str) -> None:
    set_max_depth(db_url, "default", 1)
    with SyncQueue(db_url) as q:
        q.enqueue("echo", {})
        with pytest.raises(notifyq.QueueFull) as full:
            q.enqueue("echo", {}, dedup_key="k")
        assert full.value.queue == "default"
        with pytest.raises(notifyq.QueueFull):
            q.enqueue_many([{"task": "echo"}, {"task": "echo"}])
    assert depth(db_url, "default") == 1


async def test_the_api_answers_429_with_retry_after(settings: Settings, db_url: str) -> None:
    set_max_depth(db_url, "mail", 1)
    app = create_app(settings.model_copy(update={"run_worker": False}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
        ) as client,
    ):
        assert (
            await client.post("/jobs", json={"payload": {}, "queue": "mail"})
        ).status_code == 201
        answers = [
            await client.post("/jobs", json={"payload": {}, "queue": "mail"}),
            await client.post("/jobs/batch", json={"jobs": [{"payload": {}, "queue": "mail"}]}),
            await client.post(
                "/workflows", json={"jobs": [{"ref": "a", "payload": {}, "queue": "mail"}]}
            ),
        ]
        for answer in answers:
            assert answer.status_code == 429, answer.text
            assert int(answer.headers["retry-after"]) > 0
            assert answer.json()["queue"] == "mail"
            assert 'queue "mail" is full' in answer.json()["detail"]
        other = await client.post("/jobs", json={"payload": {}, "queue": "other"})
        assert other.status_code == 201
        queues = {row["queue"]: row for row in (await client.get("/queues")).json()}
        assert queues["mail"]["max_depth"] == 1 and queues["other"]["max_depth"] is None
    assert depth(db_url, "mail") == 1


def waiting_on_a_lock(db_url: str) -> bool:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        ).fetchone()
    return bool(row and row[0])


def test_concurrent_inserts_never_pass_the_bound_together(db_url: str) -> None:
    # Two transactions, each under the bound alone, together over it: the second waits for
    # the first's commit and is refused.
    set_max_depth(db_url, "mail", 3)
    with (
        psycopg.connect(db_url) as one,
        psycopg.connect(db_url, autocommit=True) as two,
    ):
        one.execute(
            "INSERT INTO notifyq.jobs (task, queue) VALUES ('echo', 'mail'), ('echo', 'mail')"
        )
        refused: list[BaseException] = []

        def insert_two() -> None:
            try:
                two.execute(
                    "INSERT INTO notifyq.jobs (task, queue) "
                    "VALUES ('echo', 'mail'), ('echo', 'mail')"
                )
            except psycopg.Error as exc:
                refused.append(exc)

        other = threading.Thread(target=insert_two)
        other.start()
        # The second insert waits on the queue's lock, held by the first transaction.
        deadline = time.monotonic() + 10
        while not waiting_on_a_lock(db_url):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        one.commit()
        other.join(timeout=10)
    assert len(refused) == 1 and getattr(refused[0], "sqlstate", None) == "NQ429"
    assert depth(db_url, "mail") == 2
