"""The storage of version 20: live jobs in ``notifyq.jobs``, finished ones in
``notifyq.jobs_done`` (a child of it), and what psql users see of the two: every job through
``notifyq.jobs``, the queue alone through ``ONLY notifyq.jobs``."""

from __future__ import annotations

import json
from typing import Any

import anyio
import psycopg
import pytest
from psycopg.rows import dict_row

from notifyq import Queue
from notifyq.migrations import _apply_missing, load_migrations
from notifyq.settings import Settings
from tests.helpers import (
    end_by_hand,
    insert_in_state,
    registry,
    running_worker,
    wait_for_status,
    wait_until,
)

CONTRACT_COLUMNS = (
    "id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts, "
    "dedup_key, result, last_error, created_at, started_at, finished_at"
)


async def rows(conn: Any, query: str, *params: Any) -> list[dict[str, Any]]:
    cursor = conn.cursor(row_factory=dict_row)
    await cursor.execute(query, params or None)
    return await cursor.fetchall()


async def tables_of(conn: Any, ids: list[Any]) -> dict[Any, str]:
    """Which table holds each job, by id."""
    found = await rows(
        conn,
        "SELECT id, tableoid::regclass::text AS held_in FROM notifyq.jobs WHERE id = ANY(%s)",
        ids,
    )
    return {row["id"]: row["held_in"] for row in found}


async def test_a_job_moves_to_the_history_in_the_statement_that_ends_it(
    settings: Settings, conn: Any
) -> None:
    async def boom(payload: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    async with Queue(settings=settings) as q:
        done = await q.enqueue("echo", {"n": 1})
        failed = await q.enqueue("boom", {}, max_attempts=1)
        cancelled = await q.enqueue("echo", {}, delay=3600)
        waiting = await q.enqueue("echo", {}, depends_on=[cancelled.job_id])
        await q.store.cancel_job(cancelled.job_id)
        async with running_worker(settings, registry(boom=boom)):
            await wait_for_status(conn, done.job_id, "completed")
            await wait_for_status(conn, failed.job_id, "failed")
    ids = [done.job_id, failed.job_id, cancelled.job_id, waiting.job_id]
    assert await tables_of(conn, ids) == dict.fromkeys(ids, "notifyq.jobs_done")
    assert await rows(conn, "SELECT id FROM ONLY notifyq.jobs") == []
    # Every job, in every status, with the contract's columns, through notifyq.jobs.
    seen = await rows(conn, f"SELECT {CONTRACT_COLUMNS} FROM notifyq.jobs ORDER BY id")
    assert {row["id"]: row["status"] for row in seen} == {
        done.job_id: "completed",
        failed.job_id: "failed",
        cancelled.job_id: "cancelled",
        waiting.job_id: "cancelled",
    }
    completed = next(row for row in seen if row["id"] == done.job_id)
    assert completed["result"] == {"n": 1} and completed["last_error"] is None
    assert completed["finished_at"] is not None and completed["attempt_count"] == 1


async def test_a_read_that_names_a_status_reads_only_the_table_that_can_hold_it(
    conn: Any,
) -> None:
    plans = {}
    for status in ("queued", "failed"):
        cursor = await conn.execute(f"EXPLAIN SELECT * FROM notifyq.jobs WHERE status = '{status}'")
        plans[status] = "\n".join(row[0] for row in await cursor.fetchall())
    assert "jobs_done" not in plans["queued"]
    assert "on jobs_done" in plans["failed"] and "on jobs " not in plans["failed"]


@pytest.mark.parametrize(
    ("table", "status", "said"),
    [
        ("ONLY notifyq.jobs", "cancelled", "notifyq cancel ID"),
        ("notifyq.jobs_done", "queued", "notifyq retry ID"),
    ],
)
async def test_an_update_that_would_end_or_revive_a_job_is_refused_saying_what_to_do(
    conn: Any, table: str, status: str, said: str
) -> None:
    [job] = await insert_in_state(conn, "echo")
    if table == "notifyq.jobs_done":
        await end_by_hand(conn, [job], "failed")
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        await conn.execute(f"UPDATE {table} SET status = %s WHERE id = %s", [status, job])
    assert f"cannot become {status} by an UPDATE" in str(refused.value)
    assert refused.value.diag.message_hint is not None
    assert said in refused.value.diag.message_hint


async def test_an_update_of_what_a_producer_gives_keeps_the_rules_of_an_insert(
    conn: Any,
) -> None:
    [job] = await insert_in_state(conn, "echo")
    with pytest.raises(psycopg.errors.CheckViolation, match="payload must be a JSON object"):
        await conn.execute("UPDATE notifyq.jobs SET payload = '[1]' WHERE id = %s", [job])
    with pytest.raises(psycopg.errors.CheckViolation, match="finite"):
        await conn.execute("UPDATE notifyq.jobs SET run_at = 'infinity' WHERE id = %s", [job])
    await conn.execute("UPDATE notifyq.jobs SET priority = 5 WHERE id = %s", [job])


async def test_a_retried_job_goes_back_with_its_errors_its_claim_number_and_its_place(
    settings: Settings, conn: Any
) -> None:
    async with Queue(settings=settings) as q:
        first = await q.enqueue("fail", {"message": "once"}, group_key="g", max_attempts=1)
        second = await q.enqueue("echo", {}, group_key="g", delay=3600)
        async with running_worker(settings):
            await wait_for_status(conn, first.job_id, "failed")
        before = (await rows(conn, "SELECT * FROM notifyq.jobs WHERE id = %s", first.job_id))[0]
        retried = await q.store.retry_job(first.job_id)
        assert retried is not None and retried.status.value == "queued", retried
        after = (await rows(conn, "SELECT * FROM notifyq.jobs WHERE id = %s", first.job_id))[0]
    assert await tables_of(conn, [first.job_id]) == {first.job_id: "notifyq.jobs"}
    assert after["status"] == "queued" and after["attempt_count"] == 0
    assert after["claims"] == before["claims"] == 1
    assert after["errors"] == before["errors"] and len(after["errors"]) == 1
    assert after["last_error"] == before["last_error"]
    assert after["group_seq"] == before["group_seq"]
    # Its group's next member became the head when it failed; back, it waits behind that one.
    [head] = await rows(conn, "SELECT group_blocked FROM notifyq.jobs WHERE id = %s", second.job_id)
    assert head["group_blocked"] is False and after["group_blocked"] is True
    assert after["created_at"] == before["created_at"]


async def test_a_job_inserted_by_sql_after_its_parent_failed_ends_cancelled_at_commit(
    conn: Any,
) -> None:
    [parent] = await insert_in_state(conn, "echo", status="'failed'")
    async with conn.transaction():
        cursor = await conn.execute(
            "INSERT INTO notifyq.jobs (task, depends_on) VALUES ('echo', ARRAY[%s]::uuid[]) "
            "RETURNING id, status",
            [parent],
        )
        child, status = await cursor.fetchone()
        # An INSERT cannot put a finished row in the queue's table: it waits until its commit.
        assert status == "waiting"
    [row] = await rows(conn, "SELECT status, last_error FROM notifyq.jobs WHERE id = %s", child)
    assert row["status"] == "cancelled"
    assert row["last_error"] == f"cancelled: job {parent}, which it depends on, failed"
    assert await tables_of(conn, [child]) == {child: "notifyq.jobs_done"}


async def test_a_cancel_that_waits_for_a_completion_answers_the_finished_job(
    settings: Settings, db_url: str, conn: Any
) -> None:
    """A cancel that waits for the row a worker is moving reads the job again once the move
    commits: the statement that waited cannot see the job's new row in notifyq.jobs_done."""
    [job] = await insert_in_state(
        conn,
        "echo",
        status="'processing'",
        worker_id="'w'",
        claims="1",
        lease_expires_at="now() + interval '1 hour'",
    )
    async with await psycopg.AsyncConnection.connect(db_url) as mover:
        await mover.execute(
            "SELECT notifyq.complete_v3('w', ARRAY[%s]::uuid[], ARRAY[1], ARRAY['7'::jsonb])",
            [job],
        )
        answer: list[Any] = []

        async def cancel() -> None:
            async with Queue(settings=settings) as q:
                answer.append(await q.store.cancel_job(job))

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel)

            async def waiting() -> bool:
                cursor = await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
                return bool((await cursor.fetchone())[0])

            await wait_until(waiting, timeout=10)
            await mover.commit()
    [outcome] = answer
    assert outcome is not None
    assert (outcome.was.value, outcome.now.value) == ("completed", "completed")


async def test_version_20_moves_a_filled_table_and_every_job_reads_as_before(
    empty_db_url: str,
) -> None:
    migrations = load_migrations()
    async with await psycopg.AsyncConnection.connect(empty_db_url, autocommit=True) as conn:
        await _apply_missing(conn, [m for m in migrations if m.version <= 19], lambda _: None)
        # A history as version 19 kept it, in the one table: finished jobs of every kind, live
        # ones queued and processing, and a job that depends on a completed one.
        await conn.execute(
            "INSERT INTO notifyq.jobs (task, payload) "
            "SELECT 'echo', jsonb_build_object('n', n) FROM generate_series(1, 3000) AS n"
        )
        await conn.execute(
            "UPDATE notifyq.jobs SET status = (ARRAY['completed', 'failed', 'cancelled'])"
            "[1 + (payload->>'n')::int % 3], finished_at = now(), attempt_count = 1, "
            "claims = 1, result = payload WHERE (payload->>'n')::int <= 2400"
        )
        await conn.execute(
            "UPDATE notifyq.jobs SET status = 'processing', worker_id = 'old', claims = 1, "
            "attempt_count = 1, lease_expires_at = now() + interval '1 hour' "
            "WHERE (payload->>'n')::int BETWEEN 2401 AND 2500"
        )
        cursor = await conn.execute(
            "SELECT id, payload FROM notifyq.jobs WHERE status = 'completed' ORDER BY id LIMIT 1"
        )
        parent, parent_payload = await cursor.fetchone()
        await conn.execute(
            "INSERT INTO notifyq.jobs (task, depends_on) VALUES ('echo', ARRAY[%s]::uuid[])",
            [parent],
        )
        before = await rows(conn, "SELECT to_jsonb(j) AS row FROM notifyq.jobs AS j ORDER BY id")
        await _apply_missing(conn, migrations, lambda _: None)
        after = await rows(conn, "SELECT to_jsonb(j) AS row FROM notifyq.jobs AS j ORDER BY id")
        # Every column kept its value; later versions may add columns (sql/023's are null).
        kept = set(before[0]["row"])
        assert [
            json.dumps({k: v for k, v in r["row"].items() if k in kept}, sort_keys=True)
            for r in after
        ] == [json.dumps(r["row"], sort_keys=True) for r in before]
        assert {
            k for r in after for k, v in r["row"].items() if k not in kept and v is not None
        } == (set())
        cursor = await conn.execute(
            "SELECT tableoid::regclass::text, status, count(*) FROM notifyq.jobs "
            "GROUP BY 1, 2 ORDER BY 1, 2"
        )
        assert await cursor.fetchall() == [
            ("notifyq.jobs", "processing", 100),
            ("notifyq.jobs", "queued", 501),
            ("notifyq.jobs_done", "cancelled", 800),
            ("notifyq.jobs_done", "completed", 800),
            ("notifyq.jobs_done", "failed", 800),
        ]
    settings = Settings.load(database_url=empty_db_url, auto_migrate=False)
    async with Queue(settings=settings) as q:
        job = await q.get(parent)
        assert job is not None and job.status.value == "completed"
        assert job.result == parent_payload
    async with running_worker(settings.model_copy(update={"poll_interval": 0.5})):
        async with await psycopg.AsyncConnection.connect(empty_db_url, autocommit=True) as conn:

            async def drained() -> bool:
                cursor = await conn.execute(
                    "SELECT count(*) FROM ONLY notifyq.jobs WHERE status = 'queued'"
                )
                return (await cursor.fetchone())[0] == 0

            await wait_until(drained, timeout=30)
