"""Workers running in this process against a real database and real notifications.

The tests of this that need no database are in tests/unit/test_worker.py.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import anyio.lowlevel
import psycopg

from notifyq.builtins import worker_registry
from notifyq.errors import PermanentFailure
from notifyq.settings import Settings
from notifyq.tasks import Registry, make_task
from notifyq.worker import Worker
from tests.helpers import (
    count_by_status,
    job_row,
    registry,
    running_worker,
    wait_for_status,
    wait_until,
)


async def insert(
    conn: psycopg.AsyncConnection[Any], task: str, payload: str = "{}", **cols: Any
) -> Any:
    names = ["task", "payload", *cols]
    placeholders = ", ".join(["%s"] * len(names))
    cursor = await conn.execute(
        f"INSERT INTO notifyq.jobs ({', '.join(names)}) VALUES ({placeholders}) RETURNING id",
        [task, payload, *cols.values()],
    )
    row = await cursor.fetchone()
    assert row is not None
    return row[0]


async def test_notification_wakes_an_idle_worker(settings: Settings, conn: Any) -> None:
    # The poll interval is 30 s: only the notification can start the job this fast.
    async with running_worker(settings) as worker:
        await wait_until(lambda: worker.stats.empty_claims >= 1)
        job_id = await insert(conn, "echo", '{"n": 1}')
        row = await wait_for_status(conn, job_id, "completed", timeout=5)
    assert row["result"] == {"n": 1}
    assert row["attempt_count"] == 1
    assert worker.listener is not None and worker.listener.notifications >= 1


async def test_task_comes_from_the_payload_or_the_default(settings: Settings, conn: Any) -> None:
    cursor = await conn.execute(
        """INSERT INTO notifyq.jobs (payload) VALUES ('{"task": "hello_world"}'), ('{"n": 2}'),
           ('{"task": 5}') RETURNING id"""
    )
    greeting, plain, numeric = [row[0] for row in await cursor.fetchall()]
    async with running_worker(settings):
        assert (await wait_for_status(conn, greeting, "completed"))["result"] == {
            "message": "Hello, world!"
        }
        assert (await wait_for_status(conn, plain, "completed"))["task"] == "echo"
        assert (await wait_for_status(conn, numeric, "completed"))["task"] == "echo"


async def test_higher_priority_runs_first(settings: Settings, conn: Any) -> None:
    order: list[int] = []

    async def note(payload: dict[str, Any]) -> None:
        order.append(payload["p"])

    for priority in (0, 5, -3, 10, 5):
        await insert(conn, "note", f'{{"p": {priority}}}', priority=priority)
    one_at_a_time = settings.model_copy(update={"concurrency": 1})
    await Worker(one_at_a_time, registry(note=note), burst=True).run()
    assert order == [10, 5, 5, 0, -3]


async def test_a_delayed_job_starts_on_time_without_a_poll(settings: Settings, conn: Any) -> None:
    async with running_worker(settings):
        cursor = await conn.execute(
            "SELECT notifyq.enqueue('echo', '{}', run_at => now() + interval '0.6 seconds')"
        )
        job_id = (await cursor.fetchone())[0]
        row = await wait_for_status(conn, job_id, "completed", timeout=5)
    assert row["started_at"] >= row["run_at"]
    # Poll interval is 30 s; the worker slept until run_at instead.
    assert (row["started_at"] - row["run_at"]).total_seconds() < 1.0


async def test_a_failing_job_is_retried_then_failed_with_every_error(
    settings: Settings, conn: Any
) -> None:
    job_id = await insert(conn, "fail", '{"message": "boom"}', max_attempts=3)
    async with running_worker(settings):
        row = await wait_for_status(conn, job_id, "failed", timeout=10)
    assert row["attempt_count"] == 3
    assert row["last_error"].startswith("RuntimeError: boom")
    assert [e["attempt"] for e in row["errors"]] == [1, 2, 3]
    assert row["finished_at"] is not None


async def test_a_permanent_failure_is_not_retried(settings: Settings, conn: Any) -> None:
    async def reject(payload: dict[str, Any]) -> None:
        raise PermanentFailure("bad input")

    job_id = await insert(conn, "reject", max_attempts=5)
    await Worker(settings, registry(reject=reject), burst=True).run()
    row = await job_row(conn, job_id)
    assert row is not None
    assert (row["status"], row["attempt_count"]) == ("failed", 1)
    assert "bad input" in row["last_error"]


async def test_a_result_that_is_not_json_fails_the_job(settings: Settings, conn: Any) -> None:
    async def odd(payload: dict[str, Any]) -> Any:
        return {"when": object()}

    async def nul(payload: dict[str, Any]) -> Any:
        return {"text": "a\x00b"}

    odd_id = await insert(conn, "odd")
    nul_id = await insert(conn, "nul")
    await Worker(settings, registry(odd=odd, nul=nul), burst=True).run()
    odd_row, nul_row = await job_row(conn, odd_id), await job_row(conn, nul_id)
    assert odd_row is not None and odd_row["status"] == "failed"
    assert "not JSON-serialisable" in odd_row["last_error"]
    assert nul_row is not None and nul_row["status"] == "failed"
    assert "NUL" in nul_row["last_error"]


async def test_plain_functions_run_in_a_thread(settings: Settings, conn: Any) -> None:
    import threading

    main_thread = threading.get_ident()

    def blocking(payload: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.05)  # a blocking call must not stall the event loop
        return {"thread": threading.get_ident() != main_thread}

    job_id = await insert(conn, "blocking")
    await Worker(settings, registry(blocking=blocking), burst=True).run()
    row = await job_row(conn, job_id)
    assert row is not None and row["result"] == {"thread": True}


async def test_a_task_timeout_cancels_the_attempt(settings: Settings, conn: Any) -> None:
    async def slow(payload: dict[str, Any]) -> None:
        await anyio.sleep(30)

    tasks = worker_registry(Registry([make_task(slow, timeout=0.1)]))
    job_id = await insert(conn, "slow", max_attempts=2)
    async with running_worker(settings, tasks):
        row = await wait_for_status(conn, job_id, "failed", timeout=10)
    assert row["attempt_count"] == 2
    assert "timeout" in row["last_error"]


async def test_a_worker_claims_only_tasks_it_knows(settings: Settings, conn: Any) -> None:
    unknown = await insert(conn, "nobody_has_this")
    known = await insert(conn, "echo")
    await Worker(settings, burst=True).run()
    assert (await job_row(conn, known))["status"] == "completed"  # type: ignore[index]
    assert (await job_row(conn, unknown))["status"] == "queued"  # type: ignore[index]


async def test_a_worker_serves_only_its_queues(settings: Settings, conn: Any) -> None:
    mine = await insert(conn, "echo", queue="mine")
    theirs = await insert(conn, "echo", queue="theirs")
    await Worker(settings.model_copy(update={"queues": ["mine"]}), burst=True).run()
    assert (await job_row(conn, mine))["status"] == "completed"  # type: ignore[index]
    assert (await job_row(conn, theirs))["status"] == "queued"  # type: ignore[index]


async def test_four_workers_run_2000_jobs_each_exactly_once(settings: Settings, conn: Any) -> None:
    runs: dict[int, int] = {}

    async def count(payload: dict[str, Any]) -> None:
        runs[payload["n"]] = runs.get(payload["n"], 0) + 1
        await anyio.lowlevel.checkpoint()

    tasks = registry(count=count)
    busy = settings.model_copy(update={"concurrency": 20})
    async with running_worker(busy, tasks) as a, running_worker(busy, tasks) as b:
        async with running_worker(busy, tasks) as c, running_worker(busy, tasks) as d:
            await conn.execute(
                """INSERT INTO notifyq.jobs (task, payload)
                   SELECT 'count', jsonb_build_object('n', i) FROM generate_series(1, 2000) i"""
            )
            await wait_until(lambda: _completed(conn, 2000), timeout=60, interval=0.05)
    assert sorted(runs) == list(range(1, 2001))
    assert set(runs.values()) == {1}
    shares = [w.stats.completed for w in (a, b, c, d)]
    assert sum(shares) == 2000
    assert sum(1 for share in shares if share > 0) >= 2, shares


async def test_graceful_stop_lets_running_jobs_finish(settings: Settings, conn: Any) -> None:
    started = anyio.Event()

    async def work(payload: dict[str, Any]) -> str:
        started.set()
        await anyio.sleep(0.3)
        return "done"

    job_id = await insert(conn, "work")
    worker = Worker(settings, registry(work=work))
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        with anyio.fail_after(5):
            await started.wait()
        worker.stop()
    row = await job_row(conn, job_id)
    assert row is not None and (row["status"], row["result"]) == ("completed", "done")


async def test_jobs_past_the_grace_go_back_to_the_queue_at_once(
    settings: Settings, conn: Any
) -> None:
    started = anyio.Event()

    async def stuck(payload: dict[str, Any]) -> None:
        started.set()
        await anyio.sleep(60)

    job_id = await insert(conn, "stuck")
    worker = Worker(settings.model_copy(update={"shutdown_grace": 0.2}), registry(stuck=stuck))
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        with anyio.fail_after(5):
            await started.wait()
        worker.stop()
    row = await job_row(conn, job_id)
    assert row is not None
    # Back in the queue with the interrupted attempt not counted, and no lease left behind.
    assert (row["status"], row["attempt_count"], row["worker_id"]) == ("queued", 0, None)
    assert worker.stats.released == 1


async def test_a_completion_after_losing_the_lease_is_discarded(
    settings: Settings, conn: Any
) -> None:
    release = anyio.Event()
    started = anyio.Event()

    async def slow(payload: dict[str, Any]) -> str:
        started.set()
        await release.wait()
        return "late"

    job_id = await insert(conn, "slow")
    async with running_worker(settings, registry(slow=slow)) as worker:
        with anyio.fail_after(5):
            await started.wait()
        # Another worker's rescuer takes the job over (as after an expired lease).
        await conn.execute(
            """UPDATE notifyq.jobs SET status = 'queued', worker_id = NULL,
                      lease_expires_at = NULL, run_at = now() + interval '1 hour'
               WHERE id = %s""",
            [job_id],
        )
        release.set()
        await wait_until(lambda: worker.stats.lost == 1)
    row = await job_row(conn, job_id)
    assert row is not None and (row["status"], row["result"]) == ("queued", None)


async def test_a_live_worker_rescues_a_job_whose_lease_ran_out(
    settings: Settings, conn: Any
) -> None:
    job_id = await insert(conn, "echo", '{"r": 1}')
    await conn.execute(
        """UPDATE notifyq.jobs SET status = 'processing', attempt_count = 1, claims = 1,
                  worker_id = 'dead-host:1:abc', lease_expires_at = now() - interval '1 second',
                  heartbeat_at = now() - interval '2 seconds'
           WHERE id = %s""",
        [job_id],
    )
    fast = settings.model_copy(update={"lease_seconds": 3})
    async with running_worker(fast):
        row = await wait_for_status(conn, job_id, "completed", timeout=10)
    assert row["attempt_count"] == 2
    assert "lease expired" in row["errors"][0]["error"]


async def test_a_rescued_job_out_of_attempts_fails(settings: Settings, conn: Any) -> None:
    job_id = await insert(conn, "echo", max_attempts=1)
    await conn.execute(
        """UPDATE notifyq.jobs SET status = 'processing', attempt_count = 1, claims = 1,
                  worker_id = 'dead-host:1:abc', lease_expires_at = now() - interval '1 second',
                  heartbeat_at = now() - interval '2 seconds'
           WHERE id = %s""",
        [job_id],
    )
    async with running_worker(settings.model_copy(update={"lease_seconds": 3})):
        row = await wait_for_status(conn, job_id, "failed", timeout=10)
    assert "no attempts left" in row["last_error"]


async def test_the_fallback_poll_covers_a_missed_notification(
    settings: Settings, conn: Any
) -> None:
    await conn.execute("ALTER TABLE notifyq.jobs DISABLE TRIGGER jobs_notify_inserted")
    polling = settings.model_copy(update={"poll_interval": 0.5})
    async with running_worker(polling) as worker:
        await wait_until(lambda: worker.stats.empty_claims >= 1)
        job_id = await insert(conn, "echo")
        await wait_for_status(conn, job_id, "completed", timeout=5)


async def test_the_listener_reconnects_and_claims_after_its_connection_dies(
    settings: Settings, conn: Any
) -> None:
    async with running_worker(settings) as worker:
        assert worker.listener is not None
        await conn.execute(
            """SELECT pg_terminate_backend(pid) FROM pg_stat_activity
               WHERE application_name = 'notifyq-listener' AND datname = current_database()"""
        )
        # Inserted while the listener is down: its notification is lost, so the claim that
        # follows the reconnect must find it (the poll interval is 30 s).
        job_id = await insert(conn, "echo")
        await wait_for_status(conn, job_id, "completed", timeout=10)
        await wait_until(lambda: worker.listener.reconnects >= 1)  # type: ignore[union-attr]


async def test_counts_by_status_after_a_mixed_run(settings: Settings, conn: Any) -> None:
    for n in range(5):
        await insert(conn, "echo", f'{{"n": {n}}}')
    await insert(conn, "fail", max_attempts=1)
    await Worker(settings, burst=True).run()
    assert await count_by_status(conn) == {"completed": 5, "failed": 1}


async def _completed(conn: Any, expected: int) -> bool:
    cursor = await conn.execute("SELECT count(*) FROM notifyq.jobs WHERE status = 'completed'")
    row = await cursor.fetchone()
    return bool(row and row[0] == expected)
