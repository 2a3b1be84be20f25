"""The HTTP API (``create_app``) against a real PostgreSQL: the contract's "HTTP API" section.

Every test gets its own migrated database (``db_url``). The app runs its real lifespan (pool, and
the in-process worker when ``run_worker`` is on) and is reached through httpx's ASGI transport,
with ``raise_app_exceptions=False`` so that an unhandled error shows up as the 500 a real client
would see.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import anyio
import httpx
import psycopg
import pytest
from psycopg import sql
from pydantic import SecretStr

from notifyq.api import create_app
from notifyq.models import MAX_DEPTH
from notifyq.settings import Settings
from notifyq.tasks import Registry
from tests.helpers import job_row, registry, url_with_dbname, wait_for_status, wait_until

JSON = {"content-type": "application/json"}
MIB = 1024 * 1024
CONTRACT_FIELDS = {
    "job_id",
    "status",
    "task",
    "queue",
    "priority",
    "payload",
    "attempt_count",
    "max_attempts",
    "result",
    "error",
    "created_at",
    "run_at",
    "started_at",
    "finished_at",
}
JOB_IN_FIELDS = {
    "payload",
    "task",
    "queue",
    "priority",
    "run_at",
    "delay",
    "max_attempts",
    "dedup_key",
    "fair_key",
    "on_conflict",
    "debounce",
    "depends_on",
    "group_key",
}

Serve = Callable[..., contextlib.AbstractAsyncContextManager[httpx.AsyncClient]]


# -- fixtures -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(
    settings: Settings, tasks: Registry | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """The app built from ``settings`` with its lifespan running, and a client talking to it."""
    app = create_app(settings, registry=tasks)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            yield client


@pytest.fixture
def serve(settings: Settings) -> Serve:
    """``async with serve(**overrides) as client``: the app on this test's database.

    A factory rather than a yielding fixture because the lifespan opens an anyio task group
    (the in-process worker), which must be entered and exited in the test's own task. The
    defaults are ``create_app``'s: a worker runs unless ``run_worker=False``.
    """

    def start(
        tasks: Registry | None = None, **overrides: Any
    ) -> contextlib.AbstractAsyncContextManager[httpx.AsyncClient]:
        return serving(settings.model_copy(update={"run_worker": True, **overrides}), tasks)

    return start


@contextlib.asynccontextmanager
async def hosted(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """``serving(settings)`` entered and exited in a task of its own.

    pytest-asyncio sets a fixture up and tears it down in different tasks, and anyio refuses
    to exit a task group (which the lifespan may open) outside the task that entered it.
    """
    entered: asyncio.Future[httpx.AsyncClient] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()

    async def host() -> None:
        try:
            async with serving(settings) as c:
                entered.set_result(c)
                await stop.wait()
        except BaseException as exc:
            if not entered.done():
                entered.set_exception(exc)
            raise

    task = asyncio.create_task(host())
    try:
        yield await entered
    finally:
        stop.set()
        await task


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app without a worker: jobs stay as the API left them."""
    async with hosted(settings.model_copy(update={"run_worker": False})) as c:
        yield c


@pytest.fixture(scope="module")
def refusals_db_url(server_url: str, template_db: str) -> Iterator[str]:
    """One migrated database shared by the many bad-input cases of this module, which must
    all leave it untouched: cloning a database per case would triple this file's run time.
    Named like conftest's databases, so a killed run's copy is dropped by the next run."""
    name = f"nq_test_{os.getpid()}_api{secrets.token_hex(3)}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template_db)
            )
        )
    yield url_with_dbname(server_url, name)
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture
async def refusals(refusals_db_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    """A worker-less app on the shared bad-input database, and a connection to that database."""
    settings = Settings.load(database_url=refusals_db_url, auto_migrate=False, run_worker=False)
    async with (
        await psycopg.AsyncConnection.connect(refusals_db_url, autocommit=True) as conn,
        hosted(settings) as c,
    ):
        yield c, conn


# -- helpers --------------------------------------------------------------------------------


async def post_raw(
    client: httpx.AsyncClient, body: bytes, content_type: str = "application/json"
) -> httpx.Response:
    return await client.post("/jobs", content=body, headers={"content-type": content_type})


async def enqueue(client: httpx.AsyncClient, body: dict[str, Any], status: int = 201) -> str:
    response = await client.post("/jobs", json=body)
    assert response.status_code == status, response.text
    job_id: str = response.json()["job_id"]
    return job_id


async def enqueue_raw(client: httpx.AsyncClient, body: bytes) -> str:
    response = await post_raw(client, body)
    assert response.status_code == 201, response.text[:300]
    job_id: str = response.json()["job_id"]
    return job_id


async def get_job(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    response = await client.get(f"/jobs/{job_id}")
    assert response.status_code == 200, response.text
    job: dict[str, Any] = response.json()
    return job


async def db_scalar(conn: psycopg.AsyncConnection[Any], query: str, *params: Any) -> Any:
    cursor = await conn.execute(query, list(params))
    row = await cursor.fetchone()
    assert row is not None
    return row[0]


async def all_jobs(conn: psycopg.AsyncConnection[Any]) -> dict[str, dict[str, Any]]:
    cursor = conn.cursor(row_factory=psycopg.rows.dict_row)
    await cursor.execute(
        "SELECT id, task, queue, payload, status, priority, run_at, max_attempts, dedup_key "
        "FROM notifyq.jobs"
    )
    return {str(row["id"]): row for row in await cursor.fetchall()}


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def assert_client_error(response: httpx.Response, status: int | None = 422) -> None:
    """A 4xx with a JSON ``detail`` (never a 5xx, never a bare text answer)."""
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    if status is not None:
        assert response.status_code == status, (response.status_code, response.text[:500])
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert isinstance(body, dict) and body.get("detail"), body


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


# -- POST /jobs and GET /jobs/{id}: the basics ------------------------------------------------


async def test_post_minimal_body_creates_a_queued_job(client: httpx.AsyncClient, conn: Any) -> None:
    response = await client.post("/jobs", json={"payload": {"n": 1}})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["status"] == "queued"
    assert body["duplicate"] is False
    job_id = str(uuid.UUID(body["job_id"]))
    row = await job_row(conn, job_id)
    assert row is not None and row["status"] == "queued" and row["payload"] == {"n": 1}


async def test_get_returns_every_contract_field(client: httpx.AsyncClient, conn: Any) -> None:
    job_id = await enqueue(client, {"payload": {"n": 1}})
    job = await get_job(client, job_id)
    assert CONTRACT_FIELDS <= set(job), CONTRACT_FIELDS - set(job)
    assert job["job_id"] == job_id
    assert job["status"] == "queued"
    assert job["task"] == "echo"
    assert job["queue"] == "default"
    assert job["priority"] == 0
    assert job["payload"] == {"n": 1}
    assert job["attempt_count"] == 0
    assert job["max_attempts"] == 3
    assert job["result"] is None
    assert job["error"] is None
    assert job["started_at"] is None
    assert job["finished_at"] is None
    created, run_at = parse_time(job["created_at"]), parse_time(job["run_at"])
    assert created.tzinfo is not None and run_at.tzinfo is not None
    assert run_at == created  # not deferred: due at once
    age = await db_scalar(conn, "SELECT extract(epoch FROM now() - %s::timestamptz)", created)
    assert 0 <= age < 60


# -- task resolution ------------------------------------------------------------------------


async def test_explicit_task_wins_over_payload_task(client: httpx.AsyncClient) -> None:
    job_id = await enqueue(client, {"payload": {"task": "sleep"}, "task": "hello_world"})
    assert (await get_job(client, job_id))["task"] == "hello_world"


async def test_task_taken_from_payload_task_string(client: httpx.AsyncClient) -> None:
    job_id = await enqueue(client, {"payload": {"task": "hello_world", "name": "Ada"}})
    job = await get_job(client, job_id)
    assert job["task"] == "hello_world"
    assert job["payload"] == {"task": "hello_world", "name": "Ada"}


@pytest.mark.parametrize("value", [5, None, True, {"name": "x"}, ["hello_world"]])
async def test_non_string_payload_task_falls_back_to_default(
    client: httpx.AsyncClient, value: Any
) -> None:
    job_id = await enqueue(client, {"payload": {"task": value}})
    job = await get_job(client, job_id)
    assert job["task"] == "echo"
    assert job["payload"] == {"task": value}


async def test_default_task_setting_is_used(serve: Serve) -> None:
    async with serve(run_worker=False, default_task="hello_world") as client:
        plain = await enqueue(client, {"payload": {"n": 1}})
        numeric = await enqueue(client, {"payload": {"task": 7}})
        named = await enqueue(client, {"payload": {"task": "sleep"}})
        explicit = await enqueue(client, {"payload": {}, "task": "fail"})
        assert (await get_job(client, plain))["task"] == "hello_world"
        assert (await get_job(client, numeric))["task"] == "hello_world"
        assert (await get_job(client, named))["task"] == "sleep"
        assert (await get_job(client, explicit))["task"] == "fail"


# -- stored options -------------------------------------------------------------------------


async def test_priority_queue_and_max_attempts_are_stored(client: httpx.AsyncClient) -> None:
    job_id = await enqueue(
        client, {"payload": {}, "priority": -7, "queue": "emails", "max_attempts": 9}
    )
    job = await get_job(client, job_id)
    assert (job["priority"], job["queue"], job["max_attempts"]) == (-7, "emails", 9)


@pytest.mark.parametrize("priority", [2**31 - 1, -(2**31)])
async def test_priority_bounds_of_32_bits_are_accepted(
    client: httpx.AsyncClient, priority: int
) -> None:
    job_id = await enqueue(client, {"payload": {}, "priority": priority})
    assert (await get_job(client, job_id))["priority"] == priority


async def test_longest_names_and_dedup_key_are_accepted(client: httpx.AsyncClient) -> None:
    body = {"payload": {}, "task": "t" * 200, "queue": "q" * 200, "dedup_key": "k" * 512}
    job = await get_job(client, await enqueue(client, body))
    assert (job["task"], job["queue"]) == ("t" * 200, "q" * 200)


@pytest.mark.parametrize(
    "run_at",
    [
        "2030-01-02T03:04:05Z",
        "2030-01-02T03:04:05",  # no time zone: UTC
        "2030-01-02T03:04:05+00:00",
        "2030-01-02T08:34:05+05:30",
    ],
)
async def test_run_at_defers_the_job(client: httpx.AsyncClient, conn: Any, run_at: str) -> None:
    job_id = await enqueue(client, {"payload": {}, "run_at": run_at})
    expected = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert parse_time((await get_job(client, job_id))["run_at"]) == expected
    row = await job_row(conn, job_id)
    assert row is not None and row["run_at"] == expected
    assert await db_scalar(conn, "SELECT run_at > now() FROM notifyq.jobs WHERE id = %s", job_id)


@pytest.mark.parametrize("delay", [3600, 3600.5])
async def test_delay_defers_the_job(client: httpx.AsyncClient, conn: Any, delay: float) -> None:
    job_id = await enqueue(client, {"payload": {}, "delay": delay})
    ahead = await db_scalar(
        conn,
        "SELECT extract(epoch FROM run_at - now())::float8 FROM notifyq.jobs WHERE id = %s",
        job_id,
    )
    assert delay - 60 < ahead <= delay


async def test_run_at_and_delay_together_are_refused(client: httpx.AsyncClient, conn: Any) -> None:
    response = await client.post(
        "/jobs", json={"payload": {}, "run_at": "2030-01-01T00:00:00Z", "delay": 5}
    )
    assert_client_error(response, 422)
    assert "run_at" in response.text and "delay" in response.text
    assert await db_scalar(conn, "SELECT count(*) FROM notifyq.jobs") == 0


# -- with a worker --------------------------------------------------------------------------


async def test_echo_job_completes_with_its_payload(serve: Serve, conn: Any) -> None:
    payload = {"n": 1, "nested": {"list": [1, "two", None, 3.5]}, "text": "héllo ✓"}
    async with serve() as client:
        job_id = await enqueue(client, {"payload": payload, "task": "echo"})
        await wait_for_status(conn, job_id, "completed")
        job = await get_job(client, job_id)
    assert job["status"] == "completed"
    assert job["result"] == payload
    assert job["attempt_count"] == 1
    assert job["error"] is None
    assert job["started_at"] is not None and job["finished_at"] is not None
    assert parse_time(job["finished_at"]) >= parse_time(job["started_at"])


async def test_failing_job_ends_failed_after_its_attempts(serve: Serve, conn: Any) -> None:
    async with serve() as client:
        job_id = await enqueue(
            client, {"payload": {"message": "boom-42"}, "task": "fail", "max_attempts": 2}
        )
        await wait_for_status(conn, job_id, "failed")
        job = await get_job(client, job_id)
    assert job["status"] == "failed"
    assert job["attempt_count"] == 2
    assert job["max_attempts"] == 2
    assert "boom-42" in job["error"]
    assert job["result"] is None
    assert job["finished_at"] is not None


async def test_hello_world_job(serve: Serve, conn: Any) -> None:
    async with serve() as client:
        plain = await enqueue(client, {"payload": {}, "task": "hello_world"})
        named = await enqueue(client, {"payload": {"task": "hello_world", "name": "Ada"}})
        await wait_for_status(conn, plain, "completed")
        await wait_for_status(conn, named, "completed")
        assert (await get_job(client, plain))["result"] == {"message": "Hello, world!"}
        assert (await get_job(client, named))["result"] == {"message": "Hello, Ada!"}


# -- duplicates -----------------------------------------------------------------------------


async def test_duplicate_of_queued_job_replaces_it(client: httpx.AsyncClient, conn: Any) -> None:
    first = await client.post(
        "/jobs",
        json={
            "payload": {"v": 1},
            "priority": 1,
            "max_attempts": 2,
            "delay": 3600,
            "dedup_key": "k",
        },
    )
    assert first.status_code == 201, first.text
    job_id = first.json()["job_id"]
    second = await client.post(
        "/jobs",
        json={
            "payload": {"v": 2},
            "priority": 9,
            "max_attempts": 5,
            "run_at": "2031-05-06T07:08:09Z",
            "dedup_key": "k",
        },
    )
    assert second.status_code == 200, second.text
    body = second.json()
    assert body["job_id"] == job_id
    assert body["duplicate"] is True
    assert body["status"] == "queued"
    job = await get_job(client, job_id)
    assert job["payload"] == {"v": 2}
    assert job["priority"] == 9
    assert job["max_attempts"] == 5
    assert parse_time(job["run_at"]) == datetime(2031, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    assert await db_scalar(conn, "SELECT count(*) FROM notifyq.jobs") == 1


async def test_duplicate_without_run_at_makes_the_job_due(
    client: httpx.AsyncClient, conn: Any
) -> None:
    job_id = await enqueue(client, {"payload": {}, "delay": 3600, "dedup_key": "k"})
    assert await enqueue(client, {"payload": {}, "dedup_key": "k"}, status=200) == job_id
    assert await db_scalar(conn, "SELECT run_at <= now() FROM notifyq.jobs WHERE id = %s", job_id)


async def test_same_dedup_key_in_another_queue_is_a_new_job(
    client: httpx.AsyncClient, conn: Any
) -> None:
    a = await enqueue(client, {"payload": {"q": "a"}, "queue": "a", "dedup_key": "k"})
    b = await enqueue(client, {"payload": {"q": "b"}, "queue": "b", "dedup_key": "k"})
    assert a != b
    assert (await get_job(client, a))["payload"] == {"q": "a"}
    assert (await get_job(client, b))["payload"] == {"q": "b"}
    assert await db_scalar(conn, "SELECT count(*) FROM notifyq.jobs") == 2


async def test_duplicate_of_processing_job_is_a_new_job(
    client: httpx.AsyncClient, conn: Any
) -> None:
    first = await enqueue(client, {"payload": {"v": 1}, "dedup_key": "k"})
    await conn.execute(
        "UPDATE notifyq.jobs SET status = 'processing', attempt_count = 1, started_at = now(), "
        "worker_id = 'elsewhere', lease_expires_at = now() + interval '1 hour' WHERE id = %s",
        [first],
    )
    response = await client.post("/jobs", json={"payload": {"v": 2}, "dedup_key": "k"})
    assert response.status_code == 201, response.text
    assert response.json()["duplicate"] is False
    second = response.json()["job_id"]
    assert second != first
    old = await get_job(client, first)
    assert (old["status"], old["payload"]) == ("processing", {"v": 1})
    assert (await get_job(client, second))["payload"] == {"v": 2}
    # The new queued job is now the one later duplicates replace.
    assert await enqueue(client, {"payload": {"v": 3}, "dedup_key": "k"}, status=200) == second


async def test_duplicate_of_completed_job_is_a_new_job(serve: Serve, conn: Any) -> None:
    async with serve() as client:
        first = await enqueue(client, {"payload": {"v": 1}, "dedup_key": "k"})
        await wait_for_status(conn, first, "completed")
        response = await client.post("/jobs", json={"payload": {"v": 2}, "dedup_key": "k"})
        assert response.status_code == 201, response.text
        second = response.json()["job_id"]
        assert second != first and response.json()["duplicate"] is False
        await wait_for_status(conn, second, "completed")
        assert (await get_job(client, first))["result"] == {"v": 1}
        assert (await get_job(client, second))["result"] == {"v": 2}


async def test_concurrent_duplicates_make_one_job(client: httpx.AsyncClient, conn: Any) -> None:
    responses = await asyncio.gather(
        *(client.post("/jobs", json={"payload": {"i": i}, "dedup_key": "same"}) for i in range(50))
    )
    codes = [r.status_code for r in responses]
    assert codes.count(201) == 1, codes
    assert codes.count(200) == 49, codes
    ids = {r.json()["job_id"] for r in responses}
    assert len(ids) == 1
    assert [r.json()["duplicate"] for r in responses].count(False) == 1
    assert (
        await db_scalar(
            conn,
            "SELECT count(*) FROM notifyq.jobs WHERE dedup_key = 'same' AND status = 'queued'",
        )
        == 1
    )
    assert await db_scalar(conn, "SELECT count(*) FROM notifyq.jobs") == 1
    assert await db_scalar(conn, "SELECT id::text FROM notifyq.jobs") == ids.pop()


async def test_retry_of_deduplicated_job_while_a_duplicate_is_queued(
    serve: Serve, conn: Any
) -> None:
    gate = anyio.Event()

    async def gated_fail(payload: dict[str, Any]) -> None:
        await gate.wait()
        raise RuntimeError("first attempt fails")

    async with serve(tasks=registry(gated_fail=gated_fail)) as client:
        first = await enqueue(
            client, {"payload": {}, "task": "gated_fail", "dedup_key": "k", "max_attempts": 3}
        )
        await wait_for_status(conn, first, "processing")
        # A job of a task no worker serves stays queued: it holds the (queue, dedup_key) slot.
        second = await enqueue(client, {"payload": {}, "task": "nobody", "dedup_key": "k"})
        assert second != first
        gate.set()
        # The failed attempt has attempts left: it must leave 'processing' (requeued, merged
        # into the queued duplicate, or failed) rather than hang there.
        await wait_until(
            lambda: db_scalar(
                conn, "SELECT status <> 'processing' FROM notifyq.jobs WHERE id = %s", first
            ),
            timeout=3,
        )
        assert (
            await db_scalar(
                conn,
                "SELECT count(*) FROM notifyq.jobs WHERE dedup_key = 'k' AND status = 'queued'",
            )
            <= 1
        )


# -- bad input ------------------------------------------------------------------------------


def _encoded(value: Any) -> bytes:
    return json.dumps(value).encode()


BAD_BODIES: list[tuple[str, bytes]] = [
    ("payload missing", _encoded({})),
    ("payload missing with options", _encoded({"task": "echo", "priority": 1})),
    ("body a list", _encoded([{"payload": {}}])),
    ("body a string", _encoded("payload")),
    ("body null", b"null"),
    ("payload list", _encoded({"payload": [1, 2]})),
    ("payload string", _encoded({"payload": "x"})),
    ("payload null", _encoded({"payload": None})),
    ("payload number", _encoded({"payload": 5})),
    ("payload bool", _encoded({"payload": True})),
    ("unknown top-level field", _encoded({"payload": {}, "colour": "red"})),
    ("priority string", _encoded({"payload": {}, "priority": "5"})),
    ("priority float", _encoded({"payload": {}, "priority": 1.5})),
    ("priority bool", _encoded({"payload": {}, "priority": True})),
    ("priority over 32 bits", _encoded({"payload": {}, "priority": 2**31})),
    ("priority under 32 bits", _encoded({"payload": {}, "priority": -(2**31) - 1})),
    ("priority huge", _encoded({"payload": {}, "priority": 10**100})),
    ("task number", _encoded({"payload": {}, "task": 5})),
    ("task empty", _encoded({"payload": {}, "task": ""})),
    ("task too long", _encoded({"payload": {}, "task": "t" * 201})),
    ("task NUL", _encoded({"payload": {}, "task": "ec\x00ho"})),
    ("queue empty", _encoded({"payload": {}, "queue": ""})),
    ("queue number", _encoded({"payload": {}, "queue": 1})),
    ("queue too long", _encoded({"payload": {}, "queue": "q" * 201})),
    ("queue NUL", _encoded({"payload": {}, "queue": "de\x00fault"})),
    ("max_attempts zero", _encoded({"payload": {}, "max_attempts": 0})),
    ("max_attempts negative", _encoded({"payload": {}, "max_attempts": -1})),
    ("max_attempts string", _encoded({"payload": {}, "max_attempts": "3"})),
    ("max_attempts float", _encoded({"payload": {}, "max_attempts": 2.5})),
    ("delay negative", _encoded({"payload": {}, "delay": -1})),
    ("delay string", _encoded({"payload": {}, "delay": "x"})),
    ("delay numeric string", _encoded({"payload": {}, "delay": "30"})),
    ("delay bool", _encoded({"payload": {}, "delay": True})),
    ("delay NaN", b'{"payload": {}, "delay": NaN}'),
    ("delay Infinity", b'{"payload": {}, "delay": Infinity}'),
    ("run_at not a date", _encoded({"payload": {}, "run_at": "next tuesday"})),
    ("run_at bad month", _encoded({"payload": {}, "run_at": "2030-13-01T00:00:00Z"})),
    ("run_at and delay", _encoded({"payload": {}, "run_at": "2030-01-01T00:00:00Z", "delay": 1})),
    ("dedup_key too long", _encoded({"payload": {}, "dedup_key": "k" * 513})),
    ("dedup_key empty", _encoded({"payload": {}, "dedup_key": ""})),
    ("dedup_key number", _encoded({"payload": {}, "dedup_key": 7})),
    ("dedup_key NUL", _encoded({"payload": {}, "dedup_key": "k\x00"})),
    ("NUL in payload value", _encoded({"payload": {"k": "a\x00b"}})),
    ("NUL in payload key", _encoded({"payload": {"a\x00b": 1}})),
    ("NUL deep in payload", _encoded({"payload": {"k": [{"x": ["\x00"]}]}})),
    ("lone surrogate in payload value", b'{"payload": {"k": "\\ud800"}}'),
    ("lone surrogate in payload key", b'{"payload": {"\\udfff": 1}}'),
    ("lone surrogate in task", b'{"payload": {}, "task": "\\ud800"}'),
    ("lone surrogate in queue", b'{"payload": {}, "queue": "\\ud800"}'),
    ("lone surrogate in dedup_key", b'{"payload": {}, "dedup_key": "\\ud800"}'),
    ("lone surrogate as field name", b'{"payload": {}, "\\ud800": 1}'),
    ("NaN in payload", b'{"payload": {"x": NaN}}'),
    ("Infinity in payload", b'{"payload": {"x": Infinity}}'),
    ("-Infinity in payload", b'{"payload": {"x": [-Infinity]}}'),
    ("float overflow in payload", b'{"payload": {"x": 1e400}}'),
    ("priority Infinity", b'{"payload": {}, "priority": Infinity}'),
    ("5000-digit integer in payload", b'{"payload": {"n": ' + b"7" * 5000 + b"}}"),
    ("5000-digit priority", b'{"payload": {}, "priority": ' + b"7" * 5000 + b"}"),
    ("arrays nested 100000 deep", b'{"payload": {"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"),
    ("objects nested 100000 deep", b'{"payload": ' + b'{"a":' * 100_000 + b"1" + b"}" * 100_001),
    ("invalid JSON", b'{"payload": {'),
    ("trailing garbage", b'{"payload": {}} x'),
    ("single quotes", b"{'payload': {}}"),
    ("empty body", b""),
    ("invalid UTF-8", b'{"payload": {"k": "\xff\xfe"}}'),
]


@pytest.mark.parametrize(("case", "body"), BAD_BODIES, ids=[case for case, _ in BAD_BODIES])
async def test_bad_input_is_a_422_with_detail(
    refusals: tuple[httpx.AsyncClient, Any], case: str, body: bytes
) -> None:
    client, conn = refusals
    response = await post_raw(client, body)
    assert_client_error(response, 422)
    assert await db_scalar(conn, "SELECT count(*) FROM notifyq.jobs") == 0


async def test_error_detail_says_what_is_wrong(client: httpx.AsyncClient) -> None:
    unknown = (await client.post("/jobs", json={"payload": {}, "colour": "red"})).json()
    assert any("colour" in map(str, error["loc"]) for error in unknown["detail"]), unknown
    priority = (await client.post("/jobs", json={"payload": {}, "priority": "5"})).json()
    assert any("priority" in map(str, error["loc"]) for error in priority["detail"]), priority
    nul = (await client.post("/jobs", json={"payload": {"k": "\x00"}})).json()
    assert "NUL" in json.dumps(nul), nul
    deep = (await post_raw(client, b'{"payload": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")).json()
    assert "deep" in json.dumps(deep), deep


async def test_body_that_is_not_json_typed_is_refused(client: httpx.AsyncClient) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        assert_client_error(await post_raw(client, b'{"payload": {}}', content_type), 422)
    response = await client.post("/jobs", content=b'{"payload": {}}')  # no content-type
    assert_client_error(response, 422)


async def test_a_byte_order_mark_before_the_json_is_ignored(client: httpx.AsyncClient) -> None:
    job_id = await enqueue_raw(client, b'\xef\xbb\xbf{"payload": {"k": 1}}')
    assert (await get_job(client, job_id))["payload"] == {"k": 1}


async def test_a_client_gone_mid_body_gets_a_400_and_nothing_is_stored(
    settings: Settings, conn: Any
) -> None:
    app = create_app(settings.model_copy(update={"run_worker": False}))
    sent: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return parts.pop(0) if parts else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    for path in ("/jobs", "/jobs/batch"):
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"test"), (b"content-type", b"application/json")],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
        }
        sent.clear()
        parts[:] = [
            {"type": "http.request", "body": b'{"payload": {"k"', "more_body": True},
            {"type": "http.disconnect"},
        ]
        async with app.router.lifespan_context(app):
            await app(scope, receive, send)
        assert sent and sent[0]["status"] == 400, (path, sent)
    cursor = await conn.execute("SELECT count(*) FROM notifyq.jobs")
    assert (await cursor.fetchone())[0] == 0


async def test_literal_backslash_u0000_text_is_not_a_nul(client: httpx.AsyncClient) -> None:
    # The six characters \u0000 (an escaped backslash in JSON) are ordinary text.
    job_id = await enqueue(client, {"payload": {"k": "\\u0000", "\\u0000": 1}})
    assert (await get_job(client, job_id))["payload"] == {"k": "\\u0000", "\\u0000": 1}


async def test_body_over_the_limit_with_content_length_is_413(
    client: httpx.AsyncClient, conn: Any
) -> None:
    body = b'{"payload": {"k": "' + b"x" * MIB + b'"}}'
    response = await post_raw(client, body)
    assert response.request.headers["content-length"] == str(len(body))
    assert_client_error(response, 413)
    assert await db_scalar(conn, "SELECT count(*) FROM notifyq.jobs") == 0


async def test_body_over_the_limit_streamed_without_length_is_413(
    client: httpx.AsyncClient, conn: Any
) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"payload": {"k": "'
        for _ in range(20):
            yield b"x" * 65_536
        yield b'"}}'

    response = await client.post("/jobs", content=chunks(), headers=JSON)
    assert "content-length" not in response.request.headers
    assert_client_error(response, 413)
    assert await db_scalar(conn, "SELECT count(*) FROM notifyq.jobs") == 0


async def test_body_at_the_limit_is_accepted_with_or_without_length(
    client: httpx.AsyncClient,
) -> None:
    head, tail = b'{"payload": {"k": "', b'"}}'
    body = head + b"x" * (MIB - len(head) - len(tail)) + tail
    assert len(body) == MIB
    job_id = await enqueue_raw(client, body)
    assert len((await get_job(client, job_id))["payload"]["k"]) == MIB - len(head) - len(tail)

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 100_000):
            yield body[start : start + 100_000]

    response = await client.post("/jobs", content=chunks(), headers=JSON)
    assert response.status_code == 201, response.text[:300]
    assert response.json()["job_id"] != job_id


async def test_bad_inputs_leave_the_good_jobs_intact(client: httpx.AsyncClient, conn: Any) -> None:
    good = [
        await enqueue(client, {"payload": {"n": 1}}),
        await enqueue(client, {"payload": {"n": 2}, "queue": "q", "dedup_key": "k", "priority": 4}),
    ]
    before = await all_jobs(conn)
    for case, body in BAD_BODIES:
        response = await post_raw(client, body)
        assert 400 <= response.status_code < 500, (case, response.status_code, response.text)
        assert response.json().get("detail"), case
    for body_bytes in (b"x" * (MIB + 1), b'{"payload": {"k": "' + b"y" * MIB + b'"}}'):
        assert (await post_raw(client, body_bytes)).status_code == 413
    # One more good request after the storm: the app still works and dedup still holds.
    assert (
        await enqueue(client, {"payload": {"n": 3}, "queue": "q", "dedup_key": "k"}, 200) == good[1]
    )
    after = await all_jobs(conn)
    assert set(after) == set(good)
    assert after[good[0]] == before[good[0]]
    assert after[good[1]]["payload"] == {"n": 3}
    assert after[good[1]]["priority"] == 0
    assert {row["status"] for row in after.values()} == {"queued"}


@pytest.mark.parametrize(
    "run_at", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"], ids=["BC", "year10K"]
)
async def test_run_at_out_of_range_creates_no_job(
    client: httpx.AsyncClient, conn: Any, run_at: str
) -> None:
    response = await client.post("/jobs", json={"payload": {}, "run_at": run_at})
    if response.status_code == 201:  # accepted: then it must be readable
        await get_job(client, response.json()["job_id"])
    else:
        assert_client_error(response, 422)
        assert await db_scalar(conn, "SELECT count(*) FROM notifyq.jobs") == 0


async def test_out_of_range_run_at_does_not_stop_the_worker(serve: Serve, conn: Any) -> None:
    async with serve() as client:
        await client.post("/jobs", json={"payload": {}, "run_at": "0001-01-01T00:00:00+14:00"})
        job_id = await enqueue(client, {"payload": {"n": 1}})
        row = await wait_for_status(conn, job_id, "completed", timeout=3)
        assert row["result"] == {"n": 1}


async def test_payload_deeper_than_the_limit_is_refused(client: httpx.AsyncClient) -> None:
    response = await client.post("/jobs", json={"payload": nested(MAX_DEPTH + 1)})
    assert_client_error(response, 422)
    assert "nests deeper than" in response.text


async def test_payload_at_the_depth_limit_round_trips(client: httpx.AsyncClient) -> None:
    payload = nested(MAX_DEPTH)
    job_id = await enqueue(client, {"payload": payload})
    assert (await get_job(client, job_id))["payload"] == payload


# -- GET /jobs/{id} -------------------------------------------------------------------------


async def test_get_unknown_job_is_404(client: httpx.AsyncClient) -> None:
    response = await client.get(f"/jobs/{uuid.uuid4()}")
    assert_client_error(response, 404)


@pytest.mark.parametrize("job_id", ["not-a-uuid", "123", "0" * 33, "%00"])
async def test_get_malformed_id_is_422(client: httpx.AsyncClient, job_id: str) -> None:
    assert_client_error(await client.get(f"/jobs/{job_id}"), 422)


# -- /health and an unreachable database ----------------------------------------------------


async def test_health_is_healthy(client: httpx.AsyncClient) -> None:
    response = await client.get("/health")
    assert response.status_code == 200
    assert response.json()["status"] == "healthy"


async def test_unreachable_database_answers_503_quickly() -> None:
    settings = Settings.load(
        database_url=f"postgresql://postgres@127.0.0.1:{closed_port()}/postgres",
        auto_migrate=False,
        run_worker=False,
        connect_timeout=1,
    )
    async with serving(settings) as client:
        started = time.monotonic()
        health = await client.get("/health")
        assert health.status_code == 503
        assert health.json()["status"] == "unhealthy"
        assert time.monotonic() - started < 4

        started = time.monotonic()
        post = await client.post("/jobs", json={"payload": {"n": 1}})
        assert post.status_code == 503, post.text
        assert post.headers["content-type"].startswith("application/json")
        assert post.json()["detail"]
        assert time.monotonic() - started < 4

        got = await client.get(f"/jobs/{uuid.uuid4()}")
        assert got.status_code == 503 and got.json()["detail"]
        # Bad input is still the client's fault, database or not.
        assert_client_error(await client.post("/jobs", json={"payload": []}), 422)


# -- auth -----------------------------------------------------------------------------------


async def test_api_token_guards_every_route_but_health(serve: Serve) -> None:
    async with serve(run_worker=False, api_token=SecretStr("s3cret")) as client:
        response = await client.post("/jobs", json={"payload": {}})
        assert_client_error(response, 401)
        assert_client_error(await client.get(f"/jobs/{uuid.uuid4()}"), 401)
        for header in ("Bearer wrong", "Bearer s3cre", "Bearer s3cret2", "Basic s3cret"):
            response = await client.post(
                "/jobs", json={"payload": {}}, headers={"authorization": header}
            )
            assert_client_error(response, None)
            assert response.status_code in (401, 403), (header, response.status_code)
            response = await client.get(f"/jobs/{uuid.uuid4()}", headers={"authorization": header})
            assert response.status_code in (401, 403), (header, response.status_code)

        right = {"authorization": "Bearer s3cret"}
        response = await client.post("/jobs", json={"payload": {"n": 1}}, headers=right)
        assert response.status_code == 201, response.text
        job_id = response.json()["job_id"]
        got = await client.get(f"/jobs/{job_id}", headers=right)
        assert got.status_code == 200 and got.json()["payload"] == {"n": 1}
        assert (await client.get(f"/jobs/{uuid.uuid4()}", headers=right)).status_code == 404

        health = await client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "healthy"


async def test_unauthenticated_bad_body_is_still_401(serve: Serve, conn: Any) -> None:
    async with serve(run_worker=False, api_token=SecretStr("s3cret")) as client:
        for body in (_encoded({"payload": []}), _encoded({"colour": 1})):
            assert_client_error(await post_raw(client, body), 401)
    assert await db_scalar(conn, "SELECT count(*) FROM notifyq.jobs") == 0


async def test_unauthenticated_unparseable_body_is_401(serve: Serve) -> None:
    async with serve(run_worker=False, api_token=SecretStr("s3cret")) as client:
        assert_client_error(await post_raw(client, b'{"payload": {'), 401)


# -- settings the API must honour -----------------------------------------------------------


async def test_max_attempts_setting_is_the_default(serve: Serve) -> None:
    async with serve(run_worker=False, max_attempts=7) as client:
        job_id = await enqueue(client, {"payload": {}, "task": "no_such_task"})
        assert (await get_job(client, job_id))["max_attempts"] == 7


# -- OpenAPI --------------------------------------------------------------------------------


async def test_openapi_documents_every_job_field(client: httpx.AsyncClient) -> None:
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    spec = response.json()
    job_in = spec["components"]["schemas"]["JobIn"]
    properties = job_in["properties"]
    assert set(properties) == JOB_IN_FIELDS
    assert job_in["required"] == ["payload"]
    for name, schema in properties.items():
        assert schema.get("description"), f"JobIn.{name} has no description"
    post = spec["paths"]["/jobs"]["post"]
    assert {"200", "201", "413", "422", "503"} <= set(post["responses"])
    assert {"200", "404", "422"} <= set(spec["paths"]["/jobs/{job_id}"]["get"]["responses"])


async def test_null_optional_fields_mean_their_defaults(client: httpx.AsyncClient) -> None:
    body = {"payload": {}, "queue": None, "priority": None, "task": None, "delay": None}
    job = await get_job(client, await enqueue(client, body))
    assert (job["queue"], job["priority"], job["task"]) == ("default", 0, "echo")
