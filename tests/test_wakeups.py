"""An idle worker starts a job at its run_at, whoever set that run_at and whenever the worker
heard of it: never at the next fallback poll.

Every worker here polls once a minute, and every job must start within a few seconds of its
run_at: a worker that waited for its poll fails the test. The job comes back to the queue in each
way a job can: the worker's own retry or snooze, a delayed insert by SQL or Python (whose
notification comes before it is due), another worker's retry, and the rescuer's.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest

from notifyq import Queue, Snooze
from notifyq.context import JobContext
from notifyq.db import open_pool
from notifyq.models import ClaimedJob
from notifyq.retry import Backoff
from notifyq.settings import Settings
from notifyq.store import Store
from notifyq.tasks import Registry, make_task
from notifyq.worker import Worker
from tests.helpers import registry, running_worker, wait_for_status, wait_until

#: The fallback poll of every worker here: far longer than any test may take.
POLL = 60.0
#: How late after its run_at a job may start (a busy machine, two test processes).
LATE = 3.0


@pytest.fixture
def slow_poll(settings: Settings) -> Settings:
    return settings.model_copy(update={"poll_interval": POLL})


class SlowLook(Store):
    """The real store, whose look for the next run_at (and the claim sent with it) answers
    ``delay`` seconds late, as on a loaded machine."""

    def __init__(self, pool: Any, *, delay: float) -> None:
        super().__init__(pool)
        self._delay = delay

    async def look_and_claim(
        self,
        *,
        worker_id: str,
        tasks: Sequence[str],
        queues: Sequence[str] | None,
        limit: int,
        lease: float,
    ) -> tuple[float | None, list[ClaimedJob]]:
        answer = await super().look_and_claim(
            worker_id=worker_id, tasks=tasks, queues=queues, limit=limit, lease=lease
        )
        await anyio.sleep(self._delay)
        return answer


def first_attempt_fails(backoff: Backoff, before_failing: anyio.Event | None = None) -> Registry:
    """The built-ins and ``flaky``, whose first attempt fails (once ``before_failing`` is set,
    when given), retried after ``backoff``; the second succeeds."""

    async def flaky(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        if ctx.attempt == 1:
            if before_failing is not None:
                await before_failing.wait()
            raise RuntimeError("the first attempt fails")
        return {"attempt": ctx.attempt}

    return Registry([*registry(), make_task(flaky, "flaky", backoff=backoff)])


async def enqueue(conn: psycopg.AsyncConnection[Any], statement: str, *params: Any) -> Any:
    cursor = await conn.execute(statement, params)
    row = await cursor.fetchone()
    assert row is not None
    return row[0]


async def started_on_time(conn: psycopg.AsyncConnection[Any], job_id: Any) -> dict[str, Any]:
    """Waits for the job to complete; answers its row, once sure that its last attempt started
    within LATE seconds of the job's run_at."""
    row = await wait_for_status(conn, job_id, "completed", timeout=15 + LATE)
    late = (row["started_at"] - row["run_at"]).total_seconds()
    assert late < LATE, f"started {late:.1f}s after its run_at: the worker waited for a poll"
    return row


async def asleep(worker: Worker, times: int = 1) -> None:
    """Waits until the worker's producer began to wait for a wake-up ``times`` times in all."""
    with anyio.fail_after(10):
        await worker.signals.asleep.reached(times)


async def test_an_idle_worker_runs_its_own_retry_at_its_run_at(
    slow_poll: Settings, conn: psycopg.AsyncConnection[Any]
) -> None:
    tasks = first_attempt_fails(Backoff(base=1.0, factor=1.0, cap=1.0))
    async with running_worker(slow_poll, tasks) as worker:
        await asleep(worker)
        job_id = await enqueue(conn, "SELECT notifyq.enqueue('flaky', '{}', max_attempts => 2)")
        row = await started_on_time(conn, job_id)
    assert row["result"] == {"attempt": 2}
    assert len(row["errors"]) == 1


async def test_a_retry_due_before_the_look_for_the_next_run_at_answers_starts_on_time(
    slow_poll: Settings, conn: psycopg.AsyncConnection[Any]
) -> None:
    # The first attempt fails while the worker sleeps, and its retry is due within 0.1 s, before
    # the worker's look for the next run_at answers (a loaded machine): a claim made before that
    # look finds it not due yet, and the look finds it due already. It must start now all the
    # same, not at the poll.
    fail_now = anyio.Event()
    tasks = first_attempt_fails(Backoff(base=0.1, factor=1.0, cap=0.1), fail_now)
    async with open_pool(slow_poll, name="slow-look", min_size=2) as pool:
        store = SlowLook(pool, delay=0.5)
        async with running_worker(slow_poll, tasks, store=store) as worker:
            await asleep(worker)
            job_id = await enqueue(conn, "SELECT notifyq.enqueue('flaky', '{}', max_attempts => 2)")
            await wait_until(lambda: worker.running_jobs == 1)
            await asleep(worker, 2)
            fail_now.set()
            row = await started_on_time(conn, job_id)
    assert row["result"] == {"attempt": 2}


async def test_an_idle_worker_runs_a_snoozed_job_when_its_snooze_ends(
    slow_poll: Settings, conn: psycopg.AsyncConnection[Any]
) -> None:
    napped: list[Any] = []

    async def nap(payload: dict[str, Any], ctx: JobContext) -> str:
        if not napped:
            napped.append(ctx.job_id)
            raise Snooze(1.0)
        return "awake"

    # Not "nap": tests/sample_tasks.py registers a task of that name in the process's registry.
    async with running_worker(slow_poll, registry(snooze_once=nap)) as worker:
        await asleep(worker)
        job_id = await enqueue(conn, "SELECT notifyq.enqueue('snooze_once', '{}')")
        row = await started_on_time(conn, job_id)
    assert napped == [job_id]
    assert row["result"] == "awake"


@pytest.mark.parametrize("delay", [0.05, 1.0])
async def test_an_idle_worker_runs_a_job_inserted_by_sql_with_a_delay_at_its_run_at(
    slow_poll: Settings, conn: psycopg.AsyncConnection[Any], delay: float
) -> None:
    # The insert notifies at once, before the job is due: the worker, woken early, must sleep
    # until its run_at, not until its poll.
    async with running_worker(slow_poll) as worker:
        await asleep(worker)
        job_id = await enqueue(
            conn,
            "INSERT INTO notifyq.jobs (task, payload, run_at) "
            "VALUES ('echo', '{}', now() + make_interval(secs => %s)) RETURNING id",
            delay,
        )
        await started_on_time(conn, job_id)


@pytest.mark.parametrize("delay", [0.05, 1.0])
async def test_an_idle_worker_runs_a_job_enqueued_from_python_with_a_delay_at_its_run_at(
    slow_poll: Settings, conn: psycopg.AsyncConnection[Any], delay: float
) -> None:
    assert slow_poll.database_url is not None
    async with running_worker(slow_poll) as worker, Queue(slow_poll.database_url) as queue:
        await asleep(worker)
        enqueued = await queue.enqueue("echo", {"n": 1}, delay=timedelta(seconds=delay))
        await started_on_time(conn, enqueued.job_id)


async def test_a_delayed_job_due_before_the_look_for_the_next_run_at_answers_starts_on_time(
    slow_poll: Settings, conn: psycopg.AsyncConnection[Any]
) -> None:
    async with open_pool(slow_poll, name="slow-look", min_size=2) as pool:
        async with running_worker(slow_poll, store=SlowLook(pool, delay=0.5)) as worker:
            await asleep(worker)
            job_id = await enqueue(
                conn, "SELECT notifyq.enqueue('echo', '{}', run_at => now() + interval '0.1 s')"
            )
            await started_on_time(conn, job_id)


async def test_an_idle_worker_runs_a_retry_that_another_worker_scheduled(
    slow_poll: Settings, conn: psycopg.AsyncConnection[Any]
) -> None:
    # The first attempt runs on a draining worker, which stops before the retry is due; the
    # idle worker has slept since before the retry existed, and must run it on time.
    fail_now = anyio.Event()
    tasks = first_attempt_fails(Backoff(base=2.0, factor=1.0, cap=2.0), fail_now)
    job_id = await enqueue(conn, "SELECT notifyq.enqueue('flaky', '{}', max_attempts => 2)")
    draining = Worker(slow_poll, tasks, burst=True)
    async with anyio.create_task_group() as tg:
        tg.start_soon(draining.run)
        await wait_until(lambda: draining.running_jobs == 1)
        async with running_worker(slow_poll, tasks) as sleeper:
            await asleep(sleeper)
            fail_now.set()
            row = await started_on_time(conn, job_id)
    assert row["worker_id"] == sleeper.id
    assert [e["worker"] for e in row["errors"]] == [draining.id]


async def test_an_idle_worker_runs_a_job_the_rescuer_put_back_at_once(
    slow_poll: Settings, conn: psycopg.AsyncConnection[Any]
) -> None:
    # The rescuer runs in another worker (the leader), which serves another queue: only the
    # notification of the rescue can wake the idle worker of this job's queue.
    fast = slow_poll.model_copy(update={"lease_seconds": 3})
    job_id = await enqueue(conn, "SELECT notifyq.enqueue('echo', '{}')")
    await conn.execute(
        """UPDATE notifyq.jobs SET status = 'processing', attempt_count = 1, claims = 1,
                  worker_id = 'dead-host:1:abc', heartbeat_at = now(),
                  lease_expires_at = now() + interval '1 second'
           WHERE id = %s""",
        [job_id],
    )
    elsewhere = fast.model_copy(update={"queues": ["elsewhere"]})
    async with running_worker(elsewhere) as rescuer:
        await wait_until(lambda: rescuer.leadership is not None and rescuer.leadership.leading)
        async with running_worker(fast.model_copy(update={"queues": ["default"]})) as sleeper:
            await asleep(sleeper)
            row = await started_on_time(conn, job_id)
    assert row["worker_id"] == sleeper.id
    assert row["attempt_count"] == 2
    assert "lease expired" in row["errors"][0]["error"]
