"""Dependencies, groups, snooze, progress and pushed waits, through Python and SQL, against a real
database, real notifications and real workers.

The tests of this that need no database are in tests/unit/test_workflows.py.
"""

from __future__ import annotations

import random
import time
from typing import Any
from uuid import UUID

import anyio
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from notifyq import JobContext, JobStatus, Queue, Snooze
from notifyq.errors import InvalidJob, RefusedInput
from notifyq.settings import Settings
from notifyq.workflows import chain, chord, group, step
from tests.helpers import (
    count_by_status,
    end_by_hand,
    job_row,
    registry,
    running_worker,
    wait_for_status,
    wait_until,
)

# -- dependencies --------------------------------------------------------------------------


async def test_a_dependent_waits_then_runs_with_its_parents_results(
    settings: Settings, conn: Any
) -> None:
    seen: list[dict[str, Any]] = []

    async def collect(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        seen.append(dict(ctx.dependencies))
        return {"sum": sum(result["n"] for result in ctx.dependencies.values())}

    async with Queue(settings.database_url) as q:
        first = await q.enqueue("echo", {"n": 1}, delay=3600)
        second = await q.enqueue("echo", {"n": 2}, delay=3600)
        child = await q.enqueue("collect", {}, depends_on=[first.job_id, str(second.job_id)])
        assert child.status is JobStatus.WAITING
        job = await q.get(child.job_id)
        assert job is not None and job.depends_on == sorted([first.job_id, second.job_id])
        async with running_worker(settings, registry(collect=collect)):
            await conn.execute("UPDATE notifyq.jobs SET run_at = now() WHERE task = 'echo'")
            await conn.execute("SELECT notifyq.wake_v1(ARRAY['default'])")
            done = await q.wait(child.job_id, timeout=10)
    assert done.status is JobStatus.COMPLETED and done.result == {"sum": 3}
    assert seen == [{str(first.job_id): {"n": 1}, str(second.job_id): {"n": 2}}]


async def test_a_parents_completion_starts_its_child_without_a_poll(
    settings: Settings, conn: Any
) -> None:
    # The poll interval is 30 s: only the completion's own wake-up can start the child this fast.
    started: list[float] = []

    async def child(payload: dict[str, Any]) -> None:
        started.append(time.monotonic())

    async with running_worker(settings, registry(child=child)) as worker:
        async with Queue(settings.database_url) as q:
            parent = await q.enqueue("sleep", {"seconds": 0.2})
            kid = await q.enqueue("child", {}, depends_on=[parent.job_id])
            await wait_for_status(conn, kid.job_id, "completed", timeout=5)
    assert worker.stats.completed == 2


async def test_the_statement_that_completes_a_parent_claims_its_child_on_the_same_worker(
    settings: Settings, conn: Any
) -> None:
    # The child's claim shares the transaction (so the now()) of its parent's completion: it was
    # claimed by that statement, not by a later claim woken by a notification. The parent runs
    # long enough for the producer to be asleep when it ends (a claim of the producer's in
    # flight would hold the free slots, and the completion would claim nothing).
    async with running_worker(settings) as worker:
        async with Queue(settings.database_url) as q:
            parent = await q.enqueue("sleep", {"seconds": 0.3})
            kid = await q.enqueue("echo", {}, depends_on=[parent.job_id])
            await wait_for_status(conn, kid.job_id, "completed", timeout=5)
    cursor = await conn.execute(
        "SELECT (SELECT finished_at FROM notifyq.jobs WHERE id = %s), started_at, worker_id "
        "FROM notifyq.jobs WHERE id = %s",
        [parent.job_id, kid.job_id],
    )
    finished, started, worker_id = await cursor.fetchone()
    assert started == finished and worker_id == worker.id


async def test_a_completion_claims_only_what_its_worker_serves(
    settings: Settings, conn: Any
) -> None:
    # The child is of a task this worker does not serve: it stays queued for one that does.
    async with running_worker(settings.model_copy(update={"queues": ["default"]})):
        async with Queue(settings.database_url) as q:
            parent = await q.enqueue("echo", {})
            elsewhere = await q.enqueue("echo", {}, queue="other", depends_on=[parent.job_id])
            await wait_for_status(conn, parent.job_id, "completed", timeout=5)
            await wait_for_status(conn, elsewhere.job_id, "queued", timeout=5)
        other = settings.model_copy(update={"queues": ["other"]})
        async with running_worker(other):
            await wait_for_status(conn, elsewhere.job_id, "completed", timeout=5)


async def test_a_failed_parent_cancels_its_dependents_and_theirs(
    settings: Settings, conn: Any
) -> None:
    async with Queue(settings.database_url) as q:
        parent = await q.enqueue("fail", {"message": "no"}, max_attempts=1)
        child = await q.enqueue("echo", {}, depends_on=[parent.job_id])
        grandchild = await q.enqueue("echo", {}, depends_on=[child.job_id])
        async with running_worker(settings):
            final = await q.wait(grandchild.job_id, timeout=10)
        middle = await q.get(child.job_id)
    assert middle is not None and middle.status is JobStatus.CANCELLED
    assert middle.last_error == f"cancelled: job {parent.job_id}, which it depends on, failed"
    assert final.status is JobStatus.CANCELLED
    assert final.last_error == f"cancelled: job {child.job_id}, which it depends on, was cancelled"


async def test_depending_on_a_job_that_already_failed_cancels_at_once(
    settings: Settings, conn: Any
) -> None:
    async with Queue(settings.database_url) as q:
        parent = await q.enqueue("echo", {})
        await q.store.cancel_job(parent.job_id)
        child = await q.enqueue("echo", {}, depends_on=[parent.job_id])
    assert child.status is JobStatus.CANCELLED


async def test_an_unknown_dependency_is_refused_and_nothing_is_stored(
    settings: Settings, conn: Any
) -> None:
    unknown = UUID(int=7)
    async with Queue(settings.database_url) as q:
        with pytest.raises(RefusedInput, match=str(unknown)):
            await q.enqueue("echo", {}, depends_on=[unknown])
        known = await q.enqueue("echo", {})
        with pytest.raises(RefusedInput, match=str(unknown)):
            await q.enqueue_many(
                [
                    {"task": "echo", "depends_on": [known.job_id]},
                    {"task": "echo", "depends_on": [unknown]},
                ]
            )
        with pytest.raises(InvalidJob, match="not a job id"):
            await q.enqueue("echo", {}, depends_on=["nope"])
    assert await count_by_status(conn) == {"queued": 1}


async def test_dependencies_by_plain_sql_and_by_notifyq_enqueue(
    settings: Settings, conn: Any
) -> None:
    cursor = await conn.execute("SELECT notifyq.enqueue('echo', '{\"n\": 1}')")
    parent = (await cursor.fetchone())[0]
    cursor = await conn.execute(
        "SELECT notifyq.enqueue('echo', '{\"n\": 2}', depends_on => ARRAY[%s]::uuid[],"
        " group_key => 'g')",
        [parent],
    )
    by_function = (await cursor.fetchone())[0]
    cursor = await conn.execute(
        "INSERT INTO notifyq.jobs (task, payload, depends_on)"
        " VALUES ('echo', '{}', ARRAY[%s]::uuid[]) RETURNING id, status",
        [parent],
    )
    by_insert, status = await cursor.fetchone()
    assert status == "waiting"
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="do not exist"):
        await conn.execute(
            "INSERT INTO notifyq.jobs (task, depends_on) VALUES ('echo', ARRAY[%s]::uuid[])",
            [UUID(int=9)],
        )
    with pytest.raises(psycopg.errors.CheckViolation, match="group_blocked"):
        await conn.execute("INSERT INTO notifyq.jobs (task, group_blocked) VALUES ('echo', true)")
    async with running_worker(settings):
        for job_id in (by_function, by_insert):
            await wait_for_status(conn, job_id, "completed", timeout=10)
    row = await job_row(conn, by_function)
    assert row is not None and row["group_key"] == "g" and row["depends_on"] == [parent]


async def test_cancelling_a_waiting_parent_cancels_its_children(
    settings: Settings, conn: Any
) -> None:
    async with Queue(settings.database_url) as q:
        parent = await q.enqueue("echo", {}, delay=3600)
        child = await q.enqueue("echo", {}, depends_on=[parent.job_id])
        outcome = await q.store.cancel_job(parent.job_id)
        assert outcome is not None and outcome.now is JobStatus.CANCELLED
        job = await q.get(child.job_id)
    assert job is not None and job.status is JobStatus.CANCELLED
    assert str(parent.job_id) in (job.last_error or "")


async def test_a_retried_parent_lets_its_cancelled_child_be_retried(
    settings: Settings, conn: Any
) -> None:
    async with Queue(settings.database_url) as q:
        parent = await q.enqueue("echo", {}, delay=3600)
        child = await q.enqueue("echo", {}, depends_on=[parent.job_id])
        await q.store.cancel_job(parent.job_id)
        refused = await q.store.retry_job(child.job_id)
        assert refused is not None and "retry it first" in (refused.refused or "")
        assert (await q.store.retry_job(parent.job_id)) is not None
        again = await q.store.retry_job(child.job_id)
        assert again is not None and again.refused is None
        assert again.status is JobStatus.WAITING
        async with running_worker(settings):
            assert (await q.wait(child.job_id, timeout=10)).status is JobStatus.COMPLETED


async def test_a_duplicate_replaces_a_waiting_job(settings: Settings, conn: Any) -> None:
    async with Queue(settings.database_url) as q:
        parent = await q.enqueue("echo", {}, delay=3600)
        first = await q.enqueue("echo", {"v": 1}, depends_on=[parent.job_id], dedup_key="k")
        second = await q.enqueue("echo", {"v": 2}, depends_on=[parent.job_id], dedup_key="k")
        job = await q.get(first.job_id)
    assert second.duplicate and second.job_id == first.job_id
    assert second.status is JobStatus.WAITING
    assert job is not None and job.payload == {"v": 2}


async def test_a_duplicate_must_ask_for_the_same_dependencies_and_group(
    settings: Settings, conn: Any
) -> None:
    async with Queue(settings.database_url) as q:
        parent = await q.enqueue("echo", {}, delay=3600)
        first = await q.enqueue("echo", {"v": 1}, dedup_key="k", group_key="g")
        with pytest.raises(RefusedInput, match="depends_on"):
            await q.enqueue(
                "echo", {"v": 2}, dedup_key="k", group_key="g", depends_on=[parent.job_id]
            )
        with pytest.raises(RefusedInput, match="group_key 'g', not 'h'"):
            await q.enqueue("echo", {"v": 3}, dedup_key="k", group_key="h")
        job = await q.get(first.job_id)
    assert job is not None and job.payload == {"v": 1} and job.depends_on == []
    # The SQL face applies the same rule.
    with pytest.raises(psycopg.errors.UniqueViolation, match="group_key 'g', not none"):
        await conn.execute("SELECT notifyq.enqueue('echo', '{}', dedup_key => 'k')")


async def test_retention_keeps_a_parent_whose_child_has_not_started(
    settings: Settings, conn: Any
) -> None:
    async with Queue(settings.database_url) as q:
        kept = await q.enqueue("echo", {})
        gone = await q.enqueue("echo", {})
        blocker = await q.enqueue("echo", {}, delay=3600)
        await q.enqueue("echo", {}, depends_on=[kept.job_id, blocker.job_id])
        await end_by_hand(
            conn, [kept.job_id, gone.job_id], "completed", finished_at="now() - interval '1 day'"
        )
        deleted = await q.store.prune(JobStatus.COMPLETED, keep=60)
        assert deleted == 1
        assert await q.get(kept.job_id) is not None and await q.get(gone.job_id) is None
        assert not await q.store.delete_job(kept.job_id)


async def test_a_child_committed_after_its_parent_ended_still_runs(
    settings: Settings, conn: Any
) -> None:
    """The parent ends while the child's insert is uncommitted: the end cannot see the child,
    the insert saw the parent running. The commit must queue the child, and wake a worker."""
    release = anyio.Event()

    async def parent(payload: dict[str, Any]) -> None:
        await release.wait()

    async with (
        Queue(settings.database_url) as q,
        running_worker(settings, registry(parent=parent)),
        await psycopg.AsyncConnection.connect(settings.database_url) as producer,
    ):
        first = await q.enqueue("parent", {})
        await wait_for_status(conn, first.job_id, "processing")
        async with producer.transaction():
            child = await q.enqueue("echo", {}, depends_on=[first.job_id], conn=producer)
            assert child.status is JobStatus.WAITING
            release.set()
            # Its end commits (it is not held back by the uncommitted child).
            await wait_for_status(conn, first.job_id, "completed", timeout=5)
        # The poll interval is 30 s: only the commit itself can have queued and woken it.
        assert (await q.wait(child.job_id, timeout=5)).status is JobStatus.COMPLETED


async def test_no_child_is_left_waiting_when_its_parent_ends_during_the_insert(
    settings: Settings, conn: Any
) -> None:
    """The race of a child being inserted while its parent completes, hammered: each child's
    transaction stays open for a few milliseconds, in which its parent is claimed, run and
    completed (or not yet). Every child must run; none may stay waiting."""
    rounds = 200
    fast = settings.model_copy(update={"concurrency": 20})
    async with (
        Queue(settings.database_url, pool_size=8) as q,
        AsyncConnectionPool(settings.database_url, min_size=8, max_size=8, open=False) as pool,
        running_worker(fast) as worker,
    ):
        children: list[UUID] = []

        async def parent_and_child() -> None:
            parent = await q.enqueue("echo", {})
            async with pool.connection() as producer, producer.transaction():
                await anyio.sleep(random.uniform(0, 0.003))
                child = await q.enqueue("echo", {}, depends_on=[parent.job_id], conn=producer)
                await anyio.sleep(random.uniform(0, 0.005))
            children.append(child.job_id)

        async with anyio.create_task_group() as tg:
            for _ in range(rounds):
                tg.start_soon(parent_and_child)
        for child_id in children:
            job = await q.wait(child_id, timeout=15)
            assert job.status is JobStatus.COMPLETED
    assert len(children) == rounds and worker.stats.completed == 2 * rounds
    assert "waiting" not in await count_by_status(conn)


# -- groups --------------------------------------------------------------------------------


async def test_a_group_runs_one_at_a_time_in_order_across_workers(
    settings: Settings, conn: Any
) -> None:
    running: set[str] = set()
    overlaps: list[str] = []
    order: list[tuple[str, int]] = []

    async def member(payload: dict[str, Any]) -> None:
        key = payload["key"]
        if key in running:
            overlaps.append(key)
        running.add(key)
        order.append((key, payload["n"]))
        await anyio.sleep(random.uniform(0, 0.01))
        running.discard(key)

    tasks = registry(member=member)
    async with Queue(settings.database_url) as q:
        jobs = [
            {"task": "member", "payload": {"key": key, "n": n}, "group_key": key}
            for n in range(15)
            for key in ("a", "b", "c")
        ]
        results = await q.enqueue_many(jobs)
        async with running_worker(settings, tasks), running_worker(settings, tasks):
            for result in results:
                await q.wait(result.job_id, timeout=20)
    assert overlaps == []
    for key in ("a", "b", "c"):
        assert [n for k, n in order if k == key] == list(range(15))


async def test_a_busy_group_holds_back_neither_other_keys_nor_ungrouped_jobs(
    settings: Settings, conn: Any
) -> None:
    release = anyio.Event()

    async def hold(payload: dict[str, Any]) -> None:
        await release.wait()

    async with Queue(settings.database_url) as q, running_worker(settings, registry(hold=hold)):
        head = await q.enqueue("hold", {}, group_key="busy")
        behind = await q.enqueue("echo", {}, group_key="busy")
        await wait_for_status(conn, head.job_id, "processing")
        other = await q.enqueue("echo", {}, group_key="other")
        plain = await q.enqueue("echo", {})
        for job_id in (other.job_id, plain.job_id):
            assert (await q.wait(job_id, timeout=5)).status is JobStatus.COMPLETED
        row = await job_row(conn, behind.job_id)
        assert row is not None and row["status"] == "queued" and row["group_blocked"]
        release.set()
        assert (await q.wait(behind.job_id, timeout=5)).status is JobStatus.COMPLETED


async def test_a_grouped_job_that_fails_and_retries_keeps_the_head_of_its_group(
    settings: Settings, conn: Any
) -> None:
    order: list[str] = []

    async def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
        order.append(f"{payload['name']}#{ctx.attempt}")
        if payload["name"] == "first" and ctx.attempt == 1:
            raise RuntimeError("once")

    async with Queue(settings.database_url) as q:
        first = await q.enqueue("flaky", {"name": "first"}, group_key="g", max_attempts=3)
        second = await q.enqueue("flaky", {"name": "second"}, group_key="g")
        async with running_worker(settings, registry(flaky=flaky)):
            assert (await q.wait(second.job_id, timeout=10)).status is JobStatus.COMPLETED
        assert (await q.get(first.job_id)).attempt_count == 2  # type: ignore[union-attr]
    assert order == ["first#1", "first#2", "second#1"]


async def test_a_grouped_job_that_fails_for_good_lets_the_next_one_run(
    settings: Settings, conn: Any
) -> None:
    async with Queue(settings.database_url) as q, running_worker(settings):
        first = await q.enqueue("fail", {}, group_key="g", max_attempts=1)
        second = await q.enqueue("echo", {}, group_key="g")
        assert (await q.wait(second.job_id, timeout=10)).status is JobStatus.COMPLETED
        assert (await q.get(first.job_id)).status is JobStatus.FAILED  # type: ignore[union-attr]


async def test_a_cancelled_head_lets_the_next_member_run(settings: Settings, conn: Any) -> None:
    async with Queue(settings.database_url) as q:
        first = await q.enqueue("echo", {}, group_key="g", delay=3600)
        second = await q.enqueue("echo", {}, group_key="g")
        await q.store.cancel_job(first.job_id)
        async with running_worker(settings):
            assert (await q.wait(second.job_id, timeout=10)).status is JobStatus.COMPLETED


async def test_a_group_moves_on_reading_its_own_members_on_a_table_full_of_finished_jobs(
    conn: Any,
) -> None:
    """On a table that ANALYZE saw full of finished jobs, as a queue in service has, the planner
    expects no pending member of any group: advancing one group must still look at that group's
    members only, not at every pending grouped job (sql/016)."""
    await conn.execute("ALTER TABLE notifyq.jobs SET (autovacuum_enabled = false)")
    await conn.execute(
        "INSERT INTO notifyq.jobs (task) SELECT 'echo' FROM generate_series(1, 2000)"
    )
    ids, claims = zip(
        *await (
            await conn.execute(
                "SELECT id, claims FROM notifyq.claim_v4('w', '{echo}', NULL, 2000, 60, false)"
            )
        ).fetchall(),
        strict=True,
    )
    await conn.execute(
        "SELECT notifyq.complete_v3('w', %s::uuid[], %s::integer[], %s::jsonb[])",
        [list(ids), list(claims), ["{}"] * len(ids)],
    )
    await conn.execute("ANALYZE notifyq.jobs")
    # 500 groups of two: each head queued and unblocked, the member behind it blocked.
    await conn.execute(
        "INSERT INTO notifyq.jobs (task, group_key) "
        "SELECT 'echo', 'k' || (g % 500) FROM generate_series(1, 1000) AS g ORDER BY g"
    )
    read = "SELECT pg_stat_get_xact_tuples_returned('notifyq.jobs_group_idx'::regclass)"
    async with conn.transaction():
        before = (await (await conn.execute(read)).fetchone())[0]
        moved = await (
            await conn.execute("SELECT * FROM notifyq.advance_groups_v1('{default}', '{k7}')")
        ).fetchall()
        after = (await (await conn.execute(read)).fetchone())[0]
    assert moved == []  # k7's head is still pending: nothing moves
    assert after - before <= 4, f"advancing one group read {after - before} grouped jobs"


# -- snooze, progress, waits ---------------------------------------------------------------


async def test_snooze_puts_the_job_back_without_counting_an_attempt(
    settings: Settings, conn: Any
) -> None:
    calls: list[int] = []

    async def later(payload: dict[str, Any], ctx: JobContext) -> str:
        calls.append(ctx.attempt)
        if len(calls) == 1:
            raise Snooze(0.3)
        return "done"

    async with (
        Queue(settings.database_url) as q,
        running_worker(settings, registry(later=later)) as worker,
    ):
        result = await q.enqueue("later", {}, max_attempts=1)
        snoozed_at = time.monotonic()
        job = await q.wait(result.job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED and job.result == "done"
    assert calls == [1, 1] and job.attempt_count == 1
    assert time.monotonic() - snoozed_at >= 0.3
    assert worker.stats.snoozed == 1


async def test_progress_is_stored_coalesced_and_visible_while_running(
    settings: Settings, conn: Any
) -> None:
    reported = anyio.Event()
    release = anyio.Event()

    async def work(payload: dict[str, Any], ctx: JobContext) -> None:
        for n in range(20_000):
            ctx.progress(n / 20_000, f"step {n}")
        await ctx.progress(0.5, "half way")
        reported.set()
        await release.wait()

    def threaded(payload: dict[str, Any], ctx: JobContext) -> None:
        for n in range(5_000):
            ctx.progress(fraction=n / 5_000)

    async with (
        Queue(settings.database_url) as q,
        running_worker(settings, registry(work=work, threaded=threaded)) as worker,
    ):
        result = await q.enqueue("work", {})
        await reported.wait()

        async def half_way() -> bool:
            job = await q.get(result.job_id)
            return job is not None and job.progress == {"fraction": 0.5, "message": "half way"}

        await wait_until(half_way, timeout=5)
        release.set()
        await q.wait(result.job_id, timeout=5)
        threaded_job = await q.enqueue("threaded", {})
        done = await q.wait(threaded_job.job_id, timeout=5)
    assert done.status is JobStatus.COMPLETED
    # 25,000 reports, a handful of statements.
    assert 1 <= worker.stats.progress_writes <= 40


async def test_progress_refuses_values_out_of_range(settings: Settings, conn: Any) -> None:
    async def bad(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.progress(1.5)

    async with Queue(settings.database_url) as q, running_worker(settings, registry(bad=bad)):
        result = await q.enqueue("bad", {}, max_attempts=1)
        job = await q.wait(result.job_id, timeout=5)
    assert job.status is JobStatus.FAILED and "not from 0 to 1" in (job.last_error or "")


async def test_wait_is_woken_by_the_notification(settings: Settings, conn: Any) -> None:
    # Queue.wait's fallback look is NOTIFYQ_POLL_INTERVAL (30 s here): only the notification
    # can end these waits this fast.
    async with Queue(settings=settings) as q:
        result = await q.enqueue("sleep", {"seconds": 0.3})
        async with running_worker(settings):
            started = time.monotonic()
            job = await q.wait(result.job_id, timeout=10)
            waited = time.monotonic() - started
            again = await q.enqueue("echo", {"n": 2})
            second = await q.wait(again.job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED and second.result == {"n": 2}
    assert waited < 5


async def test_wait_with_no_time_left_answers_a_job_that_has_ended(
    settings: Settings, conn: Any
) -> None:
    async with Queue(settings=settings) as q:
        result = await q.enqueue("echo", {"n": 1})
        with pytest.raises(TimeoutError):
            await q.wait(result.job_id, timeout=0)
        async with running_worker(settings):
            await wait_for_status(conn, result.job_id, "completed")
        job = await q.wait(result.job_id, timeout=0)
    assert job.status is JobStatus.COMPLETED


async def test_waits_that_race_the_jobs_end_are_all_woken(settings: Settings, conn: Any) -> None:
    """A wait registers its watch while the job ends: the end may look for watchers before the
    watch is in, and the wait read the job before the end committed. Hammered; the fallback look
    is 30 s away, so a missed announcement fails the test."""
    rounds = 300
    async with Queue(settings=settings) as q, running_worker(settings):
        finished = 0

        async def enqueue_and_wait() -> None:
            nonlocal finished
            result = await q.enqueue("echo", {})
            await anyio.sleep(random.uniform(0, 0.003))
            job = await q.wait(result.job_id, timeout=10)
            assert job.status is JobStatus.COMPLETED
            finished += 1

        limiter = anyio.CapacityLimiter(10)

        async def limited() -> None:
            async with limiter:
                await enqueue_and_wait()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(rounds):
                    tg.start_soon(limited)
    assert finished == rounds


# -- workflows -----------------------------------------------------------------------------


async def test_a_workflow_of_refs_runs_in_dependency_order(settings: Settings, conn: Any) -> None:
    async def total(payload: dict[str, Any], ctx: JobContext) -> int:
        return sum(int(value) for value in ctx.dependencies.values()) + payload["n"]

    async with Queue(settings.database_url) as q:
        created = await q.enqueue_workflow(
            [
                {"ref": "end", "task": "total", "payload": {"n": 100}, "depends_on": ["b", "c"]},
                {"ref": "a", "task": "total", "payload": {"n": 1}},
                {"ref": "b", "task": "total", "payload": {"n": 10}, "depends_on": ["a"]},
                {"ref": "c", "task": "total", "payload": {"n": 20}, "depends_on": ["a"]},
            ]
        )
        assert set(created.jobs) == {"a", "b", "c", "end"}
        async with running_worker(settings, registry(total=total)):
            end = await q.wait(created.jobs["end"], timeout=10)
        jobs = await q.store.workflow_jobs(created.workflow_id)
    assert end.result == 100 + (10 + 1) + (20 + 1)
    assert {job.workflow_id for job in jobs} == {created.workflow_id} and len(jobs) == 4
    assert {job.ref: job.id for job in jobs} == created.jobs  # each job keeps its ref


@pytest.mark.parametrize(
    ("jobs", "message"),
    [
        ([], "at least one job"),
        ([{"task": "echo"}], "needs a ref"),
        ([{"ref": "a", "task": "echo"}, {"ref": "a", "task": "echo"}], "also the ref"),
        ([{"ref": "a", "task": "echo", "depends_on": ["b"]}], "neither a ref"),
        ([{"ref": "a", "task": "echo", "depends_on": ["a"]}], "itself"),
        (
            [
                {"ref": "a", "task": "echo", "depends_on": ["c"]},
                {"ref": "b", "task": "echo", "depends_on": ["a"]},
                {"ref": "c", "task": "echo", "depends_on": ["b"]},
            ],
            "cycle: a -> b -> c -> a|cycle: b -> c -> a -> b|cycle: c -> a -> b -> c",
        ),
        ([{"ref": "a", "task": "echo", "dedup_key": "k"}], "dedup_key"),
        ([{"ref": "a", "task": "echo", "payload": [1]}], r"jobs\[0\].*payload"),
    ],
)
async def test_a_malformed_workflow_is_refused_and_creates_nothing(
    settings: Settings, conn: Any, jobs: list[dict[str, Any]], message: str
) -> None:
    async with Queue(settings.database_url) as q:
        with pytest.raises(InvalidJob, match=message):
            await q.enqueue_workflow(jobs)
    assert await count_by_status(conn) == {}


async def test_a_workflow_whose_middle_job_is_cancelled(settings: Settings, conn: Any) -> None:
    async with Queue(settings.database_url) as q:
        created = await q.enqueue_workflow(
            chain(
                step("echo", {"n": 1}, ref="a", delay=3600),
                step("echo", ref="b"),
                step("echo", ref="c"),
            )
        )
        await q.store.cancel_job(created.jobs["b"])
        jobs = {job.id: job for job in await q.store.workflow_jobs(created.workflow_id)}
    assert jobs[created.jobs["a"]].status is JobStatus.QUEUED
    assert jobs[created.jobs["b"]].status is JobStatus.CANCELLED
    assert jobs[created.jobs["c"]].status is JobStatus.CANCELLED
    assert str(created.jobs["b"]) in (jobs[created.jobs["c"]].last_error or "")


async def test_chain_group_and_chord_build_the_graph(settings: Settings, conn: Any) -> None:
    async def add(payload: dict[str, Any], ctx: JobContext) -> int:
        return payload.get("n", 0) + sum(ctx.dependencies.values())

    flow = chain(
        step("add", {"n": 1}, ref="start"),
        chord([step("add", {"n": 10}), step("add", {"n": 100})], step("add", ref="sum")),
        group(step("add", ref="left"), step("add", {"n": 5}, ref="right")),
    )
    shape = {job["ref"]: sorted(job["depends_on"]) for job in flow.jobs()}
    assert shape == {
        "start": [],
        "add-2": ["start"],
        "add-3": ["start"],
        "sum": ["add-2", "add-3"],
        "left": ["sum"],
        "right": ["sum"],
    }
    async with Queue(settings.database_url) as q:
        created = await q.enqueue_workflow(flow)
        async with running_worker(settings, registry(add=add)):
            left = await q.wait(created.jobs["left"], timeout=10)
            right = await q.wait(created.jobs["right"], timeout=10)
    assert left.result == 11 + 101 and right.result == 5 + 11 + 101
    with pytest.raises(InvalidJob, match="twice"):
        same = step("add")
        chain(same, same).jobs()


# -- through HTTP --------------------------------------------------------------------------


async def test_http_workflow_dependencies_and_groups(settings: Settings, conn: Any) -> None:
    from tests.test_api import serving

    async with serving(settings.model_copy(update={"run_worker": True})) as client:
        created = await client.post(
            "/workflows",
            json={
                "jobs": [
                    {"ref": "a", "task": "echo", "payload": {"n": 1}, "group_key": "g"},
                    {"ref": "b", "task": "echo", "payload": {"n": 2}, "depends_on": ["a"]},
                ]
            },
        )
        assert created.status_code == 201, created.text
        body = created.json()
        workflow = f"/workflows/{body['workflow_id']}"

        async def finished() -> dict[str, Any] | None:
            answer = (await client.get(workflow)).json()
            return answer if answer["status"] != "running" else None

        done = await wait_until(finished, timeout=10)
        assert done["status"] == "completed"
        jobs = {job["job_id"]: job for job in done["jobs"]}
        child = jobs[body["jobs"]["b"]]
        assert child["depends_on"] == [body["jobs"]["a"]] and child["progress"] is None
        assert jobs[body["jobs"]["a"]]["group_key"] == "g"
        assert child["workflow_id"] == body["workflow_id"]
        refused = [
            {"jobs": [{"ref": "a", "payload": {}, "depends_on": ["b"]},
                      {"ref": "b", "payload": {}, "depends_on": ["a"]}]},
            {"jobs": [{"ref": "a", "payload": {}}, {"ref": "a", "payload": {}}]},
            {"jobs": [{"ref": "a", "payload": {}, "depends_on": ["nope"]}]},
            {"jobs": [{"ref": "a", "payload": {}, "depends_on": [str(UUID(int=5))]}]},
            {"jobs": []},
        ]  # fmt: skip
        before = await count_by_status(conn)
        for bad in refused:
            answer = await client.post("/workflows", json=bad)
            assert answer.status_code == 422, (bad, answer.text)
        unknown = await client.post("/jobs", json={"payload": {}, "depends_on": [str(UUID(int=5))]})
        assert unknown.status_code == 422 and str(UUID(int=5)) in unknown.text
        assert await count_by_status(conn) == before
        assert (await client.get(f"/workflows/{UUID(int=5)}")).status_code == 404
        events = await client.get(f"/jobs/{body['jobs']['b']}/events")
        assert events.headers["content-type"].startswith("text/event-stream")
        assert events.text.startswith("event: job\ndata: {") and '"completed"' in events.text
        assert (await client.get(f"/jobs/{UUID(int=5)}/events")).status_code == 404
