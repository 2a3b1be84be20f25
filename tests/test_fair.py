"""Fair claims per key (sql/024): round-robin across the fair keys of a queue and priority,
weights, key_concurrency across worker processes, and what a duplicate does (on_conflict,
debounce), on every path a job comes by (HTTP, Python, SQL)."""

from __future__ import annotations

import itertools
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from notifyq import InvalidJob, Queue
from notifyq.builtins import worker_registry
from notifyq.errors import RefusedInput
from notifyq.settings import Settings
from notifyq.tasks import Registry, make_task
from tests.helpers import notifyq_env, processes, running_worker, wait_until
from tests.test_api import hosted


async def _claim(conn: psycopg.AsyncConnection[Any], limit: int, tasks: str = "echo") -> list[str]:
    """The fair keys of the jobs one claim takes ('' for none), in the order claim_v4 answers."""
    cursor = await conn.execute(
        """SELECT coalesce(j.fair_key, '')
           FROM notifyq.claim_v4('test', string_to_array(%s, ','), NULL, %s, 30, false) AS c
           JOIN notifyq.jobs AS j ON j.id = c.id""",
        [tasks, limit],
    )
    return [row[0] for row in await cursor.fetchall()]


async def _insert(conn: psycopg.AsyncConnection[Any], key: str | None, n: int, **cols: Any) -> None:
    task = cols.get("task", "echo")
    await conn.execute(
        """INSERT INTO notifyq.jobs (task, payload, fair_key)
           SELECT %s, jsonb_build_object('n', i), %s FROM generate_series(1, %s) AS i""",
        [task, key, n],
    )


async def _end(conn: psycopg.AsyncConnection[Any], n: int | None = None) -> None:
    """Completes the jobs processing (the first ``n`` of them when given) by hand."""
    await conn.execute(
        """SELECT notifyq.complete_v3('test', array_agg(id), array_agg(claims),
                                      array_fill('{}'::jsonb, ARRAY[count(*)::integer]))
           FROM (SELECT id, claims FROM notifyq.jobs WHERE status = 'processing'
                 ORDER BY started_at, id LIMIT %s) AS p""",
        [n],
    )


# -- round-robin ---------------------------------------------------------------------------------


async def test_a_flood_of_one_key_delays_the_next_job_of_another_by_one_turn(conn: Any) -> None:
    """A key with a backlog of any size delays another key's next job by at most one job of
    its own per turn: claims of one job alternate between two backlogged keys."""
    await _insert(conn, "flood", 500)
    await _insert(conn, "small", 5)
    order = [(await _claim(conn, 1))[0] for _ in range(10)]
    assert order.count("small") == 5, order
    for a, b in itertools.pairwise(order):
        assert not (a == b == "small") and not (a == b == "flood"), order
    # Then the flood alone, in order.
    assert await _claim(conn, 10) == ["flood"] * 10


async def test_nine_single_jobs_are_claimed_beside_a_flood_not_after_it(conn: Any) -> None:
    await _insert(conn, "a", 1000)
    await _claim(conn, 50)  # the flood has been served for a while
    for key in "bcdefghij":
        await _insert(conn, key, 1)
    taken = await _claim(conn, 10)
    assert sorted(k for k in taken if k != "a") == list("bcdefghij"), taken
    assert taken.count("a") == 1


async def test_jobs_without_a_key_share_one_turn_of_their_own(conn: Any) -> None:
    await _insert(conn, None, 300)
    await _insert(conn, "tenant", 300)
    counts = Counter()
    for _ in range(20):
        counts.update(await _claim(conn, 10))
    assert counts[""] == counts["tenant"] == 100, counts


async def test_a_level_without_keys_is_claimed_as_before(conn: Any) -> None:
    await _insert(conn, None, 20)
    assert await _claim(conn, 15) == [""] * 15
    cursor = await conn.execute("SELECT count(*) FROM notifyq.fair_lanes")
    assert (await cursor.fetchone())[0] == 0


async def test_queues_and_priorities_keep_their_order_beside_fair_levels(conn: Any) -> None:
    await _insert(conn, "low", 5)
    await conn.execute(
        "INSERT INTO notifyq.jobs (task, priority, fair_key) SELECT 'echo', 5, 'high' "
        "FROM generate_series(1, 3)"
    )
    assert sorted(await _claim(conn, 4)) == ["high", "high", "high", "low"]


async def test_weights_share_the_claims_four_to_one(conn: Any) -> None:
    await conn.execute("INSERT INTO notifyq.fair_weights (fair_key, weight) VALUES ('big', 4)")
    await _insert(conn, "big", 3000)
    await _insert(conn, "small", 3000)
    counts = Counter()
    for _ in range(100):
        counts.update(await _claim(conn, 20))
        await _end(conn)
    share = counts["big"] / (counts["big"] + counts["small"])
    assert counts.total() == 2000 and 0.76 <= share <= 0.84, counts


async def test_a_claim_beside_another_fills_itself_from_the_lanes_it_holds(
    conn: Any, db_url: str
) -> None:
    """Two claims at once, the second able to lock only a lane further back: it takes its
    share from that lane instead of coming back empty (which would put its worker to sleep
    until its poll while the lanes hold work), and the turns settle the difference after."""
    await _insert(conn, "front", 10)
    await _insert(conn, "back", 10)
    await conn.execute(
        "UPDATE notifyq.fair_lanes SET turn = CASE fair_key WHEN 'front' THEN 0 ELSE 5 END "
        "WHERE fair_key IN ('front', 'back')"
    )
    async with await psycopg.AsyncConnection.connect(db_url) as first:
        assert await _claim(first, 1) == ["front"]  # holds the lane in front, and stays open
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as second:
            await second.execute("SET statement_timeout = '5s'")
            assert await _claim(second, 4) == ["back"] * 4
        await first.commit()
    cursor = await conn.execute(
        "SELECT fair_key, turn FROM notifyq.fair_lanes WHERE fair_key IN ('front', 'back')"
    )
    assert dict(await cursor.fetchall()) == {"front": 1, "back": 9}
    # The lane that fell behind comes first until the turns meet.
    assert await _claim(conn, 8) == ["front"] * 8


async def test_a_claim_waits_a_second_at_most_for_a_lane_another_transaction_holds(
    conn: Any, db_url: str
) -> None:
    """A lane's row held by a transaction that is not a claim (here one that locked it and
    stays open): a claim that finds every lane held waits for it a second, then leaves the
    level with nothing, rather than for as long as that transaction runs."""
    await _insert(conn, "only", 3)
    async with await psycopg.AsyncConnection.connect(db_url) as holder:
        await holder.execute("SELECT 1 FROM notifyq.fair_lanes FOR UPDATE")
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as claimer:
            await claimer.execute("SET statement_timeout = '20s'")
            began = time.monotonic()
            assert await _claim(claimer, 2) == []
            waited = time.monotonic() - began
        await holder.rollback()
    assert 1 <= waited < 15, waited
    assert await _claim(conn, 2) == ["only", "only"]


async def test_a_key_that_ran_dry_starts_level_with_the_others(conn: Any) -> None:
    """A key that comes back after its lane went idle banks no credit for the time it had
    nothing queued: it alternates with the busy key at once."""
    await _insert(conn, "busy", 400)
    await _insert(conn, "back", 1)
    await _claim(conn, 200)
    await _claim(conn, 1)  # finds the lane of "back" empty
    cursor = await conn.execute(
        "SELECT idle_since IS NOT NULL FROM notifyq.fair_lanes WHERE fair_key = 'back'"
    )
    assert (await cursor.fetchone())[0] is True
    await _insert(conn, "back", 20)
    order = [(await _claim(conn, 1))[0] for _ in range(8)]
    assert order.count("back") == 4, order


async def test_delayed_jobs_of_one_key_do_not_hold_up_the_claims_of_others(conn: Any) -> None:
    """Lanes whose jobs are not due go to the back: a claim looks past more of them than it
    takes, and still fills up from the keys that have work."""
    await conn.execute(
        """INSERT INTO notifyq.jobs (task, fair_key, run_at)
           SELECT 'echo', 'later-' || i, now() + interval '1 hour' FROM generate_series(1, 30) i"""
    )
    await _insert(conn, "now", 10)
    assert await _claim(conn, 5) == ["now"] * 5


async def test_the_leader_reopens_removes_and_mends_lanes(conn: Any) -> None:
    await _insert(conn, "k", 2)
    # A lane marked idle while a job was going in (two transactions unseen by each other).
    await conn.execute("UPDATE notifyq.fair_lanes SET idle_since = now() WHERE fair_key = 'k'")
    assert await _claim(conn, 5) == []
    cursor = await conn.execute("SELECT notifyq.tend_lanes_v1()")
    assert (await cursor.fetchone())[0] == 1
    assert await _claim(conn, 5) == ["k", "k"]
    await _claim(conn, 5)  # finds the lane empty: idle
    await conn.execute("UPDATE notifyq.fair_lanes SET idle_since = now() - interval '2 minutes'")
    await conn.execute("SELECT notifyq.tend_lanes_v1()")
    cursor = await conn.execute("SELECT count(*) FROM notifyq.fair_lanes")
    assert (await cursor.fetchone())[0] == 0
    # A lane gone while its key has jobs (a trigger switched off by hand): the net makes it.
    await conn.execute("ALTER TABLE notifyq.jobs DISABLE TRIGGER jobs_floors")
    await _insert(conn, "stray", 3)
    await conn.execute("ALTER TABLE notifyq.jobs ENABLE TRIGGER jobs_floors")
    await conn.execute("SELECT notifyq.mend_floors_v1()")
    assert await _claim(conn, 5) == []
    cursor = await conn.execute("SELECT notifyq.mend_lanes_v1()")
    assert (await cursor.fetchone())[0] >= 1
    assert await _claim(conn, 5) == ["stray"] * 3


async def test_producers_of_one_key_never_wait_for_each_other(conn: Any, db_url: str) -> None:
    """A producer's transaction that opened a key's lane and stays open does not hold up
    another producer of that key (the lane is left to the first); if the first rolls back,
    the leader's net opens the lane for the second's job."""
    await _insert(conn, None, 1)  # the level's claim floor exists (sql/021)
    assert await _claim(conn, 1) == [""]
    async with await psycopg.AsyncConnection.connect(db_url) as first:
        await _insert(first, "shared", 1)  # opens the lane, and stays open
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as second:
            await second.execute("SET statement_timeout = '5s'")
            await _insert(second, "shared", 1)  # would wait for `first` without the skip
            await _insert(second, "idle-key", 1)
        await first.rollback()
    assert await _claim(conn, 5) == ["idle-key"]
    cursor = await conn.execute("SELECT notifyq.mend_lanes_v1()")
    assert (await cursor.fetchone())[0] == 1
    assert await _claim(conn, 5) == ["shared"]


# -- key_concurrency -----------------------------------------------------------------------------


async def test_key_concurrency_holds_in_the_claim(conn: Any) -> None:
    await conn.execute(
        "SELECT notifyq.register_task_v2('capped', NULL, '{}', NULL, 30, NULL, NULL, NULL, 2)"
    )
    await _insert(conn, "a", 10, task="capped")
    await _insert(conn, "b", 10, task="capped")
    await _insert(conn, None, 5, task="capped")
    assert sorted(await _claim(conn, 20, "capped")) == ["", "", "", "", "", "a", "a", "b", "b"]
    assert await _claim(conn, 20, "capped") == []
    await conn.execute(
        """SELECT notifyq.complete_v3('test', ARRAY[id], ARRAY[claims], ARRAY['{}'::jsonb])
           FROM notifyq.jobs WHERE status = 'processing' AND fair_key = 'a' LIMIT 1"""
    )
    assert await _claim(conn, 20, "capped") == ["a"]


@pytest.mark.heavy
def test_key_concurrency_holds_across_worker_processes(db_url: str, tmp_path: Path) -> None:
    """key_concurrency=2, four worker processes of eight slots each, 400 jobs over ten keys:
    never more than two jobs of one key run at once (each run's start and end are written by
    the handler, on the host's monotonic clock), and two of a key did run together."""
    runs = tmp_path / "runs.txt"
    env = notifyq_env(db_url, NQ_RUNS_FILE=str(runs), NOTIFYQ_IMPORT="tests.sample_tasks")
    with processes(tmp_path) as start:
        workers = [start("worker", "--concurrency", "8", env=env) for _ in range(4)]
        for worker in workers:
            worker.wait_for_output("ready")
        with psycopg.connect(db_url, autocommit=True) as db:
            db.execute(
                """INSERT INTO notifyq.jobs (task, payload, fair_key)
                   SELECT 'per_key', jsonb_build_object('key', 'k' || (i % 10)), 'k' || (i % 10)
                   FROM generate_series(1, 400) AS i"""
            )
            deadline = time.monotonic() + 120
            while True:
                row = db.execute(
                    "SELECT count(*) FILTER (WHERE status = 'completed'), count(*) "
                    "FROM notifyq.jobs"
                ).fetchone()
                assert row is not None
                if row[0] == row[1] == 400:
                    break
                assert time.monotonic() < deadline, f"{row[0]} of 400 completed"
                time.sleep(0.05)
        for worker in workers:
            worker.signal(signal.SIGTERM)
        for worker in workers:
            assert worker.wait() == 0, worker.output()
    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for line in runs.read_text().splitlines():
        key, began, ended, _pid = line.split()
        intervals[key].append((float(began), float(ended)))
    assert sum(map(len, intervals.values())) == 400
    peaks = {key: _peak(spans) for key, spans in intervals.items()}
    assert max(peaks.values()) == 2, peaks


def _stop(workers: list[Any]) -> None:
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.output()


def _wait_for(
    db: psycopg.Connection[Any],
    query: str,
    count: int,
    params: list[Any] | None = None,
    timeout: float = 120,
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        row = db.execute(query, params).fetchone()
        assert row is not None
        if row[0] >= count:
            return
        assert time.monotonic() < deadline, f"{row[0]} of {count}: {query}"
        time.sleep(0.05)


@pytest.mark.heavy
def test_weights_hold_across_worker_processes(db_url: str, tmp_path: Path) -> None:
    """Three worker processes claiming at once, keys a (weight 4) and b both backlogged: a
    takes about four of every five jobs, however the claims race for the two lanes."""
    env = notifyq_env(db_url)
    with psycopg.connect(db_url, autocommit=True) as db:
        db.execute("INSERT INTO notifyq.fair_weights (fair_key, weight) VALUES ('a', 4)")
        with processes(tmp_path) as start:
            workers = [start("worker", "--concurrency", "8", env=env) for _ in range(3)]
            for worker in workers:
                worker.wait_for_output("ready")
            db.execute(
                """INSERT INTO notifyq.jobs (task, payload, fair_key)
                   SELECT 'echo', '{}', CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END
                   FROM generate_series(1, 3000) AS i ORDER BY i"""
            )
            _wait_for(db, "SELECT count(*) FROM notifyq.jobs_done", 1000)
            _stop(workers)
        keys = [
            key
            for (key,) in db.execute(
                "SELECT fair_key FROM notifyq.jobs WHERE started_at IS NOT NULL "
                "ORDER BY started_at, id LIMIT 1000"
            )
        ]
    assert len(keys) == 1000
    share = keys.count("a") / len(keys)
    assert 0.72 <= share <= 0.88, share


@pytest.mark.heavy
def test_worker_processes_share_a_backlog_of_keyed_jobs(db_url: str, tmp_path: Path) -> None:
    """Three worker processes drain 20 keys' jobs of 20 ms together: a claim that finds the
    lanes taken by another's does not send its worker to sleep until the poll (5 s, longer
    than the whole drain), so each runs a fair part of the jobs."""
    env = notifyq_env(db_url)
    with psycopg.connect(db_url, autocommit=True) as db:
        with processes(tmp_path) as start:
            workers = [start("worker", "--concurrency", "4", env=env) for _ in range(3)]
            for worker in workers:
                worker.wait_for_output("ready")
            db.execute(
                """INSERT INTO notifyq.jobs (task, payload, fair_key)
                   SELECT 'sleep', '{"seconds": 0.02}', 'k' || (i % 20)
                   FROM generate_series(1, 600) AS i ORDER BY i"""
            )
            _wait_for(db, "SELECT count(*) FROM notifyq.jobs_done", 600, timeout=60)
            _stop(workers)
        ran = Counter(
            dict(db.execute("SELECT worker_id, count(*) FROM notifyq.jobs_done GROUP BY 1"))
        )
    assert ran.total() == 600 and len(ran) == 3 and min(ran.values()) >= 100, ran


@pytest.mark.heavy
def test_every_key_is_served_beside_a_flood_across_worker_processes(
    db_url: str, tmp_path: Path
) -> None:
    """Three worker processes busy with one key's flood of jobs that hold their slots: a job
    each of nine other keys, inserted one by one, starts while the flood is still queued."""
    env = notifyq_env(db_url)
    with psycopg.connect(db_url, autocommit=True) as db:
        with processes(tmp_path) as start:
            workers = [start("worker", "--concurrency", "4", env=env) for _ in range(3)]
            for worker in workers:
                worker.wait_for_output("ready")
            db.execute(
                """INSERT INTO notifyq.jobs (task, payload, fair_key)
                   SELECT 'sleep', '{"seconds": 0.05}', 'flood' FROM generate_series(1, 2000)"""
            )
            _wait_for(db, "SELECT count(*) FROM notifyq.jobs WHERE status = 'processing'", 12)
            ids = []
            for key in "bcdefghij":
                row = db.execute(
                    "INSERT INTO notifyq.jobs (task, payload, fair_key) "
                    "VALUES ('echo', '{}', %s) RETURNING id",
                    [key],
                ).fetchone()
                assert row is not None
                ids.append(row[0])
            _wait_for(db, "SELECT count(*) FROM notifyq.jobs_done WHERE id = ANY(%s)", 9, [ids], 30)
            row = db.execute(
                "SELECT count(*) FROM notifyq.jobs WHERE fair_key = 'flood' AND status = 'queued'"
            ).fetchone()
            db.execute("DELETE FROM notifyq.jobs WHERE status = 'queued'")
            _stop(workers)
    # Each took its turn within the first rounds of the flood: most of it was still queued.
    assert row is not None and row[0] > 1500, row


async def test_a_finished_job_keeps_its_key(conn: Any) -> None:
    """Completed, failed and retried jobs keep their fair_key: a retried one goes back into
    its key's lane."""
    await _insert(conn, "k", 2)
    assert await _claim(conn, 2) == ["k", "k"]
    await _end(conn, 1)
    await conn.execute(
        """SELECT notifyq.end_jobs_v1(array_agg(id), array_fill('failed'::text,
                                                               ARRAY[count(*)::integer]))
           FROM notifyq.jobs WHERE status = 'processing'"""
    )
    cursor = await conn.execute("SELECT status, fair_key FROM notifyq.jobs ORDER BY status")
    assert await cursor.fetchall() == [("completed", "k"), ("failed", "k")]
    await conn.execute("SELECT notifyq.retry_v1(id) FROM notifyq.jobs WHERE status = 'failed'")
    assert await _claim(conn, 1) == ["k"]


def _peak(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one moment."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


# -- a worker and the three ways in --------------------------------------------------------------


async def test_a_worker_serves_every_key_beside_a_flood(settings: Settings, db_url: str) -> None:
    started: list[str] = []

    async def tenant_job(payload: dict[str, Any]) -> None:
        started.append(payload["key"])

    registry = worker_registry(Registry([make_task(tenant_job, "tenant_job")]))
    async with Queue(db_url) as q:
        await q.enqueue_many(
            [{"task": "tenant_job", "payload": {"key": "a"}, "fair_key": "a"}] * 300
        )
        for key in "bcdefghij":
            await q.enqueue("tenant_job", {"key": key}, fair_key=key)
        one = settings.model_copy(update={"concurrency": 1})
        async with running_worker(one, registry):
            await wait_until(lambda: len(started) == 309, timeout=30)
    first = started[:20]
    assert set("bcdefghij") <= set(first), first


async def test_each_way_in_takes_a_fair_key(settings: Settings, conn: Any, db_url: str) -> None:
    async with hosted(settings.model_copy(update={"run_worker": False})) as client:
        r = await client.post("/jobs", json={"task": "echo", "payload": {}, "fair_key": "http"})
        assert r.status_code == 201, r.text
        shown = await client.get(f"/jobs/{r.json()['job_id']}")
        assert shown.json()["fair_key"] == "http"
        listed = await client.get("/jobs")
        assert [job["fair_key"] for job in listed.json()["jobs"]] == ["http"]
    async with Queue(db_url) as q:
        await q.enqueue("echo", {}, fair_key="python")
        await q.enqueue("echo", {}, fair_key="python-dedup", dedup_key="d")
        await q.enqueue_many([{"task": "echo", "fair_key": "many"}])
    await conn.execute("SELECT notifyq.enqueue('echo', fair_key => 'psql')")
    await conn.execute("INSERT INTO notifyq.jobs (task, fair_key) VALUES ('echo', 'insert')")
    cursor = await conn.execute("SELECT fair_key FROM notifyq.jobs ORDER BY fair_key")
    keys = [row[0] for row in await cursor.fetchall()]
    assert keys == sorted(["http", "python", "python-dedup", "many", "psql", "insert"])
    cursor = await conn.execute("SELECT count(*) FROM notifyq.fair_lanes WHERE fair_key <> ''")
    assert (await cursor.fetchone())[0] == 6


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"fair_key": ""}, "fair_key"),
        ({"fair_key": "k" * 513}, "fair_key"),
        ({"fair_key": 7}, "fair_key"),
        ({"on_conflict": "keep_oldest", "dedup_key": "d"}, "on_conflict"),
        ({"on_conflict": "keep_first"}, "dedup_key"),
        ({"debounce": 5}, "dedup_key"),
        ({"debounce": -1, "dedup_key": "d"}, "debounce"),
        ({"debounce": 5, "dedup_key": "d", "delay": 1}, "debounce"),
    ],
)
async def test_bad_fairness_options_are_a_clear_422(
    settings: Settings, conn: Any, body: dict[str, Any], says: str
) -> None:
    async with hosted(settings.model_copy(update={"run_worker": False})) as client:
        r = await client.post("/jobs", json={"task": "echo", "payload": {}, **body})
    assert r.status_code == 422, r.text
    assert says in r.text
    cursor = await conn.execute("SELECT count(*) FROM notifyq.jobs")
    assert (await cursor.fetchone())[0] == 0


async def test_bad_rows_by_sql_are_refused_saying_why(conn: Any) -> None:
    with pytest.raises(psycopg.errors.CheckViolation, match="fair_key must be 1 to 512"):
        await conn.execute("INSERT INTO notifyq.jobs (task, fair_key) VALUES ('echo', '')")
    with pytest.raises(psycopg.errors.CheckViolation, match="on_conflict must be"):
        await conn.execute("SELECT notifyq.enqueue('echo', dedup_key => 'd', on_conflict => 'x')")
    with pytest.raises(psycopg.errors.CheckViolation, match="debounce needs a dedup_key"):
        await conn.execute("SELECT notifyq.enqueue('echo', debounce => 3)")


# -- supersede -----------------------------------------------------------------------------------


async def test_keep_latest_and_keep_first(db_url: str, conn: Any) -> None:
    async with Queue(db_url) as q:
        first = await q.enqueue("echo", {"v": 1}, dedup_key="report")
        latest = await q.enqueue("echo", {"v": 2}, dedup_key="report", on_conflict="keep_latest")
        kept = await q.enqueue("echo", {"v": 3}, dedup_key="report", on_conflict="keep_first")
        assert latest.duplicate and kept.duplicate
        assert first.job_id == latest.job_id == kept.job_id
        job = await q.get(first.job_id)
        assert job is not None and job.payload == {"v": 2}
        with pytest.raises(InvalidJob, match="needs a dedup_key"):
            await q.enqueue("echo", {}, on_conflict="keep_first")
        with pytest.raises(RefusedInput, match=r"fair_key none, not .other."):
            await q.enqueue("echo", {"v": 4}, dedup_key="report", fair_key="other")


async def test_debounce_runs_the_last_payload_once_the_submissions_stop(
    settings: Settings, db_url: str
) -> None:
    seen: list[int] = []

    async def rebuild(payload: dict[str, Any]) -> None:
        seen.append(payload["v"])

    registry = worker_registry(Registry([make_task(rebuild, "rebuild")]))
    async with Queue(db_url) as q, running_worker(settings, registry):
        began = time.monotonic()
        results = []
        for v in range(5):
            results.append(await q.enqueue("rebuild", {"v": v}, dedup_key="idx", debounce=0.4))
            await anyio.sleep(0.1)
        last_submitted = time.monotonic()
        assert len({r.job_id for r in results}) == 1
        job = await q.wait(results[0].job_id, timeout=10)
        assert job.status.value == "completed"
        # It ran once, with the last payload, no sooner than the debounce after the last one.
        assert seen == [4]
        assert job.started_at is not None
        assert time.monotonic() - began >= (last_submitted - began) + 0.3


def test_fair_weights_from_the_command_line(db_url: str, tmp_path: Path) -> None:
    with processes(tmp_path) as start:
        env = notifyq_env(db_url)
        assert start("fair", "set", "tenant-a", "4", env=env).wait() == 0
        listing = start("fair", "list", env=env)
        assert listing.wait() == 0
        assert "tenant-a" in listing.output() and "4" in listing.output()
        bad = start("fair", "set", "tenant-a", "0", env=env)
        assert bad.wait() == 2 and "1 to 1000" in bad.output()
        assert start("fair", "unset", "tenant-a", env=env).wait() == 0
    with psycopg.connect(db_url) as db:
        row = db.execute("SELECT count(*) FROM notifyq.fair_weights").fetchone()
        assert row is not None and row[0] == 0


async def test_the_fair_keys_are_counted_for_the_dashboard(db_url: str, conn: Any) -> None:
    await _insert(conn, "a", 7)
    await _insert(conn, "b", 2)
    await _claim(conn, 4)
    async with Queue(db_url) as q:
        rows = await q.store.fair_keys(limit=1)
    assert rows == [{"queue": "default", "fair_key": "a", "queued": 5, "running": 2, "weight": 1}]
