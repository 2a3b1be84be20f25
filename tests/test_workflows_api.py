"""The HTTP face of the contract's "Workflows, groups and progress", against a real PostgreSQL.

Dependencies and groups through ``POST /jobs`` and ``POST /jobs/batch``, the new fields of
``GET /jobs/{id}``, ``POST /workflows`` and ``GET /workflows/{id}`` are reached through httpx's
ASGI transport, with the app's real lifespan (and its in-process worker when a test needs one).
``GET /jobs/{id}/events`` streams, which that transport would only hand over once they end, are
read from a real ``notifyq serve`` process shared by the module (its own database, a token, a
bound of two streams, and a poll interval of 30 s, so that whatever arrives in seconds was
pushed); the jobs they follow run on a worker in the test's own process, on a queue of the
test's own. The Python and SQL faces are in ``tests/test_workflows.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

import anyio
import httpx
import psycopg
import pytest
from psycopg import sql
from pydantic import SecretStr

from notifyq import JobContext, Snooze
from notifyq.api import create_app
from notifyq.settings import Settings
from notifyq.tasks import Registry
from tests.helpers import (
    count_by_status,
    notifyq_env,
    processes,
    registry,
    running_worker,
    url_with_dbname,
    wait_until,
)

#: The token of the module's server.
TOKEN = "stream-s3cret"
#: Its NOTIFYQ_MAX_STREAMS.
MAX_STREAMS = 2
#: How long a pushed event may take here: far under the poll interval (30 s) and the streams'
#: keep-alive (15 s), the only other things that could make a stream look at its job again.
PUSHED = 5.0


# -- the app through ASGI ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def app_client(
    settings: Settings, tasks: Registry | None = None, **overrides: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """The app on ``settings`` (no worker unless ``run_worker=True``) with its lifespan
    running, and a client of it that sees an unhandled error as the 500 it would be."""
    app = create_app(settings.model_copy(update={"run_worker": False, **overrides}), registry=tasks)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            yield client


async def enqueue(client: httpx.AsyncClient, body: dict[str, Any], status: int = 201) -> str:
    response = await client.post("/jobs", json=body)
    assert response.status_code == status, response.text
    assert response.json()["duplicate"] is False
    job_id: str = response.json()["job_id"]
    return job_id


async def get_job(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    response = await client.get(f"/jobs/{job_id}")
    assert response.status_code == 200, response.text
    job: dict[str, Any] = response.json()
    return job


async def wait_for_job(
    client: httpx.AsyncClient, job_id: str, *statuses: str, timeout: float = 10.0
) -> dict[str, Any]:
    """The job as GET /jobs/{id} shows it, once its status is one of ``statuses``."""

    async def reached() -> dict[str, Any] | None:
        job = await get_job(client, job_id)
        return job if job["status"] in statuses else None

    job: dict[str, Any] = await wait_until(reached, timeout=timeout)
    return job


def assert_422(response: httpx.Response, *fragments: str) -> None:
    """A 422 whose JSON ``detail`` mentions every fragment."""
    assert response.status_code == 422, (response.status_code, response.text[:500])
    assert response.headers["content-type"].startswith("application/json")
    detail = json.dumps(response.json()["detail"])
    for fragment in fragments:
        assert fragment in detail, (fragment, detail[:500])


def because(parent: str, ended: str = "was cancelled") -> str:
    """The error of a job cancelled because ``parent``, a job it depends on, ended so."""
    return f"cancelled: job {parent}, which it depends on, {ended}"


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def job_count(conn: psycopg.AsyncConnection[Any]) -> int:
    cursor = await conn.execute("SELECT count(*) FROM notifyq.jobs")
    row = await cursor.fetchone()
    assert row is not None
    count: int = row[0]
    return count


async def stored_group_key(conn: psycopg.AsyncConnection[Any], job_id: str) -> str | None:
    cursor = await conn.execute("SELECT group_key FROM notifyq.jobs WHERE id = %s", [job_id])
    row = await cursor.fetchone()
    assert row is not None
    key: str | None = row[0]
    return key


# -- POST /jobs: depends_on and group_key ------------------------------------------------------


async def test_a_dependent_job_is_waiting_and_get_shows_the_new_fields(
    settings: Settings, conn: Any
) -> None:
    async with app_client(settings) as client:
        parent = await enqueue(client, {"payload": {}, "delay": 3600})
        answer = await client.post(
            "/jobs", json={"payload": {}, "depends_on": [parent, parent], "group_key": "g"}
        )
        assert answer.status_code == 201, answer.text
        assert answer.json()["status"] == "waiting"
        child = await get_job(client, answer.json()["job_id"])
        plain = await get_job(client, parent)
        listed = (await client.get("/jobs", params={"status": "waiting"})).json()["jobs"]
        queues = {q["queue"]: q for q in (await client.get("/queues")).json()}
    assert child["status"] == "waiting"
    assert child["depends_on"] == [parent]  # named twice, stored once
    assert (child["group_key"], child["workflow_id"], child["progress"]) == ("g", None, None)
    # Without them: an empty list, and nulls.
    assert plain["depends_on"] == []
    assert (plain["group_key"], plain["workflow_id"], plain["progress"]) == (None, None, None)
    assert [job["job_id"] for job in listed] == [child["job_id"]]
    assert queues["default"]["waiting"] == 1 and queues["default"]["queued"] == 1


async def test_depending_on_finished_jobs_queues_or_cancels_at_once(
    settings: Settings, conn: Any
) -> None:
    async with app_client(settings, run_worker=True) as client:
        done = await enqueue(client, {"payload": {"n": 1}})
        await wait_for_job(client, done, "completed")
        cancelled = await enqueue(client, {"payload": {}, "delay": 3600})
        assert (await client.post(f"/jobs/{cancelled}/cancel")).status_code == 200
        ready = await client.post("/jobs", json={"payload": {}, "depends_on": [done]})
        doomed = await client.post("/jobs", json={"payload": {}, "depends_on": [done, cancelled]})
        assert ready.status_code == doomed.status_code == 201
        assert ready.json()["status"] == "queued"
        assert doomed.json()["status"] == "cancelled"
        ran = await wait_for_job(client, ready.json()["job_id"], "completed")
        never = await get_job(client, doomed.json()["job_id"])
    assert ran["depends_on"] == [done]
    assert never["error"] == because(cancelled)


async def test_an_unknown_dependency_is_a_422_naming_it_and_stores_nothing(
    settings: Settings, conn: Any
) -> None:
    unknown = str(uuid.UUID(int=0xDEAD))
    async with app_client(settings) as client:
        known = await enqueue(client, {"payload": {}})
        alone = await client.post("/jobs", json={"payload": {}, "depends_on": [known, unknown]})
        batch = await client.post(
            "/jobs/batch",
            json={
                "jobs": [
                    {"payload": {"n": 1}},
                    {"payload": {"n": 2}, "depends_on": [known]},
                    {"payload": {"n": 3}, "depends_on": [unknown]},
                ]
            },
        )
        # At the bound of 1,000 ids, all unknown: still a 422, never a 5xx.
        many = [str(uuid.uuid4()) for _ in range(1000)]
        at_bound = await client.post("/jobs", json={"payload": {}, "depends_on": many})
    assert_422(alone, unknown)
    assert known not in json.dumps(alone.json()["detail"])  # only the one at fault
    assert_422(batch, unknown)
    assert_422(at_bound, many[0], many[-1])
    assert await count_by_status(conn) == {"queued": 1}


#: Bodies of POST /jobs whose depends_on or group_key is malformed.
MALFORMED_JOBS: list[tuple[dict[str, Any], str]] = [
    ({"depends_on": ["nope"]}, "depends_on"),
    ({"depends_on": [""]}, "depends_on"),
    ({"depends_on": [5]}, "depends_on"),
    ({"depends_on": [None]}, "depends_on"),
    ({"depends_on": [["00000000-0000-0000-0000-000000000001"]]}, "depends_on"),
    ({"depends_on": "00000000-0000-0000-0000-000000000001"}, "depends_on"),
    ({"depends_on": {"id": "00000000-0000-0000-0000-000000000001"}}, "depends_on"),
    ({"depends_on": [str(uuid.UUID(int=n)) for n in range(1, 1002)]}, "1000"),
    ({"group_key": ""}, "group_key"),
    ({"group_key": "k" * 513}, "group_key"),
    ({"group_key": 5}, "group_key"),
    ({"group_key": ["k"]}, "group_key"),
    ({"group_key": "a\u0000b"}, "NUL"),
]


async def test_malformed_dependencies_and_group_keys_are_422_and_store_nothing(
    settings: Settings, conn: Any
) -> None:
    async with app_client(settings) as client:
        for fields, fragment in MALFORMED_JOBS:
            body = {"payload": {}, **fields}
            assert_422(await client.post("/jobs", json=body), fragment)
            batch = {"jobs": [{"payload": {}}, body]}
            assert_422(await client.post("/jobs/batch", json=batch), fragment)
            workflow = {"jobs": [{"ref": "a", "payload": {}}, {"ref": "b", **body}]}
            if "depends_on" not in fields:  # a workflow's depends_on names refs: below
                assert_422(await client.post("/workflows", json=workflow), fragment)
        # The longest group key is accepted.
        longest = await enqueue(client, {"payload": {}, "group_key": "k" * 512})
    assert await count_by_status(conn) == {"queued": 1}
    assert await stored_group_key(conn, longest) == "k" * 512


@pytest.mark.parametrize("field", ["depends_on", "group_key"])
async def test_a_duplicate_that_asks_for_other_dependencies_or_another_group_is_refused(
    settings: Settings, conn: Any, field: str
) -> None:
    # Taking the submission for the pending job's would drop what it asked for: a job meant to
    # wait for another could run first, one meant for a group could run beside its members.
    async with app_client(settings) as client:
        parent = await enqueue(client, {"payload": {}, "delay": 3600, "group_key": "g"})
        first = await enqueue(client, {"payload": {"v": 1}, "dedup_key": "k"})
        value: Any = [parent] if field == "depends_on" else "g"
        again = await client.post(
            "/jobs", json={"payload": {"v": 2}, "dedup_key": "k", field: value}
        )
        job = await get_job(client, first)
    assert again.status_code == 422, again.text
    assert first in again.json()["detail"] and field in again.json()["detail"]
    # The refusal changed nothing: the pending job keeps its payload, and no second job exists.
    assert job["payload"] == {"v": 1} and job["status"] == "queued"
    assert job[field] == ([] if field == "depends_on" else None)
    assert await count_by_status(conn) == {"queued": 2}


async def test_a_duplicate_that_asks_for_the_same_dependencies_and_group_replaces_the_job(
    settings: Settings, conn: Any
) -> None:
    async with app_client(settings) as client:
        one = await enqueue(client, {"payload": {}, "delay": 3600})
        two = await enqueue(client, {"payload": {}, "delay": 3600})
        body = {"payload": {"v": 1}, "dedup_key": "k", "group_key": "g", "depends_on": [one, two]}
        first = await enqueue(client, body)
        # The same set of dependencies, in another order and with a repeat.
        again = await client.post(
            "/jobs", json={**body, "payload": {"v": 2}, "depends_on": [two, one, two]}
        )
        job = await get_job(client, first)
    assert again.status_code == 200, again.text
    assert again.json() == {**again.json(), "job_id": first, "duplicate": True}
    assert job["payload"] == {"v": 2} and job["status"] == "waiting"
    assert sorted(job["depends_on"]) == sorted([one, two]) and job["group_key"] == "g"


async def test_a_batch_depends_on_stored_jobs_and_its_groups_run_in_batch_order(
    settings: Settings, conn: Any
) -> None:
    order: list[tuple[str, int]] = []
    running: set[str] = set()
    overlaps: list[tuple[str, int]] = []

    async def member(payload: dict[str, Any], ctx: JobContext) -> int:
        key = payload.get("key", "-")
        order.append((key, payload["n"]))
        if key != "-":
            if key in running:
                overlaps.append((key, payload["n"]))
            running.add(key)
        await anyio.sleep(0.005)
        running.discard(key)
        return sum(ctx.dependencies.values(), payload["n"])

    def batch(key: str, dedup: bool) -> list[dict[str, Any]]:
        # A group's members interleaved with jobs of no group. With a dedup key on some of
        # them the store takes the batch row by row, else in one INSERT: both keep the order.
        jobs: list[dict[str, Any]] = []
        for n in range(12):
            job = {"task": "member", "payload": {"key": key, "n": n}, "group_key": key}
            if dedup and n % 4 == 1:
                job["dedup_key"] = f"{key}{n}"
            jobs += [job, {"task": "member", "payload": {"n": 1000 + n}}]
        return jobs

    tasks = registry(member=member)
    async with app_client(settings, tasks) as client:
        parent = await enqueue(client, {"task": "member", "payload": {"n": 100}})
        results: dict[str, list[dict[str, Any]]] = {}
        for key, dedup in (("b", False), ("c", True)):
            jobs = [
                *batch(key, dedup),
                {"task": "member", "payload": {"n": 7000}, "depends_on": [parent]},
            ]
            answer = await client.post("/jobs/batch", json={"jobs": jobs})
            assert answer.status_code == 200, answer.text
            results[key] = answer.json()["results"]
            assert [r["status"] for r in results[key]] == ["queued"] * 24 + ["waiting"]
    # Then a worker (the app's, 10 jobs at once) runs them all.
    async with app_client(settings, tasks, run_worker=True) as client:
        for key in results:
            for result in results[key]:
                await wait_for_job(client, result["job_id"], "completed")
        last = await get_job(client, results["c"][-1]["job_id"])
        members = {
            key: [await get_job(client, r["job_id"]) for r in results[key][:24:2]]
            for key in results
        }
    assert last["depends_on"] == [parent] and last["result"] == 7000 + 100
    for key in ("b", "c"):
        assert [n for k, n in order if k == key] == list(range(12)), key
        assert {m["group_key"] for m in members[key]} == {key}
    # One at a time, as the handlers saw it. (The stored times cannot show it to the
    # microsecond: a claim's started_at is the time its statement began, which may be before
    # the statement that ended the member before it committed.)
    assert overlaps == []


# -- the waiting -> queued transition, and cancellations ------------------------------------


async def test_a_parents_completion_starts_the_waiting_child_at_once(
    settings: Settings, conn: Any
) -> None:
    """The app's worker serves only "default" and is idle throughout; the parent runs on
    another worker, in queue "upstream". The poll interval is 30 s: only the wake-up sent by
    the parent's completion can start the child within the deadline."""
    upstream = settings.model_copy(update={"queues": ["upstream"]})
    async with app_client(settings, run_worker=True, queues=["default"]) as client:
        parent = await enqueue(
            client, {"task": "sleep", "queue": "upstream", "payload": {"seconds": 0.3}}
        )
        child = await enqueue(client, {"payload": {"n": 1}, "depends_on": [parent]})
        assert (await get_job(client, child))["status"] == "waiting"
        async with running_worker(upstream):
            done = await wait_for_job(client, child, "completed", timeout=5)
        finished = await get_job(client, parent)
    assert finished["status"] == "completed"
    gap = parse_time(done["started_at"]) - parse_time(finished["finished_at"])
    assert gap.total_seconds() < 2, gap


async def test_cancelling_a_parent_over_http_cancels_its_children_naming_it(
    settings: Settings, conn: Any
) -> None:
    async with app_client(settings) as client:
        parent = await enqueue(client, {"payload": {}, "delay": 3600})
        child = await enqueue(client, {"payload": {}, "depends_on": [parent]}, 201)
        grandchild = await enqueue(client, {"payload": {}, "depends_on": [child]})
        cancelled = await client.post(f"/jobs/{parent}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        kid, grandkid = await get_job(client, child), await get_job(client, grandchild)
        # The child is retried only once its parent is.
        refused = await client.post(f"/jobs/{child}/retry")
        assert (await client.post(f"/jobs/{parent}/retry")).status_code == 200
        again = await client.post(f"/jobs/{child}/retry")
    assert kid["status"] == grandkid["status"] == "cancelled"
    assert kid["error"] == because(parent)
    assert grandkid["error"] == because(child)
    assert refused.status_code == 409 and parent in refused.json()["detail"]
    assert again.status_code == 200 and again.json()["status"] == "waiting"


async def test_a_failed_or_stopped_parent_cancels_its_child(settings: Settings, conn: Any) -> None:
    async with app_client(settings, run_worker=True) as client:
        failing = await enqueue(
            client, {"task": "fail", "payload": {"message": "no"}, "max_attempts": 1}
        )
        after_failure = await enqueue(client, {"payload": {}, "depends_on": [failing]})
        running = await enqueue(client, {"task": "sleep", "payload": {"seconds": 60}})
        after_stop = await enqueue(client, {"payload": {}, "depends_on": [running]})
        await wait_for_job(client, running, "processing")
        stop = await client.post(f"/jobs/{running}/cancel")
        assert stop.status_code == 202, stop.text  # its worker is asked to stop it
        first = await wait_for_job(client, after_failure, "cancelled")
        second = await wait_for_job(client, after_stop, "cancelled")
    assert first["error"] == because(failing, "failed")
    assert second["error"] == because(running)


async def test_get_job_shows_progress_while_the_handler_reports(
    settings: Settings, conn: Any
) -> None:
    step = anyio.Event()
    stage = 0

    async def report(payload: dict[str, Any], ctx: JobContext) -> str:
        nonlocal stage
        ctx.progress(message="warming up")
        stage = 1
        await step.wait()
        ctx.progress(0.75)
        stage = 2
        await anyio.sleep(3600)  # until cancelled
        return "never"

    async with app_client(settings, registry(report=report), run_worker=True) as client:
        job_id = await enqueue(client, {"task": "report", "payload": {}})

        async def progress() -> Any:
            return (await get_job(client, job_id))["progress"]

        assert await wait_until(progress) == {"fraction": None, "message": "warming up"}
        step.set()
        await wait_until(lambda: stage == 2)
        assert await wait_until(lambda: _changed(progress, "warming up")) == {
            "fraction": 0.75,
            "message": None,
        }
        await client.post(f"/jobs/{job_id}/cancel")
        await wait_for_job(client, job_id, "cancelled")


async def _changed(read: Any, message: str) -> Any:
    value = await read()
    return value if value and value["message"] != message else None


# -- POST /workflows and GET /workflows/{id} ------------------------------------------------


async def test_a_workflow_of_refs_and_stored_ids_runs_and_get_follows_it(
    settings: Settings, conn: Any
) -> None:
    gate = anyio.Event()

    async def add(payload: dict[str, Any], ctx: JobContext) -> int:
        if payload.get("gated"):
            await gate.wait()
        return sum(ctx.dependencies.values(), payload.get("n", 0))

    async with app_client(settings, registry(add=add), run_worker=True) as client:
        stored = await enqueue(client, {"task": "add", "payload": {"n": 1000}})
        await wait_for_job(client, stored, "completed")
        body = {
            "jobs": [
                {"ref": "sum", "task": "add", "payload": {}, "depends_on": ["left", "right"]},
                {"ref": "start", "task": "add", "payload": {"n": 1, "gated": True}},
                {"ref": "left", "task": "add", "payload": {"n": 10}, "depends_on": ["start"]},
                {
                    "ref": "right",
                    "task": "add",
                    "payload": {"n": 20},
                    "depends_on": ["start", stored],
                    "group_key": "wf",
                },
            ]
        }
        created = await client.post("/workflows", json=body)
        assert created.status_code == 201, created.text
        answer = created.json()
        assert set(answer) == {"workflow_id", "jobs"}
        ids = answer["jobs"]
        assert set(ids) == {"sum", "start", "left", "right"}
        workflow_id = answer["workflow_id"]
        running = (await client.get(f"/workflows/{workflow_id}")).json()
        right = await get_job(client, ids["right"])
        gate.set()
        await wait_for_job(client, ids["sum"], "completed")
        done = await client.get(f"/workflows/{workflow_id}")
        alone = await get_job(client, stored)
    assert str(uuid.UUID(workflow_id)) == workflow_id
    assert set(running) == {"workflow_id", "status", "jobs"}
    assert running["workflow_id"] == workflow_id and running["status"] == "running"
    assert {job["job_id"] for job in running["jobs"]} == set(ids.values())
    assert right["depends_on"] == sorted([ids["start"], stored])
    assert (right["workflow_id"], right["group_key"]) == (workflow_id, "wf")
    assert alone["workflow_id"] is None
    assert done.status_code == 200
    final = done.json()
    assert final["status"] == "completed"
    by_id = {job["job_id"]: job for job in final["jobs"]}
    assert by_id[ids["sum"]]["result"] == (10 + 1) + (20 + 1 + 1000)
    # Each job as GET /jobs/{id} shows it.
    async with app_client(settings) as client:
        for job_id, job in by_id.items():
            assert job == await get_job(client, job_id)


async def test_get_workflow_names_each_job_by_its_ref(settings: Settings, conn: Any) -> None:
    """A client that did not keep the POST answer finds the steps by name: each job of GET
    /workflows/{id} (and GET /jobs/{id}) has its `ref`; a job outside a workflow has none."""
    jobs = [
        {"ref": "fetch", "payload": {}, "delay": 3600},
        {"ref": "parse", "payload": {}, "depends_on": ["fetch"]},
        {"ref": "store", "payload": {}, "depends_on": ["parse", "fetch"]},
    ]
    async with app_client(settings) as client:
        created = await client.post("/workflows", json={"jobs": jobs})
        assert created.status_code == 201, created.text
        ids, workflow_id = created.json()["jobs"], created.json()["workflow_id"]
        read = (await client.get(f"/workflows/{workflow_id}")).json()
        one = await get_job(client, ids["parse"])
        alone = await get_job(client, await enqueue(client, {"payload": {}}))
        listed = (await client.get("/jobs", params={"limit": 10})).json()["jobs"]
    assert {job["ref"]: job["job_id"] for job in read["jobs"]} == ids
    assert [job["ref"] for job in read["jobs"]] == ["fetch", "parse", "store"]
    assert one["ref"] == "parse" and alone["ref"] is None
    assert {job["job_id"]: job["ref"] for job in listed} == {
        **{job_id: ref for ref, job_id in ids.items()},
        alone["job_id"]: None,
    }
    cursor = await conn.execute(
        "SELECT ref FROM notifyq.jobs WHERE id = %s", [uuid.UUID(ids["store"])]
    )
    assert await cursor.fetchone() == ("store",)


def _workflow_cases(stored: str) -> list[tuple[list[dict[str, Any]], list[str]]]:
    """Workflows that must be refused, each with what the 422 must name. The fault is in the
    last job where it can be, so that the jobs before it were already checked (or stored)."""
    unknown = str(uuid.UUID(int=0xBAD))
    ok = {"task": "echo", "payload": {}}
    return [
        (
            [
                {"ref": "a", **ok, "depends_on": ["c"]},
                {"ref": "b", **ok, "depends_on": ["a"]},
                {"ref": "c", **ok, "depends_on": ["b", stored]},
            ],
            ["cycle"],
        ),
        ([{"ref": "a", **ok, "depends_on": ["a"]}], ["itself"]),
        ([{"ref": "a", **ok}, {"ref": "b", **ok}, {"ref": "a", **ok}], ["'a'", "jobs[2]"]),
        ([{"ref": "a", **ok}, {"ref": "b", **ok, "depends_on": ["a", "zz"]}], ["'zz'"]),
        ([{"ref": "a", **ok}, {"ref": "b", **ok, "depends_on": ["a", unknown]}], [unknown]),
        ([{"ref": "a", **ok}, {"ref": "b", "task": "echo", "payload": [1]}], ["payload"]),
        ([{"ref": "a", **ok}, {"ref": "b", "task": "echo"}], ["payload"]),
        ([{"ref": "a", **ok}, {"ref": "b", **ok, "depends_on": [5]}], ["depends_on"]),
        ([{"ref": "a", **ok}, {"ref": "b", **ok, "depends_on": "a"}], ["depends_on"]),
        ([{"ref": "a", **ok}, {"ref": "", **ok}], ["ref"]),
        ([{"ref": "a", **ok}, {**ok}], ["ref"]),
        ([{"ref": "a", **ok}, {"ref": "b\u0000", **ok}], ["NUL"]),
        ([{"ref": "a", **ok}, {"ref": "b", **ok, "colour": 1}], ["colour"]),
        ([{"ref": "a", **ok}, {"ref": "b", **ok, "payload": {"x": "\u0000"}}], ["NUL"]),
        ([{"ref": "a", **ok}, {"ref": "b", **ok, "delay": -1}], ["delay"]),
        ([], ["jobs"]),
    ]


async def test_get_workflow_lists_the_jobs_in_the_order_they_went_in(
    settings: Settings, conn: Any
) -> None:
    # Every job after those it depends on, the others as submitted: the first job, which waits
    # for the last, goes in last. (One transaction gives them all one created_at.)
    refs = [f"j{n:02d}" for n in range(12)]
    jobs: list[dict[str, Any]] = [{"ref": ref, "payload": {}, "delay": 3600} for ref in refs]
    jobs[0]["depends_on"] = [refs[-1]]
    async with app_client(settings) as client:
        created = await client.post("/workflows", json={"jobs": jobs})
        assert created.status_code == 201, created.text
        ids = created.json()["jobs"]
        read = await client.get(f"/workflows/{created.json()['workflow_id']}")
    listed = [job["job_id"] for job in read.json()["jobs"]]
    assert listed == [ids[ref] for ref in refs[1:] + refs[:1]]


async def test_a_bad_workflow_is_a_422_and_creates_nothing(settings: Settings, conn: Any) -> None:
    async with app_client(settings) as client:
        stored = await enqueue(client, {"payload": {}})
        for jobs, fragments in _workflow_cases(stored):
            answer = await client.post("/workflows", json={"jobs": jobs})
            assert_422(answer, *fragments)
            assert await job_count(conn) == 1, jobs
        assert_422(await client.post("/workflows", json={"jobs": [], "x": 1}), "x")
        assert_422(await client.post("/workflows", json=[{"ref": "a", "payload": {}}]))
        unknown = await client.get(f"/workflows/{uuid.uuid4()}")
        malformed = await client.get("/workflows/not-a-uuid")
        a_job_id = await client.get(f"/workflows/{stored}")  # a job's id is not a workflow's
    assert unknown.status_code == 404 and "no workflow" in unknown.json()["detail"]
    assert a_job_id.status_code == 404
    assert_422(malformed, "workflow_id")


async def test_a_workflow_whose_job_failed_is_failed(settings: Settings, conn: Any) -> None:
    async with app_client(settings, run_worker=True) as client:
        created = await client.post(
            "/workflows",
            json={
                "jobs": [
                    {"ref": "boom", "task": "fail", "payload": {}, "max_attempts": 1},
                    {"ref": "after", "payload": {}, "depends_on": ["boom"]},
                    {"ref": "aside", "payload": {"n": 1}},
                ]
            },
        )
        assert created.status_code == 201, created.text
        ids, workflow_id = created.json()["jobs"], created.json()["workflow_id"]
        await wait_for_job(client, ids["after"], "cancelled")
        await wait_for_job(client, ids["aside"], "completed")
        workflow = (await client.get(f"/workflows/{workflow_id}")).json()
    # One failed and one was cancelled: failed says more.
    assert workflow["status"] == "failed"
    statuses = {job["job_id"]: job["status"] for job in workflow["jobs"]}
    assert statuses == {ids["boom"]: "failed", ids["after"]: "cancelled", ids["aside"]: "completed"}


async def test_a_workflow_whose_middle_job_is_cancelled_over_http(
    settings: Settings, conn: Any
) -> None:
    async with app_client(settings) as client:
        created = await client.post(
            "/workflows",
            json={
                "jobs": [
                    {"ref": "a", "payload": {}, "delay": 3600},
                    {"ref": "b", "payload": {}, "depends_on": ["a"]},
                    {"ref": "c", "payload": {}, "depends_on": ["b"]},
                    {"ref": "d", "payload": {}, "depends_on": ["c"]},
                ]
            },
        )
        ids, workflow_id = created.json()["jobs"], created.json()["workflow_id"]
        before = (await client.get(f"/workflows/{workflow_id}")).json()
        assert (await client.post(f"/jobs/{ids['b']}/cancel")).status_code == 200
        after = (await client.get(f"/workflows/{workflow_id}")).json()
    assert before["status"] == "running"
    assert after["status"] == "cancelled"
    jobs = {job["job_id"]: job for job in after["jobs"]}
    assert [jobs[ids[ref]]["status"] for ref in "abcd"] == [
        "queued",
        "cancelled",
        "cancelled",
        "cancelled",
    ]
    assert jobs[ids["c"]]["error"] == because(ids["b"])
    assert jobs[ids["d"]]["error"] == because(ids["c"])


async def test_the_token_guards_workflows_and_event_streams(settings: Settings, conn: Any) -> None:
    body = {"jobs": [{"ref": "a", "payload": {}}]}
    right = {"authorization": "Bearer s3cret"}
    async with app_client(settings, api_token=SecretStr("s3cret")) as client:
        assert (await client.post("/workflows", json=body)).status_code == 401
        wrong = await client.post("/workflows", json=body, headers={"authorization": "Bearer x"})
        assert wrong.status_code in (401, 403)
        assert await job_count(conn) == 0
        created = await client.post("/workflows", json=body, headers=right)
        assert created.status_code == 201, created.text
        workflow_id, job_id = created.json()["workflow_id"], created.json()["jobs"]["a"]
        assert (await client.get(f"/workflows/{workflow_id}")).status_code == 401
        assert (await client.get(f"/workflows/{workflow_id}", headers=right)).status_code == 200
        assert (await client.get(f"/jobs/{job_id}/events")).status_code == 401
        await client.post(f"/jobs/{job_id}/cancel", headers=right)
        # A finished job's stream is one event and its end: the ASGI transport can read it.
        stream = await client.get(f"/jobs/{job_id}/events", headers=right)
    assert stream.status_code == 200
    assert stream.text.startswith("event: job\ndata: ")


async def test_openapi_documents_the_workflow_routes_and_the_stream(
    settings: Settings, conn: Any
) -> None:
    async with app_client(settings) as client:
        spec = (await client.get("/openapi.json")).json()
    paths = spec["paths"]
    assert {"201", "422"} <= set(paths["/workflows"]["post"]["responses"])
    assert {"200", "404", "422"} <= set(paths["/workflows/{workflow_id}"]["get"]["responses"])
    events = paths["/jobs/{job_id}/events"]["get"]["responses"]
    assert {"200", "404", "422", "503"} <= set(events)
    assert "text/event-stream" in events["200"]["content"]
    job = spec["components"]["schemas"]["JobOut"]["properties"]
    assert {"depends_on", "group_key", "workflow_id", "progress"} <= set(job)


# -- GET /jobs/{id}/events, from a real server ---------------------------------------------


@pytest.fixture(scope="module")
def stream_db_url(server_url: str, template_db: str) -> Iterator[str]:
    """A database for the module's server, named like conftest's (so a killed run's copy is
    dropped by the next run). Each test uses a queue of its own in it."""
    name = f"nq_test_{os.getpid()}_sse{secrets.token_hex(3)}"
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


@pytest.fixture(scope="module")
def stream_server(stream_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``notifyq serve --no-worker`` on the module's database; answers its base URL."""
    env = notifyq_env(
        stream_db_url,
        NOTIFYQ_API_TOKEN=TOKEN,
        NOTIFYQ_MAX_STREAMS=str(MAX_STREAMS),
        NOTIFYQ_POLL_INTERVAL="30",
    )
    with processes(tmp_path_factory.mktemp("serve")) as start:
        serve = start("serve", "--port", "0", "--no-worker", env=env)
        serve.wait_for_output("Uvicorn running on")
        found = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", serve.output())
        assert found, serve.output()
        yield f"http://127.0.0.1:{found.group(1)}"


@pytest.fixture
def queue() -> str:
    """A queue of this test's own in the module's database."""
    return f"q-{secrets.token_hex(4)}"


@pytest.fixture
def stream_settings(stream_db_url: str, queue: str) -> Settings:
    """Settings of a worker serving only this test's queue, polling every 30 s."""
    return Settings.load(
        database_url=stream_db_url,
        queues=[queue],
        poll_interval=30,
        lease_seconds=30,
        auto_migrate=False,
    )


@contextlib.asynccontextmanager
async def server_client(
    base_url: str, token: str | None = TOKEN
) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=10) as client:
        yield client


class Events:
    """The server-sent events of one streamed response, read as they arrive."""

    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.aiter_lines()

    async def next(self, timeout: float = PUSHED) -> tuple[str | None, Any] | None:
        """The next event as (event, data decoded from JSON), or None once the stream ended;
        fails the test if none comes within ``timeout`` seconds."""
        kind: str | None = None
        data: list[str] = []
        with anyio.fail_after(timeout):
            while True:
                try:
                    line = await anext(self._lines)
                except StopAsyncIteration:
                    assert kind is None and not data, "the stream ended inside an event"
                    return None
                if not line:
                    if kind is not None or data:
                        return kind, json.loads("\n".join(data))
                elif not line.startswith(":"):  # a comment: a keep-alive
                    field, _, value = line.partition(":")
                    value = value.removeprefix(" ")
                    if field == "event":
                        kind = value
                    elif field == "data":
                        data.append(value)


@contextlib.asynccontextmanager
async def open_stream(client: httpx.AsyncClient, job_id: str) -> AsyncIterator[Events]:
    async with client.stream("GET", f"/jobs/{job_id}/events") as response:
        assert response.status_code == 200, (await response.aread())[:500]
        assert response.headers["content-type"].split(";")[0] == "text/event-stream"
        yield Events(response)


async def watch_rows(conn: psycopg.AsyncConnection[Any], *job_ids: str) -> int:
    cursor = await conn.execute(
        "SELECT count(*) FROM notifyq.watched_jobs WHERE job_id = ANY(%s::uuid[])",
        [list(job_ids)],
    )
    row = await cursor.fetchone()
    assert row is not None
    count: int = row[0]
    return count


async def test_a_stream_follows_a_waiting_job_to_its_end_pushed_by_notify(
    stream_server: str, stream_settings: Settings, queue: str
) -> None:
    """Every change is pushed, whichever statement made it: the parent's completion (waiting
    to queued), the claim, a snooze (back to queued), progress, the completion."""
    # Each step of the handler waits until the stream showed the one before: what the test
    # expects to see is then never overtaken by the next change.
    seen_running = [anyio.Event(), anyio.Event()]
    release = anyio.Event()
    runs = 0

    async def steps(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        nonlocal runs
        runs += 1
        await seen_running[runs - 1].wait()
        if runs == 1:
            raise Snooze(0.3)
        ctx.progress(0.25, "a quarter")
        await release.wait()
        return {"done": True, **ctx.dependencies}

    async with server_client(stream_server) as client:
        parent = await enqueue(client, {"task": "echo", "queue": queue, "payload": {"n": 1}})
        child = await enqueue(
            client, {"task": "steps", "queue": queue, "payload": {}, "depends_on": [parent]}
        )
        async with open_stream(client, child) as events:
            first = await events.next()
            assert first == ("job", await get_job(client, child))  # as GET /jobs/{id} shows it
            seen: list[dict[str, Any]] = [first[1]]
            async with running_worker(stream_settings, registry(steps=steps)):
                while seen[-1]["status"] != "completed":
                    event = await events.next()
                    assert event is not None, f"the stream ended after {seen[-1]['status']}"
                    kind, job = event
                    assert kind == "job" and set(job) == set(first[1])
                    seen.append(job)
                    if job["status"] == "processing" and job["progress"] is None:
                        started = [j for j in seen if j["status"] == "processing"]
                        seen_running[len(started) - 1].set()
                    if job["progress"] == {"fraction": 0.25, "message": "a quarter"}:
                        release.set()
                assert await events.next() is None  # it ends after the final status
    statuses = [job["status"] for job in seen]
    # queued right after waiting may come and go between two looks: the others last.
    if statuses[1] == "queued":
        del statuses[1]
    assert statuses == ["waiting", "processing", "queued", "processing", "processing", "completed"]
    assert seen[-3]["progress"] is None
    assert seen[-2]["progress"] == {"fraction": 0.25, "message": "a quarter"}
    assert seen[-1]["result"] == {"done": True, parent: {"n": 1}}
    running = next(job for job in seen if job["status"] == "processing")
    snoozed = seen[seen.index(running) + 1]
    assert snoozed["status"] == "queued" and snoozed["attempt_count"] == 0  # not counted
    assert parse_time(snoozed["run_at"]) > parse_time(running["started_at"])


async def test_a_stream_of_a_finished_job_is_one_event_and_bad_ids_are_refused(
    stream_server: str, queue: str
) -> None:
    async with server_client(stream_server) as client:
        job_id = await enqueue(client, {"queue": queue, "payload": {}})
        assert (await client.post(f"/jobs/{job_id}/cancel")).status_code == 200
        async with open_stream(client, job_id) as events:
            only = await events.next()
            assert only is not None and only[0] == "job"
            assert only[1]["status"] == "cancelled"
            assert await events.next() is None
        unknown = await client.get(f"/jobs/{uuid.uuid4()}/events")
        malformed = await client.get("/jobs/not-a-uuid/events")
    async with server_client(stream_server, token=None) as anonymous:
        without = await anonymous.get(f"/jobs/{job_id}/events")
    async with server_client(stream_server, token="wrong") as stranger:
        wrong = await stranger.get(f"/jobs/{job_id}/events")
    assert unknown.status_code == 404 and "no job" in unknown.json()["detail"]
    assert_422(malformed, "job_id")
    assert without.status_code == 401
    assert wrong.status_code in (401, 403)


async def test_streams_past_the_bound_are_refused_and_a_gone_client_costs_nothing(
    stream_server: str, stream_db_url: str, queue: str
) -> None:
    async with (
        await psycopg.AsyncConnection.connect(stream_db_url, autocommit=True) as conn,
        server_client(stream_server) as client,
    ):
        ids = [await enqueue(client, {"queue": queue, "payload": {"n": n}}) for n in range(3)]
        async with contextlib.AsyncExitStack() as open_streams:
            # Each stream in a client of its own: closing it closes its connection.
            async with (
                server_client(stream_server) as leaving,
                open_stream(leaving, ids[0]) as first,
            ):
                assert (await first.next()) is not None
                other = await open_streams.enter_async_context(server_client(stream_server))
                second = await open_streams.enter_async_context(open_stream(other, ids[1]))
                assert (await second.next()) is not None
                await wait_until(lambda: _equals(watch_rows(conn, ids[0], ids[1]), 2))

                refused = await client.get(f"/jobs/{ids[2]}/events")
                assert refused.status_code == 503, refused.text
                assert "NOTIFYQ_MAX_STREAMS" in refused.json()["detail"]
                assert refused.headers.get("retry-after")
            # The first client went away, its stream unread: its watch goes, and its place
            # is free again.
            await wait_until(lambda: _equals(watch_rows(conn, ids[0]), 0), timeout=5)
            third = await open_streams.enter_async_context(open_stream(client, ids[2]))
            assert (await third.next()) is not None
            await wait_until(lambda: _equals(watch_rows(conn, ids[2]), 1))
        # Every client gone: nothing is left watched, and the bound is free again.
        await wait_until(lambda: _equals(watch_rows(conn, *ids), 0), timeout=5)
        async with contextlib.AsyncExitStack() as again:
            for job_id in ids[:MAX_STREAMS]:
                fresh = await again.enter_async_context(server_client(stream_server))
                stream = await again.enter_async_context(open_stream(fresh, job_id))
                assert (await stream.next()) is not None


async def _equals(value: Any, expected: Any) -> bool:
    return bool(await value == expected)
