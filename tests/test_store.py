"""The store's seam: typed rows from explicit column lists."""

from __future__ import annotations

from typing import Any

import pytest

from notifyq.models import ClaimedJob
from notifyq.store._runner import fields_and_row, fields_row


async def test_a_statement_whose_columns_drift_from_its_type_fails_naming_both(conn: Any) -> None:
    cursor = conn.cursor(row_factory=fields_row(ClaimedJob))
    with pytest.raises(TypeError, match=r"do not match the fields of ClaimedJob"):
        await cursor.execute("SELECT gen_random_uuid() AS id, 'echo' AS task")
        await cursor.fetchall()


async def test_the_claim_answers_rows_of_its_type(conn: Any) -> None:
    from notifyq.queries import load_queries

    await conn.execute("INSERT INTO notifyq.jobs (task) VALUES ('echo')")
    cursor = conn.cursor(row_factory=fields_row(ClaimedJob))
    await cursor.execute(
        load_queries()["claim_jobs"],
        {"worker_id": "w", "tasks": ["echo"], "queues": None, "limit": 5, "lease": 30.0,
         "probe": False},
    )  # fmt: skip
    (job,) = await cursor.fetchall()
    assert isinstance(job, ClaimedJob) and (job.task, job.attempt, job.claim) == ("echo", 1, 1)


async def test_only_a_claim_that_took_jobs_commits_without_waiting_for_the_disk(
    conn: Any,
) -> None:
    """The producer's claims set synchronous_commit off for their own transaction when they
    take a job (a claim undone by a crash leaves its jobs queued); a claim that took nothing,
    the outcome writer's completion that also claims, and the next transaction keep it on."""
    from notifyq.queries import load_queries

    queries = load_queries()
    claim = {"worker_id": "w", "tasks": ["echo"], "queues": None, "limit": 1, "lease": 30.0}

    async def setting_after(query: bytes, params: dict[str, Any]) -> str:
        async with conn.transaction():
            await conn.execute(query, params)
            cursor = await conn.execute("SHOW synchronous_commit")
            row = await cursor.fetchone()
        return str(row[0])

    await conn.execute("SET synchronous_commit = on")  # a test's database has it off
    await conn.execute("INSERT INTO notifyq.jobs (task) SELECT 'echo' FROM generate_series(1, 3)")
    assert await setting_after(queries["claim_jobs"], {**claim, "probe": False}) == "off"
    assert await setting_after(queries["look_and_claim_jobs"], claim) == "off"
    cursor = await conn.execute("SHOW synchronous_commit")
    assert (await cursor.fetchone())[0] == "on"
    cursor = await conn.execute("SELECT id, claims FROM notifyq.jobs WHERE status = 'processing'")
    done = await cursor.fetchall()
    writer = {"worker_id": "w", "ids": [i for i, _ in done], "claims": [c for _, c in done],
              "results": ["null"] * len(done), "tasks": ["echo"], "queues": None, "take": 1,
              "lease": 30.0}  # fmt: skip
    assert await setting_after(queries["complete_and_claim_jobs"], writer) == "on"
    await conn.execute("DELETE FROM notifyq.jobs WHERE status = 'queued'")
    assert await setting_after(queries["look_and_claim_jobs"], claim) == "on"


async def test_the_look_and_the_claim_answer_the_jobs_then_the_next_run_at(conn: Any) -> None:
    from notifyq.queries import load_queries

    await conn.execute("INSERT INTO notifyq.jobs (task) VALUES ('echo'), ('echo')")
    await conn.execute(
        "INSERT INTO notifyq.jobs (task, run_at) VALUES ('echo', now() + interval '90 seconds')"
    )
    cursor = conn.cursor(row_factory=fields_and_row(ClaimedJob, "due"))
    query = load_queries()["look_and_claim_jobs"]
    params = {"worker_id": "w", "tasks": ["echo"], "queues": None, "limit": 5, "lease": 30.0}
    await cursor.execute(query, params)
    *jobs, (last, due) = await cursor.fetchall()
    assert [job.task for job, _ in jobs] == ["echo", "echo"]
    assert all(isinstance(job, ClaimedJob) and no_due is None for job, no_due in jobs)
    assert last is None and 85 < due <= 90
    # Nothing left that is due: no job, and the look still answers.
    await cursor.execute(query, params)
    assert [(job, round(due)) for job, due in await cursor.fetchall()] == [(None, 90)]
    await conn.execute("DELETE FROM notifyq.jobs")
    await cursor.execute(query, params)
    assert await cursor.fetchall() == [(None, None)]


async def test_a_look_and_claim_whose_columns_drift_fails_naming_both(conn: Any) -> None:
    cursor = conn.cursor(row_factory=fields_and_row(ClaimedJob, "due"))
    with pytest.raises(TypeError, match=r"do not match ClaimedJob's and due"):
        await cursor.execute("SELECT gen_random_uuid() AS id, 1.0 AS due")
        await cursor.fetchall()
