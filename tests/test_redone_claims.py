"""A claim a crash of the server undid, made again by the same worker under the same number.

A worker's claims commit without waiting for the disk (sql/queries.sql, ``claim_jobs``): a crash
of the server can undo one whose job the worker already runs. The row goes back to what it was
before the claim, and the worker's next claim of it writes the same claim number, the fence of
the run in progress. These tests put a row back exactly so, with the handler held mid-run, and
check that the job still runs once per fence: the run goes on as the new claim's, or, when the
job changed meanwhile, stops without a write while the job runs again under a claim of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio

from notifyq.context import JobContext
from notifyq.settings import Settings
from notifyq.tasks import Registry
from notifyq.worker import Worker
from notifyq.worker._ledger import Ledger
from tests.helpers import job_row, registry, running_worker, wait_until

#: What a claim changes in a row (notifyq.claim_v4): a crash that undoes it puts these back.
CLAIMED = (
    "status, attempt_count, claims, started_at, finished_at, heartbeat_at, progress, worker_id,"
    " lease_expires_at"
)


def quiet(settings: Settings) -> Settings:
    """No heartbeat while a test runs (it would drop the run whose claim was undone)."""
    return settings.model_copy(update={"lease_seconds": 300.0, "heartbeat_interval": 100.0})


class Held:
    """A task whose runs wait for ``go`` when their payload says so, and are counted."""

    def __init__(self) -> None:
        self.runs: list[dict[str, Any]] = []
        self.started = anyio.Event()
        self.go = anyio.Event()
        self.cancelled = 0

    def task(self) -> Registry:
        """The built-ins and ``held``, whose handler is this object's :meth:`run`."""

        async def held(payload: dict[str, Any]) -> dict[str, Any]:
            return await self.run(payload)

        return registry(held=held)

    async def run(self, payload: dict[str, Any]) -> dict[str, Any]:
        self.runs.append(payload)
        if payload.get("hold"):
            self.started.set()
            try:
                await self.go.wait()
            except anyio.get_cancelled_exc_class():
                self.cancelled += 1
                raise
        return {"run": len(self.runs), "v": payload.get("v")}


async def undo_the_claim(conn: Any, job_id: Any, before: tuple[Any, ...], **changes: Any) -> int:
    """Puts the row back as it was before its claim, as a crash that lost the claim's commit
    does (plus ``changes``, made while it is queued again); answers the claim number undone."""
    cursor = await conn.execute("SELECT claims FROM notifyq.jobs WHERE id = %s", [job_id])
    row = await cursor.fetchone()
    sets = ", ".join(f"{name} = %s" for name in changes)
    await conn.execute(
        f"UPDATE notifyq.jobs SET ({CLAIMED}) = ({', '.join(['%s'] * len(before))})"
        + (f", {sets}" if sets else "")
        + " WHERE id = %s",
        [*before, *changes.values(), job_id],
    )
    return int(row[0])


async def start_held(conn: Any, payload: str) -> tuple[Any, tuple[Any, ...]]:
    cursor = await conn.execute(
        f"INSERT INTO notifyq.jobs (task, payload) VALUES ('held', %s) RETURNING id, {CLAIMED}",
        [payload],
    )
    row = await cursor.fetchone()
    return row[0], tuple(row[1:])


def ledger_of(worker: Worker) -> Ledger:
    assert worker._ledger is not None
    return worker._ledger


async def completed(conn: Any, job_id: Any) -> dict[str, Any]:
    """Wakes the worker (a job of another task, whose insert notifies) until ``job_id`` is
    completed, and answers its row."""

    async def done() -> dict[str, Any] | None:
        await conn.execute("INSERT INTO notifyq.jobs (task) VALUES ('echo')")
        row = await job_row(conn, job_id)
        return row if row is not None and row["status"] == "completed" else None

    row: dict[str, Any] = await wait_until(done, timeout=10, interval=0.05)
    return row


async def claimed_again(conn: Any, job_id: Any, claim: int) -> None:
    """Wakes the worker (a job of another task, whose insert notifies) until it has claimed
    ``job_id`` again under ``claim``."""

    async def again() -> bool:
        await conn.execute("INSERT INTO notifyq.jobs (task) VALUES ('echo')")
        cursor = await conn.execute(
            "SELECT status, claims FROM notifyq.jobs WHERE id = %s", [job_id]
        )
        row = await cursor.fetchone()
        return row is not None and tuple(row) == ("processing", claim)

    await wait_until(again, timeout=10, interval=0.05)


@contextlib.asynccontextmanager
async def held_mid_run(
    settings: Settings, conn: Any
) -> AsyncIterator[tuple[Held, Worker, Any, tuple[Any, ...]]]:
    """A worker running a ``held`` job (payload v 1) whose handler waits for ``go``: the task,
    the worker, the job's id and its row as before its claim."""
    held = Held()
    job_id, before = await start_held(conn, '{"hold": true, "v": 1}')
    async with running_worker(quiet(settings), held.task()) as worker:
        with anyio.fail_after(10):
            await held.started.wait()
        yield held, worker, job_id, before
        await wait_until(lambda: len(ledger_of(worker)) == 0)  # nothing left held


async def test_a_claim_redone_under_the_same_number_goes_on_as_the_run_in_progress(
    settings: Settings, conn: Any
) -> None:
    async with held_mid_run(settings, conn) as (held, _, job_id, before):
        claim = await undo_the_claim(conn, job_id, before)
        await claimed_again(conn, job_id, claim)
        held.go.set()
        row = await completed(conn, job_id)
    # One run, under the one claim: its outcome is the job's.
    assert len(held.runs) == 1 and held.cancelled == 0
    assert (row["result"], row["claims"], row["attempt_count"]) == ({"run": 1, "v": 1}, 1, 1)


async def test_a_claim_redone_after_the_payload_changed_runs_the_new_payload_once(
    settings: Settings, conn: Any
) -> None:
    async with held_mid_run(settings, conn) as (held, _, job_id, before):
        # Queued again, its payload is replaced (as a keep_latest duplicate does) before the
        # same worker claims it again under the same number.
        claim = await undo_the_claim(conn, job_id, before, payload='{"v": 2}')
        row = await completed(conn, job_id)
    # The run of the old payload was stopped without a write; the claim made again went back
    # to the queue, and the new payload ran under a claim of its own.
    assert held.cancelled == 1
    assert [run.get("v") for run in held.runs] == [1, 2]
    assert row["result"] == {"run": 2, "v": 2}
    assert row["claims"] == claim + 1


async def test_a_claim_redone_after_its_run_was_dropped_as_lost_runs_under_a_new_number(
    settings: Settings, conn: Any
) -> None:
    async with held_mid_run(settings, conn) as (held, worker, job_id, before):
        # The heartbeat saw the row no longer held (the claim undone, below), and dropped the
        # run: its handler may still write until it returns, as a plain function in a thread.
        (entry,) = list(ledger_of(worker).entries())
        assert ledger_of(worker).lose(entry.held) is entry
        claim = await undo_the_claim(conn, job_id, before)
        held.go.set()  # the next run does not wait
        row = await completed(conn, job_id)
    assert held.cancelled == 1
    assert row["result"] == {"run": 2, "v": 1}
    assert row["claims"] == claim + 1


async def test_a_step_refused_by_a_claim_a_crash_undid_counts_no_attempt_and_runs_again(
    settings: Settings, conn: Any
) -> None:
    """The claim is undone while a durable step runs: the step's record is refused, which drops
    the run without a write (no failed attempt: the crash, not the job, ended it). Its claim
    comes back under the same number: released, the job runs again under a claim of its own."""
    runs: list[int] = []
    started = anyio.Event()
    go = anyio.Event()

    async def stepped(payload: dict[str, Any], ctx: JobContext) -> str:
        async def first() -> str:
            runs.append(len(runs) + 1)
            if len(runs) == 1:
                started.set()
                await go.wait()
            return f"run {len(runs)}"

        result: str = await ctx.step("first", first)
        return result

    cursor = await conn.execute(
        f"INSERT INTO notifyq.jobs (task) VALUES ('stepped') RETURNING id, {CLAIMED}"
    )
    row = await cursor.fetchone()
    job_id, before = row[0], tuple(row[1:])
    async with running_worker(quiet(settings), registry(stepped=stepped)) as worker:
        with anyio.fail_after(10):
            await started.wait()
        claim = await undo_the_claim(conn, job_id, before)
        go.set()  # the step ends; its record is refused (the row is queued)
        finished = await completed(conn, job_id)
        await wait_until(lambda: len(ledger_of(worker)) == 0)
    assert runs == [1, 2]
    assert finished["result"] == "run 2" and finished["errors"] == []
    assert finished["claims"] > claim and finished["attempt_count"] == 1
