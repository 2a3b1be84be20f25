"""The blocking client, notifyq.SyncQueue: what notifyq.Queue does, from threads, without an event
loop. Against a real database, real notifications and a real worker (in a thread of its own, as
a web app's worker would run beside its views).

The tests of this that need no database are in tests/unit/test_sync_queue.py.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import anyio
import psycopg
import pytest
from anyio.from_thread import start_blocking_portal

from notifyq import JobSpec, JobStatus, Queue, SyncQueue
from notifyq.errors import InvalidJob, NotifyQError
from notifyq.settings import Settings
from notifyq.tasks import Registry
from notifyq.worker import Worker
from notifyq.workflows import chain, chord, step
from tests.helpers import registry

LATER = datetime(2030, 1, 1, tzinfo=timezone.utc)


@contextlib.contextmanager
def worker_thread(settings: Settings, tasks: Registry | None = None) -> Iterator[Worker]:
    """A worker running in an event loop of its own thread; stopped gracefully on exit."""
    with start_blocking_portal() as portal:
        worker = Worker(settings, tasks)
        running, _ = portal.start_task(worker.run)
        try:
            yield worker
        finally:
            portal.call(worker.stop)
            running.result(timeout=30)


def scalar(db_url: str, query: str, params: Any = None) -> Any:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def until(condition: Callable[[], Any], *, timeout: float = 10.0) -> Any:
    """Polls ``condition`` until it answers something truthy; fails after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)
    return value


def client_connections(db_url: str) -> dict[str, int]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE 'notifyq-client%' "
            "GROUP BY 1"
        ).fetchall()
    return dict(rows)


# -- enqueue and read ----------------------------------------------------------------------


def test_enqueue_and_get(db_url: str) -> None:
    with SyncQueue(db_url) as q:
        result = q.enqueue("echo", {"n": 1}, priority=3, max_attempts=4)
        job = q.get(result.job_id)
        assert q.get(str(result.job_id)) == job
        assert q.get("00000000-0000-0000-0000-000000000000") is None
    assert result.status is JobStatus.QUEUED and not result.duplicate
    assert job is not None
    assert (job.task, job.payload, job.priority, job.max_attempts) == ("echo", {"n": 1}, 3, 4)
    assert (job.queue, job.attempt_count, job.status) == ("default", 0, JobStatus.QUEUED)


def test_delay_and_run_at(db_url: str) -> None:
    with SyncQueue(db_url) as q:
        delayed = q.enqueue("echo", {}, delay=timedelta(seconds=30))
        scheduled = q.enqueue("echo", {}, run_at=LATER)
    seconds = scalar(
        db_url,
        "SELECT extract(epoch FROM run_at - created_at) FROM notifyq.jobs WHERE id = %s",
        [delayed.job_id],
    )
    assert 29 < float(seconds) < 31
    assert scheduled.run_at == LATER


def test_a_duplicate_replaces_the_queued_job_of_its_key(db_url: str) -> None:
    with SyncQueue(db_url) as q:
        first = q.enqueue("echo", {"v": 1}, dedup_key="k", delay=3600)
        second = q.enqueue("echo", {"v": 2}, dedup_key="k", delay=3600, priority=5)
        elsewhere = q.enqueue("echo", {"v": 3}, dedup_key="k", queue="other")
        job = q.get(first.job_id)
    assert (first.duplicate, second.duplicate, elsewhere.duplicate) == (False, True, False)
    assert second.job_id == first.job_id != elsewhere.job_id
    assert job is not None and (job.payload, job.priority) == ({"v": 2}, 5)


def test_enqueue_many_answers_in_order_with_duplicates(db_url: str) -> None:
    jobs: list[Any] = [{"task": "echo", "payload": {"i": i}, "priority": i % 3} for i in range(500)]
    jobs[10] = {"task": "echo", "payload": {"v": 1}, "dedup_key": "d"}
    jobs[20] = JobSpec.create("echo", {"v": 2}, dedup_key="d")
    with SyncQueue(db_url) as q:
        results = q.enqueue_many(jobs)
        assert q.enqueue_many([]) == []
        first, seventh = q.get(results[10].job_id), q.get(results[7].job_id)
    assert len(results) == 500 and len({r.job_id for r in results}) == 499
    assert results[20].job_id == results[10].job_id
    assert (results[10].duplicate, results[20].duplicate) == (False, True)
    assert first is not None and first.payload == {"v": 2}
    assert seventh is not None and (seventh.payload, seventh.priority) == ({"i": 7}, 1)


def test_a_large_batch_from_an_iterator_is_one_transaction_answered_in_order(db_url: str) -> None:
    jobs: list[Any] = [{"task": "echo", "payload": {"i": i}} for i in range(620)]
    jobs[5] = {"task": "echo", "payload": {"v": 1}, "dedup_key": "k"}
    jobs[600] = {"task": "echo", "payload": {"v": 2}, "dedup_key": "k"}
    with SyncQueue(db_url) as q:
        results = q.enqueue_many(iter(jobs))
        stored = {i: q.get(results[i].job_id) for i in (0, 5, 249, 250, 499, 500, 619)}
    assert len(results) == 620
    assert results[600].job_id == results[5].job_id and results[600].duplicate
    assert scalar(db_url, "SELECT count(*) FROM notifyq.jobs") == 619
    for i, job in stored.items():
        assert job is not None and job.payload == ({"v": 2} if i == 5 else {"i": i})


def test_an_invalid_job_late_in_a_large_batch_stores_none(db_url: str) -> None:
    """Checked while the first chunks are already inserted, it still rolls the batch back: on
    the queue's own connection, and inside the caller's transaction, whose own work stays."""
    jobs: list[Any] = [{"task": "echo", "payload": {"i": i}} for i in range(600)]
    jobs[555] = {"task": "echo", "payload": {"text": "a\x00b"}}
    with SyncQueue(db_url) as q:
        with pytest.raises(InvalidJob, match="NUL"):
            q.enqueue_many(jobs)
        with psycopg.connect(db_url) as mine:
            q.enqueue("echo", {"mine": True}, conn=mine)
            with pytest.raises(InvalidJob, match="NUL"):
                q.enqueue_many(jobs, conn=mine)
            q.enqueue("echo", {"mine": 2}, conn=mine)
            mine.commit()
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT payload ->> 'mine' FROM notifyq.jobs ORDER BY 1").fetchall()
    assert rows == [("2",), ("true",)]


# -- the same errors as Queue -------------------------------------------------------------

CYCLE = [
    {"ref": "a", "task": "echo", "depends_on": ["b"]},
    {"ref": "b", "task": "echo", "depends_on": ["a"]},
]

BAD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("enqueue", ("echo", [1]), {}),
    ("enqueue", ("echo", {"a": "x\x00"}), {}),
    ("enqueue", ("echo", {"a": float("nan")}), {}),
    ("enqueue", ("", {}), {}),
    ("enqueue", ("echo", {}), {"queue": "q\x00"}),
    ("enqueue", ("echo", {}), {"priority": 2**40}),
    ("enqueue", ("echo", {}), {"delay": -1}),
    ("enqueue", ("echo", {}), {"delay": 1, "run_at": LATER}),
    ("enqueue", ("echo", {}), {"max_attempts": 0}),
    ("enqueue", ("echo", {}), {"dedup_key": "k" * 600}),
    ("enqueue", ("echo", {}), {"depends_on": ["nope"]}),
    ("enqueue", ("echo", {}), {"depends_on": [UUID(int=7)]}),
    ("enqueue_many", ([{"task": "echo", "colour": "red"}],), {}),
    ("enqueue_many", ([{"payload": {}}],), {}),
    ("enqueue_many", ([{"task": "echo"}, {"task": "echo", "depends_on": [UUID(int=7)]}],), {}),
    ("enqueue_workflow", ([],), {}),
    ("enqueue_workflow", (CYCLE,), {}),
    ("enqueue_workflow", ([{"ref": "a", "task": "echo", "dedup_key": "k"}],), {}),
    ("enqueue_workflow", ([{"ref": "a", "task": "echo", "depends_on": ["b"]}],), {}),
    ("get", ("not-a-uuid",), {}),
    ("wait", ("not-a-uuid",), {}),
    ("wait", (UUID(int=9),), {"timeout": 5}),
]


@pytest.mark.parametrize(
    ("method", "args", "kwargs"), BAD_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)]
)
def test_bad_input_raises_what_queue_raises(
    db_url: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    async def through_queue() -> NotifyQError:
        async with Queue(db_url) as q:
            try:
                await getattr(q, method)(*args, **kwargs)
            except NotifyQError as exc:
                return exc
        raise AssertionError(f"Queue.{method} accepted {args} {kwargs}")

    expected = anyio.run(through_queue)
    with SyncQueue(db_url) as q, pytest.raises(type(expected)) as caught:
        getattr(q, method)(*args, **kwargs)
    assert type(caught.value) is type(expected)
    assert str(caught.value) == str(expected)
    assert scalar(db_url, "SELECT count(*) FROM notifyq.jobs") == 0


async def test_an_async_connection_is_refused_with_a_clear_error(
    db_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    with SyncQueue(db_url) as q, pytest.raises(TypeError, match="AsyncConnection"):
        q.enqueue("echo", {}, conn=conn)  # type: ignore[arg-type]


# -- the caller's transaction ------------------------------------------------------------


def test_enqueue_in_the_callers_transaction(settings: Settings, db_url: str) -> None:
    with SyncQueue(settings=settings) as q, worker_thread(settings) as worker:
        with psycopg.connect(db_url) as mine:
            mine.execute("CREATE TABLE orders (id int)")
            mine.execute("INSERT INTO orders VALUES (1)")
            result = q.enqueue("echo", {"order": 1}, conn=mine)
            many = q.enqueue_many(
                [{"task": "echo", "payload": {"i": i}} for i in range(300)], conn=mine
            )
            flow = q.enqueue_workflow(chain(step("echo"), step("echo")), conn=mine)
            # Not visible, and no worker woken, before the caller commits.
            assert q.get(result.job_id) is None and q.get(many[299].job_id) is None
            mine.commit()
        job = q.wait(result.job_id, timeout=5)
        for ref, job_id in flow.jobs.items():
            done = q.wait(job_id, timeout=5)
            assert done.status is JobStatus.COMPLETED and done.ref == ref
        until(lambda: worker.stats.completed == 303)
    assert job.status is JobStatus.COMPLETED and job.result == {"order": 1}


def test_a_rolled_back_enqueue_leaves_nothing(db_url: str) -> None:
    with SyncQueue(db_url) as q, psycopg.connect(db_url) as mine:
        result = q.enqueue("echo", {}, conn=mine)
        q.enqueue_many([{"task": "echo"}] * 300, conn=mine)
        q.enqueue_workflow(chain(step("echo"), step("echo")), conn=mine)
        mine.rollback()
        assert q.get(result.job_id) is None
    assert scalar(db_url, "SELECT count(*) FROM notifyq.jobs") == 0


def test_a_rolled_back_batch_leaves_nothing_even_as_the_first_statement(db_url: str) -> None:
    # See the same test of Queue in tests/test_client.py.
    with SyncQueue(db_url) as q, psycopg.connect(db_url) as mine:
        q.enqueue_many([{"task": "echo"}] * 600, conn=mine)
        mine.rollback()
        q.enqueue_many([{"task": "echo"}] * 300, conn=mine)
        mine.commit()
    assert scalar(db_url, "SELECT count(*) FROM notifyq.jobs") == 300


def test_a_connection_with_client_side_binding_cursors_works(db_url: str) -> None:
    """Django's connections make client-side binding cursors by default (and a connection
    through a transaction-mode pooler may need them): notifyq's statements run on the caller's
    own kind of cursor, batches included."""
    with (
        SyncQueue(db_url) as q,
        psycopg.connect(db_url, cursor_factory=psycopg.ClientCursor) as mine,
    ):
        q.enqueue("echo", {"n": 1}, conn=mine)
        q.enqueue("echo", {"n": 2}, dedup_key="k", conn=mine)
        q.enqueue_many([{"task": "echo", "payload": {"i": i}} for i in range(10)], conn=mine)
        q.enqueue_many([{"task": "echo", "dedup_key": f"d{i}"} for i in range(300)], conn=mine)
        mine.commit()
    assert scalar(db_url, "SELECT count(*) FROM notifyq.jobs") == 312


# -- dependencies, groups, workflows ------------------------------------------------------


def test_dependencies_and_groups_run_in_order(settings: Settings) -> None:
    ran: list[str] = []

    async def member(payload: dict[str, Any]) -> None:
        ran.append(f"start {payload['n']}")
        await anyio.sleep(0.01)
        ran.append(f"end {payload['n']}")

    with SyncQueue(settings=settings) as q:
        parent = q.enqueue("member", {"n": 1}, delay=3600)
        child = q.enqueue("member", {"n": 2}, depends_on=[str(parent.job_id)], group_key="g")
        behind = q.enqueue("member", {"n": 3}, group_key="g")
        assert child.status is JobStatus.WAITING
        stored = q.get(child.job_id)
        assert stored is not None
        assert (stored.depends_on, stored.group_key) == ([parent.job_id], "g")
        with psycopg.connect(settings.database_url or "", autocommit=True) as conn:
            conn.execute("UPDATE notifyq.jobs SET run_at = now() WHERE id = %s", [parent.job_id])
            conn.execute("SELECT notifyq.wake_v1(ARRAY['default'])")
        with worker_thread(settings, registry(member=member)):
            last = q.wait(behind.job_id, timeout=10)
            middle = q.wait(child.job_id, timeout=10)
    assert last.status is middle.status is JobStatus.COMPLETED
    # The parent, then its child; the group runs one job at a time, in submission order, so the
    # one behind the child starts after the child's handler returned. (The rows' timestamps
    # cannot tell: each is its statement's transaction start, and a claim's transaction may
    # begin before the completion that lets it see the job.)
    assert ran == ["start 1", "end 1", "start 2", "end 2", "start 3", "end 3"]


def test_enqueue_workflow_creates_every_job_and_runs_them(settings: Settings) -> None:
    flow = chain(
        step("echo", {"n": 1}, ref="first"),
        chord([step("echo", {"n": 2}), step("echo", {"n": 3})], step("echo", ref="summary")),
    )
    with SyncQueue(settings=settings) as q:
        created = q.enqueue_workflow(flow)
        mapped = q.enqueue_workflow(
            [{"ref": "a", "task": "echo"}, {"ref": "b", "task": "echo", "depends_on": ["a"]}]
        )
        with worker_thread(settings):
            summary = q.wait(created.jobs["summary"], timeout=10)
            b = q.wait(mapped.jobs["b"], timeout=10)
        jobs = [q.get(job_id) for job_id in created.jobs.values()]
    assert len(created.jobs) == 4 and "first" in created.jobs
    assert summary.status is b.status is JobStatus.COMPLETED
    assert sorted(summary.depends_on) == sorted(
        job_id for ref, job_id in created.jobs.items() if ref not in ("first", "summary")
    )
    assert all(job is not None and job.workflow_id == created.workflow_id for job in jobs)


# -- waits ---------------------------------------------------------------------------------


def test_wait_is_woken_by_the_jobs_end_not_by_a_poll(settings: Settings) -> None:
    # The settings' poll interval, which is also the wait's last-resort look, is 30 s.
    with SyncQueue(settings=settings) as q, worker_thread(settings):
        result = q.enqueue("sleep", {"seconds": 0.3})
        job = q.wait(result.job_id, timeout=10)
        returned = datetime.now(timezone.utc)
    assert job.status is JobStatus.COMPLETED
    assert job.finished_at is not None
    assert (returned - job.finished_at).total_seconds() < 1.0


def test_no_wait_misses_a_job_that_ends_while_the_wait_starts_watching(settings: Settings) -> None:
    """Each job ends around the moment its wait reads it and registers its watch: it is either
    seen by the read after the watch, or announced; never left to the 30 s last-resort look."""
    with SyncQueue(settings=settings) as q, worker_thread(settings):
        for i in range(60):
            result = q.enqueue("echo", {"i": i})
            began = time.monotonic()
            assert q.wait(result.job_id, timeout=10).status is JobStatus.COMPLETED
            assert time.monotonic() - began < 3, f"the wait of job {i} missed its end"


def test_wait_times_out_with_the_error_queue_wait_raises(db_url: str) -> None:
    with SyncQueue(db_url) as q:
        result = q.enqueue("echo", {})  # no worker runs it
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            q.wait(result.job_id, timeout=0.5)
        assert 0.5 <= time.monotonic() - started < 3
        job = q.get(result.job_id)
        assert job is not None and job.status is JobStatus.QUEUED
    # The watch went with the wait.
    assert scalar(db_url, "SELECT count(*) FROM notifyq.watched_jobs") == 0


def test_a_wait_survives_the_loss_of_its_listen_connection(settings: Settings, db_url: str) -> None:
    """The listener reconnects, registers the watches again (a crash of the server empties
    their unlogged table) and the wait is woken by the job's end as before."""
    with SyncQueue(settings=settings) as q:
        result = q.enqueue("echo", {"n": 1})
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(q.wait, result.job_id, timeout=25)
            until(lambda: scalar(db_url, "SELECT count(*) FROM notifyq.watched_jobs") == 1)
            scalar(db_url, "DELETE FROM notifyq.watched_jobs RETURNING 1")
            listener = "application_name = 'notifyq-client-listener'"
            before = scalar(db_url, f"SELECT pid FROM pg_stat_activity WHERE {listener}")
            scalar(
                db_url, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {listener}"
            )
            until(lambda: scalar(db_url, "SELECT count(*) FROM notifyq.watched_jobs") == 1)
            assert scalar(db_url, f"SELECT pid FROM pg_stat_activity WHERE {listener}") != before
            with worker_thread(settings):
                started = time.monotonic()
                job = waiting.result(timeout=20)
                assert time.monotonic() - started < 5
    assert job.status is JobStatus.COMPLETED and job.result == {"n": 1}


# -- threads, the pool, closing ------------------------------------------------------------


def test_one_queue_serves_eight_threads_at_once(settings: Settings, db_url: str) -> None:
    start = threading.Barrier(8)

    def producer(n: int) -> tuple[list[UUID], UUID, int]:
        start.wait(timeout=10)
        ids = [q.enqueue("echo", {"thread": n, "i": i}).job_id for i in range(20)]
        batch = q.enqueue_many(
            [{"task": "echo", "payload": {"thread": n, "j": j}} for j in range(30)]
        )
        ids += [r.job_id for r in batch]
        held = q.enqueue("echo", {"thread": n}, dedup_key="shared", delay=3600)
        for job_id in ids[::5]:
            job = q.wait(job_id, timeout=20)
            assert job.status is JobStatus.COMPLETED and job.result["thread"] == n
        # Due later, so that this wait listens (the others may have found their job done).
        later = q.enqueue("echo", {"thread": n, "later": True}, delay=0.3)
        assert q.wait(later.job_id, timeout=20).status is JobStatus.COMPLETED
        return ids, held.job_id, client_connections(db_url)["notifyq-client-listener"]

    with SyncQueue(settings=settings) as q, worker_thread(settings):
        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(producer, range(8)))
    ids = [job_id for own, _, _ in outcomes for job_id in own]
    assert len(set(ids)) == 8 * 50
    # At most one queued job per (queue, dedup_key), also from eight threads at once.
    assert len({held for _, held, _ in outcomes}) == 1
    assert scalar(db_url, "SELECT count(*) FROM notifyq.jobs") == 8 * 50 + 8 + 1
    # Every thread's waits share one LISTEN connection.
    assert {listeners for _, _, listeners in outcomes} == {1}


def test_the_pool_opens_on_first_use_and_close_ends_every_connection(db_url: str) -> None:
    q = SyncQueue(db_url)
    assert client_connections(db_url) == {}
    result = q.enqueue("echo", {})
    with pytest.raises(TimeoutError):
        q.wait(result.job_id, timeout=0.2)
    opened = client_connections(db_url)
    assert opened["notifyq-client"] >= 1 and opened["notifyq-client-listener"] == 1
    q.close()
    until(lambda: client_connections(db_url) == {})
    with pytest.raises(RuntimeError, match="closed"):
        q.get(result.job_id)
    q.close()  # twice is fine
