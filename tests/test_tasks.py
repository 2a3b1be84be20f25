"""The task system: options, payload models, job context, limits, periodic jobs, retention.

The tests of this that need no database are in tests/unit/test_tasks.py.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import anyio
import pytest
from pydantic import BaseModel, Field

from notifyq import JobContext, current_job
from notifyq.builtins import worker_registry
from notifyq.client import Queue
from notifyq.settings import Settings
from notifyq.tasks import Registry, make_task
from notifyq.worker import Worker
from tests.helpers import (
    ROOT,
    insert_in_state,
    job_row,
    notifyq_env,
    running_worker,
    wait_for_status,
    wait_until,
)


def tasks(*items: Any) -> Registry:
    return worker_registry(Registry(list(items)))


async def insert(conn: Any, task: str, payload: str = "{}", n: int = 1) -> list[Any]:
    cursor = await conn.execute(
        """INSERT INTO notifyq.jobs (task, payload)
           SELECT %s, %s::jsonb FROM generate_series(1, %s) RETURNING id""",
        [task, payload, n],
    )
    return [row[0] for row in await cursor.fetchall()]


class Email(BaseModel):
    to: str = Field(pattern=r"^[^@]+@[^@]+$")
    subject: str


async def test_a_payload_model_validates_and_a_misfit_fails_at_once(
    settings: Settings, conn: Any
) -> None:
    seen: list[Email] = []

    async def send(payload: Email) -> Email:
        seen.append(payload)
        return payload

    registry = tasks(make_task(send, max_attempts=5))
    (good,) = await insert(conn, "send", '{"to": "a@b.c", "subject": "hi"}')
    (bad,) = await insert(conn, "send", '{"to": "nobody", "extra": 1}')
    await Worker(settings, registry, burst=True).run()
    assert seen == [Email(to="a@b.c", subject="hi")]
    good_row, bad_row = await job_row(conn, good), await job_row(conn, bad)
    assert good_row is not None and good_row["result"] == {"to": "a@b.c", "subject": "hi"}
    assert bad_row is not None
    assert (bad_row["status"], bad_row["attempt_count"]) == ("failed", 1)
    assert "does not fit Email" in bad_row["last_error"] and "subject" in bad_row["last_error"]


async def test_handlers_see_their_job(settings: Settings, conn: Any) -> None:
    contexts: list[JobContext] = []

    async def with_ctx(payload: dict[str, Any], ctx: JobContext) -> None:
        contexts.append(ctx)

    def deep_in_a_thread(payload: dict[str, Any]) -> str:
        return str(current_job().job_id)

    registry = tasks(make_task(with_ctx), make_task(deep_in_a_thread))
    (first,) = await insert(conn, "with_ctx")
    (second,) = await insert(conn, "deep_in_a_thread")
    await Worker(settings, registry, burst=True, worker_id="w-test").run()
    (ctx,) = contexts
    assert (ctx.job_id, ctx.task, ctx.queue, ctx.attempt, ctx.worker_id) == (
        first,
        "with_ctx",
        "default",
        1,
        "w-test",
    )
    assert not ctx.last_attempt
    row = await job_row(conn, second)
    assert row is not None and row["result"] == str(second)
    with pytest.raises(LookupError):
        current_job()


async def test_a_tasks_queue_and_priority_are_the_defaults(settings: Settings, db_url: str) -> None:
    async def mail(payload: dict[str, Any]) -> None: ...

    registry = tasks(make_task(mail, queue="mail", priority=7, max_attempts=9))
    async with running_worker(settings, registry), Queue(db_url) as q:
        default = await q.enqueue("mail", {})
        explicit = await q.enqueue("mail", {}, queue="other", priority=1)
        job, other = await q.get(default.job_id), await q.get(explicit.job_id)
    assert job is not None and (job.queue, job.priority, job.max_attempts) == ("mail", 7, 9)
    assert other is not None and (other.queue, other.priority) == ("other", 1)


async def test_max_concurrency_holds_across_workers(settings: Settings, conn: Any) -> None:
    running = 0
    peak = 0

    async def scarce(payload: dict[str, Any]) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.05)
        running -= 1

    registry = tasks(make_task(scarce, max_concurrency=2))
    wide = settings.model_copy(update={"concurrency": 10})
    ids = await insert(conn, "scarce", n=12)
    async with running_worker(wide, registry), running_worker(wide, registry):
        for job_id in ids:
            await wait_for_status(conn, job_id, "completed", timeout=20)
    assert peak == 2


async def test_a_task_rate_limit_spaces_the_starts(settings: Settings, conn: Any) -> None:
    async def metered(payload: dict[str, Any]) -> None: ...

    registry = tasks(make_task(metered, rate_limit=10))
    ids = await insert(conn, "metered", n=25)
    async with running_worker(settings, registry), running_worker(settings, registry):
        for job_id in ids:
            await wait_for_status(conn, job_id, "completed", timeout=20)
    cursor = await conn.execute(
        "SELECT extract(epoch FROM started_at) FROM notifyq.jobs ORDER BY started_at"
    )
    starts = [float(row[0]) for row in await cursor.fetchall()]
    # A bucket of 10 tokens refilling at 10/s: 25 jobs need at least 1.5 s, and no second
    # window holds more than the burst plus a second's refill.
    assert starts[-1] - starts[0] >= 1.4
    for first in starts:
        assert sum(1 for s in starts if first <= s < first + 1.0) <= 21


async def test_a_queue_rate_limit_holds(settings: Settings, conn: Any) -> None:
    await conn.execute(
        "INSERT INTO notifyq.queues (name, rate_limit, rate_burst) VALUES ('slow', 4, 1)"
    )
    cursor = await conn.execute(
        """INSERT INTO notifyq.jobs (task, queue) SELECT 'echo', 'slow'
           FROM generate_series(1, 6) RETURNING id"""
    )
    ids = [row[0] for row in await cursor.fetchall()]
    async with running_worker(settings):
        for job_id in ids:
            await wait_for_status(conn, job_id, "completed", timeout=20)
    cursor = await conn.execute(
        "SELECT extract(epoch FROM max(started_at) - min(started_at)) FROM notifyq.jobs"
    )
    # One token at a time, four per second: six jobs span at least five refills.
    assert float((await cursor.fetchone())[0]) >= 1.1


async def test_a_periodic_tick_is_enqueued_once_by_many_workers(
    settings: Settings, conn: Any
) -> None:
    async def every_minute(payload: dict[str, Any]) -> None: ...

    registry = tasks(make_task(every_minute, cron="* * * * *", cron_payload={"from": "cron"}))
    async with (
        running_worker(settings, registry),
        running_worker(settings, registry),
        running_worker(settings, registry),
    ):
        # Each worker starts by looking at the last minute: the latest tick is due.
        cursor = await conn.execute("SELECT count(*) FROM notifyq.periodic_ticks")

        async def ticked() -> bool:
            cursor = await conn.execute("SELECT count(*) FROM notifyq.periodic_ticks")
            return bool((await cursor.fetchone())[0])

        await wait_until(ticked, timeout=10)
        cursor = await conn.execute(
            "SELECT tick, job_id FROM notifyq.periodic_ticks WHERE name = 'every_minute'"
        )
        rows = await cursor.fetchall()
        assert len(rows) in (1, 2)  # two if a minute turned while the workers started
        for tick, job_id in rows:
            row = await wait_for_status(conn, job_id, "completed", timeout=10)
            assert row["run_at"] == tick and row["payload"] == {"from": "cron"}
    cursor = await conn.execute("SELECT count(*) FROM notifyq.jobs WHERE task = 'every_minute'")
    assert (await cursor.fetchone())[0] == len(rows)


async def test_retention_deletes_old_finished_jobs_only(
    settings: Settings, conn: Any, db_url: str
) -> None:
    for status in ("completed", "completed", "failed", "cancelled"):
        await insert_in_state(conn, status=f"'{status}'", finished_at="now() - interval '8 days'")
    await insert_in_state(conn, status="'completed'", finished_at="now()")
    await insert_in_state(conn)
    done = await anyio.run_process(
        [sys.executable, "-m", "notifyq", "prune", "--batch", "1"],
        env=notifyq_env(db_url),
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "deleted 3 job(s)" in done.stdout.decode()
    cursor = await conn.execute("SELECT status FROM notifyq.jobs ORDER BY status")
    assert [row[0] for row in await cursor.fetchall()] == ["completed", "failed", "queued"]


async def test_workers_prune_on_their_own(settings: Settings, conn: Any) -> None:
    await insert_in_state(
        conn, count=50, status="'completed'", finished_at="now() - interval '2 hours'"
    )
    short = settings.model_copy(update={"keep_completed": 3600, "prune_interval": 0.2})
    started = time.monotonic()
    async with running_worker(short):

        async def pruned() -> bool:
            cursor = await conn.execute("SELECT count(*) FROM notifyq.jobs")
            return (await cursor.fetchone())[0] == 0  # type: ignore[index]

        await wait_until(pruned, timeout=10)
    assert time.monotonic() - started < 10


async def test_a_backlog_of_unlimited_jobs_does_not_starve_limited_ones(
    settings: Settings, conn: Any
) -> None:
    async def metered(payload: dict[str, Any]) -> None: ...

    async def bulk(payload: dict[str, Any]) -> None:
        await anyio.sleep(0.001)

    registry = tasks(make_task(metered, rate_limit=50), make_task(bulk))
    await insert(conn, "bulk", n=3000)
    limited = await insert(conn, "metered", n=3)
    async with running_worker(settings.model_copy(update={"concurrency": 20}), registry):
        for job_id in limited:
            await wait_for_status(conn, job_id, "completed", timeout=20)
        cursor = await conn.execute("SELECT count(*) FROM notifyq.jobs WHERE status = 'queued'")
        still_queued = (await cursor.fetchone())[0]
    # The limited jobs ran while most of the backlog still waited.
    assert still_queued > 1000


async def test_an_application_task_replaces_a_builtin_of_the_same_name(
    settings: Settings, conn: Any
) -> None:
    def send_email(payload: dict[str, Any]) -> str:  # the contract's own example name
        return "sent by the application"

    registry = tasks(make_task(send_email, "send_email", max_attempts=5, timeout=30))
    assert registry.get("send_email").fn is send_email  # type: ignore[union-attr]
    (job_id,) = await insert(conn, "send_email", '{"to": "a@b.c"}')
    await Worker(settings, registry, burst=True).run()
    row = await job_row(conn, job_id)
    assert row is not None and row["result"] == "sent by the application"
