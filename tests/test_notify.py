"""When inserts notify: once per statement and queue, at commit, only while a worker waits,
never for a queue switched off, and without losing a job in the window where a worker goes
idle."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import anyio
import psycopg

from notifyq.builtins import worker_registry
from notifyq.settings import Settings
from notifyq.tasks import Registry, make_task
from tests.helpers import running_worker, wait_until


async def somebody_waits(conn: Any, queues: list[str] | None = None) -> None:
    """Registers a pretend worker as waiting, as a real one does when it runs out of work."""
    await conn.execute("SELECT notifyq.mark_waiting_v1('pretend-worker', %s, 60)", [queues])


async def notifications(listener: Any, timeout: float = 0.5) -> list[str]:
    return [n.payload async for n in listener.notifies(timeout=timeout, stop_after=20)]


async def test_bulk_insert_notifies_once_per_queue(db_url: str, conn: Any) -> None:
    await somebody_waits(conn)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute("LISTEN notifyq")
        await conn.execute(
            """INSERT INTO notifyq.jobs (task, queue, payload)
               SELECT 'echo', CASE WHEN i % 2 = 0 THEN 'even' ELSE 'odd' END,
                      jsonb_build_object('i', i)
               FROM generate_series(1, 1000) AS i"""
        )
        received = await notifications(listener)
    assert sorted(received) == ["even", "odd"]


async def test_a_transaction_notifies_at_commit_only(db_url: str, conn: Any) -> None:
    await somebody_waits(conn)
    async with (
        await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener,
        await psycopg.AsyncConnection.connect(db_url) as writer,
    ):
        await listener.execute("LISTEN notifyq")
        for _ in range(3):
            await writer.execute("INSERT INTO notifyq.jobs (task) VALUES ('echo')")
        before = await notifications(listener, timeout=0.2)
        await writer.commit()
        after = await notifications(listener, timeout=1)
    assert before == []
    assert after == ["default"]


async def test_no_notification_while_no_worker_waits(db_url: str, conn: Any) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute("LISTEN notifyq")
        await conn.execute("INSERT INTO notifyq.jobs (task) VALUES ('echo')")
        assert await notifications(listener, timeout=0.3) == []
        await somebody_waits(conn, ["other"])
        await conn.execute("INSERT INTO notifyq.jobs (task) VALUES ('echo')")
        assert await notifications(listener, timeout=0.3) == []  # waits for another queue
        await conn.execute("INSERT INTO notifyq.jobs (task, queue) VALUES ('echo', 'other')")
        assert await notifications(listener) == ["other"]


async def test_a_queue_with_notify_off_is_left_to_polling(db_url: str, conn: Any) -> None:
    await somebody_waits(conn)
    await conn.execute("INSERT INTO notifyq.queues (name, notify) VALUES ('bulk', false)")
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute("LISTEN notifyq")
        await conn.execute(
            "INSERT INTO notifyq.jobs (task, queue) VALUES ('echo', 'bulk'), ('echo', 'default')"
        )
        assert await notifications(listener) == ["default"]


async def test_a_worker_marks_itself_waiting_only_while_it_has_free_slots(
    settings: Settings, conn: Any
) -> None:
    gate = anyio.Event()

    async def hold(payload: dict[str, Any]) -> None:
        await gate.wait()

    async def waiting() -> int:
        cursor = await conn.execute("SELECT count(*) FROM notifyq.waiting_workers")
        return int((await cursor.fetchone())[0])

    tasks = worker_registry(Registry([make_task(hold)]))
    async with running_worker(settings.model_copy(update={"concurrency": 2}), tasks):
        await wait_until(lambda: _equal(waiting(), 1))
        await conn.execute(
            "INSERT INTO notifyq.jobs (task) SELECT 'hold' FROM generate_series(1, 2)"
        )
        await wait_until(lambda: _equal(waiting(), 0))  # both slots busy: no wake-up needed
        gate.set()
        await wait_until(lambda: _equal(waiting(), 1))
    assert await waiting() == 0  # a stopped worker removes its mark


async def _equal(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def test_no_job_waits_for_a_poll_when_the_worker_goes_idle_mid_insert(
    db_url: str, settings: Settings, conn: Any
) -> None:
    """Drives the race the advisory lock closes, round after round: an insert checks "is a
    worker waiting?" while the worker is busy (no), the worker then finishes, goes idle and
    claims, and only then the insert commits. Without the lock its job would wait for the
    30-second poll; with it the worker's registration waits for (or re-checks after) that
    commit."""

    async def brief(payload: dict[str, Any]) -> None:
        await anyio.sleep(0.05)

    async def scalar(query: str) -> Any:
        cursor = await conn.execute(query)
        return (await cursor.fetchone())[0]  # type: ignore[index]

    async def completed(job_id: Any) -> bool:
        cursor = await conn.execute("SELECT status FROM notifyq.jobs WHERE id = %s", [job_id])
        return (await cursor.fetchone())[0] == "completed"  # type: ignore[index]

    tasks = worker_registry(Registry([make_task(brief)]))
    one_slot = settings.model_copy(update={"concurrency": 1, "poll_interval": 30})
    delays = []
    async with (
        running_worker(one_slot, tasks),
        await psycopg.AsyncConnection.connect(db_url) as writer,
    ):
        for _ in range(8):
            await wait_until(
                lambda: _equal(scalar("SELECT count(*) FROM notifyq.waiting_workers"), 1)
            )
            busy = await scalar("SELECT notifyq.enqueue('brief', '{}')")
            # The worker took the job and, its only slot full, is no longer waiting.
            await wait_until(
                lambda: _equal(scalar("SELECT count(*) FROM notifyq.waiting_workers"), 0)
            )
            cursor = await writer.execute(
                "INSERT INTO notifyq.jobs (task) VALUES ('echo') RETURNING id"
            )
            target = (await cursor.fetchone())[0]  # type: ignore[index]
            # Hold the insert open until the busy job is done and the worker went idle again.
            await wait_until(partial(completed, busy))
            await wait_until(
                lambda: _equal(scalar("SELECT count(*) FROM notifyq.waiting_workers"), 1)
            )
            await writer.commit()
            committed = time.monotonic()
            await wait_until(partial(completed, target), timeout=5)
            delays.append(time.monotonic() - committed)
    # Polling would mean 30 s; the re-check of a registration that could not wait is 0.25 s.
    assert max(delays) < 1.0, delays


async def test_a_completion_that_starts_its_dependents_wakes_no_one(db_url: str, conn: Any) -> None:
    """The statement that completes a parent and claims: the dependents it claims itself wake
    no other worker; those it leaves queued (a task it does not serve, no free slot) do."""
    await somebody_waits(conn)

    async def parent_and_child(child_task: str) -> tuple[Any, int]:
        cursor = await conn.execute("INSERT INTO notifyq.jobs (task) VALUES ('echo') RETURNING id")
        parent = (await cursor.fetchone())[0]
        await conn.execute(
            "INSERT INTO notifyq.jobs (task, depends_on) VALUES (%s, ARRAY[%s]::uuid[])",
            [child_task, parent],
        )
        cursor = await conn.execute(
            "SELECT id, claims FROM notifyq.claim_v4('w', ARRAY['echo'], NULL, 1, 60, false)"
        )
        row = await cursor.fetchone()
        assert row is not None and row[0] == parent
        # The insert of a dependent wakes its parent's queue (see recheck_waiting_v1).
        await notifications(listener, timeout=0.3)
        return parent, row[1]

    async def complete_and_claim(parent: Any, claim: int, take: int) -> list[str]:
        cursor = await conn.execute(
            "SELECT task FROM notifyq.complete_and_claim_v2('w', ARRAY[%s]::uuid[], "
            "ARRAY[%s]::integer[], ARRAY['null'::jsonb], ARRAY['echo', 'double'], NULL, %s, 60)",
            [parent, claim, take],
        )
        return [task for (task,) in await cursor.fetchall() if task is not None]

    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute("LISTEN notifyq")
        parent, claim = await parent_and_child("echo")
        assert await complete_and_claim(parent, claim, 5) == ["echo"]
        claimed_here = await notifications(listener, timeout=0.3)
        parent, claim = await parent_and_child("unserved")
        assert await complete_and_claim(parent, claim, 5) == []
        unserved = await notifications(listener)
        parent, claim = await parent_and_child("echo")
        assert await complete_and_claim(parent, claim, 0) == []
        no_slot = await notifications(listener)
    assert claimed_here == []
    assert unserved == ["default"]
    assert no_slot == ["default"]
