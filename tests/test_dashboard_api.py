"""The routes the dashboard's pages read: the payload search of GET /jobs, POST /jobs/bulk,
GET /queues/states, GET /workers, GET /scheduled (with POST /jobs/{id}/run-now) and
GET /periodic; bounded, and bad input answered 4xx.

The tests of this that need no database are in tests/unit/test_dashboard_api.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import timezone
from typing import Any
from uuid import UUID

import anyio
import httpx
import pytest
from pydantic import SecretStr

from notifyq import Snooze
from notifyq.api import create_app
from notifyq.api.routes import jobs as jobs_routes
from notifyq.builtins import worker_registry
from notifyq.retry import Backoff
from notifyq.settings import Settings
from notifyq.tasks import Registry, make_task
from tests.helpers import (
    insert_in_state,
    job_row,
    registry,
    running_worker,
    wait_for_status,
    wait_until,
)
from tests.unit.test_dashboard_api import DEEP


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


for _ in range(120):
    DEEP = [DEEP]


def client_error(response: httpx.Response, code: int) -> None:
    assert response.status_code == code, (response.status_code, response.text)
    assert "detail" in response.json()


async def enqueue(client: httpx.AsyncClient, **job: Any) -> str:
    answer = await client.post("/jobs", json=job)
    assert answer.status_code == 201, answer.text
    job_id: str = answer.json()["job_id"]
    return job_id


async def test_payload_search_finds_the_jobs_whose_payload_contains_the_object(
    settings: Settings,
) -> None:
    async with api(settings) as client:
        ids = [
            await enqueue(client, task="echo", payload={"account": n % 3, "tags": ["a", f"t{n}"]})
            for n in range(9)
        ]
        await enqueue(client, task="other", payload={"account": 1})
        page = (await client.get("/jobs", params={"payload": '{"account": 1}'})).json()
        by_task = await client.get("/jobs", params={"payload": '{"account": 1}', "task": "echo"})
        nested = await client.get("/jobs", params={"payload": '{"tags": ["t4"]}'})
        none = await client.get("/jobs", params={"payload": '{"account": 7}'})
    assert len(page["jobs"]) == 4 and page["next_cursor"] is None and page["scanned"] == 10
    assert [job["job_id"] for job in by_task.json()["jobs"]] == [ids[7], ids[4], ids[1]]
    assert [job["job_id"] for job in nested.json()["jobs"]] == [ids[4]]
    assert none.json()["jobs"] == [] and none.json()["next_cursor"] is None


async def test_a_payload_search_looks_at_a_bounded_number_of_rows_per_page(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each page scans SEARCH_SCAN rows at most; a page may come back empty with a cursor,
    and following the cursors finds every match once."""
    monkeypatch.setattr(jobs_routes, "SEARCH_SCAN", 4)
    async with api(settings) as client:
        wanted = []
        for n in range(11):
            job_id = await enqueue(client, task="echo", payload={"hit": n in (0, 1, 9)})
            if n in (0, 1, 9):
                wanted.append(job_id)
        found: list[str] = []
        scans: list[int] = []
        cursor = None
        for _ in range(10):
            params = {"payload": '{"hit": true}', "limit": 1, **({"cursor": cursor} or {})}
            if cursor is None:
                params.pop("cursor")
            page = (await client.get("/jobs", params=params)).json()
            found += [job["job_id"] for job in page["jobs"]]
            scans.append(page["scanned"])
            cursor = page["next_cursor"]
            if cursor is None:
                break
    assert found == wanted[::-1]
    assert max(scans) <= 4


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        ('"text"', "JSON object"),
        ('{"a":' * 330 + "1" + "}" * 330, "nests"),
        ('{"a": "x\\u0000y"}', "NUL"),
        ('{"a": 1e400}', "JSON"),
        ("{" + '"a":1,' * 400 + '"b":2}', "at most 2000"),
    ],
    ids=["not-json", "array", "string", "deep", "nul", "infinite", "long"],
)
async def test_a_bad_payload_filter_is_a_422(settings: Settings, value: str, says: str) -> None:
    async with api(settings) as client:
        answer = await client.get("/jobs", params={"payload": value})
    client_error(answer, 422)
    assert says.lower() in answer.text.lower(), answer.text


async def test_bulk_dry_run_counts_what_the_action_applies_to(
    settings: Settings, conn: Any
) -> None:
    await insert_in_state(conn, "mail", 3, status="'failed'", finished_at="now()")
    await insert_in_state(conn, "mail", 2, status="'cancelled'", finished_at="now()")
    await insert_in_state(conn, "echo", 4, status="'completed'", finished_at="now()")
    await conn.execute("UPDATE notifyq.jobs SET payload = '{\"acct\": 1}' WHERE task = 'echo'")
    async with api(settings) as client:

        async def count(**body: Any) -> Any:
            answer = await client.post("/jobs/bulk", json={"dry_run": True, **body})
            assert answer.status_code == 200, answer.text
            return answer.json()

        retry_all = await count(action="retry")
        retry_failed = await count(action="retry", status="failed", task="mail")
        delete_all = await count(action="delete")
        delete_acct = await count(action="delete", payload={"acct": 1})
        cancel = await count(action="cancel")
    assert retry_all == {"action": "retry", "dry_run": True, "matched": 5, "exact": True}
    assert retry_failed["matched"] == 3
    assert delete_all["matched"] == 9 and delete_acct["matched"] == 4
    assert cancel["matched"] == 0


async def test_bulk_retry_and_delete_go_a_bounded_step_at_a_time(
    settings: Settings, conn: Any
) -> None:
    failed = await insert_in_state(
        conn, "mail", 5, status="'failed'", finished_at="now()", attempt_count="1"
    )
    await insert_in_state(conn, "echo", 3, status="'failed'", finished_at="now()")
    async with api(settings) as client:
        steps = []
        after = None
        while True:
            body = {"action": "retry", "task": "mail", "limit": 2, "after": after}
            answer = await client.post("/jobs/bulk", json=body)
            assert answer.status_code == 200, answer.text
            steps.append(answer.json())
            after = steps[-1].get("next_after")
            if after is None:
                break
        deleted = await client.post("/jobs/bulk", json={"action": "delete", "status": "failed"})
    assert [step["scanned"] for step in steps] == [2, 2, 1]
    assert sum(step["affected"] for step in steps) == 5
    cursor = await conn.execute(
        "SELECT count(*) FROM notifyq.jobs WHERE id = ANY(%s) AND status = 'queued'", [failed]
    )
    assert (await cursor.fetchone())[0] == 5
    # The echo jobs stayed failed and were deleted; the requeued ones were not finished.
    assert deleted.json()["affected"] == 3
    cursor = await conn.execute("SELECT count(*) FROM notifyq.jobs")
    assert (await cursor.fetchone())[0] == 5


async def test_bulk_delete_spares_a_job_a_waiting_job_depends_on(
    settings: Settings, conn: Any
) -> None:
    async with api(settings) as client:
        parent = await enqueue(client, payload={}, delay=600)
        child = await enqueue(client, payload={}, depends_on=[parent])
        cancelled = await client.post(
            "/jobs/bulk", json={"action": "cancel", "status": "queued", "payload": {}}
        )
        # The child was cancelled with its parent, as POST /jobs/{id}/cancel does.
        deleted = await client.post("/jobs/bulk", json={"action": "delete"})
        gone = [(await client.get(f"/jobs/{i}")).status_code for i in (parent, child)]
    assert cancelled.json()["affected"] == 1
    assert deleted.json()["affected"] == 2
    assert gone == [404, 404]


async def test_bulk_cancel_asks_the_worker_of_a_running_job_to_stop_it(
    settings: Settings, conn: Any
) -> None:
    started = anyio.Event()

    async def endless(payload: dict[str, Any]) -> None:
        started.set()
        await anyio.sleep(3600)

    tasks = registry(endless=endless)
    async with running_worker(settings, tasks), api(settings) as client:
        running = await enqueue(client, task="endless", payload={"n": 1})
        queued = await enqueue(client, task="endless", payload={"n": 2}, delay=600)
        with anyio.fail_after(10):
            await started.wait()
        await wait_for_status(conn, running, "processing")
        answer = await client.post("/jobs/bulk", json={"action": "cancel", "task": "endless"})
        await wait_for_status(conn, running, "cancelled")
        await wait_for_status(conn, queued, "cancelled")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["affected"] == 2 and body["stopping"] == 1 and body.get("next_after") is None


@pytest.mark.parametrize(
    "body",
    [
        {"action": "retry", "status": "completed"},
        {"action": "delete", "status": "processing"},
        {"action": "cancel", "status": "failed"},
        {"action": "explode"},
        {"action": "retry", "limit": 1001},
        {"action": "retry", "limit": 0},
        {"action": "retry", "after": "not-a-uuid"},
        {"action": "retry", "payload": [1]},
        {"action": "retry", "payload": {"a": "x\u0000"}},
        {"action": "retry", "payload": {"k": "v" * 2100}},
        {"action": "retry", "queue": ""},
        {"action": "retry", "colour": "red"},
        {"action": "retry", "queue": "a\u0000b"},
        {"action": "delete", "task": "a\u0000b", "dry_run": True},
        {"action": "cancel", "group_key": "\u0000"},
        {"action": "retry", "payload": {"deep": DEEP}},
    ],
)
async def test_bad_bulk_input_is_a_422(settings: Settings, body: dict[str, Any]) -> None:
    async with api(settings) as client:
        client_error(await client.post("/jobs/bulk", json=body), 422)


async def test_queue_states_say_why_due_jobs_do_not_move(settings: Settings, conn: Any) -> None:
    async with api(settings) as client:
        await enqueue(client, task="nobody_knows", queue="orphans", payload={})
        await enqueue(client, task="echo", queue="held", payload={})
        await client.post("/queues/held/pause")
        await enqueue(client, task="echo", queue="lonely", payload={})
        await conn.execute("UPDATE notifyq.queues SET notify = false WHERE name = 'held'")
        states = {row["queue"]: row for row in (await client.get("/queues/states")).json()}
    assert states["orphans"]["state"] == "unregistered"
    assert states["orphans"]["unregistered_tasks"] == ["nobody_knows"]
    assert "no worker registered" in states["orphans"]["reasons"][0]
    assert states["held"]["state"] == "paused"
    assert any("polling" in r or "poll" in r for r in states["held"]["reasons"])
    # echo is registered by the app's own registry only once a worker starts: none did.
    assert states["lonely"]["state"] in ("unregistered", "no_workers")


async def test_queue_states_and_workers_see_a_listening_worker(
    settings: Settings, conn: Any
) -> None:
    release = anyio.Event()

    async def hold(payload: dict[str, Any]) -> None:
        await release.wait()

    tasks = registry(hold=hold)
    async with (
        running_worker(settings.model_copy(update={"concurrency": 2}), tasks) as worker,
        api(settings) as client,
    ):

        async def listening() -> Any:
            rows = (await client.get("/workers")).json()
            return [row for row in rows if row["worker_id"] == worker.id and row["listening"]]

        await wait_until(listening)
        job_id = await enqueue(client, task="hold", payload={})
        await wait_for_status(conn, job_id, "processing")

        async def running() -> Any:
            rows = (await client.get("/workers")).json()
            return [row for row in rows if row["worker_id"] == worker.id and row["running"]]

        (row,) = await wait_until(running)
        states = {row["queue"]: row for row in (await client.get("/queues/states")).json()}
        release.set()
    assert [job["job_id"] for job in row["jobs"]] == [job_id]
    assert row["jobs"][0]["task"] == "hold"
    assert states["default"]["state"] in ("ok", "idle")


async def test_an_idle_queue_counts_the_workers_serving_every_queue_as_listening(
    settings: Settings, conn: Any
) -> None:
    """A queue with nothing due and no settings of its own is still served: two workers
    serving every queue and one naming the queue listen on it; one naming another does not."""
    async with api(settings) as client:
        for queue in ("default", "reports"):
            await enqueue(client, task="echo", queue=queue, payload={})
        await conn.execute(
            "SELECT notifyq.end_jobs_v1(array_agg(id), array_agg('completed'::text))"
            " FROM ONLY notifyq.jobs"
        )
        async with (
            running_worker(settings) as first,
            running_worker(settings) as second,
            running_worker(settings.model_copy(update={"queues": ["reports"]})) as third,
            running_worker(settings.model_copy(update={"queues": ["emails"]})) as fourth,
        ):
            ids = {first.id, second.id, third.id, fourth.id}

            async def all_listen() -> bool:
                rows = (await client.get("/workers")).json()
                return {row["worker_id"] for row in rows if row["listening"]} >= ids

            await wait_until(all_listen)
            states = {row["queue"]: row for row in (await client.get("/queues/states")).json()}
    assert (states["default"]["listening"], states["default"]["state"]) == (2, "idle")
    assert (states["reports"]["listening"], states["reports"]["state"]) == (3, "idle")


async def test_a_search_with_a_nul_in_a_filter_is_a_422(settings: Settings) -> None:
    async with api(settings) as client:
        answer = await client.get("/jobs", params={"payload": "{}", "queue": "a\u0000b"})
    assert 400 <= answer.status_code < 500, answer.text


async def test_the_new_routes_need_the_token_when_one_is_set(settings: Settings) -> None:
    async with api(settings, api_token=SecretStr("s3cret")) as client:
        for method, path, body in (
            ("GET", "/queues/states", None),
            ("GET", "/workers", None),
            ("POST", "/jobs/bulk", {"action": "retry", "dry_run": True}),
            ("GET", "/jobs?payload=%7B%7D", None),
            ("GET", "/scheduled", None),
            ("GET", "/periodic", None),
        ):
            answer = await client.request(method, path, json=body)
            client_error(answer, 401)
            right = {"authorization": "Bearer s3cret"}
            assert (await client.request(method, path, json=body, headers=right)).status_code == 200


async def test_minute_stats_count_each_minute_once_and_keep_it(
    settings: Settings, conn: Any
) -> None:
    """A whole minute is counted from the finished jobs once and stored: deleting the jobs
    later does not change it. Each read counts 10 missing minutes at most, newest first."""
    cursor = await conn.execute(
        "SELECT date_trunc('minute', now() - interval '5 seconds') - interval '3 minutes',"
        "       date_trunc('minute', now() - interval '5 seconds') - interval '30 minutes'"
    )
    recent, old = await cursor.fetchone()
    at = "%s::timestamptz + interval '20 seconds'"
    for minute, status, count in (
        (recent, "completed", 3),
        (recent, "failed", 2),
        (old, "completed", 4),
    ):
        ids = await insert_in_state(conn, "echo", count, status=f"'{status}'")
        await conn.execute(
            f"UPDATE notifyq.jobs SET finished_at = {at} WHERE id = ANY(%s)", [minute, ids]
        )
    async with api(settings) as client:

        async def read() -> dict[Any, dict[str, Any]]:
            answer = await client.get("/stats/minutes")
            assert answer.status_code == 200, answer.text
            rows = answer.json()["minutes"]
            assert len(rows) == 61 and rows[-1]["partial"] and not rows[0]["partial"]
            return {row["minute"]: row for row in rows}

        def at(rows: dict[Any, dict[str, Any]], minute: Any) -> dict[str, Any]:
            stamp = minute.astimezone(timezone.utc).isoformat()[:16]  # the API answers in UTC
            return next(row for name, row in rows.items() if name.startswith(stamp))

        first = await read()
        await conn.execute("DELETE FROM notifyq.jobs")
        second = await read()
        third = await read()
        bad = [
            await client.get("/stats/minutes", params={"minutes": value})
            for value in ("0", "61", "many")
        ]
    row = at(first, recent)
    assert (row["completed"], row["failed"], row["cancelled"]) == (3, 2, 0)
    row = at(second, recent)
    assert (row["completed"], row["failed"]) == (3, 2)  # stored: the jobs are gone
    assert at(first, old)["completed"] is None  # beyond the first read's 10 minutes
    assert at(third, old)["completed"] == 0  # counted by the third read, after the delete
    for answer in bad:
        client_error(answer, 422)


async def test_scheduled_lists_jobs_due_later_soonest_first_and_says_why_each_waits(
    settings: Settings, conn: Any
) -> None:
    """A first run set for later, a retry waiting out its backoff (after a real failed
    attempt) and a snoozed job; due, running and finished jobs are not listed."""

    async def flaky(payload: dict[str, Any]) -> None:
        raise RuntimeError("upstream said no")

    async def sleepy(payload: dict[str, Any]) -> None:
        raise Snooze(900)

    tasks = Registry(
        [
            # Half of a backoff is jitter: 1,800 s to 3,600 s, always after the 900 s snooze.
            make_task(flaky, "flaky", max_attempts=5, backoff=Backoff(base=3600, cap=3600)),
            make_task(sleepy, "sleepy"),
        ]
    )
    async with running_worker(settings, worker_registry(tasks)), api(settings) as client:
        later = await enqueue(client, task="echo", queue="mail", payload={}, delay=300)
        retried = await enqueue(client, task="flaky", payload={})
        snoozed = await enqueue(client, task="sleepy", payload={})
        await enqueue(client, task="echo", payload={"due": "now"})

        async def settled() -> bool:
            rows = [await job_row(conn, job_id) for job_id in (retried, snoozed)]
            return all(r and r["status"] == "queued" and r["claims"] == 1 for r in rows)

        await wait_until(settled)
        page = (await client.get("/scheduled")).json()
        by_task = (await client.get("/scheduled", params={"task": "flaky"})).json()
        by_queue = (await client.get("/scheduled", params={"queue": "mail"})).json()
    jobs = {job["job_id"]: job for job in page["jobs"]}
    assert [job["job_id"] for job in page["jobs"]] == [later, snoozed, retried]  # soonest first
    assert jobs[later]["reason"] == "first_run" and jobs[later]["queue"] == "mail"
    assert jobs[retried]["reason"] == "retry" and jobs[retried]["failed_attempt"] == 1
    assert "upstream said no" in jobs[retried]["error"]
    assert jobs[retried]["last_error"] == jobs[retried]["error"]  # the deprecated alias
    assert jobs[snoozed]["reason"] == "snoozed" and jobs[snoozed]["attempt_count"] == 0
    assert page["next_cursor"] is None and page["now"]
    assert [job["job_id"] for job in by_task["jobs"]] == [retried]
    assert [job["job_id"] for job in by_queue["jobs"]] == [later]


async def test_every_http_answer_says_error_and_last_error_is_only_a_deprecated_alias(
    settings: Settings,
) -> None:
    """One name for one thing: `error` over HTTP, `last_error` in SQL. The only `last_error` in
    an answer is GET /scheduled's, documented as the deprecated alias it is."""
    app = create_app(settings.model_copy(update={"run_worker": False}))
    schemas = app.openapi()["components"]["schemas"]
    with_error = {
        name for name, schema in schemas.items() if "error" in schema.get("properties", {})
    }
    aliases = {
        name: schema["properties"]["last_error"]
        for name, schema in schemas.items()
        if "last_error" in schema.get("properties", {})
    }
    assert {"JobOut", "ScheduledJobOut"} <= with_error
    assert set(aliases) == {"ScheduledJobOut"}
    assert aliases["ScheduledJobOut"].get("deprecated") is True
    assert "error" in aliases["ScheduledJobOut"]["description"]


async def test_scheduled_pages_follow_the_cursor_and_bad_input_is_a_422(
    settings: Settings,
) -> None:
    async with api(settings) as client:
        ids = [await enqueue(client, payload={"n": n}, delay=100 + n) for n in range(5)]
        found: list[str] = []
        cursor = None
        for _ in range(5):
            params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
            page = (await client.get("/scheduled", params=params)).json()
            assert len(page["jobs"]) <= 2
            found += [job["job_id"] for job in page["jobs"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        bad = [
            await client.get("/scheduled", params=params)
            for params in (
                {"limit": 0},
                {"limit": 501},
                {"cursor": "not-a-cursor"},
                {"cursor": "bm9wZQ"},
                {"queue": "q" * 201},
                {"task": "a\u0000b"},
            )
        ]
    assert found == ids
    for answer in bad:
        assert 400 <= answer.status_code < 500, answer.text
        assert "detail" in answer.json()


@pytest.mark.parametrize("route", ["/jobs", "/scheduled"])
async def test_a_cursor_the_route_did_not_give_out_is_a_422_that_names_the_route(
    settings: Settings, route: str
) -> None:
    async with api(settings) as client:
        answers = [
            await client.get(route, params={"cursor": cursor})
            for cursor in ("not-a-cursor", "bm9wZQ", "garbage!")
        ]
    for answer in answers:
        assert answer.status_code == 422, answer.text
        assert answer.json() == {"detail": f"cursor is not one that GET {route} gave out"}


async def test_run_now_makes_a_job_due_later_due_and_a_worker_runs_it_at_once(
    settings: Settings, conn: Any
) -> None:
    # A long poll: only the wake-up of run-now gets the job started within the wait.
    slow_poll = settings.model_copy(update={"poll_interval": 60.0})
    async with running_worker(slow_poll), api(settings) as client:
        job_id = await enqueue(client, task="echo", payload={"n": 1}, delay=3600)

        async def listening() -> bool:
            return any(row["listening"] for row in (await client.get("/workers")).json())

        await wait_until(listening)  # idle, asleep until the poll or a wake-up
        answer = await client.post(f"/jobs/{job_id}/run-now")
        assert answer.status_code == 200, answer.text
        await wait_for_status(conn, job_id, "completed", timeout=10)
        again = await client.post(f"/jobs/{job_id}/run-now")
        missing = await client.post(f"/jobs/{UUID(int=1)}/run-now")
        malformed = await client.post("/jobs/not-a-uuid/run-now")
        due = await enqueue(client, task="nobody_runs_this", payload={})
        due_now = await client.post(f"/jobs/{due}/run-now")
    client_error(again, 409)
    assert "completed" in again.json()["detail"]
    client_error(missing, 404)
    client_error(malformed, 422)
    client_error(due_now, 409)
    assert "due already" in due_now.json()["detail"]


async def test_run_now_needs_the_token_and_refuses_another_site(settings: Settings) -> None:
    async with api(settings, api_token=SecretStr("s3cret")) as client:
        job_id = await enqueue_with(client, {"authorization": "Bearer s3cret"})
        client_error(await client.post(f"/jobs/{job_id}/run-now"), 401)
    async with api(settings) as client:
        job_id = await enqueue(client, payload={}, delay=600)
        foreign = await client.post(
            f"/jobs/{job_id}/run-now", headers={"origin": "https://evil.example"}
        )
        assert foreign.status_code == 403, foreign.text
        row = (await client.get(f"/jobs/{job_id}")).json()
    assert row["status"] == "queued"


async def enqueue_with(client: httpx.AsyncClient, headers: dict[str, str]) -> str:
    answer = await client.post("/jobs", json={"payload": {}, "delay": 600}, headers=headers)
    assert answer.status_code == 201, answer.text
    job_id: str = answer.json()["job_id"]
    return job_id


async def test_periodic_shows_each_cron_task_its_last_tick_and_job_and_the_next(
    settings: Settings, conn: Any
) -> None:
    async def every_minute(payload: dict[str, Any]) -> None: ...

    tasks = worker_registry(Registry([make_task(every_minute, cron="* * * * *")]))
    async with running_worker(settings, tasks), api(settings) as client:

        async def ticked() -> Any:
            rows = (await client.get("/periodic")).json()["tasks"]
            row = next(r for r in rows if r["name"] == "every_minute")
            return row if row["last_tick"] and row["last_tick"]["job_status"] else None

        row = await wait_until(ticked)
        await wait_for_status(conn, row["last_tick"]["job_id"], "completed")
        row = await wait_until(ticked)
    assert row["cron"] == "* * * * *" and row["description"] == "every minute"
    assert row["state"] == "ok", row
    assert row["queue"] == "default" and row["queue_paused"] is False
    assert row["next_tick"] > row["last_tick"]["at"]
    # Only the periodic task: the built-ins have no schedule.
    assert [r["name"] for r in (await tasks_listed(settings))] == ["every_minute"]


async def tasks_listed(settings: Settings) -> list[dict[str, Any]]:
    async with api(settings) as client:
        rows: list[dict[str, Any]] = (await client.get("/periodic")).json()["tasks"]
    return rows


async def test_periodic_says_when_no_live_worker_enqueues_a_task_any_more(
    settings: Settings, conn: Any
) -> None:
    """A worker registered the task an hour ago and stopped: the ticks since are missing."""
    await conn.execute(
        "INSERT INTO notifyq.tasks (name, options, updated_at) VALUES"
        ' (\'nightly\', \'{"cron": "30 2 * * *", "queue": "reports"}\','
        "  now() - interval '3 days'),"
        " ('fresh', '{\"cron\": \"0 0 1 1 *\"}', now()),"
        " ('broken', '{\"cron\": \"not a cron\"}', now())"
    )
    await conn.execute("INSERT INTO notifyq.queues (name, paused) VALUES ('reports', true)")
    async with api(settings) as client:
        answer = await client.get("/periodic")
    assert answer.status_code == 200, answer.text
    rows = {row["name"]: row for row in answer.json()["tasks"]}
    assert rows["nightly"]["state"] == "missed"
    assert "no live worker" in rows["nightly"]["reason"]
    assert rows["nightly"]["last_tick"] is None and rows["nightly"]["queue_paused"] is True
    assert rows["nightly"]["description"] == "every day at 02:30 UTC"
    assert rows["fresh"]["state"] == "pending"
    assert rows["broken"]["state"] == "invalid" and rows["broken"]["next_tick"] is None
