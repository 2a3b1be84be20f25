"""The jobs API beyond submit and read: batch, cancel, delete, queues, pause, readiness."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import psycopg

from notifyq.api import create_app
from notifyq.builtins import worker_registry
from notifyq.db import open_pool
from notifyq.retry import Backoff
from notifyq.settings import Settings
from notifyq.store import Store
from notifyq.tasks import Registry, make_task
from notifyq.worker import Worker
from tests.helpers import insert_in_state, job_row, running_worker, wait_for_status, wait_until


@contextlib.asynccontextmanager
async def api(settings: Settings, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"run_worker": False, **overrides}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as client,
    ):
        yield client


async def test_batch_enqueues_in_order_in_one_request(settings: Settings, conn: Any) -> None:
    jobs = [{"payload": {"i": i}, "priority": i % 4} for i in range(300)]
    jobs[5] = {"payload": {"v": 1}, "dedup_key": "k"}
    jobs[9] = {"payload": {"v": 2}, "dedup_key": "k"}
    async with api(settings) as client:
        answer = await client.post("/jobs/batch", json={"jobs": jobs})
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        bad = await client.post("/jobs/batch", json={"jobs": [{"payload": {}}, {"payload": [1]}]})
        empty = await client.post("/jobs/batch", json={"jobs": []})
    assert len(results) == 300
    assert results[9]["job_id"] == results[5]["job_id"] and results[9]["duplicate"]
    cursor = await conn.execute("SELECT count(*) FROM notifyq.jobs")
    assert (await cursor.fetchone())[0] == 299
    row = await job_row(conn, results[7]["job_id"])
    assert row is not None and (row["payload"], row["priority"]) == ({"i": 7}, 3)
    # One malformed job refuses the whole batch, naming its position.
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][:3] == ["body", "jobs", 1]
    assert empty.status_code == 422


async def test_a_late_malformed_job_in_a_large_batch_stores_none(
    settings: Settings, conn: Any
) -> None:
    """A large batch is inserted chunk by chunk while the rest is checked; a job refused after
    the first chunks went in still rolls the whole batch back."""
    jobs: list[dict[str, Any]] = [{"task": "echo", "payload": {"i": i}} for i in range(600)]
    jobs[590] = {"task": "echo", "payload": {"text": "a\u0000b"}}
    async with api(settings) as client:
        bad = await client.post("/jobs/batch", json={"jobs": jobs})
        jobs[590] = {"task": "echo", "payload": {"i": 590}}
        good = await client.post("/jobs/batch", json={"jobs": jobs})
    assert bad.status_code == 422, bad.text
    assert bad.json()["detail"][0]["loc"][:3] == ["body", "jobs", 590]
    assert good.status_code == 200, good.text
    results = good.json()["results"]
    cursor = await conn.execute("SELECT id::text, payload FROM notifyq.jobs")
    stored = dict(await cursor.fetchall())
    assert len(stored) == 600
    assert [stored[result["job_id"]]["i"] for result in results] == list(range(600))


async def test_cancel_a_queued_job(settings: Settings, conn: Any) -> None:
    async with api(settings) as client:
        job_id = (await client.post("/jobs", json={"payload": {}})).json()["job_id"]
        answer = await client.post(f"/jobs/{job_id}/cancel")
        again = await client.post(f"/jobs/{job_id}/cancel")
        missing = await client.post("/jobs/00000000-0000-0000-0000-000000000001/cancel")
    assert answer.status_code == 200 and answer.json()["status"] == "cancelled"
    assert again.status_code == 409
    assert missing.status_code == 404
    # It never runs.
    await Worker(settings, burst=True).run()
    row = await job_row(conn, job_id)
    assert row is not None and row["status"] == "cancelled" and row["attempt_count"] == 0


async def test_cancel_stops_a_running_handler(settings: Settings, conn: Any) -> None:
    started = anyio.Event()
    stopped = anyio.Event()

    async def endless(payload: dict[str, Any]) -> None:
        started.set()
        try:
            await anyio.sleep(3600)
        finally:
            stopped.set()

    tasks = worker_registry(Registry([make_task(endless)]))
    async with running_worker(settings, tasks) as worker, api(settings) as client:
        job_id = (await client.post("/jobs", json={"task": "endless", "payload": {}})).json()[
            "job_id"
        ]
        with anyio.fail_after(5):
            await started.wait()
        answer = await client.post(f"/jobs/{job_id}/cancel")
        assert answer.status_code == 202
        assert answer.json()["cancel_requested_at"] is not None
        with anyio.fail_after(5):
            await stopped.wait()
        row = await wait_for_status(conn, job_id, "cancelled")
    assert "cancelled while running" in row["last_error"]
    assert worker.stats.cancelled == 1


async def test_a_slot_runs_its_next_job_normally_after_a_cancel(
    settings: Settings, conn: Any
) -> None:
    # One slot, so every job goes through the same runner: a cancel must end with the job it
    # was meant for, whether the handler let it through or swallowed it and returned.
    started: list[str] = []
    gate = anyio.Event()

    async def endless(payload: dict[str, Any]) -> str:
        started.append(payload["name"])
        gate.set()
        try:
            await anyio.sleep(3600)
        except BaseException:
            if payload.get("swallow"):
                return "swallowed"  # a handler that ignores the cancel
            raise
        return "slept"

    async def quick(payload: dict[str, Any]) -> dict[str, Any]:
        await anyio.sleep(0.01)  # awaits, where a stray cancel would land
        return {"ok": payload["name"]}

    tasks = worker_registry(Registry([make_task(endless), make_task(quick)]))
    one_slot = settings.model_copy(update={"concurrency": 1})
    async with running_worker(one_slot, tasks) as worker, api(settings) as client:
        for name, swallow in (("first", False), ("second", True)):
            gate = anyio.Event()
            body = {"task": "endless", "payload": {"name": name, "swallow": swallow}}
            job_id = (await client.post("/jobs", json=body)).json()["job_id"]
            with anyio.fail_after(5):
                await gate.wait()
            assert (await client.post(f"/jobs/{job_id}/cancel")).status_code == 202
            expected = "completed" if swallow else "cancelled"
            await wait_for_status(conn, job_id, expected, timeout=5)
            after = await client.post("/jobs", json={"task": "quick", "payload": {"name": name}})
            row = await wait_for_status(conn, after.json()["job_id"], "completed", timeout=5)
            assert row["result"] == {"ok": name}
    assert started == ["first", "second"]
    assert worker.stats.cancelled == 1 and worker.stats.completed == 3


async def test_a_cancel_is_delivered_again_and_spares_shielded_sections(
    settings: Settings, conn: Any
) -> None:
    # A handler that shrugs off the first cancellation is cancelled again at its next await;
    # a section it shields (a connection being closed, say) is not cut short.
    shielded_done = anyio.Event()
    started = anyio.Event()
    seen: list[str] = []

    async def stubborn(payload: dict[str, Any]) -> str:
        started.set()
        try:
            await anyio.sleep(3600)
        except BaseException:
            seen.append("first cancel")
            with anyio.CancelScope(shield=True):
                await anyio.sleep(0.2)
                shielded_done.set()
        await anyio.sleep(3600)  # cancelled again here
        return "not reached"

    tasks = worker_registry(Registry([make_task(stubborn)]))
    async with running_worker(settings, tasks) as worker, api(settings) as client:
        job_id = (await client.post("/jobs", json={"task": "stubborn", "payload": {}})).json()[
            "job_id"
        ]
        with anyio.fail_after(5):
            await started.wait()
        assert (await client.post(f"/jobs/{job_id}/cancel")).status_code == 202
        row = await wait_for_status(conn, job_id, "cancelled", timeout=5)
    assert shielded_done.is_set() and seen == ["first cancel"]
    assert row["result"] is None and worker.stats.cancelled == 1


async def test_a_cancel_whose_notification_was_lost_is_seen_by_the_heartbeat(
    settings: Settings, conn: Any
) -> None:
    started = anyio.Event()

    async def endless(payload: dict[str, Any]) -> None:
        started.set()
        await anyio.sleep(3600)

    tasks = worker_registry(Registry([make_task(endless)]))
    fast_beat = settings.model_copy(update={"lease_seconds": 3})
    async with running_worker(fast_beat, tasks):
        cursor = await conn.execute("SELECT notifyq.enqueue('endless', '{}')")
        job_id = (await cursor.fetchone())[0]
        with anyio.fail_after(5):
            await started.wait()
        # What cancel_job does, minus the notification.
        await conn.execute(
            "UPDATE notifyq.jobs SET cancel_requested_at = now() WHERE id = %s", [job_id]
        )
        await wait_for_status(conn, job_id, "cancelled", timeout=5)


async def test_a_cancelled_job_of_a_dead_worker_is_not_requeued(
    settings: Settings, conn: Any
) -> None:
    (job_id,) = await insert_in_state(
        conn,
        status="'processing'",
        attempt_count="1",
        worker_id="'gone:1:x'",
        lease_expires_at="now() - interval '1 s'",
        cancel_requested_at="now()",
    )
    async with running_worker(settings.model_copy(update={"lease_seconds": 3})):
        await wait_for_status(conn, job_id, "cancelled", timeout=10)


async def test_delete_only_finished_jobs(settings: Settings, conn: Any) -> None:
    async with api(settings) as client:
        queued = (await client.post("/jobs", json={"payload": {}})).json()["job_id"]
        refused = await client.delete(f"/jobs/{queued}")
        await client.post(f"/jobs/{queued}/cancel")
        deleted = await client.delete(f"/jobs/{queued}")
        gone = await client.get(f"/jobs/{queued}")
        missing = await client.delete(f"/jobs/{queued}")
    assert refused.status_code == 409
    assert deleted.status_code == 204
    assert gone.status_code == 404 and missing.status_code == 404


async def test_queue_counts_and_pause(settings: Settings, conn: Any) -> None:
    await conn.execute("INSERT INTO notifyq.jobs (task, queue) VALUES ('echo', 'mail')")
    await conn.execute("INSERT INTO notifyq.jobs (task, queue) VALUES ('echo', 'mail')")
    await insert_in_state(conn, queue="'mail'", status="'completed'", finished_at="now()")
    await insert_in_state(conn, queue="'mail'", status="'failed'")
    async with api(settings) as client:
        queues = {q["queue"]: q for q in (await client.get("/queues")).json()}
        paused = await client.post("/queues/mail/pause")
        assert paused.status_code == 200 and paused.json()["paused"] is True
        await Worker(settings, burst=True).run()
        cursor = await conn.execute(
            "SELECT count(*) FROM notifyq.jobs WHERE queue = 'mail' AND status = 'queued'"
        )
        assert (await cursor.fetchone())[0] == 2  # paused: nothing claimed
        async with running_worker(settings):
            resumed = await client.post("/queues/mail/resume")
            assert resumed.json()["paused"] is False

            async def drained() -> bool:
                cursor = await conn.execute(
                    "SELECT count(*) FROM notifyq.jobs WHERE status = 'queued'"
                )
                return (await cursor.fetchone())[0] == 0  # type: ignore[index]

            await wait_until(drained, timeout=5)  # resume wakes the worker (poll is 30 s)
        bad = await client.post("/queues/%00/pause")
    mail = queues["mail"]
    assert (mail["queued"], mail["completed"], mail["failed"], mail["due"]) == (2, 1, 1, 2)
    assert mail["completed_estimated"] is False
    assert mail["completed_last_minute"] == 1
    assert mail["oldest_due_seconds"] is not None
    assert bad.status_code == 422


async def test_queue_counts_are_estimated_on_a_large_table(settings: Settings, db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await insert_in_state(conn, count=20000, status="'completed'", finished_at="now()")
        await conn.execute("ANALYZE notifyq.jobs_done")
    async with open_pool(settings, name="t") as pool:
        rows = await Store(pool).queue_stats(exact_below=1000, sample_percent=50)
    (row,) = rows
    assert row["completed_estimated"] is True
    assert 12_000 < row["completed"] < 28_000


async def test_ready_reports_each_part(settings: Settings, conn: Any) -> None:
    async with api(settings) as client:
        alone = await client.get("/ready")
    assert alone.status_code == 200
    assert alone.json()["listener"] == "no worker in this process"
    app = create_app(settings.model_copy(update={"run_worker": True}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as client,
    ):
        answer = await client.get("/ready")
        assert answer.status_code == 200 and answer.json()["listener"] == "ok"
        await conn.execute(
            "DELETE FROM notifyq.migrations WHERE version = (SELECT max(version) "
            "FROM notifyq.migrations)"
        )
        stale = await client.get("/ready")
    assert stale.status_code == 503
    assert "this notifyq needs" in stale.json()["migrations"]


async def test_cors_is_off_unless_configured(settings: Settings) -> None:
    headers = {"Origin": "https://ops.example", "Access-Control-Request-Method": "POST"}
    async with api(settings) as client:
        closed = await client.options("/jobs", headers=headers)
    async with api(settings, cors_origins=["https://ops.example"]) as client:
        opened = await client.options("/jobs", headers=headers)
    assert "access-control-allow-origin" not in closed.headers
    assert opened.headers["access-control-allow-origin"] == "https://ops.example"


async def test_list_pages_leave_job_data_out_unless_asked(settings: Settings) -> None:
    blob = {"blob": "x" * 10_000}
    async with api(settings) as client:
        done = (await client.post("/jobs", json={"task": "echo", "payload": blob})).json()
        failing = {"task": "fail", "payload": {"message": "nope"}, "max_attempts": 1}
        failed = (await client.post("/jobs", json=failing)).json()
        await Worker(settings, burst=True).run()
        plain = (await client.get("/jobs")).json()["jobs"]
        some = (await client.get("/jobs", params={"include": " payload , errors"})).json()
        every = (await client.get("/jobs", params={"include": "payload,result,errors"})).json()
        single = {
            job_id: (await client.get(f"/jobs/{job_id}")).json()
            for job_id in (done["job_id"], failed["job_id"])
        }
        bad = await client.get("/jobs", params={"include": "payload,secrets"})
    assert len(plain) == 2
    for job in plain:
        assert not {"payload", "result", "errors"} & set(job), job
        assert job == {k: v for k, v in single[job["job_id"]].items() if k in job}
    assert next(j for j in plain if j["status"] == "failed")["error"].startswith("RuntimeError")
    for job in some["jobs"]:
        assert "payload" in job and "errors" in job and "result" not in job
    assert {job["job_id"]: job for job in every["jobs"]} == single
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["query", "include"]
    assert "secrets" in bad.json()["detail"][0]["msg"]


async def test_a_job_that_completes_on_a_retry_has_no_error_but_keeps_its_attempts(
    settings: Settings, conn: Any
) -> None:
    """`error` is the error of a job that has one: null once it completed, whatever an earlier
    attempt said. Every failed attempt stays in `errors`, and a job that failed for good keeps
    its last error."""
    attempts = 0

    async def flaky(payload: dict[str, Any]) -> str:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise RuntimeError("first attempt: upstream said no")
        return "fine"

    tasks = worker_registry(
        Registry([make_task(flaky, "flaky", max_attempts=3, backoff=Backoff(base=0))])
    )
    async with running_worker(settings, tasks), api(settings) as client:
        ok = (await client.post("/jobs", json={"task": "flaky", "payload": {}})).json()["job_id"]
        bad = await client.post(
            "/jobs", json={"task": "fail", "payload": {"message": "no"}, "max_attempts": 1}
        )
        await wait_for_status(conn, ok, "completed")
        await wait_for_status(conn, bad.json()["job_id"], "failed")
        job = (await client.get(f"/jobs/{ok}")).json()
        failed = (await client.get(f"/jobs/{bad.json()['job_id']}")).json()
    assert (job["status"], job["result"], job["attempt_count"]) == ("completed", "fine", 2)
    assert job["error"] is None
    assert [e["attempt"] for e in job["errors"]] == [1]
    assert "upstream said no" in job["errors"][0]["error"]
    assert failed["status"] == "failed" and "no" in failed["error"]
    row = await job_row(conn, ok)
    assert row is not None and row["last_error"] is None  # the column, for psql users too
