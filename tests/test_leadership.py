"""One worker of a database leads its maintenance (rescue of lost jobs, retention): the others do
not run those passes, a leader that stops hands the lead on at once, and one that dies loses it
when its lease runs out (the performance issue, item 3)."""

from __future__ import annotations

from typing import Any

import pytest

from notifyq.settings import Settings
from tests.helpers import insert_in_state, running_worker, wait_for_status, wait_until


async def lead(conn: Any, holder: str, ttl: float = 30) -> bool:
    cursor = await conn.execute("SELECT notifyq.lead_v1('maintenance', %s, %s)", [holder, ttl])
    row = await cursor.fetchone()
    return bool(row[0])


async def test_the_lead_is_taken_when_free_kept_by_its_holder_and_taken_once_expired(
    conn: Any,
) -> None:
    assert await lead(conn, "a")
    assert not await lead(conn, "b")
    assert await lead(conn, "a")  # renewed
    await conn.execute("UPDATE notifyq.leaders SET expires_at = now() - interval '1 second'")
    assert await lead(conn, "b")
    assert not await lead(conn, "a")
    await conn.execute("SELECT notifyq.resign_v1('maintenance', 'a')")  # not a's: nothing
    assert not await lead(conn, "a")
    await conn.execute("SELECT notifyq.resign_v1('maintenance', 'b')")
    assert await lead(conn, "a")


@pytest.fixture
def fast(settings: Settings) -> Settings:
    """Heartbeats every 0.3 s, leases of 3 s: the lead moves within a test's patience."""
    return settings.model_copy(update={"lease_seconds": 3.0, "heartbeat_interval": 0.3})


async def test_only_the_leader_rescues_and_a_stopping_leader_hands_the_lead_on(
    fast: Settings, conn: Any
) -> None:
    async with running_worker(fast) as first:
        assert first.leadership is not None and first.leadership.leading
        async with running_worker(fast) as second:
            assert second.leadership is not None and not second.leadership.leading
            passes = second.signals.rescue_pass.count
            await first.signals.rescue_pass.reached(first.signals.rescue_pass.count + 3)
            assert second.signals.rescue_pass.count == passes  # three of the leader's: none
            first.stop()  # the leader stops, and gives the lead up
            leadership = second.leadership
            await wait_until(lambda: leadership.leading, timeout=10)
            # A job lost by a dead worker (of a task nobody here serves) is rescued by the new
            # leader: back to the queue.
            (lost,) = await insert_in_state(
                conn, "elsewhere", status="'processing'", worker_id="'dead:1:x'", claims="1",
                attempt_count="1", started_at="now()",
                lease_expires_at="now() - interval '1 second'",
            )  # fmt: skip
            await wait_for_status(conn, lost, "queued", timeout=10)
            # The worker counts its rescue once the statement's answer is back, which may come
            # after the commit this test saw.
            await wait_until(lambda: second.stats.rescued == 1, timeout=5)
            assert first.leadership.leading is False
            assert first.stats.rescued == 0


async def test_a_leader_that_died_loses_the_lead_when_its_lease_runs_out(
    fast: Settings, conn: Any
) -> None:
    # A leader that died without giving up the lead: its row stays until it expires.
    await conn.execute(
        "INSERT INTO notifyq.leaders VALUES ('maintenance', 'dead:1:x', now() + interval '1 s')"
    )
    async with running_worker(fast) as worker:
        assert worker.leadership is not None and not worker.leadership.leading
        leadership = worker.leadership
        await wait_until(lambda: leadership.leading, timeout=5)
    cursor = await conn.execute("SELECT count(*) FROM notifyq.leaders")
    assert (await cursor.fetchone())[0] == 0  # the stopped worker gave it up
