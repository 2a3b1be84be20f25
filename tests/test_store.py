"""The store's seam: typed rows from explicit column lists."""

from __future__ import annotations

from typing import Any

import pytest

from notifyq.models import ClaimedJob
from notifyq.store._runner import fields_row


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
