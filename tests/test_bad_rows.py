"""One bad row never stops the queue: the contract's "Safe by default" for data that arrives by SQL.

A row inserted by plain SQL is untrusted input. Whatever it holds (JSON nested thousands deep, a
number of 5,000 digits, a time of 'infinity', columns only workers may set), it can fail its own
job and nothing else: every worker and the API keep serving every other job.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import psycopg
import pytest

from notifyq.api import create_app
from notifyq.builtins import worker_registry
from notifyq.client import Queue
from notifyq.errors import InvalidJob
from notifyq.migrations import _apply_missing, load_migrations
from notifyq.settings import Settings
from notifyq.tasks import Registry, make_task
from notifyq.worker import Worker
from tests.helpers import (
    count_by_status,
    insert_in_state,
    job_row,
    registry,
    running_worker,
    wait_for_status,
    wait_until,
)

JSON = {"content-type": "application/json"}

#: A payload jsonb stores happily and Python's decoder cannot read (RecursionError).
DEEP = "('{\"a\": ' || repeat('[', 3000) || repeat(']', 3000) || '}')::jsonb"
#: A payload with a number of 5,000 digits: Python refuses to read it (ValueError).
HUGE_NUMBER = "('{\"n\": ' || repeat('7', 5000) || '}')::jsonb"


async def status_of(conn: Any, job_id: Any) -> dict[str, Any]:
    """The job's status, attempts and error, read without its payload (which this test's own
    connection, with psycopg's plain loaders, could not decode)."""
    cursor = conn.cursor(row_factory=psycopg.rows.dict_row)
    await cursor.execute(
        "SELECT status, attempt_count, last_error FROM notifyq.jobs WHERE id = %s", [job_id]
    )
    row: dict[str, Any] = await cursor.fetchone()
    return row


async def has_status(conn: Any, job_id: Any, status: str) -> bool:
    return (await status_of(conn, job_id))["status"] == status


async def scalar(conn: Any, query: str, params: list[Any] | None = None) -> Any:
    cursor = await conn.execute(query, params)
    row = await cursor.fetchone()
    return None if row is None else row[0]


@contextlib.asynccontextmanager
async def api(settings: Settings, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"run_worker": False, **overrides}))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client,
    ):
        yield client


# -- poison rows --------------------------------------------------------------------------


@pytest.mark.parametrize("payload", [DEEP, HUGE_NUMBER], ids=["deep", "huge-number"])
@pytest.mark.parametrize("way", ["insert", "notifyq.enqueue"])
async def test_a_payload_python_cannot_read_fails_its_job_and_the_worker_runs_the_rest(
    settings: Settings, conn: Any, payload: str, way: str
) -> None:
    if way == "insert":
        poison = await scalar(
            conn,
            f"INSERT INTO notifyq.jobs (task, payload) VALUES ('echo', {payload}) RETURNING id",
        )
    else:
        poison = await scalar(conn, f"SELECT notifyq.enqueue('echo', {payload}::jsonb)")
    good = [
        await scalar(
            conn, "INSERT INTO notifyq.jobs (task, payload) VALUES ('echo', %s) RETURNING id", [n]
        )
        for n in ('{"n": 1}', '{"n": 2}', '{"n": 3}')
    ]
    # A burst worker returns when nothing is due: it must come back, not raise.
    with anyio.fail_after(20):
        await Worker(settings, burst=True).run()
    row = await status_of(conn, poison)
    assert row["status"] == "failed", row
    assert row["attempt_count"] == 1, "failed at once, without retries"
    assert "payload cannot be used" in row["last_error"]
    for job_id in good:
        assert (await job_row(conn, job_id))["status"] == "completed"  # type: ignore[index]


async def test_reading_jobs_never_fails_because_of_one_stored_row(
    settings: Settings, conn: Any
) -> None:
    deep = await scalar(
        conn, f"INSERT INTO notifyq.jobs (task, payload) VALUES ('echo', {DEEP}) RETURNING id"
    )
    huge = await scalar(
        conn,
        f"INSERT INTO notifyq.jobs (task, payload) VALUES ('echo', {HUGE_NUMBER}) RETURNING id",
    )
    async with api(settings) as client:
        listed = await client.get("/jobs", params={"limit": 50, "include": "payload"})
        one = await client.get(f"/jobs/{deep}")
        other = await client.get(f"/jobs/{huge}")
    assert listed.status_code == 200, listed.text
    assert one.status_code == 200, one.text
    assert other.status_code == 200, other.text
    assert "nests too deeply" in one.json()["payload"]["undecodable"]
    assert "5000 digits" in other.json()["payload"]["undecodable"]


async def test_the_worker_inside_the_api_survives_a_poison_row(
    settings: Settings, conn: Any
) -> None:
    app = create_app(settings.model_copy(update={"run_worker": True}))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client,
    ):
        poison = await scalar(
            conn, f"INSERT INTO notifyq.jobs (task, payload) VALUES ('echo', {DEEP}) RETURNING id"
        )
        await wait_until(lambda: has_status(conn, poison, "failed"), timeout=10)
        posted = await client.post("/jobs", json={"task": "echo", "payload": {"n": 1}})
        assert posted.status_code == 201, posted.text
        await wait_for_status(conn, posted.json()["job_id"], "completed")
        health = await client.get("/health")
        ready = await client.get("/ready")
    assert health.status_code == 200, health.text
    assert ready.status_code == 200, ready.text


async def test_unreadable_payloads_are_refused_on_every_way_in_from_python_and_http(
    settings: Settings, conn: Any
) -> None:
    deep: Any = {}
    for _ in range(3000):
        deep = {"a": deep}
    huge = "1" * 5000
    async with api(settings) as client:
        one = await client.post(
            "/jobs", content=b'{"payload": {"n": ' + huge.encode() + b"}}", headers=JSON
        )
        nested = await client.post(
            "/jobs", content=b'{"payload": ' + b'{"a": ' * 3000 + b"{}" + b"}" * 3001, headers=JSON
        )
        batch = await client.post(
            "/jobs/batch",
            content=b'{"jobs": [{"payload": {}}, {"payload": {"n": ' + huge.encode() + b"}}]}",
            headers=JSON,
        )
        after = await client.post("/jobs", json={"payload": {"ok": True}})
    assert one.status_code == 422, one.text
    assert nested.status_code == 422, nested.text
    assert batch.status_code == 422, batch.text
    assert after.status_code == 201
    async with Queue(settings=settings) as q:
        with pytest.raises(InvalidJob):
            await q.enqueue("echo", deep)
        with pytest.raises(InvalidJob):
            await q.enqueue_many(
                [{"task": "echo", "payload": {}}, {"task": "echo", "payload": deep}]
            )
    assert await count_by_status(conn) == {"queued": 1}


# -- rows a producer may not write ----------------------------------------------------------


@pytest.mark.parametrize(
    ("columns", "values", "named"),
    [
        ("status, lease_expires_at", "'processing', NULL", "status"),
        (
            "status, lease_expires_at, worker_id",
            "'processing', 'infinity', 'w'",
            "lease_expires_at",
        ),
        ("status, result", "'completed', '{\"forged\": true}'", "result"),
        ("attempt_count", "2", "attempt_count"),
        ("errors, last_error", "'[{\"x\": 1}]', 'no'", "errors"),
        ("started_at, finished_at", "now(), now()", "finished_at"),
    ],
)
async def test_an_insert_may_not_set_what_only_workers_write(
    conn: Any, columns: str, values: str, named: str
) -> None:
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        await conn.execute(f"INSERT INTO notifyq.jobs (task, {columns}) VALUES ('echo', {values})")
    assert named in str(refused.value)
    assert "set by notifyq's workers" in str(refused.value)
    assert await count_by_status(conn) == {}


async def test_copy_is_held_to_the_same_rules(conn: Any) -> None:
    with pytest.raises(psycopg.errors.CheckViolation):
        async with conn.cursor().copy("COPY notifyq.jobs (task, status) FROM STDIN") as copy:
            await copy.write_row(("echo", "completed"))
    assert await count_by_status(conn) == {}


async def test_a_processing_row_without_a_lease_is_rescued_and_run(
    settings: Settings, conn: Any
) -> None:
    (job_id,) = await insert_in_state(conn, status="'processing'", attempt_count="1")
    async with running_worker(settings.model_copy(update={"lease_seconds": 3})):
        row = await wait_for_status(conn, job_id, "completed", timeout=10)
    assert "lease expired" in row["errors"][0]["error"]


async def test_a_processing_row_without_a_lease_holds_no_concurrency_slot(
    settings: Settings, conn: Any
) -> None:
    async def solo(payload: dict[str, Any]) -> str:
        return "ran"

    await insert_in_state(conn, "solo", status="'processing'", attempt_count="1")
    tasks = worker_registry(Registry([make_task(solo, "solo", max_concurrency=1)]))
    # Lease 30 s: the first rescue comes after a heartbeat (7.5 s); the job must run before.
    async with running_worker(settings, tasks):
        job_id = await scalar(conn, "INSERT INTO notifyq.jobs (task) VALUES ('solo') RETURNING id")
        await wait_for_status(conn, job_id, "completed", timeout=4)


# -- times ---------------------------------------------------------------------------------


@pytest.mark.parametrize("moment", ["infinity", "-infinity", "20000-01-01", "0044-03-15 BC"])
async def test_a_time_python_cannot_hold_is_refused_with_a_clear_error(
    conn: Any, moment: str
) -> None:
    with pytest.raises(psycopg.errors.DatetimeFieldOverflow) as by_function:
        await conn.execute(
            "SELECT notifyq.enqueue('echo', '{}', run_at => %s::timestamptz)", [moment]
        )
    with pytest.raises(psycopg.errors.DatetimeFieldOverflow) as by_insert:
        await conn.execute(
            "INSERT INTO notifyq.jobs (task, run_at) VALUES ('echo', %s::timestamptz)", [moment]
        )
    for refused in (by_function, by_insert):
        assert "run_at must be a finite time" in str(refused.value)
    assert await count_by_status(conn) == {}


async def test_rows_written_before_this_version_are_read_and_cancelled_without_errors(
    empty_db_url: str,
) -> None:
    """A database that holds an 'infinity' run_at and an unreadable payload from an earlier
    version: after the upgrade every job can be listed, read and cancelled."""
    migrations = load_migrations()
    async with await psycopg.AsyncConnection.connect(empty_db_url, autocommit=True) as conn:
        await _apply_missing(conn, [m for m in migrations if m.version <= 2], lambda _: None)
        forever = await scalar(
            conn,
            "INSERT INTO notifyq.jobs (task, run_at) VALUES ('echo', 'infinity') RETURNING id",
        )
        await conn.execute(
            "INSERT INTO notifyq.jobs (task, status, finished_at) "
            "VALUES ('echo', 'completed', 'infinity')"
        )
        await conn.execute(f"INSERT INTO notifyq.jobs (task, payload) VALUES ('echo', {DEEP})")
        await _apply_missing(conn, migrations, lambda _: None)
    settings = Settings.load(database_url=empty_db_url, auto_migrate=False)
    async with api(settings) as client:
        listed = await client.get("/jobs")
        read = await client.get(f"/jobs/{forever}")
        cancelled = await client.post(f"/jobs/{forever}/cancel")
    assert listed.status_code == 200, listed.text
    assert len(listed.json()["jobs"]) == 3
    assert read.status_code == 200, read.text
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"


# -- the SQL path gets the task's defaults --------------------------------------------------


async def test_every_way_in_gives_a_job_its_tasks_queue_and_priority(
    settings: Settings, conn: Any
) -> None:
    async def mailer(payload: dict[str, Any]) -> str:
        return "sent"

    mail = worker_registry(Registry([make_task(mailer, "mailer", queue="mail", priority=7)]))
    # A worker that serves the task registers it: from then on the database knows its options.
    await Worker(settings, mail, burst=True).run()
    ids = [
        await scalar(
            conn, "INSERT INTO notifyq.jobs (task, payload) VALUES ('mailer', '{}') RETURNING id"
        ),
        await scalar(
            conn, 'INSERT INTO notifyq.jobs (payload) VALUES (\'{"task": "mailer"}\') RETURNING id'
        ),
        await scalar(conn, "SELECT notifyq.enqueue('mailer', '{}')"),
        await scalar(conn, "SELECT notifyq.enqueue('mailer', '{}', dedup_key => 'k')"),
    ]
    async with Queue(settings=settings) as q:
        ids.append((await q.enqueue("mailer", {})).job_id)
        ids += [r.job_id for r in await q.enqueue_many([{"task": "mailer"}] * 300)]
        deduplicated = [{"task": "mailer", "dedup_key": "b"}, {"task": "mailer"}]
        ids += [r.job_id for r in await q.enqueue_many(deduplicated)]
    async with api(settings) as client:
        ids.append(
            (await client.post("/jobs", json={"task": "mailer", "payload": {}})).json()["job_id"]
        )
        ids.append(
            (await client.post("/jobs", json={"payload": {"task": "mailer"}})).json()["job_id"]
        )
        batch = await client.post("/jobs/batch", json={"jobs": [{"task": "mailer", "payload": {}}]})
        ids.append(batch.json()["results"][0]["job_id"])
    cursor = await conn.execute(
        "SELECT DISTINCT queue, priority FROM notifyq.jobs WHERE id::text = ANY(%s)",
        [[str(i) for i in ids]],
    )
    assert await cursor.fetchall() == [("mail", 7)]
    explicit = await scalar(
        conn, "SELECT notifyq.enqueue('mailer', '{}', queue => 'other', priority => 1)"
    )
    row = await job_row(conn, explicit)
    assert row is not None and (row["queue"], row["priority"]) == ("other", 1)
    # A worker that serves only the task's queue runs every one of them.
    only_mail = settings.model_copy(update={"queues": ["mail"]})
    await Worker(only_mail, mail, burst=True).run()
    assert await scalar(
        conn,
        "SELECT count(*) FROM notifyq.jobs WHERE id::text = ANY(%s) AND status = 'completed'",
        [[str(i) for i in ids]],
    ) == len(ids)


# -- cancelling rows no live worker holds ---------------------------------------------------


@pytest.mark.parametrize("lease", ["NULL", "now() - interval '5 seconds'"], ids=["none", "expired"])
async def test_cancelling_a_processing_job_no_live_worker_holds_cancels_it_at_once(
    settings: Settings, conn: Any, lease: str
) -> None:
    (job_id,) = await insert_in_state(
        conn,
        status="'processing'",
        attempt_count="1",
        worker_id="'gone:1:x'",
        lease_expires_at=lease,
    )
    async with api(settings) as client:
        answer = await client.post(f"/jobs/{job_id}/cancel")
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "cancelled"
    row = await job_row(conn, job_id)
    assert row is not None and row["status"] == "cancelled"
    assert "no live worker" in row["last_error"]


async def test_cancelling_a_job_a_live_worker_runs_asks_it_to_stop(
    settings: Settings, conn: Any
) -> None:
    started = anyio.Event()

    async def long(payload: dict[str, Any]) -> None:
        started.set()
        await anyio.sleep(60)

    async with running_worker(settings, registry(long=long)), api(settings) as client:
        job_id = await scalar(conn, "INSERT INTO notifyq.jobs (task) VALUES ('long') RETURNING id")
        with anyio.fail_after(10):
            await started.wait()
        answer = await client.post(f"/jobs/{job_id}/cancel")
        assert answer.status_code == 202, answer.text
        await wait_for_status(conn, job_id, "cancelled")
