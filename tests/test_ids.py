"""A job's id is a UUID version 7 on every enqueue path: the time it was made, in milliseconds,
then random bits. New keys append at the right edge of the primary key instead of landing on a
random leaf of it, and ids made later sort after ids made earlier."""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

import psycopg

from notifyq.client import Queue
from notifyq.settings import Settings


def millis(job_id: UUID) -> int:
    """The time that a version 7 id carries, in milliseconds since the epoch."""
    return job_id.int >> 80


async def test_every_enqueue_path_makes_time_ordered_ids(
    settings: Settings, conn: psycopg.AsyncConnection[Any]
) -> None:
    before = time.time_ns() // 1_000_000
    ids: dict[str, UUID] = {}
    cursor = await conn.execute(
        "INSERT INTO notifyq.jobs (task, payload) VALUES ('echo', '{}') RETURNING id"
    )
    ids["psql INSERT"] = (await cursor.fetchone())[0]  # type: ignore[index]
    cursor = await conn.execute("SELECT notifyq.enqueue('echo', '{}'::jsonb)")
    ids["notifyq.enqueue"] = (await cursor.fetchone())[0]  # type: ignore[index]
    async with Queue(settings.database_url) as q:
        ids["Queue.enqueue"] = (await q.enqueue("echo", {})).job_id
        ids["Queue.enqueue, dedup"] = (await q.enqueue("echo", {}, dedup_key="k")).job_id
        many = await q.enqueue_many([{"task": "echo", "payload": {"n": n}} for n in range(3)])
        ids.update({f"enqueue_many {n}": r.job_id for n, r in enumerate(many)})
        deduped = await q.enqueue_many([{"task": "echo", "payload": {}, "dedup_key": "m"}])
        ids["enqueue_many, dedup"] = deduped[0].job_id
    after = time.time_ns() // 1_000_000
    assert {path: job_id.version for path, job_id in ids.items()} == dict.fromkeys(ids, 7)
    # The database's clock is this host's: each id carries the moment it was made.
    assert all(before - 1_000 <= millis(job_id) <= after + 1_000 for job_id in ids.values())


async def test_ids_made_later_sort_after_ids_made_earlier(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    made = []
    for _ in range(3):
        cursor = await conn.execute(
            "INSERT INTO notifyq.jobs (task, payload) VALUES ('echo', '{}') RETURNING id"
        )
        made.append((await cursor.fetchone())[0])  # type: ignore[index]
        await conn.execute("SELECT pg_sleep(0.002)")  # the next id is of a later millisecond
    assert made == sorted(made)
    assert len({millis(job_id) for job_id in made}) == 3
