"""The archive of finished jobs (NOTIFYQ_ARCHIVE_AFTER, sql/015): what moves and when, what
never moves, reads that still find archived jobs, partitions made ahead and dropped past the
keep, two movers at once, and the privileges of the roles that use it.

The tests of this that need no database are in tests/unit/test_archive.py.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import anyio
import httpx
import psycopg
import psycopg.sql
import pytest

from notifyq import SyncQueue
from notifyq.api import create_app
from notifyq.client import Queue
from notifyq.errors import RefusedInput
from notifyq.models import JobStatus
from notifyq.settings import Settings
from notifyq.worker import archive, prune
from notifyq.worker._maintenance import ARCHIVE_AHEAD_DAYS
from tests.helpers import (
    end_by_hand,
    insert_in_state,
    notifyq_env,
    registry,
    running_worker,
    wait_for_status,
    wait_until,
)
from tests.test_privileges import as_role, role, run_notifyq
from tests.unit.test_archive import DAY

HOUR = 3600.0


def archiving(settings: Settings, after: float = HOUR, **more: Any) -> Settings:
    return settings.model_copy(update={"archive_after": after, **more})


async def archived_ids(conn: Any) -> set[UUID]:
    cursor = await conn.execute("SELECT id FROM notifyq.jobs_archive")
    return {row[0] for row in await cursor.fetchall()}


async def hot_ids(conn: Any) -> set[UUID]:
    cursor = await conn.execute("SELECT id FROM notifyq.jobs")
    return {row[0] for row in await cursor.fetchall()}


async def partitions(conn: Any) -> list[str]:
    cursor = await conn.execute(
        """SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
           WHERE i.inhparent = 'notifyq.jobs_archive'::regclass ORDER BY 1"""
    )
    return [row[0] for row in await cursor.fetchall()]


async def day_names(conn: Any, *offsets: int) -> list[str]:
    """The partition names of today plus each offset (days), as the database's UTC clock says."""
    names = []
    for offset in offsets:
        cursor = await conn.execute(
            "SELECT 'jobs_archive_' || to_char((now() AT TIME ZONE 'UTC')::date + %s, 'YYYYMMDD')",
            [offset],
        )
        names.append((await cursor.fetchone())[0])
    return names


def finished(status: str, ago: str) -> dict[str, str]:
    """The columns of a job that ended ``ago`` (an SQL interval)."""
    return {
        "status": f"'{status}'",
        "started_at": f"now() - interval '{ago}' - interval '1 second'",
        "finished_at": f"now() - interval '{ago}'",
        "attempt_count": "1",
        "result": """'{"done": true}'""" if status == "completed" else "NULL",
        "last_error": "'boom'" if status == "failed" else "NULL",
    }


# -- the setting --------------------------------------------------------------------------------


# -- what moves -----------------------------------------------------------------------------------


async def test_finished_jobs_move_once_older_than_the_setting_and_not_before(
    settings: Settings, conn: Any
) -> None:
    old = [
        *await insert_in_state(conn, **finished("completed", "2 hours")),
        *await insert_in_state(conn, "fail", **finished("failed", "2 hours")),
        *await insert_in_state(conn, **finished("cancelled", "2 hours")),
    ]
    young = await insert_in_state(conn, count=2, **finished("completed", "10 minutes"))
    queued = await insert_in_state(conn, count=2)
    running = await insert_in_state(
        conn,
        status="'processing'",
        worker_id="'w'",
        started_at="now() - interval '3 hours'",
        lease_expires_at="now() + interval '1 hour'",
        claims="1",
        attempt_count="1",
    )
    async with Queue(settings=settings) as q:
        done = await archive(q.store, archiving(settings, HOUR))
        assert done.moved == 3
        assert await archived_ids(conn) == set(old)
        assert await hot_ids(conn) == {*young, *queued, *running}
        # A second pass finds nothing more to move.
        assert (await archive(q.store, archiving(settings, HOUR))).moved == 0
        # What moved kept its columns.
        cursor = await conn.execute(
            """SELECT a.status, a.result, a.last_error, a.attempt_count, a.finished_at IS NOT NULL
               FROM notifyq.jobs_archive AS a ORDER BY a.status"""
        )
        assert await cursor.fetchall() == [
            ("cancelled", None, None, 1, True),
            ("completed", {"done": True}, None, 1, True),
            ("failed", None, "boom", 1, True),
        ]


async def test_a_job_that_a_job_not_started_yet_depends_on_never_moves(
    settings: Settings, conn: Any
) -> None:
    [parent] = await insert_in_state(conn, **finished("completed", "2 hours"))
    [other] = await insert_in_state(conn, **finished("completed", "2 hours"))
    [late] = await insert_in_state(conn, **finished("completed", "2 hours"))
    async with Queue(settings=settings) as q:
        # Queued for later (its parent completed), and waiting (one of its parents has not).
        child = await q.enqueue("echo", {}, depends_on=[parent], delay=3600)
        [unfinished] = await insert_in_state(conn, count=1)
        waiting = await q.enqueue("echo", {}, depends_on=[other, unfinished])
        assert (child.status.value, waiting.status.value) == ("queued", "waiting")
        await archive(q.store, archiving(settings, HOUR))
        assert await archived_ids(conn) == {late}
        # Once its dependent has started (here: finished), the parent moves too.
        await end_by_hand(conn, [child.job_id], "cancelled")
        await archive(q.store, archiving(settings, HOUR))
        assert await archived_ids(conn) == {late, parent}
        assert other in await hot_ids(conn)


async def test_a_job_whose_parent_is_archived_does_not_go_back(
    settings: Settings, conn: Any
) -> None:
    [parent] = await insert_in_state(conn, "fail", **finished("failed", "2 hours"))
    async with Queue(settings=settings) as q:
        child = await q.enqueue("echo", {}, depends_on=[parent])
        assert child.status.value == "cancelled"  # its parent had failed
        await archive(q.store, archiving(settings, HOUR))
        assert await archived_ids(conn) == {parent}
        retried = await q.store.retry_job(child.job_id)
        assert retried is not None and retried.status.value == "cancelled"
        assert retried.refused is not None and f"job {parent}" in retried.refused
        assert "archived" in retried.refused
        assert await q.store.retry_jobs(status=JobStatus.CANCELLED) == 0
        job = await q.get(child.job_id)
        assert job is not None and job.status.value == "cancelled" and not job.archived


async def test_with_the_archive_off_nothing_moves(settings: Settings, conn: Any) -> None:
    kept = await insert_in_state(conn, count=3, **finished("completed", "2 hours"))
    # Past the default keep of completed jobs (7 days): its deletion shows a pass has run.
    [expired] = await insert_in_state(conn, **finished("completed", "8 days"))
    async with running_worker(settings.model_copy(update={"prune_interval": 0.1})):
        await wait_until(lambda: _gone(conn, expired), timeout=10)
    assert await hot_ids(conn) == set(kept)
    assert await archived_ids(conn) == set()
    assert await partitions(conn) == []


async def _gone(conn: Any, job_id: UUID) -> bool:
    return job_id not in await hot_ids(conn)


async def test_a_worker_archives_finished_jobs_on_its_own(settings: Settings, conn: Any) -> None:
    fast = archiving(settings, 0.5, prune_interval=0.1)
    async with running_worker(fast), Queue(settings=settings) as q:
        ids = [(await q.enqueue("echo", {"n": n})).job_id for n in range(5)]

        async def all_archived() -> bool:
            return await archived_ids(conn) == set(ids)

        await wait_until(all_archived, timeout=15)
        # Queue.wait on an archived job answers it.
        job = await q.wait(ids[0], timeout=5)
        assert job.archived and job.result == {"n": 0}
    assert await hot_ids(conn) == set()


async def test_a_dependency_s_result_reaches_its_dependent_through_the_archive_passes(
    settings: Settings, conn: Any
) -> None:
    seen: list[Any] = []

    async def child(payload: dict[str, Any], ctx: Any) -> None:
        seen.append(dict(ctx.dependencies))

    tasks = registry(child=child)
    fast = archiving(settings, 0, prune_interval=0.05)
    async with running_worker(fast, tasks), Queue(settings=settings) as q:
        flow = await q.enqueue_workflow(
            [
                {"ref": "parent", "task": "echo", "payload": {"from": "parent"}},
                {"ref": "child", "task": "child", "depends_on": ["parent"], "delay": 1.0},
            ]
        )
        parent, dependent = flow.jobs["parent"], flow.jobs["child"]
        await wait_for_status(conn, parent, "completed")
        # Many archive passes (archive_after=0) run while the dependent is not due yet.
        done = await q.wait(dependent, timeout=15)
        assert done.status.value == "completed"
        await wait_until(lambda: _archived(conn, dependent), timeout=10)
        # A new job cannot depend on an archived one: as for a deleted job, its id is unknown.
        with pytest.raises(RefusedInput, match="do not exist"):
            await q.enqueue("echo", {}, depends_on=[parent])
    assert seen == [{str(parent): {"from": "parent"}}]
    assert await archived_ids(conn) == {parent, dependent}


async def _archived(conn: Any, job_id: UUID) -> bool:
    return job_id in await archived_ids(conn)


async def test_notifyq_prune_runs_the_archive_pass_when_it_is_on(conn: Any, db_url: str) -> None:
    [old] = await insert_in_state(conn, **finished("completed", "2 hours"))
    code, out, err = await run_notifyq("prune", env=notifyq_env(db_url))
    assert code == 0, err
    assert "archived" not in out and await archived_ids(conn) == set()
    code, out, err = await run_notifyq(
        "prune", env=notifyq_env(db_url, NOTIFYQ_ARCHIVE_AFTER="3600")
    )
    assert code == 0, err
    assert "archived 1 job(s)" in out
    assert await archived_ids(conn) == {old}


# -- reads ------------------------------------------------------------------------------------


async def test_reads_find_archived_jobs_through_http_python_and_the_cli(
    settings: Settings, conn: Any, db_url: str
) -> None:
    [failed] = await insert_in_state(conn, "fail", **finished("failed", "2 hours"))
    [done] = await insert_in_state(conn, **finished("completed", "2 hours"))
    async with Queue(settings=settings) as q:
        await archive(q.store, archiving(settings, HOUR))
        assert await archived_ids(conn) == {failed, done}
        job = await q.get(done)
        assert job is not None and job.archived and job.result == {"done": True}
        waited = await q.wait(done, timeout=0)
        assert waited.id == done and waited.status.value == "completed"

    def read_sync() -> Any:
        with SyncQueue(db_url) as sq:
            return sq.get(failed), sq.wait(failed, timeout=0)

    got, waited_sync = await anyio.to_thread.run_sync(read_sync)
    assert got.archived and got.last_error == "boom"
    assert waited_sync.status.value == "failed"

    code, out, err = await run_notifyq("status", str(done), env=notifyq_env(db_url))
    assert code == 0, err
    assert json.loads(out)["status"] == "completed"

    app = create_app(settings.model_copy(update={"run_worker": False}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c,
    ):
        r = await c.get(f"/jobs/{done}")
        assert r.status_code == 200
        body = r.json()
        assert body["archived"] is True and body["result"] == {"done": True}
        assert body["status"] == "completed" and body["lease_expires_at"] is None
        # The listing shows notifyq.jobs only.
        assert (await c.get("/jobs")).json()["jobs"] == []
        # An archived job is history: not retried, cancelled or deleted; 409 says why.
        r = await c.post(f"/jobs/{failed}/retry")
        assert r.status_code == 409 and "archived" in r.json()["detail"], r.text
        r = await c.post(f"/jobs/{done}/cancel")
        assert r.status_code == 409 and "already completed" in r.json()["detail"], r.text
        r = await c.delete(f"/jobs/{done}")
        assert r.status_code == 409 and "archived" in r.json()["detail"], r.text
        # An unknown id is still a 404.
        r = await c.get(f"/jobs/{UUID(int=1)}")
        assert r.status_code == 404
        # The job's event stream answers it once, and ends.
        r = await c.get(f"/jobs/{done}/events")
        assert r.status_code == 200 and r.text.count("event: job") == 1

    code, _, err = await run_notifyq("retry", str(failed), env=notifyq_env(db_url))
    assert code == 1 and "archived" in err, err


async def test_a_workflow_reads_its_archived_jobs_with_the_others(
    settings: Settings, conn: Any
) -> None:
    async with running_worker(settings), Queue(settings=settings) as q:
        flow = await q.enqueue_workflow(
            [
                {"ref": "a", "task": "echo", "payload": {"step": "a"}},
                {"ref": "b", "task": "echo", "payload": {"step": "b"}, "depends_on": ["a"]},
            ]
        )
        await q.wait(flow.jobs["b"], timeout=10)
    # Only a's end is old enough.
    await conn.execute(
        "UPDATE notifyq.jobs SET finished_at = now() - interval '2 hours' WHERE id = %s",
        [flow.jobs["a"]],
    )
    async with Queue(settings=settings) as q:
        await archive(q.store, archiving(settings, HOUR))
    assert await archived_ids(conn) == {flow.jobs["a"]}
    app = create_app(settings.model_copy(update={"run_worker": False}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c,
    ):
        r = await c.get(f"/workflows/{flow.workflow_id}")
        assert r.status_code == 200, r.text
        body = r.json()
    assert body["status"] == "completed"
    assert [(j["job_id"], j["archived"], j["ref"]) for j in body["jobs"]] == [
        (str(flow.jobs["a"]), True, "a"),
        (str(flow.jobs["b"]), False, "b"),
    ]


# -- partitions -------------------------------------------------------------------------------


async def test_partitions_are_made_ahead_by_the_maintenance_and_not_by_a_producer(
    settings: Settings, conn: Any
) -> None:
    async with Queue(settings=settings) as q:
        await q.enqueue("echo", {})
        assert await partitions(conn) == []  # no statement of a producer makes one
        done = await archive(q.store, archiving(settings, HOUR))
    ahead = await day_names(conn, *range(ARCHIVE_AHEAD_DAYS + 1))
    assert done.created == len(ahead)
    assert await partitions(conn) == ahead


async def test_a_day_past_its_keep_is_dropped_and_a_newer_one_is_not(
    settings: Settings, conn: Any
) -> None:
    old = await insert_in_state(conn, count=3, **finished("completed", "5 days"))
    recent = await insert_in_state(conn, count=2, **finished("completed", "1 day"))
    old_day, recent_day = await day_names(conn, -5, -1)
    forever = archiving(settings, HOUR, keep_completed=10 * DAY)  # failed: kept for good
    async with Queue(settings=settings) as q:
        done = await archive(q.store, forever)
        assert done.moved == 5 and done.dropped == 0
        assert {old_day, recent_day} <= set(await partitions(conn))
        # Every status kept at most 2 days: the day 5 days ago goes, with its rows.
        two_days = {"keep_completed": 2 * DAY, "keep_failed": 2 * DAY, "keep_cancelled": DAY}
        done = await archive(q.store, archiving(settings, HOUR, **two_days))
        assert done.dropped >= 1
        names = await partitions(conn)
        assert old_day not in names and recent_day in names
        assert await archived_ids(conn) == set(recent)
        assert not set(old) & await hot_ids(conn)
        # The retention of notifyq.jobs is unchanged beside it.
        assert await prune(q.store, settings) == 0


async def test_two_movers_at_once_move_each_job_once(settings: Settings, conn: Any) -> None:
    ids = [
        *await insert_in_state(conn, count=1500, **finished("completed", "2 hours")),
        *await insert_in_state(conn, count=1500, **finished("completed", "3 days")),
    ]
    on = archiving(settings, HOUR)
    moved: list[int] = []
    async with Queue(settings=settings) as q1, Queue(settings=settings) as q2:
        # Both make the same partitions first, at the same moment: neither fails for it.
        async def mover(q: Queue) -> None:
            moved.append((await archive(q.store, on, batch=100)).moved)

        async with anyio.create_task_group() as tg:
            tg.start_soon(mover, q1)
            tg.start_soon(mover, q2)
    assert sum(moved) == 3000
    cursor = await conn.execute("SELECT count(*), count(DISTINCT id) FROM notifyq.jobs_archive")
    assert await cursor.fetchone() == (3000, 3000)
    assert await archived_ids(conn) == set(ids)
    assert await hot_ids(conn) == set()


# -- privileges -------------------------------------------------------------------------------


async def test_the_worker_role_archives_and_a_producer_reads_but_cannot_touch_partitions(
    settings: Settings, conn: Any, db_url: str
) -> None:
    [old] = await insert_in_state(conn, **finished("completed", "5 days"))
    [recent] = await insert_in_state(conn, **finished("completed", "2 hours"))
    env = notifyq_env(db_url)
    with role(db_url) as worker, role(db_url) as producer:
        for name, kind in ((worker, "worker"), (producer, "producer")):
            code, _, err = await run_notifyq("grant", name, "--as", kind, env=env)
            assert code == 0, err
        as_worker = settings.model_copy(update={"database_url": as_role(db_url, worker)})
        keeps = {"keep_completed": 2 * DAY, "keep_failed": 2 * DAY, "keep_cancelled": 2 * DAY}
        async with Queue(settings=as_worker) as q:
            done = await archive(q.store, archiving(as_worker, HOUR))
            assert done.moved == 2 and done.created >= 2
            done = await archive(q.store, archiving(as_worker, HOUR, **keeps))
            assert done.dropped >= 1
        assert await archived_ids(conn) == {recent}
        assert old not in await hot_ids(conn)

        as_producer = settings.model_copy(update={"database_url": as_role(db_url, producer)})
        async with Queue(settings=as_producer) as q:
            job = await q.get(recent)
            assert job is not None and job.archived
        async with await psycopg.AsyncConnection.connect(
            as_role(db_url, producer), autocommit=True
        ) as c:
            for statement in (
                "SELECT notifyq.archive_prepare_v1(0, 30)",
                "SELECT notifyq.archive_drop_v1(0)",
                "SELECT notifyq.archive_v1(0, 10)",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    await c.execute(statement)
        # A producer reads a job by its id (notifyq.job_v1, sql/022), not through the tables:
        # an unknown id is None, not a refused statement.
        async with Queue(settings=as_producer) as q:
            assert await q.get(UUID(int=7)) is None
    assert await archived_ids(conn) == {recent}


async def test_two_leaders_dropping_at_once_drop_each_day_once(
    settings: Settings, conn: Any
) -> None:
    await insert_in_state(conn, count=10, **finished("completed", "6 days"))
    await insert_in_state(conn, count=10, **finished("completed", "5 days"))
    async with Queue(settings=settings) as q1, Queue(settings=settings) as q2:
        await archive(q1.store, archiving(settings, HOUR))
        before = await partitions(conn)
        dropped: list[int] = []

        async def drop(q: Queue) -> None:
            dropped.append(await q.store.archive_drop(2 * DAY))

        async with anyio.create_task_group() as tg:
            tg.start_soon(drop, q1)
            tg.start_soon(drop, q2)
    assert sum(dropped) == 2
    assert len(await partitions(conn)) == len(before) - 2
    assert await archived_ids(conn) == set()
