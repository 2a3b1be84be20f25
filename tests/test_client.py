"""The Python client, notifyq.Queue.

The tests of this that need no database are in tests/unit/test_client.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from notifyq import InvalidJob, JobSpec, JobStatus, Queue
from notifyq.settings import Settings
from tests.helpers import running_worker, wait_for_status


async def test_enqueue_and_get(db_url: str) -> None:
    async with Queue(db_url) as q:
        result = await q.enqueue("echo", {"n": 1}, priority=3, max_attempts=4)
        job = await q.get(result.job_id)
    assert result.status is JobStatus.QUEUED and not result.duplicate
    assert job is not None
    assert (job.task, job.payload, job.priority, job.max_attempts) == ("echo", {"n": 1}, 3, 4)
    assert (job.queue, job.attempt_count, job.status) == ("default", 0, JobStatus.QUEUED)


async def test_get_of_an_unknown_id_is_none(db_url: str) -> None:
    async with Queue(db_url) as q:
        assert await q.get("00000000-0000-0000-0000-000000000000") is None
        with pytest.raises(InvalidJob):
            await q.get("not-a-uuid")


async def test_delay_and_run_at(db_url: str, conn: Any) -> None:
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    async with Queue(db_url) as q:
        delayed = await q.enqueue("echo", {}, delay=30)
        scheduled = await q.enqueue("echo", {}, run_at=later)
        with pytest.raises(InvalidJob, match="not both"):
            await q.enqueue("echo", {}, delay=1, run_at=later)
    cursor = await conn.execute(
        "SELECT extract(epoch FROM run_at - created_at) FROM notifyq.jobs WHERE id = %s",
        [delayed.job_id],
    )
    assert 29 < float((await cursor.fetchone())[0]) < 31
    assert abs((scheduled.run_at - later).total_seconds()) < 0.001


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("echo", [1]), {}, "payload must be a JSON object"),
        (("echo", {"a": "x\x00"}), {}, "NUL"),
        (("echo", {"a": float("nan")}), {}, "not JSON-serialisable"),
        (("", {}), {}, "task must be a non-empty string"),
        (("echo", {}), {"queue": "q\x00"}, "NUL"),
        (("echo", {}), {"priority": 2**40}, "32 bits"),
        (("echo", {}), {"delay": -1}, "delay"),
        (("echo", {}), {"max_attempts": 0}, "max_attempts"),
        (("echo", {}), {"dedup_key": "k" * 600}, "dedup_key"),
    ],
)
async def test_malformed_jobs_are_refused_before_the_database(
    db_url: str, args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    async with Queue(db_url) as q:
        with pytest.raises(InvalidJob, match=message):
            await q.enqueue(*args, **kwargs)


async def test_enqueue_in_the_callers_transaction(
    db_url: str, settings: Settings, conn: Any
) -> None:
    async with Queue(db_url) as q, running_worker(settings) as worker:
        async with await psycopg.AsyncConnection.connect(db_url) as mine:
            await mine.execute("CREATE TABLE orders (id int)")
            await mine.execute("INSERT INTO orders VALUES (1)")
            result = await q.enqueue("echo", {"order": 1}, conn=mine)
            # Not visible, and no worker woken, before the caller commits.
            assert await q.get(result.job_id) is None
            await mine.commit()
        row = await wait_for_status(conn, result.job_id, "completed", timeout=5)
    assert row["result"] == {"order": 1}
    assert worker.stats.completed == 1


async def test_a_rolled_back_enqueue_leaves_nothing(db_url: str) -> None:
    async with Queue(db_url) as q:
        async with await psycopg.AsyncConnection.connect(db_url) as mine:
            result = await q.enqueue("echo", {}, conn=mine)
            await mine.rollback()
        assert await q.get(result.job_id) is None


async def test_a_rolled_back_batch_leaves_nothing_even_as_the_first_statement(
    db_url: str, conn: Any
) -> None:
    # Over one statement's worth of jobs (several chunks in a pipeline), as the first statement
    # of the caller's transaction: psycopg's transaction() would have committed a block of its
    # own there, which the caller's rollback would not undo.
    async with Queue(db_url) as q:
        async with await psycopg.AsyncConnection.connect(db_url) as mine:
            await q.enqueue_many([{"task": "echo"}] * 600, conn=mine)
            await mine.rollback()
            await q.enqueue_many([{"task": "echo"}] * 300, conn=mine)
            await mine.commit()
    cursor = await conn.execute("SELECT count(*) FROM notifyq.jobs")
    assert await cursor.fetchone() == (300,)


async def test_enqueue_many_answers_in_order_with_duplicates(db_url: str, conn: Any) -> None:
    jobs: list[Any] = [{"task": "echo", "payload": {"i": i}, "priority": i % 3} for i in range(500)]
    jobs[10] = {"task": "echo", "payload": {"v": 1}, "dedup_key": "d"}
    jobs[20] = JobSpec.create("echo", {"v": 2}, dedup_key="d")
    async with Queue(db_url) as q:
        results = await q.enqueue_many(jobs)
        with pytest.raises(InvalidJob, match="unknown job field"):
            await q.enqueue_many([{"task": "echo", "colour": "red"}])
    assert len(results) == 500
    assert results[20].job_id == results[10].job_id
    assert (results[10].duplicate, results[20].duplicate) == (False, True)
    assert len({r.job_id for r in results}) == 499
    cursor = await conn.execute(
        "SELECT payload FROM notifyq.jobs WHERE id = %s", [results[10].job_id]
    )
    assert (await cursor.fetchone())[0] == {"v": 2}
    cursor = await conn.execute(
        "SELECT payload FROM notifyq.jobs WHERE id = %s", [results[7].job_id]
    )
    assert (await cursor.fetchone())[0] == {"i": 7}


async def test_a_large_batch_is_one_transaction_answered_in_order(db_url: str, conn: Any) -> None:
    """Over 250 jobs go as one statement per chunk in one pipeline: the answers keep the input
    order, a duplicate in a later chunk finds the job of an earlier one, and the jobs may come
    from an iterator."""
    jobs: list[Any] = [{"task": "echo", "payload": {"i": i}} for i in range(620)]
    jobs[5] = {"task": "echo", "payload": {"v": 1}, "dedup_key": "k"}
    jobs[600] = {"task": "echo", "payload": {"v": 2}, "dedup_key": "k"}
    async with Queue(db_url) as q:
        results = await q.enqueue_many(iter(jobs))
    assert len(results) == 620
    assert results[600].job_id == results[5].job_id and results[600].duplicate
    cursor = await conn.execute("SELECT id, payload FROM notifyq.jobs")
    stored = dict(await cursor.fetchall())
    assert len(stored) == 619
    assert stored[results[5].job_id] == {"v": 2}
    for i in (0, 249, 250, 499, 500, 619):
        assert stored[results[i].job_id] == {"i": i}


async def test_an_invalid_job_late_in_a_large_batch_stores_none(db_url: str, conn: Any) -> None:
    """Checked while the first chunks are already inserted, it still rolls the batch back: on
    the queue's own connection, and inside the caller's transaction, whose own work stays."""
    jobs: list[Any] = [{"task": "echo", "payload": {"i": i}} for i in range(600)]
    jobs[555] = {"task": "echo", "payload": {"text": "a\x00b"}}
    async with Queue(db_url) as q:
        with pytest.raises(InvalidJob, match="NUL"):
            await q.enqueue_many(jobs)
        async with await psycopg.AsyncConnection.connect(db_url) as mine:
            await q.enqueue("echo", {"mine": True}, conn=mine)
            with pytest.raises(InvalidJob, match="NUL"):
                await q.enqueue_many(jobs, conn=mine)
            await q.enqueue("echo", {"mine": 2}, conn=mine)
            await mine.commit()
    cursor = await conn.execute("SELECT payload ->> 'mine' FROM notifyq.jobs ORDER BY 1")
    assert await cursor.fetchall() == [("2",), ("true",)]


async def test_a_large_batch_survives_a_pooled_connection_the_server_closed(
    db_url: str, conn: Any
) -> None:
    """The chunks already taken from the jobs are sent again on a fresh connection."""
    async with Queue(db_url, pool_size=1) as q:
        await q.enqueue("echo", {"warm": True})
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        results = await q.enqueue_many({"task": "echo", "payload": {"i": i}} for i in range(600))
    assert len(results) == 600
    cursor = await conn.execute("SELECT count(*) FROM notifyq.jobs WHERE payload ? 'i'")
    assert await cursor.fetchone() == (600,)


async def test_wait_answers_the_finished_job(db_url: str, settings: Settings) -> None:
    async with Queue(db_url) as q, running_worker(settings):
        result = await q.enqueue("hello_world", {"name": "notifyq"})
        job = await q.wait(result.job_id, timeout=5)
    assert job.status is JobStatus.COMPLETED
    assert job.result == {"message": "Hello, notifyq!"}
