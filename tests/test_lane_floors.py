"""The lanes' floors of version 27: every claimable job of a fair lane sorts at or after its
lane's floor, whoever moves it and whenever, and a claim of a lane steps over what the last
raise left of that lane, not over every job it gave since the slowest lane of its queue (a key
whose jobs no worker serves here holds the queue's floor where it is)."""

from __future__ import annotations

import random
from typing import Any

import psycopg

from tests.helpers import end_by_hand
from tests.test_floors import (
    BELOW,
    FETCHED,
    claim,
    older_transactions_around_a_raise,
    raise_floors,
    raised,
    scalar,
)

#: Claimable keyed jobs that sort before their lane's floor: there must never be one.
BELOW_LANE = """
    SELECT j.id, j.fair_key FROM ONLY notifyq.jobs AS j
    JOIN notifyq.lane_floors AS f
      ON f.queue = j.queue AND f.priority = j.priority AND f.fair_key = j.fair_key
    WHERE j.status = 'queued' AND NOT j.group_blocked AND (j.run_at, j.id) < (f.run_at, f.id)"""

#: The floor of lane 'fast' above its queue's, at its first claimable job.
FAST_AT_ITS_HEAD = """
    SELECT (f.run_at, f.id) > (g.run_at, g.id)
           AND (f.run_at, f.id) = (SELECT j.run_at, j.id FROM ONLY notifyq.jobs AS j
                                   WHERE j.fair_key = 'fast' AND j.status = 'queued'
                                   ORDER BY j.run_at, j.id LIMIT 1)
    FROM notifyq.lane_floors AS f
    JOIN notifyq.claim_floors AS g ON g.queue = f.queue AND g.priority = f.priority
    WHERE f.fair_key = 'fast'"""


async def slow_key_and_fast_key(conn: Any, fast: int) -> None:
    """A job of key 'slow' for a task no claim here serves (it holds the queue's floor), then
    ``fast`` jobs of key 'fast'."""
    await conn.execute("INSERT INTO notifyq.jobs (task, fair_key) VALUES ('other', 'slow')")
    await conn.execute(
        "INSERT INTO notifyq.jobs (task, fair_key) SELECT 'echo', 'fast' "
        "FROM generate_series(1, %s)",
        [fast],
    )


async def drain_lane(conn: Any, jobs: int) -> None:
    """Claims and completes ``jobs`` jobs, in claims of 50."""
    left = jobs
    while left > 0:
        taken = await claim(conn, min(left, 50))
        assert taken, f"{left} of {jobs} jobs left unclaimed"
        await conn.execute(
            "SELECT notifyq.complete_v3('w', %s::uuid[], array_fill(1, ARRAY[%s]), "
            "array_fill('null'::jsonb, ARRAY[%s]))",
            [taken, len(taken), len(taken)],
        )
        left -= len(taken)


async def test_a_lanes_floor_rises_behind_its_jobs_while_a_slow_key_holds_the_queues(
    conn: Any,
) -> None:
    await slow_key_and_fast_key(conn, 300)
    await drain_lane(conn, 100)
    await raised(conn, FAST_AT_ITS_HEAD)
    for _ in range(3):
        await raise_floors(conn)
    assert await scalar(conn, FAST_AT_ITS_HEAD)
    assert await (await conn.execute(BELOW_LANE)).fetchall() == []
    assert await (await conn.execute(BELOW)).fetchall() == []
    await drain_lane(conn, 200)
    assert await claim(conn) == []  # the slow key's job is for a task not served here


async def test_behind_a_pinned_horizon_a_lane_is_read_from_what_the_last_raise_left(
    db_url: str, conn: Any
) -> None:
    """2,000 jobs of one key claimed behind a pinned horizon, beside a key whose job holds the
    queue's floor at the start: the next claim of the key reads a few index entries, not the
    2,000 it gave since (which the lane's probe from the queue's floor steps over)."""
    async with await psycopg.AsyncConnection.connect(db_url) as pin:
        await pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await pin.execute("SELECT count(*) FROM notifyq.migrations")
        await slow_key_and_fast_key(conn, 2001)
        await drain_lane(conn, 2000)
        await raised(conn, FAST_AT_ITS_HEAD)
        async with conn.transaction():
            before = await scalar(conn, FETCHED)
            claimed = await claim(conn)
            after = await scalar(conn, FETCHED)
        await pin.rollback()
    assert len(claimed) == 1
    assert after - before <= 20, f"the claim read {after - before} index entries"


async def test_a_keyed_job_below_its_lanes_floor_is_claimed_without_waiting_for_a_pass(
    conn: Any,
) -> None:
    """An insert with an older run_at (the insert's trigger) and a queued job given the key
    (the requeue's row trigger) lower the lane's floor at once."""
    await slow_key_and_fast_key(conn, 20)
    await drain_lane(conn, 10)
    await raised(conn, FAST_AT_ITS_HEAD)
    old = await scalar(
        conn,
        "INSERT INTO notifyq.jobs (task, fair_key, run_at) "
        "VALUES ('echo', 'fast', now() - interval '1 day') RETURNING id",
    )
    moved = await scalar(
        conn,
        "INSERT INTO notifyq.jobs (task, fair_key, run_at) "
        "VALUES ('echo', 'elsewhere', now() - interval '2 days') RETURNING id",
    )
    await conn.execute("UPDATE notifyq.jobs SET fair_key = 'fast' WHERE id = %s", [moved])
    assert await (await conn.execute(BELOW_LANE)).fetchall() == []
    assert set(await claim(conn, 2)) == {old, moved}


async def test_a_keyed_job_written_by_a_transaction_older_than_the_raise_is_not_left_below(
    db_url: str, conn: Any
) -> None:
    """Two transactions that began before a raise of the lane's floor: one wrote its job before
    the pass (the raise waits for it to end), one after the proposal was sealed (its insert
    lowers the proposal, and holds the floor's row: the pass that would apply it waits, then
    finds it lowered). Both jobs run at their transaction's start, before the proposal."""
    await slow_key_and_fast_key(conn, 1)
    await drain_lane(conn, 1)
    await conn.execute("INSERT INTO notifyq.jobs (task, fair_key) VALUES ('echo', 'fast')")
    await raised(conn, FAST_AT_ITS_HEAD)
    await drain_lane(conn, 1)
    await older_transactions_around_a_raise(
        conn, db_url, "INSERT INTO notifyq.jobs (task, fair_key) VALUES ('echo', 'fast')"
    )
    assert await (await conn.execute(BELOW_LANE)).fetchall() == []
    assert len(await claim(conn)) == 2


async def test_the_net_removes_a_lanes_floor_that_a_switched_off_trigger_left_above_a_job(
    conn: Any,
) -> None:
    await slow_key_and_fast_key(conn, 20)
    await drain_lane(conn, 10)
    await raised(conn, FAST_AT_ITS_HEAD)
    await conn.execute("ALTER TABLE notifyq.jobs DISABLE TRIGGER jobs_floors")
    try:
        job = await scalar(
            conn,
            "INSERT INTO notifyq.jobs (task, fair_key, run_at) "
            "VALUES ('echo', 'fast', now() - interval '1 day') RETURNING id",
        )
    finally:
        await conn.execute("ALTER TABLE notifyq.jobs ENABLE TRIGGER jobs_floors")
    assert job not in await claim(conn, 1)  # below the lane's floor: no claim reads it
    # The queue's floor is lowered (sql/021's net), the lane's removed.
    assert await scalar(conn, "SELECT notifyq.mend_floors_v2()") == 2
    assert not await scalar(
        conn, "SELECT count(*) FROM notifyq.lane_floors WHERE fair_key = 'fast'"
    )
    assert await claim(conn, 1) == [job]


async def test_no_claimable_keyed_job_is_ever_below_its_lanes_floor_whatever_happens(
    conn: Any,
) -> None:
    """Random inserts (old and new run_ats, keys, priorities, groups), claims, completions,
    failures that retry, and raises, with both invariants checked after each step."""
    rng = random.Random(27)
    held: list[Any] = []
    await conn.execute("INSERT INTO notifyq.jobs (task, fair_key) VALUES ('other', 'slow')")
    for step in range(300):
        action = rng.choice(["insert", "insert", "claim", "complete", "fail", "raise", "raise"])
        if action == "insert":
            await conn.execute(
                "INSERT INTO notifyq.jobs (task, fair_key, priority, run_at, group_key) "
                "SELECT 'echo', %s, %s, now() - make_interval(secs => %s), %s "
                "FROM generate_series(1, %s)",
                [
                    rng.choice(["a", "b", "c"]),
                    rng.choice([0, 0, 5]),
                    rng.choice([0, 0, 3600]),
                    rng.choice([None, None, "g"]),
                    rng.randint(1, 5),
                ],
            )
        elif action == "claim":
            held += await claim(conn, rng.randint(1, 4))
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
        below = await (await conn.execute(BELOW_LANE)).fetchall()
        assert below == [], (step, action, below)
        assert await (await conn.execute(BELOW)).fetchall() == [], (step, action)
    assert await scalar(conn, "SELECT count(*) FROM notifyq.lane_floors") > 0
    await end_by_hand(conn, held, "failed") if held else None
