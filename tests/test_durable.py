"""Durable jobs: steps that run once per job, sleeps and signal waits that suspend the job and
give its slot back, signals by Python, SQL and HTTP, and how the rest of notifyq treats a
suspended job (cancel, workflows, groups, limits, retention)."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from uuid import uuid4

import anyio
import httpx
import psycopg
import pytest

from notifyq import JobContext, JobStatus, Queue, SignalRefused, SignalTimeout, SyncQueue
from notifyq.api import create_app
from notifyq.builtins import worker_registry
from notifyq.errors import InvalidJob, JobNotFound
from notifyq.settings import Settings
from notifyq.tasks import Registry, make_task
from notifyq.worker import archive
from tests.helpers import (
    ROOT,
    job_row,
    notifyq_env,
    processes,
    registry,
    running_worker,
    wait_for_status,
    wait_until,
)
from tests.readme import readme_block


@contextlib.asynccontextmanager
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"run_worker": False}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as client,
    ):
        yield client


async def step_rows(conn: Any, job_id: Any) -> list[tuple[str, str]]:
    cursor = await conn.execute(
        "SELECT kind, name FROM notifyq.job_steps WHERE job_id = %s ORDER BY finished_at",
        [job_id],
    )
    return list(await cursor.fetchall())


# -- steps -------------------------------------------------------------------------------------


async def test_a_step_runs_once_across_retries_and_its_result_comes_back(
    settings: Settings, conn: Any
) -> None:
    calls: dict[str, int] = {"charge": 0, "receipt": 0}

    def charge(amount: int) -> dict[str, Any]:  # a plain function: run in a thread
        calls["charge"] += 1
        return {"charge_id": "ch_1", "amount": amount}

    async def receipt(charge: dict[str, Any], *, to: str) -> str:
        calls["receipt"] += 1
        return f"receipt for {charge['charge_id']} to {to}"

    async def pay(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        paid = await ctx.step("charge", charge, payload["amount"])
        if ctx.attempt == 1:
            raise RuntimeError("the network broke after the charge")
        sent = await ctx.step("receipt", receipt, paid, to="a@example.com")
        return {"paid": paid, "sent": sent}

    async with Queue(settings.database_url) as q, running_worker(settings, registry(pay=pay)):
        result = await q.enqueue("pay", {"amount": 42}, max_attempts=3)
        job = await q.wait(result.job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED and job.attempt_count == 2
    assert calls == {"charge": 1, "receipt": 1}
    assert job.result == {
        "paid": {"charge_id": "ch_1", "amount": 42},
        "sent": "receipt for ch_1 to a@example.com",
    }
    assert [name for name, _ in job.steps] == ["charge", "receipt"]
    assert job.steps[0][1] <= job.steps[1][1]


async def test_a_step_that_raises_stores_nothing_and_runs_again(
    settings: Settings, conn: Any
) -> None:
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("try again")
        return "ok"

    async def work(payload: dict[str, Any], ctx: JobContext) -> str:
        return str(await ctx.step("flaky", flaky))

    async with Queue(settings.database_url) as q, running_worker(settings, registry(work=work)):
        result = await q.enqueue("work", {}, max_attempts=3)
        job = await q.wait(result.job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED and job.result == "ok"
    assert calls == 2 and job.attempt_count == 2
    assert await step_rows(conn, result.job_id) == [("step", "flaky")]


async def test_a_step_result_that_is_not_json_or_too_large_fails_the_job_clearly(
    settings: Settings, conn: Any
) -> None:
    async def not_json(payload: dict[str, Any], ctx: JobContext) -> None:
        await ctx.step("s", lambda: {1, 2})

    async def too_large(payload: dict[str, Any], ctx: JobContext) -> None:
        await ctx.step("s", lambda: "x" * (1024 * 1024 + 1))

    tasks = registry(not_json=not_json, too_large=too_large)
    async with Queue(settings.database_url) as q, running_worker(settings, tasks):
        first = await q.enqueue("not_json", {}, max_attempts=3)
        second = await q.enqueue("too_large", {}, max_attempts=3)
        bad = await q.wait(first.job_id, timeout=10)
        big = await q.wait(second.job_id, timeout=10)
    # Failed at once: the same step would give the same result again.
    assert bad.status is JobStatus.FAILED and bad.attempt_count == 1
    assert "InvalidStepResult" in (bad.last_error or "")
    assert "not JSON-serialisable" in (bad.last_error or "")
    assert big.status is JobStatus.FAILED and "larger than 1048576 bytes" in (big.last_error or "")
    assert await step_rows(conn, first.job_id) == []


async def test_step_and_signal_names_are_bounded(settings: Settings, conn: Any) -> None:
    errors: list[str] = []

    async def names(payload: dict[str, Any], ctx: JobContext) -> None:
        for call in (
            lambda: ctx.step("", lambda: 1),
            lambda: ctx.step("x" * 201, lambda: 1),
            lambda: ctx.wait_for_signal(""),
            lambda: ctx.sleep(-1),
            lambda: ctx.sleep(1, until=datetime.now(timezone.utc)),
            lambda: ctx.wait_for_signal("s", timeout=float("nan")),
        ):
            try:
                await call()
            except (ValueError, TypeError) as exc:
                errors.append(type(exc).__name__)
        await ctx.step("x" * 200, lambda: 1)

    async with Queue(settings.database_url) as q, running_worker(settings, registry(names=names)):
        result = await q.enqueue("names", {})
        job = await q.wait(result.job_id, timeout=10)
        with pytest.raises(InvalidJob):
            await q.signal(result.job_id, "x" * 201)
    assert job.status is JobStatus.COMPLETED
    assert errors == ["ValueError"] * 4 + ["TypeError", "ValueError"]


async def test_a_step_written_by_a_worker_that_lost_the_lease_is_refused(
    settings: Settings, conn: Any
) -> None:
    job_id = (await (await conn.execute("SELECT notifyq.enqueue('echo', '{}')")).fetchone())[0]
    await conn.execute(
        "UPDATE notifyq.jobs SET status = 'processing', worker_id = 'w2', claims = 2, "
        "lease_expires_at = now() + interval '30 seconds' WHERE id = %s",
        [job_id],
    )
    record = "SELECT notifyq.record_step_v1(%s, %s, %s, 's', '1'::jsonb)"
    # The worker of claim 1 lost it; another worker's claim 2 holds it now.
    assert (await (await conn.execute(record, ["w1", job_id, 1])).fetchone())[0] == "refused"
    assert (await (await conn.execute(record, ["w2", job_id, 1])).fetchone())[0] == "refused"
    assert (await (await conn.execute(record, ["w2", job_id, 2])).fetchone())[0] == "written"
    assert (await (await conn.execute(record, ["w2", job_id, 2])).fetchone())[0] == "exists"
    assert await step_rows(conn, job_id) == [("step", "s")]


async def test_a_handler_whose_lease_was_lost_stops_at_its_next_step(
    settings: Settings, conn: Any
) -> None:
    stolen = anyio.Event()
    second_ran = False

    async def work(payload: dict[str, Any], ctx: JobContext) -> None:
        nonlocal second_ran
        await ctx.step("one", lambda: 1)
        await stolen.wait()

        def two() -> int:
            nonlocal second_ran
            second_ran = True
            return 2

        await ctx.step("two", two)

    async with Queue(settings.database_url) as q, running_worker(settings, registry(work=work)):
        result = await q.enqueue("work", {}, max_attempts=1)
        await wait_until(lambda: step_rows(conn, result.job_id))
        # Another worker took the job over (as a rescue and a claim would).
        await conn.execute(
            "UPDATE notifyq.jobs SET worker_id = 'other', claims = claims + 1 WHERE id = %s",
            [result.job_id],
        )
        stolen.set()
        await wait_until(lambda: second_ran)
        row = await wait_until(lambda: job_row(conn, result.job_id))
    assert await step_rows(conn, result.job_id) == [("step", "one")]
    assert row["worker_id"] == "other" and row["status"] == "processing"


# -- sleeps ------------------------------------------------------------------------------------


async def test_a_sleep_suspends_the_job_and_frees_its_slot_then_resumes_from_the_top(
    settings: Settings, conn: Any
) -> None:
    runs = 0
    before = 0

    async def nap(payload: dict[str, Any], ctx: JobContext) -> str:
        nonlocal runs, before
        runs += 1

        def count() -> int:
            nonlocal before
            before += 1
            return before

        await ctx.step("before", count)
        await ctx.sleep(payload["seconds"])
        return "woke"

    one = settings.model_copy(update={"concurrency": 1})
    async with Queue(settings.database_url) as q, running_worker(one, registry(durable_nap=nap)):
        sleeper = await q.enqueue("durable_nap", {"seconds": 1.0})
        row = await wait_for_status(conn, sleeper.job_id, "suspended")
        assert row["worker_id"] is None and row["lease_expires_at"] is None
        assert row["suspended_until"] is not None and row["waiting_for_signal"] is None
        seen = await q.get(sleeper.job_id)
        assert seen is not None and seen.suspended_until == row["suspended_until"]
        # The only slot is free: another job runs while the first sleeps.
        other = await q.enqueue("echo", {"n": 1})
        done = await q.wait(other.job_id, timeout=5)
        assert done.status is JobStatus.COMPLETED
        assert (await job_row(conn, sleeper.job_id) or {})["status"] == "suspended"
        job = await q.wait(sleeper.job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED and job.result == "woke"
    assert runs == 2 and before == 1  # from the top, the step memoised
    assert job.attempt_count == 1  # no attempt counted for the sleep
    assert job.suspended_until is None
    assert job.finished_at is not None and job.finished_at - job.created_at >= timedelta(seconds=1)


async def test_a_sleep_until_a_time_and_several_sleeps_in_a_row(
    settings: Settings, conn: Any
) -> None:
    runs = 0

    async def naps(payload: dict[str, Any], ctx: JobContext) -> int:
        nonlocal runs
        runs += 1
        await ctx.sleep(0.2)
        await ctx.sleep(until=datetime.now(timezone.utc) + timedelta(seconds=0.2))
        await ctx.sleep(0)  # returns at once
        return runs

    async with Queue(settings.database_url) as q, running_worker(settings, registry(naps=naps)):
        result = await q.enqueue("naps", {})
        job = await q.wait(result.job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED and job.result == 3
    assert [kind for kind, _ in await step_rows(conn, result.job_id)] == ["sleep", "sleep"]


# -- signals -----------------------------------------------------------------------------------


async def test_a_signal_wakes_a_waiting_job_by_its_commit_not_a_poll(
    settings: Settings, conn: Any
) -> None:
    async def approve(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        await ctx.step("ask", lambda: "asked")
        decision: dict[str, Any] = await ctx.wait_for_signal("approved")
        return decision

    slow_poll = settings.model_copy(update={"poll_interval": 60})
    async with (
        Queue(settings.database_url) as q,
        running_worker(slow_poll, registry(approve=approve)) as worker,
    ):
        result = await q.enqueue("approve", {})
        row = await wait_for_status(conn, result.job_id, "suspended")
        assert row["waiting_for_signal"] == "approved" and row["suspended_until"] is None
        assert row["attempt_count"] == 0
        sent_at = time.monotonic()
        assert await q.signal(result.job_id, "approved", {"by": "ann"}) is True
        job = await q.wait(result.job_id, timeout=10)
        took = time.monotonic() - sent_at
        # The first signal wins: a later one changes nothing, and says so.
        assert await q.signal(result.job_id, "approved", {"by": "bob"}) is False
    assert job.status is JobStatus.COMPLETED and job.result == {"by": "ann"}
    assert took < 5  # far below the 60 s poll: the signal's commit woke the worker
    assert worker.stats.suspended == 1
    assert job.attempt_count == 1 and job.waiting_for_signal is None


async def test_a_signal_sent_before_the_wait_is_kept_and_consumed_by_it(
    settings: Settings, conn: Any
) -> None:
    runs = 0

    async def later(payload: dict[str, Any], ctx: JobContext) -> Any:
        nonlocal runs
        runs += 1
        return await ctx.wait_for_signal("go")

    async with Queue(settings.database_url) as q:
        result = await q.enqueue("later", {})
        assert await q.signal(result.job_id, "go", {"n": 1}) is True  # still queued
        async with running_worker(settings, registry(later=later)):
            job = await q.wait(result.job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED and job.result == {"n": 1} and runs == 1


async def test_a_wait_times_out_with_signal_timeout(settings: Settings, conn: Any) -> None:
    async def impatient(payload: dict[str, Any], ctx: JobContext) -> str:
        try:
            await ctx.wait_for_signal("reply", timeout=0.3)
        except SignalTimeout as exc:
            return f"gave up: {exc}"
        return "replied"

    async def strict(payload: dict[str, Any], ctx: JobContext) -> None:
        await ctx.wait_for_signal("reply", timeout=0.2)

    tasks = registry(impatient=impatient, strict=strict)
    async with Queue(settings.database_url) as q, running_worker(settings, tasks):
        caught = await q.enqueue("impatient", {})
        uncaught = await q.enqueue("strict", {}, max_attempts=5)
        row = await wait_for_status(conn, caught.job_id, "suspended")
        assert row["waiting_for_signal"] == "reply" and row["suspended_until"] is not None
        job = await q.wait(caught.job_id, timeout=10)
        failed = await q.wait(uncaught.job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED
    assert job.result == "gave up: no signal 'reply' came within 0.3s"
    # Uncaught, it fails the job at once: every retry would time out again.
    assert failed.status is JobStatus.FAILED and failed.attempt_count == 1
    assert "SignalTimeout" in (failed.last_error or "")


async def test_signals_from_sql_and_sync_queue_and_their_refusals(
    settings: Settings, conn: Any
) -> None:
    async def two(payload: dict[str, Any], ctx: JobContext) -> list[Any]:
        return [await ctx.wait_for_signal("a"), await ctx.wait_for_signal("b")]

    async with Queue(settings.database_url) as q, running_worker(settings, registry(two=two)):
        result = await q.enqueue("two", {})
        await wait_for_status(conn, result.job_id, "suspended")
        cursor = await conn.execute(
            "SELECT notifyq.signal(%s, 'a', '{\"k\": 1}'::jsonb)", [result.job_id]
        )
        assert (await cursor.fetchone())[0] is True
        await wait_until(
            lambda: _waiting_for(conn, result.job_id, "b"),
        )
        with SyncQueue(settings.database_url) as sync:
            assert await anyio.to_thread.run_sync(sync.signal, result.job_id, "b") is True
        job = await q.wait(result.job_id, timeout=10)
        assert job.result == [{"k": 1}, {}]
        with pytest.raises(SignalRefused, match="has ended"):
            await q.signal(result.job_id, "c")
        with pytest.raises(JobNotFound):
            await q.signal(uuid4(), "c")
        with pytest.raises(InvalidJob, match="JSON object"):
            await q.signal(result.job_id, "c", [1])  # type: ignore[arg-type]
    with pytest.raises(psycopg.errors.NoDataFound):
        await conn.execute("SELECT notifyq.signal(%s, 'a')", [uuid4()])
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        await conn.execute("SELECT notifyq.signal(%s, 'z')", [result.job_id])
    # A repeat of one it got is still a duplicate once it has ended (a webhook's retry).
    cursor = await conn.execute("SELECT notifyq.signal(%s, 'a')", [result.job_id])
    assert (await cursor.fetchone())[0] is False


async def test_a_signal_that_commits_while_the_job_suspends_is_not_lost(
    settings: Settings, conn: Any
) -> None:
    # The handler has read its (empty) signals, and the signal commits before its suspension is
    # written: the suspension finds the signal and puts the job back in the queue at once.
    read = anyio.Event()
    go_on = anyio.Event()
    runs = 0

    async def racy(payload: dict[str, Any], ctx: JobContext) -> Any:
        nonlocal runs
        runs += 1
        await ctx.step("first", lambda: 1)  # reads the job's record: no signal yet
        if runs == 1:
            read.set()
            await go_on.wait()
        return await ctx.wait_for_signal("late")

    slow_poll = settings.model_copy(update={"poll_interval": 60})
    async with Queue(settings.database_url) as q, running_worker(slow_poll, registry(racy=racy)):
        result = await q.enqueue("racy", {})
        await read.wait()
        assert await q.signal(result.job_id, "late", {"n": 7}) is True
        go_on.set()
        job = await q.wait(result.job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED and job.result == {"n": 7} and runs == 2


async def test_suspended_jobs_are_listed_by_status_with_what_they_wait_for(
    settings: Settings, conn: Any
) -> None:
    async def sleepy(payload: dict[str, Any], ctx: JobContext) -> None:
        await ctx.sleep(3600)

    async with (
        api(settings) as client,
        Queue(settings.database_url) as q,
        running_worker(settings, registry(sleepy=sleepy)),
    ):
        result = await q.enqueue("sleepy", {})
        await q.enqueue("echo", {})
        await wait_for_status(conn, result.job_id, "suspended")
        page = (await client.get("/jobs", params={"status": "suspended"})).json()
        assert [job["job_id"] for job in page["jobs"]] == [str(result.job_id)]
        assert page["jobs"][0]["suspended_until"] is not None
        assert page["jobs"][0]["waiting_for_signal"] is None
        found = await client.get("/jobs", params={"status": "suspended", "payload": "{}"})
        assert [job["job_id"] for job in found.json()["jobs"]] == [str(result.job_id)]


async def test_the_archive_moves_a_finished_durable_job_without_its_steps(
    settings: Settings, conn: Any
) -> None:
    async def durable(payload: dict[str, Any], ctx: JobContext) -> None:
        await ctx.step("s", lambda: 1)
        if payload.get("wait"):
            await ctx.wait_for_signal("never")

    archiving = settings.model_copy(update={"archive_after": 3600.0})
    async with (
        Queue(settings.database_url) as q,
        running_worker(settings, registry(durable=durable)),
    ):
        waiting = await q.enqueue("durable", {"wait": True})
        done = await q.enqueue("durable", {})
        await q.wait(done.job_id, timeout=10)
        await wait_for_status(conn, waiting.job_id, "suspended")
        await conn.execute(
            "UPDATE notifyq.jobs SET created_at = now() - interval '1 day',"
            " started_at = now() - interval '1 day'"
        )
        await conn.execute("UPDATE notifyq.jobs_done SET finished_at = now() - interval '1 day'")
        moved = await archive(q.store, archiving)
        assert moved.moved == 1
        archived = await q.get(done.job_id)
        assert archived is not None and archived.archived and archived.steps == []
        assert (await job_row(conn, waiting.job_id) or {})["status"] == "suspended"
    cursor = await conn.execute("SELECT job_id, kind FROM notifyq.job_steps ORDER BY kind", [])
    assert await cursor.fetchall() == [(waiting.job_id, "step"), (waiting.job_id, "wait")]


async def _waiting_for(conn: Any, job_id: Any, name: str) -> bool:
    row = await job_row(conn, job_id)
    return row is not None and row["waiting_for_signal"] == name


async def test_a_job_holds_at_most_100_signal_names(settings: Settings, conn: Any) -> None:
    async with Queue(settings.database_url) as q:
        result = await q.enqueue("echo", {}, delay=3600)
        for n in range(100):
            assert await q.signal(result.job_id, f"s{n}") is True
        assert await q.signal(result.job_id, "s0") is False
        with pytest.raises(SignalRefused, match="100 signals"):
            await q.signal(result.job_id, "one more")


# -- the HTTP API ------------------------------------------------------------------------------


async def test_the_signal_route_and_the_job_fields(settings: Settings, conn: Any) -> None:
    async def wait(payload: dict[str, Any], ctx: JobContext) -> Any:
        await ctx.step("first", lambda: 1)
        return await ctx.wait_for_signal("webhook")

    async with (
        api(settings) as client,
        running_worker(settings, registry(wait=wait)),
    ):
        job_id = (await client.post("/jobs", json={"task": "wait", "payload": {}})).json()["job_id"]
        await wait_for_status(conn, job_id, "suspended")
        shown = (await client.get(f"/jobs/{job_id}")).json()
        assert shown["status"] == "suspended"
        queues = {q["queue"]: q for q in (await client.get("/queues")).json()}
        assert queues["default"]["suspended"] == queues["default"]["waiting_for_signal"] == 1
        scraped = (await client.get("/metrics")).text
        assert 'notifyq_queue_jobs{queue="default",status="suspended"} 1.0' in scraped
        assert shown["waiting_for_signal"] == "webhook" and shown["suspended_until"] is None
        assert [s["name"] for s in shown["steps"]] == ["first"]
        assert shown["steps"][0]["finished_at"]

        sent = await client.post(f"/jobs/{job_id}/signals/webhook", json={"payload": {"ok": 1}})
        assert sent.status_code == 202
        assert sent.json() == {"job_id": job_id, "name": "webhook", "duplicate": False}
        again = await client.post(f"/jobs/{job_id}/signals/webhook")
        assert again.status_code == 200 and again.json()["duplicate"] is True
        await wait_for_status(conn, job_id, "completed")
        done = (await client.get(f"/jobs/{job_id}")).json()
        assert done["result"] == {"ok": 1} and done["waiting_for_signal"] is None
        scraped = (await client.get("/metrics")).text
        assert 'notifyq_signals_total{outcome="sent"} 1.0' in scraped
        assert 'notifyq_signals_total{outcome="duplicate"} 1.0' in scraped

        assert (await client.post(f"/jobs/{job_id}/signals/other")).status_code == 409
        assert (await client.post(f"/jobs/{uuid4()}/signals/x")).status_code == 404
        assert (await client.post("/jobs/nope/signals/x")).status_code == 422
        for bad in ({"payload": [1]}, {"payload": {}, "extra": 1}, {"payload": "x"}):
            answer = await client.post(f"/jobs/{job_id}/signals/x", json=bad)
            assert answer.status_code == 422, bad
        huge = {"payload": {"x": "y" * 70_000}}
        assert (await client.post(f"/jobs/{job_id}/signals/x", json=huge)).status_code == 422
        long_name = "n" * 201
        assert (await client.post(f"/jobs/{job_id}/signals/{long_name}")).status_code == 422
        plain = (await client.post("/jobs", json={"payload": {}})).json()["job_id"]
        await wait_for_status(conn, plain, "completed")
        shown = (await client.get(f"/jobs/{plain}")).json()
        assert shown["steps"] == [] and shown["suspended_until"] is None


# -- how the rest of notifyq treats a suspended job --------------------------------------------


async def test_a_suspended_job_can_be_cancelled_and_its_dependents_follow(
    settings: Settings, conn: Any
) -> None:
    async def wait(payload: dict[str, Any], ctx: JobContext) -> Any:
        return await ctx.wait_for_signal("never")

    async with (
        api(settings) as client,
        Queue(settings.database_url) as q,
        running_worker(settings, registry(wait=wait)),
    ):
        parent = await q.enqueue("wait", {})
        child = await q.enqueue("echo", {}, depends_on=[parent.job_id])
        await wait_for_status(conn, parent.job_id, "suspended")
        # A suspended parent keeps its dependent waiting.
        assert (await job_row(conn, child.job_id) or {})["status"] == "waiting"
        answer = await client.post(f"/jobs/{parent.job_id}/cancel")
        assert answer.status_code == 200 and answer.json()["status"] == "cancelled"
        job = await q.wait(parent.job_id, timeout=5)
        dependent = await q.wait(child.job_id, timeout=5)
    assert job.status is JobStatus.CANCELLED and job.last_error == "cancelled while suspended"
    assert dependent.status is JobStatus.CANCELLED


async def test_a_suspended_group_head_holds_its_group_and_no_concurrency_slot(
    settings: Settings, conn: Any
) -> None:
    order: list[str] = []

    async def solo(payload: dict[str, Any], ctx: JobContext) -> None:
        order.append(payload["name"])
        if payload.get("wait"):
            await ctx.wait_for_signal("go")
        order.append(payload["name"] + " done")

    tasks = worker_registry(Registry([make_task(solo, "solo", max_concurrency=1)]))
    async with Queue(settings.database_url) as q, running_worker(settings, tasks):
        head = await q.enqueue("solo", {"name": "head", "wait": True}, group_key="g")
        behind = await q.enqueue("solo", {"name": "behind"}, group_key="g")
        await wait_for_status(conn, head.job_id, "suspended")
        # max_concurrency=1: a suspended job holds no place in the limit.
        free = await q.enqueue("solo", {"name": "free"})
        assert (await q.wait(free.job_id, timeout=5)).status is JobStatus.COMPLETED
        # But its group waits for it: a later member inserted now is blocked too.
        late = await q.enqueue("solo", {"name": "late"}, group_key="g")
        assert (await job_row(conn, behind.job_id) or {})["status"] == "queued"
        assert (await job_row(conn, late.job_id) or {})["group_blocked"] is True
        await q.signal(head.job_id, "go")
        for job_id in (head.job_id, behind.job_id, late.job_id):
            assert (await q.wait(job_id, timeout=10)).status is JobStatus.COMPLETED
    assert order == [
        *("head", "free", "free done", "head", "head done"),
        *("behind", "behind done", "late", "late done"),
    ]


async def test_retention_never_prunes_a_suspended_job_and_forgets_pruned_steps(
    settings: Settings, conn: Any
) -> None:
    async def durable(payload: dict[str, Any], ctx: JobContext) -> None:
        await ctx.step("s", lambda: 1)
        if payload.get("wait"):
            await ctx.wait_for_signal("never")

    async with (
        Queue(settings.database_url) as q,
        running_worker(settings, registry(durable=durable)),
    ):
        waiting = await q.enqueue("durable", {"wait": True})
        done = await q.enqueue("durable", {})
        await q.signal(done.job_id, "kept until pruned")
        await wait_for_status(conn, waiting.job_id, "suspended")
        await q.wait(done.job_id, timeout=10)
        await conn.execute("UPDATE notifyq.jobs_done SET finished_at = now() - interval '1 day'")
        for status in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED):
            await q.store.prune(status, keep=60)
        assert await q.get(done.job_id) is None
        assert (await job_row(conn, waiting.job_id) or {})["status"] == "suspended"
    cursor = await conn.execute(
        "SELECT (SELECT count(*) FROM notifyq.job_steps WHERE job_id = %(d)s),"
        " (SELECT count(*) FROM notifyq.job_signals WHERE job_id = %(d)s),"
        " (SELECT count(*) FROM notifyq.job_steps WHERE job_id = %(w)s AND kind = 'step')",
        {"d": done.job_id, "w": waiting.job_id},
    )
    assert await cursor.fetchone() == (0, 0, 1)


async def test_an_insert_cannot_make_a_suspended_job(settings: Settings, conn: Any) -> None:
    with pytest.raises(psycopg.errors.CheckViolation):
        await conn.execute(
            "INSERT INTO notifyq.jobs (task, payload, status) VALUES ('echo', '{}', 'suspended')"
        )
    with pytest.raises(psycopg.errors.CheckViolation):
        await conn.execute(
            "INSERT INTO notifyq.jobs (task, payload, waiting_for_signal)"
            " VALUES ('echo', '{}', 'x')"
        )


# -- the documentation -------------------------------------------------------------------------


def test_the_durable_jobs_page_example_runs_as_printed(db_url: str, tmp_path: Path) -> None:
    (tmp_path / "onboarding.py").write_text(readme_block("# onboarding.py"))
    env = notifyq_env(db_url, NOTIFYQ_IMPORT="onboarding", PYTHONPATH=f"{tmp_path}:{ROOT}")
    with processes(tmp_path) as start, psycopg.connect(db_url, autocommit=True) as conn:
        worker = start("worker", env=env, cwd=tmp_path)
        worker.wait_for_output("ready")
        job_id = conn.execute(
            'SELECT notifyq.enqueue(\'onboard\', \'{"email": "ann@example.com", '
            '"nudge_after": 0.3}\')'
        ).fetchone()
        assert job_id is not None

        def status() -> tuple[Any, ...] | None:
            return conn.execute(
                "SELECT status, waiting_for_signal FROM notifyq.jobs WHERE id = %s", job_id
            ).fetchone()

        deadline = time.monotonic() + 30
        while status() != ("suspended", "survey"):
            assert time.monotonic() < deadline, (status(), worker.output())
            time.sleep(0.02)
        assert conn.execute(readme_block("SELECT notifyq.signal(id, 'survey'")).fetchall() == [
            (True,)
        ]
        while (row := status()) is not None and row[0] != "completed":
            assert time.monotonic() < deadline, (row, worker.output())
            time.sleep(0.02)
        result = conn.execute("SELECT result FROM notifyq.jobs WHERE id = %s", job_id).fetchone()
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output()
    assert result == ({"account": {"account": "ann"}, "survey": {"score": 9}},)


async def test_a_cancel_asked_while_the_handler_ran_reaches_it_when_it_suspends(
    settings: Settings, conn: Any
) -> None:
    asked = anyio.Event()
    go_on = anyio.Event()

    async def wait(payload: dict[str, Any], ctx: JobContext) -> Any:
        asked.set()
        await go_on.wait()
        return await ctx.wait_for_signal("never")

    async with Queue(settings.database_url) as q, running_worker(settings, registry(wait=wait)):
        parent = await q.enqueue("wait", {})
        child = await q.enqueue("echo", {}, depends_on=[parent.job_id])
        await asked.wait()
        # Asked as the API asks, but without the notification that stops a handler at once: the
        # handler goes on to suspend its job, and the suspension ends it cancelled.
        await conn.execute(
            "UPDATE notifyq.jobs SET cancel_requested_at = now() WHERE id = %s", [parent.job_id]
        )
        go_on.set()
        job = await q.wait(parent.job_id, timeout=10)
        dependent = await q.wait(child.job_id, timeout=10)
    assert job.status is JobStatus.CANCELLED and job.last_error == "cancelled while suspended"
    assert dependent.status is JobStatus.CANCELLED
