"""The claim floors of version 21: every claimable job sorts at or after its queue's floor,
whoever moves it and whenever, and a claim behind a pinned horizon steps over what the last
raise left, not over every job claimed since the horizon was pinned."""

from __future__ import annotations

import random
from typing import Any
from uuid import uuid4

import anyio
import psycopg

from tests.helpers import end_by_hand, insert_in_state, wait_until

#: Index entries read, by every index of the live table: the claim's walk, whichever it takes.
FETCHED = (
    "SELECT sum(pg_stat_get_xact_tuples_returned(indexrelid))::int FROM pg_index "
    "WHERE indrelid = 'notifyq.jobs'::regclass"
)

#: Claimable jobs that sort before their queue's floor: there must never be one.
BELOW = """
    SELECT j.id, j.queue, j.priority FROM ONLY notifyq.jobs AS j
    LEFT JOIN notifyq.claim_floors AS f ON f.queue = j.queue AND f.priority = j.priority
    WHERE j.status = 'queued' AND NOT j.group_blocked
      AND (f.queue IS NULL OR (j.run_at, j.id) < (f.run_at, f.id))"""


async def scalar(conn: Any, query: str, *params: Any) -> Any:
    cursor = await conn.execute(query, params or None)
    row = await cursor.fetchone()
    return None if row is None else row[0]


async def claim(conn: Any, limit: int = 50, queues: list[str] | None = None) -> list[Any]:
    cursor = await conn.execute(
        "SELECT id FROM notifyq.claim_v4('w', '{echo}', %s, %s, 60, false)", [queues, limit]
    )
    return [job for (job,) in await cursor.fetchall()]


async def raise_floors(conn: Any) -> None:
    """One pass of the maintenance leader: the raise, then the seal in a statement of its own
    (``conn`` is in autocommit: each commits before the next begins)."""
    await conn.execute("SELECT notifyq.raise_floors_v2()")
    await conn.execute("SELECT notifyq.seal_floors_v2()")


async def raised(conn: Any, until: str, timeout: float = 20.0) -> None:
    """Passes until ``until`` (a query) answers true. A proposal waits for every transaction of
    the cluster that had an id when it was sealed, the other tests' included: passes are made
    until they have ended."""

    async def done() -> bool:
        await raise_floors(conn)
        return bool(await scalar(conn, until))

    await wait_until(done, timeout=timeout)


#: Every floor past the jobs finished so far.
PAST_THE_FINISHED = (
    "SELECT NOT EXISTS (SELECT 1 FROM notifyq.claim_floors AS f JOIN notifyq.jobs_done AS d "
    "ON d.queue = f.queue AND d.priority = f.priority WHERE (d.run_at, d.id) >= (f.run_at, f.id))"
)


async def drain(conn: Any) -> int:
    """Claims and completes every due job; answers how many."""
    done = 0
    while jobs := await claim(conn):
        await conn.execute(
            "SELECT notifyq.complete_v3('w', %s::uuid[], array_fill(1, ARRAY[%s]), "
            "array_fill('null'::jsonb, ARRAY[%s]))",
            [jobs, len(jobs), len(jobs)],
        )
        done += len(jobs)
    return done


async def test_a_floor_rises_behind_the_claimed_jobs_and_never_past_a_claimable_one(
    conn: Any,
) -> None:
    await conn.execute("INSERT INTO notifyq.jobs (task) SELECT 'echo' FROM generate_series(1, 300)")
    assert len(await claim(conn, 100)) == 100
    before = await scalar(conn, "SELECT run_at FROM notifyq.claim_floors")
    first_left = (
        "SELECT run_at, id FROM ONLY notifyq.jobs WHERE status = 'queued' "
        "ORDER BY run_at, id LIMIT 1"
    )
    # Up to the first job left, and not past it however many passes are made.
    await raised(conn, f"SELECT (run_at, id) = ({first_left}) FROM notifyq.claim_floors")
    for _ in range(3):
        await raise_floors(conn)
    assert await scalar(conn, f"SELECT (run_at, id) = ({first_left}) FROM notifyq.claim_floors")
    assert await scalar(conn, "SELECT run_at FROM notifyq.claim_floors") >= before
    assert await (await conn.execute(BELOW)).fetchall() == []


async def test_a_job_that_sorts_before_the_floor_is_claimed_without_waiting_for_a_pass(
    conn: Any,
) -> None:
    await conn.execute("INSERT INTO notifyq.jobs (task) SELECT 'echo' FROM generate_series(1, 5)")
    await drain(conn)
    await raised(conn, PAST_THE_FINISHED)
    # Below the raised floor: an older run_at, a higher priority (a level of its own), a
    # parent's completion that releases a dependent inserted long ago.
    old = await scalar(
        conn,
        "INSERT INTO notifyq.jobs (task, run_at) VALUES ('echo', now() - interval '1 day') "
        "RETURNING id",
    )
    urgent = await scalar(
        conn, "INSERT INTO notifyq.jobs (task, priority) VALUES ('echo', 9) RETURNING id"
    )
    [parent] = await insert_in_state(
        conn, "echo", status="'processing'", worker_id="'w'", claims="1"
    )
    waiting = await scalar(
        conn,
        "INSERT INTO notifyq.jobs (task, depends_on, run_at) "
        "VALUES ('echo', ARRAY[%s]::uuid[], now() - interval '1 hour') RETURNING id",
        parent,
    )
    assert set(await claim(conn)) == {old, urgent}
    await conn.execute(
        "SELECT notifyq.complete_v3('w', ARRAY[%s]::uuid[], ARRAY[1], ARRAY['null'::jsonb])",
        [parent],
    )
    assert await claim(conn) == [waiting]


async def commit_while_a_pass_waits_for_it(conn: Any, db_url: str, holder: Any) -> None:
    """Makes passes until one is seen waiting for a row lock ``holder`` (a transaction that
    lowered a floor's proposal) holds, then commits ``holder``. A pass applies a proposal only
    once every transaction of the cluster older than its seal has ended, the other tests'
    included: passes are made until then."""
    stop = anyio.Event()

    async def passes() -> None:
        while not stop.is_set():
            await raise_floors(conn)
            await anyio.sleep(0.02)

    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as watch:

        async def waiting() -> bool:
            cursor = await watch.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            row = await cursor.fetchone()
            return bool(row and row[0])

        async with anyio.create_task_group() as group:
            group.start_soon(passes)
            await wait_until(waiting, timeout=60)
            await holder.commit()
            stop.set()


async def older_transactions_around_a_raise(conn: Any, db_url: str, insert: str) -> None:
    """Runs ``insert`` in two transactions begun before a raise and committed after it: one
    before the pass (the raise waits for it to end), one after the proposal was sealed (its
    insert lowers the proposal and holds the floor's row), then makes the passes that apply."""
    async with (
        await psycopg.AsyncConnection.connect(db_url) as early,
        await psycopg.AsyncConnection.connect(db_url) as late,
    ):
        await early.execute(insert)
        await late.execute("SELECT 1")  # begun, with no transaction id yet
        for _ in range(3):
            await raise_floors(conn)  # proposes and seals; applies nothing while early runs
        await late.execute(insert)
        await early.commit()
        await commit_while_a_pass_waits_for_it(conn, db_url, late)
    for _ in range(2):
        await raise_floors(conn)


async def test_a_job_written_by_a_transaction_older_than_the_raise_is_not_left_below_it(
    db_url: str, conn: Any
) -> None:
    """Two transactions that began before a raise: one wrote its job before the pass (the
    raise waits for it to end), one after the proposal was sealed (its insert lowers the
    proposal and holds the floor's row: the pass that would apply it waits, then finds it
    lowered). Both jobs run at their transaction's start, before the proposal."""
    await conn.execute("INSERT INTO notifyq.jobs (task) VALUES ('echo')")
    await drain(conn)
    await older_transactions_around_a_raise(
        conn, db_url, "INSERT INTO notifyq.jobs (task) VALUES ('echo')"
    )
    assert await (await conn.execute(BELOW)).fetchall() == []
    assert len(await claim(conn)) == 2


async def test_behind_a_pinned_horizon_a_claim_reads_what_the_last_raise_left(
    db_url: str, conn: Any
) -> None:
    async with await psycopg.AsyncConnection.connect(db_url) as pin:
        await pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await pin.execute("SELECT count(*) FROM notifyq.migrations")
        for _ in range(10):
            await conn.execute(
                "INSERT INTO notifyq.jobs (task) SELECT 'echo' FROM generate_series(1, 200)"
            )
            await drain(conn)
        await raised(conn, PAST_THE_FINISHED)
        await conn.execute("INSERT INTO notifyq.jobs (task) VALUES ('echo')")
        async with conn.transaction():
            before = await scalar(conn, FETCHED)
            claimed = await claim(conn)
            after = await scalar(conn, FETCHED)
        await pin.rollback()
    assert len(claimed) == 1
    # 2,000 jobs were claimed behind the pin: their entries are all still in the index.
    assert after - before <= 10, f"the claim read {after - before} index entries"


#: Sequential scans of the live table that this session made and has not yet reported to the
#: statistics (a transaction reports none before it ends): in a transaction, at least its own.
SEQ_SCANS = "SELECT pg_stat_get_xact_numscans('notifyq.jobs'::regclass)::int"


async def test_the_looks_beside_each_claim_and_completion_never_scan_the_whole_table(
    db_url: str, conn: Any
) -> None:
    """A worker's connection plans next_due_v3 (in every look_and_claim) and
    anything_follows_v1 (in every completion) once, at its first call, when a new database's
    table looks empty: those plans must read indexes, or behind a pinned horizon each call
    reads every row version left since the pin (the pickup grew 17 -> 74 ms in a minute)."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as worker:
        looks = (
            ("SELECT notifyq.next_due_v3('{echo}', NULL)", None),
            ("SELECT notifyq.anything_follows_v1(%s::uuid[], NULL)", [[uuid4()]]),
        )
        for query, params in looks:
            await worker.execute(query, params)  # planned now, the table empty
        await conn.execute(
            "INSERT INTO notifyq.jobs (task) SELECT 'echo' FROM generate_series(1, 2000)"
        )
        await drain(conn)
        for query, params in looks:
            async with worker.transaction():
                await worker.execute(query, params)
                scans = await scalar(worker, SEQ_SCANS)
            assert scans == 0, f"{query}: {scans} sequential scan(s) of notifyq.jobs"


async def test_the_net_finds_a_job_whose_floor_a_trigger_switched_off_let_through(
    conn: Any,
) -> None:
    await conn.execute("ALTER TABLE notifyq.jobs DISABLE TRIGGER jobs_floors")
    try:
        job = await scalar(
            conn, "INSERT INTO notifyq.jobs (task, queue) VALUES ('echo', 'q2') RETURNING id"
        )
    finally:
        await conn.execute("ALTER TABLE notifyq.jobs ENABLE TRIGGER jobs_floors")
    assert await claim(conn) == []  # no floor for its queue: no claim reads it
    assert await scalar(conn, "SELECT notifyq.mend_floors_v1()") == 1
    assert await claim(conn) == [job]
    assert await scalar(conn, "SELECT notifyq.mend_floors_v1()") == 0


async def test_no_claimable_job_is_ever_below_its_floor_whatever_happens_to_the_jobs(
    conn: Any,
) -> None:
    """Random inserts (old and new run_ats, priorities, queues, groups), claims, completions,
    failures that retry, and raises, with the invariant checked after each step."""
    rng = random.Random(20)
    held: list[Any] = []
    for step in range(300):
        action = rng.choice(["insert", "insert", "claim", "complete", "fail", "raise"])
        if action == "insert":
            await conn.execute(
                "INSERT INTO notifyq.jobs (task, queue, priority, run_at, group_key) "
                "SELECT 'echo', %s, %s, now() - make_interval(secs => %s), %s "
                "FROM generate_series(1, %s)",
                [
                    rng.choice(["a", "b"]),
                    rng.choice([0, 0, 5]),
                    rng.choice([0, 0, 3600]),
                    rng.choice([None, None, "g"]),
                    rng.randint(1, 5),
                ],
            )
        elif action == "claim":
            held += await claim(conn, rng.randint(1, 4), rng.choice([None, ["a"]]))
        elif action in ("complete", "fail") and held:
            job = held.pop(rng.randrange(len(held)))
            if action == "complete":
                await conn.execute(
                    "SELECT notifyq.complete_v3('w', ARRAY[%s]::uuid[], ARRAY[1], "
                    "ARRAY['null'::jsonb])",
                    [job],
                )
            else:
                await conn.execute(
                    "SELECT notifyq.fail_v4('w', ARRAY[%s]::uuid[], ARRAY[1], ARRAY['boom'], "
                    "ARRAY[true], ARRAY[0::float8])",
                    [job],
                )
        elif action == "raise":
            await raise_floors(conn)
        below = await (await conn.execute(BELOW)).fetchall()
        assert below == [], (step, action, below)
    await end_by_hand(conn, held, "failed") if held else None
