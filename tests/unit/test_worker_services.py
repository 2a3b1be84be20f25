"""The worker's services one at a time, against a fake store: the producer's wake and sleep
arithmetic and its claim loop, the ledger, the heartbeat, and the outcome writer's paths when the
database refuses a batch or goes away.

These use no database on purpose: each exercises one service's own logic, with a store that
answers exactly what the test says. The services' behaviour against PostgreSQL is what the rest of
the suite tests (tests/test_worker.py and friends).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Container, Iterable, Sequence
from typing import Any
from uuid import UUID

import anyio
import pytest

from notifyq.errors import DatabaseUnavailable, RefusedInput
from notifyq.models import ClaimedJob, ClaimRequest, Failure, Held, JobStatus, Success
from notifyq.tasks import Registry, make_task
from notifyq.worker._heartbeat import Heartbeat
from notifyq.worker._ledger import LOST_KEPT, CancelReason, Ledger, Redone, WakeReason
from notifyq.worker._producer import (
    LIMIT_TICK,
    MARK_RETRY,
    UNSURE_RECHECK,
    IdleMark,
    Producer,
    sleep_for,
)
from notifyq.worker._stats import Signals, WorkerStats
from notifyq.worker._telemetry import Telemetry
from notifyq.worker._writer import OutcomeWriter


async def noop(payload: dict[str, Any]) -> None: ...


TASK = make_task(noop, "noop")


def job(claim: int = 1) -> ClaimedJob:
    return ClaimedJob(uuid.uuid4(), "noop", "default", {}, 0, 1, 3, claim, 0.0, 0.0)


class FakeStore:
    """Answers what the test set, and records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.claims: list[list[ClaimedJob]] = []
        self.refuse: set[UUID] = set()
        self.unavailable = 0
        self.keep: set[UUID] | None = None  # the ids beat() answers as still held
        self.mark_failures = 0  # how many of the next mark_waiting calls fail
        self.fenced_off: set[UUID] = set()  # ids whose next completion the fence refuses

    def _maybe_down(self) -> None:
        if self.unavailable:
            self.unavailable -= 1
            raise DatabaseUnavailable("the database is away")

    async def claim(self, *, limit: int, probe: bool = False, **_: Any) -> list[ClaimedJob]:
        self.calls.append(("claim", limit))
        return self.claims.pop(0) if self.claims else []

    async def mark_waiting(self, worker_id: str, queues: Any, ttl: float) -> bool:
        self.calls.append(("mark_waiting", None))
        if self.mark_failures:
            self.mark_failures -= 1
            raise DatabaseUnavailable("the database is away")
        return True

    async def unmark_waiting(self, worker_id: str) -> None:
        self.calls.append(("unmark_waiting", None))

    async def refresh_waiting(self, worker_id: str, ttl: float) -> None:
        self.calls.append(("refresh_waiting", None))

    async def seconds_to_next_job(self, **_: Any) -> float | None:
        self.calls.append(("seconds_to_next_job", None))
        return None

    async def look_and_claim(
        self, *, limit: int, **_: Any
    ) -> tuple[float | None, list[ClaimedJob]]:
        # One pipeline in the real store: the look, then the claim.
        return await self.seconds_to_next_job(), await self.claim(limit=limit)

    async def limits_exist(self, tasks: Sequence[str]) -> bool:
        self.calls.append(("limits_exist", None))
        return False

    async def complete(self, worker_id: str, done: Sequence[Success]) -> set[UUID]:
        self._maybe_down()
        self.calls.append(("complete", [s.job_id for s in done]))
        if any(s.job_id in self.refuse for s in done):
            raise RefusedInput("recording results: value too long")
        refused = {s.job_id for s in done} & self.fenced_off
        self.fenced_off -= refused
        return {s.job_id for s in done} - refused

    async def complete_and_claim(
        self, worker_id: str, done: Sequence[Success], claim: ClaimRequest
    ) -> tuple[set[UUID], list[ClaimedJob]]:
        self.calls.append(("complete_and_claim", claim.limit))
        written = await self.complete(worker_id, done)
        return written, self.claims.pop(0) if self.claims else []

    async def fail(self, worker_id: str, failed: Sequence[Failure]) -> dict[UUID, JobStatus]:
        self._maybe_down()
        self.calls.append(("fail", [f.job_id for f in failed]))
        return {f.job_id: JobStatus.FAILED for f in failed}

    async def release(self, worker_id: str, held: Iterable[Held]) -> set[UUID]:
        items = list(held)
        self.calls.append(("release", [h.job_id for h in items]))
        return {h.job_id for h in items}

    async def cancel_running(self, worker_id: str, held: Iterable[Held]) -> set[UUID]:
        return {h.job_id for h in held}

    async def beat(
        self, worker_id: str, held: Iterable[Held], running: Container[UUID], lease: float
    ) -> dict[UUID, bool]:
        items = list(held)
        self.calls.append(("beat", [(h.job_id, h.job_id in running) for h in items]))
        keep = self.keep if self.keep is not None else {h.job_id for h in items}
        return {h.job_id: False for h in items if h.job_id in keep}


# -- the producer's arithmetic ----------------------------------------------------------------


def test_an_idle_producer_sleeps_until_the_poll_when_nothing_else_is_due() -> None:
    assert (
        sleep_for(
            poll_interval=5,
            next_due=None,
            probe_in=None,
            unsure=False,
            unmarked=False,
            limited=False,
        )
        == 5
    )


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"next_due": 1.5}, 1.5),
        ({"next_due": -3.0}, 0.0),  # overdue: claim at once
        ({"probe_in": 0.4}, 0.4),
        ({"next_due": 2.0, "probe_in": 0.7}, 0.7),
        ({"unsure": True}, UNSURE_RECHECK),
        ({"unmarked": True}, MARK_RETRY),
        ({"unmarked": True, "next_due": 0.2}, 0.2),
        ({"limited": True}, LIMIT_TICK),
        ({"next_due": 0.01, "limited": True}, 0.01),
    ],
)
def test_the_producer_sleeps_until_the_first_thing_that_may_be_due(
    kwargs: dict[str, Any], expected: float
) -> None:
    args: dict[str, Any] = {
        "poll_interval": 5.0,
        "next_due": None,
        "probe_in": None,
        "unsure": False,
        "unmarked": False,
        "limited": False,
    }
    assert sleep_for(**(args | kwargs)) == pytest.approx(expected)


class Given:
    """A stand-in for the runners: keeps what it is given."""

    def __init__(self) -> None:
        self.entries: list[Any] = []

    def give(self, entry: Any) -> None:
        self.entries.append(entry)


def producer(
    store: FakeStore,
    ledger: Ledger,
    *,
    burst: bool = False,
    given: Given | None = None,
    limits_interval: float = 60,
) -> tuple[Producer, Given]:
    given = given if given is not None else Given()
    idle = IdleMark(store, worker_id="w", queues=None, ttl=30)  # type: ignore[arg-type]
    made = Producer(
        store,  # type: ignore[arg-type]
        ledger,
        given,  # type: ignore[arg-type]
        Registry([TASK]),
        idle,
        Telemetry(),
        worker_id="w",
        queues=None,
        lease=30,
        poll_interval=30,
        guarded=[],
        limits_exist=False,
        limits_interval=limits_interval,
        burst=burst,
        stats=WorkerStats(),
        signals=Signals(),
    )
    return made, given


async def test_the_producer_claims_again_while_a_claim_comes_back_full() -> None:
    store = FakeStore()
    ledger = Ledger(concurrency=5)
    store.claims = [[job(), job()], [job()], []]
    made, given = producer(store, ledger, burst=True)
    # Two slots are taken by others: the first claim asks for the three free ones.
    ledger.take(job(), TASK)
    ledger.take(job(), TASK)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(made.run)
            await anyio.wait_all_tasks_blocked()  # saturated: waits for a slot
            assert len(given.entries) == 3 and ledger.free == 0
            for entry in ledger.entries():  # every job runs and ends
                ledger.begin(entry, anyio.CancelScope())
                ledger.end(entry)
        # In burst mode it returns once nothing is due and nothing runs.
    claims = [limit for name, limit in store.calls if name == "claim"]
    # 3 free: 2 came (not full), so idle mark and claim again: 1 free, 1 came (full); then
    # saturated until the slots free: all 5.
    assert claims == [3, 1, 5]


async def test_a_producer_that_found_nothing_marks_itself_idle_and_claims_once_more() -> None:
    store = FakeStore()
    ledger = Ledger(concurrency=2)
    made, _ = producer(store, ledger)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(made.run)
            await made._signals.idle.reached(2)
            ledger.stop()
    names = [name for name, _ in store.calls]
    # Look for the next run_at, claim: nothing; register as idle (the lock waited for inserts
    # in flight); look and claim again; then sleep.
    assert names[:5] == [
        "seconds_to_next_job",
        "claim",
        "mark_waiting",
        "seconds_to_next_job",
        "claim",
    ]


async def test_a_producer_whose_idle_mark_failed_marks_again_soon_not_at_its_poll() -> None:
    # Unmarked, it is woken by no insert: a failed mark (the database away a moment, a pool
    # still replacing connections after a failover) left it deaf until its poll, 30 s here.
    store = FakeStore()
    store.mark_failures = 1
    ledger = Ledger(concurrency=2)
    made, _ = producer(store, ledger)
    with anyio.fail_after(MARK_RETRY + 3):
        async with anyio.create_task_group() as tg:
            tg.start_soon(made.run)
            await made._signals.asleep.reached(2)
            ledger.stop()
    assert [name for name, _ in store.calls].count("mark_waiting") == 2
    assert made._idle.registered


async def test_the_claim_a_producer_sleeps_after_comes_after_its_look_for_the_next_run_at() -> None:
    # A job that falls due between a claim and a look made after it is in neither: it was not
    # due for the claim, and the look counts only jobs not due yet. So the look comes first.
    store = FakeStore()
    ledger = Ledger(concurrency=2)
    store.claims = [[job(), job()]]
    made, given = producer(store, ledger)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(made.run)
            await made._signals.claimed.reached(1)
            await anyio.wait_all_tasks_blocked()  # saturated: waits for a slot
            for entry in given.entries:
                ledger.begin(entry, anyio.CancelScope())
                ledger.end(entry)
            await made._signals.asleep.reached(1)
            ledger.stop()
    names = [name for name, _ in store.calls if name != "mark_waiting"]
    # The backlog drains without a look; the claim that found it empty had none before it, so
    # the producer looks and claims once more before it sleeps.
    assert names == [
        "seconds_to_next_job",
        "claim",
        "claim",
        "seconds_to_next_job",
        "claim",
        "seconds_to_next_job",
        "claim",
    ]


async def test_a_saturated_producer_clears_its_idle_mark_and_wakes_when_a_slot_frees() -> None:
    store = FakeStore()
    ledger = Ledger(concurrency=1)
    store.claims = [[], [job()], []]
    made, given = producer(store, ledger)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(made.run)
            await made._signals.idle.reached(1)  # idle, registered
            ledger.wake.signal(WakeReason.NOTIFY)  # a job came in
            await made._signals.claimed.reached(1)
            await anyio.wait_all_tasks_blocked()
            assert ("unmark_waiting", None) in store.calls  # busy: no more wake-ups
            (entry,) = given.entries
            ledger.begin(entry, anyio.CancelScope())
            ledger.end(entry)  # the slot frees: the producer claims again
            await made._signals.idle.reached(2)
            ledger.stop()
    assert ledger.wake.reason is not WakeReason.START


async def test_a_producer_whose_slots_are_set_aside_for_a_completions_claim_keeps_its_mark() -> (
    None
):
    store = FakeStore()
    ledger = Ledger(concurrency=1)
    made, _ = producer(store, ledger)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(made.run)
            await made._signals.idle.reached(2)  # nothing; registered; nothing again
            claim = made.reserve()  # the outcome writer claims for the only slot
            assert claim is not None and ledger.free == 0 and ledger.reserved == 1
            ledger.wake.signal(WakeReason.NOTIFY)  # a job came in meanwhile
            await anyio.wait_all_tasks_blocked()
            made.hand_over(claim, [], time.monotonic())  # that claim found nothing
            assert ledger.reserved == 0
            await made._signals.idle.reached(3)  # the producer claims the job itself
            ledger.stop()
    names = [name for name, _ in store.calls]
    # Not busy, only waiting for a claim's answer: no unmark, and no second registration (with
    # its claim once more) after.
    assert "unmark_waiting" not in names
    assert names.count("mark_waiting") == 1
    assert names.count("claim") == 3


class Started(Given):
    """A stand-in for the runners that starts each job in a task of its own, as they do: the
    start goes in the store's calls, to be seen among the statements."""

    def __init__(self, store: FakeStore) -> None:
        super().__init__()
        self.store = store
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    def give(self, entry: Any) -> None:
        super().give(entry)
        self.queue.put_nowait(entry)

    async def run(self) -> None:
        while True:
            await self.queue.get()
            self.store.calls.append(("handler", None))


async def test_a_claimed_job_starts_before_the_producer_sends_its_next_statement() -> None:
    store = FakeStore()
    ledger = Ledger(concurrency=2)
    store.claims = [[], [], [job()]]
    started = Started(store)
    made, _ = producer(store, ledger, given=started, limits_interval=0)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(started.run)
            tg.start_soon(made.run)
            await made._signals.idle.reached(2)  # nothing; registered; nothing again
            ledger.wake.signal(WakeReason.NOTIFY)  # a job came in
            await made._signals.claimed.reached(1)
            await anyio.wait_all_tasks_blocked()
            ledger.stop()
            tg.cancel_scope.cancel()
    names = [name for name, _ in store.calls]
    # The third claim: nothing; registered, nothing again; then the one the notification woke.
    woken = [i for i, name in enumerate(names) if name == "claim"][2]
    # Woken, it claims at once (limits are read after a claim, not before); the handler starts
    # before the next statement (the limits, the next run_at) goes out.
    assert names[woken - 1] != "limits_exist"
    assert names[woken + 1] == "handler", names


# -- the ledger --------------------------------------------------------------------------------


async def test_the_ledger_follows_a_job_from_claim_to_written_outcome() -> None:
    ledger = Ledger(concurrency=2)
    claimed = job(claim=7)
    entry = ledger.take(claimed, TASK)
    assert (ledger.free, ledger.active, ledger.held()) == (1, 1, [Held(claimed.id, 7)])
    assert ledger.confirmed() == set()
    assert ledger.begin(entry, anyio.CancelScope())
    assert ledger.confirmed() == {claimed.id}
    ledger.end(entry)
    assert (ledger.free, ledger.active) == (2, 0)
    assert ledger.let_go(Held(claimed.id, 6)) is None  # another claim's outcome
    assert ledger.let_go(Held(claimed.id, 7)) is entry
    assert len(ledger) == 0


async def test_a_claim_made_again_under_a_number_the_ledger_held_is_never_run_beside_it() -> None:
    """A crash of the server can undo a claim whose job runs here; claimed again, the job has
    the same claim number. The run in progress goes on as that claim's when it is intact and its
    payload the same; otherwise the new claim goes back to the queue (see Ledger.redone)."""
    ledger = Ledger(concurrency=3)
    first = job(claim=4)
    entry = ledger.take(first, TASK)
    assert ledger.begin(entry, anyio.CancelScope())
    again = dataclasses.replace(first)
    assert ledger.redone(again) is Redone.GOES_ON
    assert ledger.redone(dataclasses.replace(first, claim=5)) is Redone.NO  # a later claim
    assert ledger.redone(job(claim=4)) is Redone.NO  # another job
    changed = dataclasses.replace(first, payload={"v": 2})
    assert ledger.redone(changed) is Redone.RELEASE  # and the run in progress is stopped:
    assert entry.cancel_reason is CancelReason.LEASE_LOST and len(ledger) == 0
    assert ledger.redone(again) is Redone.RELEASE  # its handler may still write


def test_the_ledger_remembers_a_bounded_number_of_lost_claims() -> None:
    ledger = Ledger(concurrency=1)
    jobs = [job(claim=1) for _ in range(LOST_KEPT + 1)]
    for claimed in jobs:
        entry = ledger.take(claimed, TASK)
        assert ledger.lose(entry.held) is entry
        ledger.end(entry)
    assert ledger.redone(jobs[0]) is Redone.NO  # forgotten, the oldest first
    assert ledger.redone(jobs[1]) is Redone.RELEASE
    assert ledger.redone(jobs[-1]) is Redone.RELEASE


async def test_a_job_cancelled_before_it_started_does_not_start() -> None:
    ledger = Ledger(concurrency=1)
    entry = ledger.take(job(), TASK)
    assert ledger.cancel(entry.job.id, CancelReason.SHUTDOWN) is entry
    assert not ledger.begin(entry, anyio.CancelScope())
    assert entry.cancel_reason is CancelReason.SHUTDOWN


# -- the heartbeat ------------------------------------------------------------------------------


def heartbeat_for(store: FakeStore, ledger: Ledger) -> tuple[Heartbeat, WorkerStats]:
    stats = WorkerStats()
    idle = IdleMark(store, worker_id="w", queues=None, ttl=30)  # type: ignore[arg-type]
    beat = Heartbeat(
        store,  # type: ignore[arg-type]
        ledger,
        idle,
        worker_id="w",
        interval=1,
        lease=30,
        stats=stats,
        signals=Signals(),
    )
    return beat, stats


async def test_the_heartbeat_confirms_started_jobs_and_stops_those_it_lost() -> None:
    store = FakeStore()
    ledger = Ledger(concurrency=3)
    running, waiting, lost = (ledger.take(job(), TASK) for _ in range(3))
    scopes = {}
    for entry in (running, lost):
        scopes[entry.job.id] = anyio.CancelScope()
        ledger.begin(entry, scopes[entry.job.id])
    store.keep = {running.job.id, waiting.job.id}
    beat, stats = heartbeat_for(store, ledger)
    await beat.beat()
    ((_, reported),) = [call for call in store.calls if call[0] == "beat"]
    assert dict(reported) == {running.job.id: True, waiting.job.id: False, lost.job.id: True}
    assert stats.lost == 1
    assert scopes[lost.job.id].cancel_called and lost.cancel_reason is CancelReason.LEASE_LOST
    assert not scopes[running.job.id].cancel_called
    assert {h.job_id for h in ledger.held()} == {running.job.id, waiting.job.id}


async def test_a_lost_job_that_no_runner_began_yet_does_not_start() -> None:
    # Its lease ran out while it waited for a runner (a partition, a stalled loop): another
    # worker may run it now, so this one must not start it too.
    store = FakeStore()
    ledger = Ledger(concurrency=2)
    waiting = ledger.take(job(), TASK)
    store.keep = set()
    beat, stats = heartbeat_for(store, ledger)
    await beat.beat()
    assert stats.lost == 1 and ledger.held() == []
    assert not ledger.begin(waiting, anyio.CancelScope())
    ledger.end(waiting)
    assert (ledger.free, ledger.active) == (2, 0)


# -- the outcome writer -------------------------------------------------------------------------


def writer_for(store: FakeStore, ledger: Ledger) -> tuple[OutcomeWriter, WorkerStats]:
    stats = WorkerStats()
    made = OutcomeWriter(
        store,  # type: ignore[arg-type]
        ledger,
        Telemetry(),
        worker_id="w",
        stats=stats,
        signals=Signals(),
    )
    return made, stats


async def test_a_refused_batch_is_written_item_by_item_and_a_refused_result_fails_its_job() -> None:
    store = FakeStore()
    ledger = Ledger(concurrency=3)
    good, bad, other = (ledger.take(job(), TASK).job for _ in range(3))
    store.refuse = {bad.id}
    writer, stats = writer_for(store, ledger)
    for claimed in (good, bad, other):
        writer.record(Success(claimed.id, claimed.claim, '"r"'))
    await writer.flush()
    completes = [ids for name, ids in store.calls if name == "complete"]
    assert completes == [[good.id, bad.id, other.id], [good.id], [bad.id], [other.id]]
    assert [ids for name, ids in store.calls if name == "fail"] == [[bad.id]]
    assert (stats.completed, stats.failed, stats.lost) == (2, 1, 0)
    assert len(ledger) == 0 and not writer


async def test_outcomes_stay_in_the_writer_while_the_database_is_away() -> None:
    store = FakeStore()
    ledger = Ledger(concurrency=1)
    claimed = ledger.take(job(), TASK).job
    writer, stats = writer_for(store, ledger)
    writer.record(Success(claimed.id, claimed.claim, "null"))
    store.unavailable = 1
    with pytest.raises(DatabaseUnavailable):
        await writer.flush()
    assert writer and len(ledger) == 1
    await writer.flush()
    assert stats.completed == 1 and not writer and len(ledger) == 0


async def test_closing_the_writer_puts_back_every_job_without_an_outcome() -> None:
    store = FakeStore()
    ledger = Ledger(concurrency=2)
    finished, interrupted = (ledger.take(job(), TASK).job for _ in range(2))
    writer, stats = writer_for(store, ledger)
    async with writer.open():
        writer.record(Success(finished.id, finished.claim, "null"))
    assert ("release", [interrupted.id]) in store.calls
    assert (stats.completed, stats.released) == (1, 1)
    assert len(ledger) == 0


# -- claims made by the completion statement ---------------------------------------------------


def refilled(
    store: FakeStore, concurrency: int, *, burst: bool = False
) -> tuple[Ledger, Producer, Given, OutcomeWriter]:
    ledger = Ledger(concurrency=concurrency)
    made, given = producer(store, ledger, burst=burst)
    writer, _ = writer_for(store, ledger)
    writer.refill = made
    return ledger, made, given, writer


async def test_a_completion_claims_for_the_free_slots_and_starts_what_it_claimed() -> None:
    store = FakeStore()
    ledger, _, given, writer = refilled(store, 3)
    parent = ledger.take(job(), TASK)
    ledger.end(parent)  # its runner is done: 3 slots free
    child = job()
    store.claims = [[child]]
    writer.record(Success(parent.job.id, parent.job.claim, "null"))
    await writer.flush()
    assert ("complete_and_claim", 3) in store.calls
    assert [e.job for e in given.entries] == [child]
    assert ledger.free == 2 and ledger.active == 1


async def test_a_completion_refused_by_a_claim_a_crash_undid_is_written_again_once_reclaimed() -> (
    None
):
    """A crash undid a claim whose job ran here: the completion's statement finds the job queued
    (its fence refused) and, in the same statement, claims it again under the same number. The
    run goes on as that claim's (Ledger.redone), so its outcome is written once more, not
    discarded; the job is not started again."""
    store = FakeStore()
    ledger, _, given, writer = refilled(store, 2)
    ran = ledger.take(job(claim=3), TASK)
    ledger.end(ran)
    store.fenced_off = {ran.job.id}
    store.claims = [[dataclasses.replace(ran.job)]]
    writer.record(Success(ran.job.id, 3, "null"))
    await writer.flush()
    assert writer  # the outcome is back for the next flush
    await writer.flush()
    completes = [ids for name, ids in store.calls if name == "complete"]
    assert completes == [[ran.job.id], [ran.job.id]]
    assert given.entries == [] and len(ledger) == 0 and not writer
    assert ledger.free == 2


async def test_a_completion_the_fence_refused_twice_is_discarded() -> None:
    store = FakeStore()
    ledger, _, _, writer = refilled(store, 2)
    ran = ledger.take(job(claim=3), TASK)
    ledger.end(ran)
    assert ledger.redone(dataclasses.replace(ran.job)) is Redone.GOES_ON
    writer.refill = None
    store.fenced_off = {ran.job.id}
    writer.record(Success(ran.job.id, 3, "null"))
    await writer.flush()
    store.fenced_off = {ran.job.id}
    await writer.flush()
    assert len(ledger) == 0 and not writer


class SlowBeat(FakeStore):
    """A beat that reads its rows (the job not held: a crash undid its claim), then answers
    only when told to."""

    def __init__(self) -> None:
        super().__init__()
        self.looked = anyio.Event()
        self.answer = anyio.Event()

    async def beat(
        self, worker_id: str, held: Iterable[Held], running: Container[UUID], lease: float
    ) -> dict[UUID, bool]:
        self.looked.set()
        await self.answer.wait()
        return {}


async def test_a_beat_answered_before_a_claim_came_back_does_not_drop_the_run_it_kept() -> None:
    store = SlowBeat()
    ledger, made, _, _ = refilled(store, 2)
    run = ledger.take(job(claim=3), TASK)
    assert ledger.begin(run, anyio.CancelScope())  # its handler runs
    beat, _ = heartbeat_for(store, ledger)
    async with anyio.create_task_group() as tg:
        tg.start_soon(beat.beat)
        await store.looked.wait()
        made._start([dataclasses.replace(run.job)], time.monotonic())  # the claim came back
        store.answer.set()
    assert run.cancel_reason is None and not run.lost and len(ledger) == 1
    await beat.beat()  # the next beat, after it, decides
    assert run.lost and len(ledger) == 0


async def test_a_claim_back_with_a_new_payload_drops_the_outcome_its_old_run_left() -> None:
    """The old run's handler returned, its completion waits for the writer; the claim comes back
    with a payload a keep_latest duplicate replaced: that completion is not written, the claim
    is released, and the job runs again with the new payload."""
    store = FakeStore()
    ledger, made, given, writer = refilled(store, 2)
    writer.refill = None
    run = ledger.take(job(claim=3), TASK)
    assert ledger.begin(run, anyio.CancelScope())
    ledger.end(run)
    writer.record(Success(run.job.id, 3, '"old"'))
    made._start([dataclasses.replace(run.job, payload={"v": 2})], time.monotonic())
    (again,) = given.entries
    assert again.cancel_reason is CancelReason.STALE_CLAIM  # to be released, not run
    writer.release(again.held)  # what its runner does
    await writer.flush()
    assert [name for name, _ in store.calls if name in ("complete", "release")] == ["release"]
    assert len(ledger) == 0 and not writer


async def test_a_claim_back_after_its_outcome_was_written_is_released_not_run() -> None:
    store = FakeStore()
    ledger, made, given, writer = refilled(store, 2)
    writer.refill = None
    run = ledger.take(job(claim=3), TASK)
    ledger.end(run)
    writer.record(Success(run.job.id, 3, "null"))
    await writer.flush()  # accepted: the claim made again committed before it looked
    made._start([dataclasses.replace(run.job)], time.monotonic())  # that claim's answer
    (again,) = given.entries
    assert again.cancel_reason is CancelReason.STALE_CLAIM


async def test_an_outcome_voided_while_a_flush_writes_another_batch_is_not_written() -> None:
    """The completion statement of one batch claims back a job whose failure waits for the
    next batch, with a new payload: that failure is dropped before its batch is written."""
    store = FakeStore()
    ledger, _, given, writer = refilled(store, 3)
    failed = ledger.take(job(claim=2), TASK)
    assert ledger.begin(failed, anyio.CancelScope())
    ledger.end(failed)
    done = ledger.take(job(claim=1), TASK)
    ledger.end(done)
    writer.record(Failure(failed.job.id, 2, "boom", True, 0))
    writer.record(Success(done.job.id, 1, "null"))
    store.claims = [[dataclasses.replace(failed.job, payload={"v": 2})]]
    await writer.flush()
    assert [name for name, _ in store.calls if name == "fail"] == []
    (again,) = given.entries
    assert again.cancel_reason is CancelReason.STALE_CLAIM
    assert not ledger.voiding


def test_a_job_enqueued_again_under_a_deleted_jobs_id_is_another_job() -> None:
    ledger = Ledger(concurrency=1)
    first = job(claim=1)
    ledger.take(first, TASK)
    ledger.let_go(Held(first.id, 1))
    assert ledger.redone(first) is Redone.RELEASE  # its claim, come back
    namesake = dataclasses.replace(first, created_at=first.created_at + 60)
    assert ledger.redone(namesake) is Redone.NO


class StopsMeanwhile(FakeStore):
    """A completion that claims while the worker begins to stop."""

    ledger: Ledger

    async def complete_and_claim(
        self, worker_id: str, done: Sequence[Success], claim: ClaimRequest
    ) -> tuple[set[UUID], list[ClaimedJob]]:
        answer = await super().complete_and_claim(worker_id, done, claim)
        self.ledger.stopping = True
        return answer


async def test_a_stopping_worker_keeps_a_claim_its_completion_made_again_for_the_run() -> None:
    store = StopsMeanwhile()
    ledger, _, _, writer = refilled(store, 3)
    store.ledger = ledger
    run = ledger.take(job(claim=3), TASK)
    assert ledger.begin(run, anyio.CancelScope())
    done = ledger.take(job(claim=1), TASK)
    ledger.end(done)
    store.claims = [[dataclasses.replace(run.job)]]  # the completion claimed it back
    writer.record(Success(done.job.id, 1, "null"))
    await writer.flush()
    assert [name for name, _ in store.calls if name == "release"] == []
    assert len(ledger) == 1 and run.cancel_reason is None


async def test_slots_a_completion_set_aside_and_did_not_fill_wake_a_waiting_producer() -> None:
    store = FakeStore()
    ledger, made, _, _ = refilled(store, 2)
    claim = made.reserve()
    assert claim is not None and claim.limit == 2 and ledger.free == 0
    ledger.starve()  # the producer found no slot and waits for one
    waiter = ledger.wake.waiter
    made.hand_over(claim, [job()], time.monotonic())
    assert ledger.free == 1
    assert waiter.is_set() and ledger.wake.reason is WakeReason.SLOT


async def test_a_completion_claims_nothing_without_a_free_slot_in_burst_mode_or_when_stopping() -> (
    None
):
    store = FakeStore()
    ledger, made, _, _ = refilled(store, 1)
    ledger.take(job(), TASK)  # the only slot is taken
    assert made.reserve() is None
    _, burst, _, _ = refilled(FakeStore(), 2, burst=True)
    assert burst.reserve() is None
    stopping, made, _, _ = refilled(FakeStore(), 2)
    stopping.stop()
    assert made.reserve() is None and stopping.free == 2


async def test_a_completion_of_an_idle_worker_leaves_one_slot_for_the_producers_own_claim() -> None:
    store = FakeStore()
    ledger, made, _, _ = refilled(store, 3)
    busy = made.reserve()  # not marked idle: every free slot
    assert busy is not None and busy.limit == 3
    made.hand_over(busy, [], time.monotonic())
    await made._idle.mark()
    idle = made.reserve()
    assert idle is not None and idle.limit == 2 and ledger.free == 1
    made.hand_over(idle, [], time.monotonic())
    one = Ledger(concurrency=1)
    alone, _ = producer(FakeStore(), one)
    await alone._idle.mark()
    only = alone.reserve()  # a single slot is the completion's to claim
    assert only is not None and only.limit == 1


async def test_jobs_a_completion_claimed_while_the_worker_began_to_stop_go_back_at_once() -> None:
    store = FakeStore()
    ledger, _, given, writer = refilled(store, 2)
    parent = ledger.take(job(), TASK)
    ledger.end(parent)
    late = job()
    store.claims = [[late]]

    async def complete_then_stop(
        worker_id: str, done: Sequence[Success], claim: ClaimRequest
    ) -> tuple[set[UUID], list[ClaimedJob]]:
        ledger.stop()  # the stop comes while the statement runs
        return {s.job_id for s in done}, store.claims.pop(0)

    store.complete_and_claim = complete_then_stop  # type: ignore[method-assign]
    writer.record(Success(parent.job.id, parent.job.claim, "null"))
    await writer.flush()
    assert given.entries == []
    assert ("release", [late.id]) in store.calls
    assert ledger.free == 2 and len(ledger) == 0


async def test_a_refused_completion_with_a_claim_is_written_plainly_and_frees_its_slots() -> None:
    store = FakeStore()
    ledger, _, given, writer = refilled(store, 2)
    good, bad = (ledger.take(job(), TASK) for _ in range(2))
    for entry in (good, bad):
        ledger.end(entry)
    store.refuse = {bad.job.id}
    for entry in (good, bad):
        writer.record(Success(entry.job.id, entry.job.claim, "null"))
    await writer.flush()
    assert ("complete_and_claim", 2) in store.calls
    assert [name for name, _ in store.calls].count("complete") == 4  # the batch, then one by one
    assert given.entries == [] and ledger.free == 2


async def test_a_claim_in_flight_keeps_its_slots_from_the_writers_claim() -> None:
    # The producer's claim and the writer's completion statement run at the same time: each
    # fills only the slots set aside for it, so the worker never holds more than its slots.
    store = FakeStore()
    ledger, made, given, writer = refilled(store, 3)
    parent = ledger.take(job(), TASK)
    ledger.end(parent)  # 3 free
    in_flight = anyio.Event()
    answer = anyio.Event()

    async def slow_claim(*, limit: int, **_: Any) -> list[ClaimedJob]:
        store.calls.append(("claim", limit))
        in_flight.set()
        await answer.wait()
        return [job() for _ in range(limit)]

    store.claim = slow_claim  # type: ignore[method-assign]
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(made.run)
            await in_flight.wait()
            assert ledger.free == 0  # all three set aside for the producer's claim
            writer.record(Success(parent.job.id, parent.job.claim, "null"))
            await writer.flush()  # the writer finds no slot: a plain completion
            answer.set()
            await anyio.wait_all_tasks_blocked()
            assert ledger.free == 0 and len(given.entries) == 3
            ledger.stop()
            for entry in ledger.entries():
                ledger.begin(entry, anyio.CancelScope())
                ledger.end(entry)
    assert ("complete", [parent.job.id]) in store.calls
    assert not any(name == "complete_and_claim" for name, _ in store.calls)


async def test_a_claim_whose_answer_came_after_half_a_lease_puts_its_jobs_back_unstarted() -> None:
    # A partition held the answer back: another worker may have rescued these jobs and run
    # them meanwhile, so this one must not start them too.
    store = FakeStore()
    ledger, made, given, _ = refilled(store, 2)
    late = job()
    made.hand_over(ClaimRequest(["noop"], None, 2, 30.0), [late], time.monotonic() - 16.0)
    (entry,) = given.entries
    assert entry.cancel_reason is CancelReason.STALE_CLAIM
    assert not ledger.begin(entry, anyio.CancelScope())
    fresh = job()
    made.hand_over(ClaimRequest(["noop"], None, 1, 30.0), [fresh], time.monotonic() - 1.0)
    assert given.entries[1].cancel_reason is None
