"""An attempt counts when its handler ran: a worker that dies between the claim and the handler's
start does not use up one of the job's attempts (the hardening issue's finding 7).

The worker's heartbeat confirms the jobs whose handler runs; a rescue of a job that no heartbeat
confirmed gives its attempt back, at most max_attempts times, so that a job that kills its worker
at once cannot go round for ever. The fence is the claim number, which only grows: a stale
outcome stays refused after an attempt was given back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from notifyq.db import open_pool
from notifyq.models import ClaimRequest, Held, JobStatus, Success
from notifyq.settings import Settings
from notifyq.store import Store
from tests.helpers import job_row, running_worker, wait_for_status, wait_until


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[Store]:
    async with open_pool(settings, name="test") as pool:
        yield Store(pool)


async def enqueue(conn: Any, max_attempts: int = 3) -> Any:
    cursor = await conn.execute(
        "INSERT INTO notifyq.jobs (task, max_attempts) VALUES ('echo', %s) RETURNING id",
        [max_attempts],
    )
    return (await cursor.fetchone())[0]


async def claim(store: Store, worker: str) -> Any:
    (job,) = await store.claim(worker_id=worker, tasks=["echo"], queues=None, limit=1, lease=30)
    return job


async def lose(conn: Any, job_id: Any) -> None:
    """The worker holding the job died: its lease runs out."""
    await conn.execute(
        "UPDATE notifyq.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
        [job_id],
    )


async def test_a_job_lost_before_its_handler_was_confirmed_keeps_its_attempt(
    store: Store, conn: Any
) -> None:
    job_id = await enqueue(conn)
    job = await claim(store, "dead:1:a")
    assert job.attempt == 1
    await lose(conn, job_id)
    (rescued,) = await store.rescue_expired()
    assert (rescued.status, rescued.counted) == (JobStatus.QUEUED, False)
    row = await job_row(conn, job_id)
    assert row is not None
    assert (row["attempt_count"], row["lost_count"], row["claims"]) == (0, 1, 1)
    assert "not counted" in row["errors"][-1]["error"]
    # The next claim is its first attempt again.
    assert (await claim(store, "live:2:b")).attempt == 1


async def test_a_job_whose_handler_a_heartbeat_confirmed_uses_its_attempt(
    store: Store, conn: Any
) -> None:
    job_id = await enqueue(conn)
    job = await claim(store, "dead:1:a")
    held = Held(job.id, job.claim)
    assert await store.beat("dead:1:a", [held], running={job.id}, lease=30) == {job.id: False}
    await lose(conn, job_id)
    (rescued,) = await store.rescue_expired()
    assert (rescued.status, rescued.counted) == (JobStatus.QUEUED, True)
    row = await job_row(conn, job_id)
    assert row is not None and (row["attempt_count"], row["lost_count"]) == (1, 0)


async def test_a_heartbeat_of_a_job_still_waiting_for_a_runner_does_not_confirm_it(
    store: Store, conn: Any
) -> None:
    job_id = await enqueue(conn)
    job = await claim(store, "dead:1:a")
    await store.beat("dead:1:a", [Held(job.id, job.claim)], running=set(), lease=30)
    await lose(conn, job_id)
    (rescued,) = await store.rescue_expired()
    assert rescued.counted is False


async def test_a_job_that_keeps_killing_its_worker_runs_out_of_attempts(
    store: Store, conn: Any
) -> None:
    job_id = await enqueue(conn, max_attempts=2)
    outcomes = []
    for n in range(4):
        await claim(store, f"dead:{n}:a")
        await lose(conn, job_id)
        (rescued,) = await store.rescue_expired()
        outcomes.append((rescued.status, rescued.counted))
    # Two attempts given back, then two counted: failed, not round and round for ever.
    assert outcomes == [
        (JobStatus.QUEUED, False),
        (JobStatus.QUEUED, False),
        (JobStatus.QUEUED, True),
        (JobStatus.FAILED, True),
    ]


async def test_an_outcome_from_before_an_attempt_was_given_back_is_discarded(
    store: Store, conn: Any
) -> None:
    """The same worker claims the job again after its attempt was given back (it was only
    paused, not dead): the attempt number repeats, the claim number does not, and the late
    outcome of the first claim is refused."""
    job_id = await enqueue(conn)
    first = await claim(store, "w:1:a")
    await lose(conn, job_id)
    await store.rescue_expired()
    second = await claim(store, "w:1:a")
    assert first.attempt == second.attempt and first.claim != second.claim
    stale = Success(first.id, first.claim, '"stale"')
    assert await store.complete("w:1:a", [stale]) == set()
    fresh = Success(second.id, second.claim, '"fresh"')
    assert await store.complete("w:1:a", [fresh]) == {job_id}
    row = await job_row(conn, job_id)
    assert row is not None and row["result"] == "fresh"


async def test_a_running_worker_confirms_its_running_jobs_at_each_heartbeat(
    settings: Settings, conn: Any
) -> None:
    from tests.helpers import registry

    async def slow(payload: dict[str, Any]) -> None:
        import anyio

        await anyio.sleep(30)

    fast = settings.model_copy(update={"lease_seconds": 2, "shutdown_grace": 0})
    async with running_worker(fast, registry(slow=slow)):
        cursor = await conn.execute("INSERT INTO notifyq.jobs (task) VALUES ('slow') RETURNING id")
        job_id = (await cursor.fetchone())[0]
        await wait_for_status(conn, job_id, "processing")

        async def confirmed() -> bool:
            row = await job_row(conn, job_id)
            return row is not None and row["heartbeat_at"] is not None

        await wait_until(confirmed, timeout=5)


async def test_a_completion_that_claims_is_fenced_and_claims_only_the_free_slots(
    store: Store, conn: Any
) -> None:
    stale_id, live_id = await enqueue(conn), await enqueue(conn)
    stale = await claim(store, "w:1:a")
    live = await claim(store, "w:1:a")
    await lose(conn, stale_id)
    await store.rescue_expired()  # another worker may take it now: its outcome is stale
    waiting = [await enqueue(conn) for _ in range(3)]
    request = ClaimRequest(["echo"], None, 2, 30.0)
    written, claimed = await store.complete_and_claim(
        "w:1:a",
        [Success(stale.id, stale.claim, '"old"'), Success(live.id, live.claim, '"ok"')],
        request,
    )
    assert written == {live_id}
    # Two slots, and the rescued job is due again: it is among the three candidates.
    assert len(claimed) == 2 and {j.id for j in claimed} <= {stale_id, *waiting}
    assert all(j.task == "echo" and j.attempt >= 1 for j in claimed)
    row = await job_row(conn, claimed[0].id)
    assert row is not None and (row["status"], row["worker_id"]) == ("processing", "w:1:a")
    assert (await job_row(conn, live_id) or {})["result"] == "ok"
    # No slot: nothing claimed, the completion still written.
    third = await claim(store, "w:1:a")
    written, claimed = await store.complete_and_claim(
        "w:1:a", [Success(third.id, third.claim, "null")], ClaimRequest(["echo"], None, 0, 30.0)
    )
    assert written == {third.id} and claimed == []
