"""The ledger: the one owner of a worker's shared state.

A claimed job is an :class:`Entry` here from its claim to the write of its outcome. The producer
adds entries (:meth:`Ledger.take`) as slots allow; a runner begins and ends one
(:meth:`Ledger.begin`, :meth:`Ledger.end`); the heartbeat reads what is held and confirmed, and
drops what another worker took over (:meth:`Ledger.lose`); the outcome writer lets entries go once
their outcome is in the database (:meth:`Ledger.let_go`). The ledger also carries the producer's
wake-ups (:class:`Wake`) and the worker's stop. Other services ask it; none reaches into its
dictionaries.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Protocol
from uuid import UUID

import anyio

from notifyq.models import ClaimedJob, Held
from notifyq.tasks import Task

__all__ = ["CancelReason", "Entry", "Fenced", "Ledger", "Redone", "Wake", "WakeReason"]


class WakeReason(str, Enum):
    """What made the producer claim (the ``woken_by`` label of ``notifyq_claims_total``)."""

    START = "start"
    NOTIFY = "notify"
    POLL = "poll"
    SLOT = "slot"
    CONNECT = "connect"
    #: Claimed by the statement that recorded the worker's completions.
    COMPLETION = "completion"
    LOOP = "loop"
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


class CancelReason(str, Enum):
    """Why a job's handler is being stopped, which decides what its outcome is."""

    #: A cancel request (POST /jobs/{id}/cancel): the job ends cancelled.
    REQUESTED = "cancel"
    #: The shutdown grace ran out: the job goes back to the queue, attempt not counted.
    SHUTDOWN = "shutdown"
    #: Another worker took the job over (its lease ran out): nothing is written.
    LEASE_LOST = "lease_lost"
    #: Its claim's answer came too late to start it (see notifyq.worker._producer.STALE_CLAIM):
    #: back to the queue, attempt not counted, unless another worker took it meanwhile.
    STALE_CLAIM = "stale_claim"


class Redone(Enum):
    """What :meth:`Ledger.redone` answers for a claimed job."""

    #: Not a claim this worker held before: take it.
    NO = "no"
    #: The run in progress goes on as this claim's: do not take it again.
    GOES_ON = "goes_on"
    #: Back to the queue without running (a fenced release).
    RELEASE = "release"


#: How many lost claims the ledger remembers (:meth:`Ledger.redone`); a crash's claims come back
#: within seconds, and each costs a few dozen bytes.
LOST_KEPT = 4096


class Fenced(Protocol):
    """What names one claim of a job: a :class:`~notifyq.models.Held`, or an outcome."""

    @property
    def job_id(self) -> UUID: ...

    @property
    def claim(self) -> int: ...


class Wake:
    """The producer's wake-up: an event to wait on, replaced each time it is set, and the reason
    of the latest one. Taking :attr:`waiter` before a claim means a wake-up that arrives while
    the claim runs is not missed."""

    def __init__(self) -> None:
        self._event = anyio.Event()
        self.reason = WakeReason.START

    @property
    def waiter(self) -> anyio.Event:
        """The event the next :meth:`signal` sets."""
        return self._event

    def signal(self, reason: WakeReason) -> None:
        """Wakes the producer, for ``reason``."""
        self.reason = reason
        event, self._event = self._event, anyio.Event()
        event.set()


@dataclass(slots=True, eq=False)
class Entry:
    """A job this worker holds, from its claim to the write of its outcome."""

    job: ClaimedJob
    task: Task
    #: Why its handler is being stopped, or None.
    cancel_reason: CancelReason | None = None
    #: Whether its handler was called: the heartbeat confirms only these (notifyq.beat_v1).
    started: bool = False
    #: Whether a runner has it now.
    running: bool = False
    #: The runner's cancel scope, while the handler runs.
    scope: anyio.CancelScope | None = None
    #: Claimed again under its claim number (:meth:`Ledger.redone`) while its outcome may have
    #: been on its way already: a write of it that the fence refused is made once more.
    redone: bool = False
    #: Dropped as lost (:meth:`Ledger.lose`): nothing of it is written any more.
    lost: bool = False

    @property
    def held(self) -> Held:
        """Its id and the claim number that fences every write about it."""
        return Held(self.job.id, self.job.claim)

    def cancel(self, reason: CancelReason) -> None:
        """Stops its handler if it runs; one that has not started yet will not start. The first
        reason given is the one that counts."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        if self.scope is not None:
            self.scope.cancel()


class Ledger:
    """The jobs a worker holds, its free slots, the producer's wake-ups and the worker's stop."""

    def __init__(self, concurrency: int) -> None:
        self._entries: dict[UUID, Entry] = {}
        #: The claims dropped as lost whose handler may still run (:meth:`lose`), and those
        #: whose outcome was written or discarded (:meth:`let_go`), oldest first, at most
        #: LOST_KEPT each: :meth:`redone` releases a claim that comes back with one.
        self._lost = _Fences(LOST_KEPT)
        self._gone = _Fences(LOST_KEPT)
        #: Fences whose pending outcome must not be written (:meth:`redone`; the writer asks
        #: :meth:`void`).
        self._void: set[tuple[UUID, int]] = set()
        #: How many claims came back under a fence this worker had (:meth:`redone`): a
        #: heartbeat whose answer was read before one of them must not drop what it kept.
        self.redone_count = 0
        self._free = concurrency
        self._reserved = 0
        self._active = 0
        self._starved = False
        #: Set when the last active job ends; made only while someone waits for that (a job
        #: that finds the worker idle would otherwise make an Event of its own).
        self._idle: anyio.Event | None = None
        self.wake = Wake()
        self.stopping = False
        #: Wake the producer whenever the last running job ends (burst mode drains, then exits).
        self.wake_when_idle = False

    # -- slots ----------------------------------------------------------------------------

    @property
    def free(self) -> int:
        """Slots for more jobs."""
        return self._free

    @property
    def reserved(self) -> int:
        """Slots set aside for claims in flight (:meth:`reserve`): free again, or taken by the
        jobs those claims bring, once they are answered."""
        return self._reserved

    @property
    def active(self) -> int:
        """Jobs given to runners whose runner has not finished them."""
        return self._active

    def reserve(self, wanted: int) -> int:
        """Sets aside up to ``wanted`` free slots for a claim made outside the producer (the
        outcome writer's, in its completion statement); answers how many. They are taken by
        :meth:`take` for the jobs that claim brings, and given back by :meth:`unreserve`."""
        reserved = min(self._free, wanted) if not self.stopping else 0
        self._free -= reserved
        self._reserved += reserved
        return reserved

    def unreserve(self, reserved: int) -> None:
        """Gives back slots set aside by :meth:`reserve` (call it before taking the jobs their
        claim brought): a producer that waits for a slot is woken if one stays free."""
        self._free += reserved
        self._reserved -= reserved

    @contextlib.contextmanager
    def reserving(self, wanted: int) -> Iterator[int]:
        """:meth:`reserve` for the block, :meth:`unreserve` at its end: take the jobs its claim
        brought right after the block, with no wait in between."""
        reserved = self.reserve(wanted)
        try:
            yield reserved
        finally:
            self.unreserve(reserved)

    def offer_free_slots(self) -> None:
        """After :meth:`unreserve` and the takes: wakes a producer that waits for a slot when
        one is still free."""
        if self._starved and self._free > 0:
            self._starved = False
            self.wake.signal(WakeReason.SLOT)

    def starve(self) -> None:
        """The producer waits for a free slot: the next job to end wakes it."""
        self._starved = True

    async def idle(self) -> None:
        """Returns once no job is active."""
        if self._active:
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()

    # -- a job's way through ---------------------------------------------------------------

    def take(self, job: ClaimedJob, task: Task) -> Entry:
        """Records a claimed job, which takes a slot until its runner ends it."""
        entry = Entry(job, task)
        self._entries[job.id] = entry
        self._free -= 1
        self._active += 1
        return entry

    def redone(self, job: ClaimedJob) -> Redone:
        """What to do with a claimed job whose claim number this worker has held before.

        Only a crash of the server (or a failover) makes one: a worker's claims commit without
        waiting for the disk (sql/queries.sql, ``claim_jobs``), so a crash can undo a claim
        whose job this worker runs. The row goes back to the claim before it, and when this
        worker claims the job again it writes the same claim number: the fence of the run it
        already has. Two runs must never share a fence (each one's writes would pass for the
        other's), so:

        - the run in progress goes on as the new claim's (:attr:`Redone.GOES_ON`) when it is
          intact and its payload is the one claimed: its outcome is the job's, and the job runs
          once;
        - otherwise (its payload was replaced meanwhile by a ``keep_latest`` duplicate, or the
          run was stopped) the run is stopped as lost and its outcome is not written (one its
          handler already returned waits in the writer, which drops it, see :meth:`void`; only
          a write already under way can still commit), and the new claim goes back to the
          queue at once (:attr:`Redone.RELEASE`), so that the job's next claim has a number of
          its own;
        - so does a claim whose run this worker has already dropped as lost (its handler may
          still run) or finished with (its outcome written or discarded before the claim's
          answer came back): a run under that fence is over, and must not start again;
        - :attr:`Redone.NO` for every other job: take it."""
        entry = self._entries.get(job.id)
        if entry is not None and entry.job.claim == job.claim:
            self.redone_count += 1
            if entry.cancel_reason is None and not entry.lost and entry.job.payload == job.payload:
                entry.redone = True
                return Redone.GOES_ON
            if self.lose(entry.held) is None:
                # Its handler returned: its outcome waits for the writer, which drops it.
                entry.lost = True
                self._void.add((job.id, job.claim))
            return Redone.RELEASE
        if self._lost.has(job) or self._gone.has(job):
            self.redone_count += 1
            return Redone.RELEASE
        return Redone.NO

    @property
    def voiding(self) -> bool:
        """Whether an outcome waiting for the writer is to be dropped (:meth:`void`)."""
        return bool(self._void)

    def void(self, held: Fenced) -> bool:
        """Whether an outcome waiting for the writer belongs to a run :meth:`redone` stopped
        after its handler returned: then it is not written (and this answers True once)."""
        if not self._void:
            return False
        fence = (held.job_id, held.claim)
        if fence in self._void:
            self._void.discard(fence)
            return True
        return False

    def begin(self, entry: Entry, scope: anyio.CancelScope) -> bool:
        """A runner is about to call the handler, inside ``scope``; False when the job was
        cancelled before it started (then it must not start)."""
        entry.running = True
        if entry.cancel_reason is not None:
            return False
        entry.started = True
        entry.scope = scope
        return True

    def end(self, entry: Entry) -> None:
        """The runner is done with the job (its outcome, if any, is on its way to the writer):
        the slot is free again."""
        entry.scope = None
        entry.running = False
        self._free += 1
        self._active -= 1
        if self._starved:
            self._starved = False
            self.wake.signal(WakeReason.SLOT)
        if self._active == 0:
            if self._idle is not None:
                self._idle.set()
                self._idle = None
            if self.wake_when_idle:
                self.wake.signal(WakeReason.OTHER)

    def let_go(self, held: Fenced) -> Entry | None:
        """Forgets a job whose outcome was written (or discarded); answers its entry, or None
        when the ledger no longer holds that claim. ``held`` names the job and the claim: a
        :class:`~notifyq.models.Held`, or the outcome itself."""
        entry = self._entries.pop(held.job_id, None)
        if entry is None:
            return None
        if entry.job.claim != held.claim:
            self._entries[held.job_id] = entry  # another claim's: still held
            return None
        self._gone.add(entry.job)
        if self._void:
            self._void.discard((held.job_id, held.claim))
        return entry

    def write_again(self, held: Fenced) -> bool:
        """Whether an outcome whose write the fence refused is to be written once more: True
        when the job was claimed again under the same number since (:meth:`redone`), which may
        have committed after the refused write had looked at the row (a completion that also
        claims can even refuse the outcome and claim the job again in one statement). Once per
        claim made again; otherwise the refusal stands and the caller lets the entry go."""
        entry = self._entries.get(held.job_id)
        if entry is None or entry.job.claim != held.claim or not entry.redone:
            return False
        entry.redone = False
        return True

    def drop(self, entry: Entry) -> None:
        """A run found itself lost (a write of it refused by the fence): as :meth:`lose`, for
        this entry only (the ledger may hold the job under another entry by now)."""
        if self._entries.get(entry.job.id) is entry:
            self.lose(entry.held)
        entry.lost = True

    def lose(self, held: Held) -> Entry | None:
        """Another worker may hold the job now: forgets it, and stops its handler if it runs, or
        keeps it from starting if a runner has not begun it yet (it would run beside the other
        worker's attempt). Answers the entry in both cases; None when the ledger does not hold
        that claim, or when its handler already ended (the write of its outcome is fenced)."""
        entry = self._entries.get(held.job_id)
        if entry is None or entry.job.claim != held.claim:
            return None
        if not entry.running and entry.started:
            return None
        del self._entries[held.job_id]
        entry.lost = True
        entry.cancel(CancelReason.LEASE_LOST)
        self._lost.add(entry.job)
        return entry

    # -- what others ask -------------------------------------------------------------------

    def held(self) -> list[Held]:
        """Every job held now."""
        return [entry.held for entry in self._entries.values()]

    def confirmed(self) -> set[UUID]:
        """The held jobs whose handler was called."""
        return {job_id for job_id, entry in self._entries.items() if entry.started}

    def entries(self) -> Iterator[Entry]:
        """Every entry (a snapshot: callers may change the ledger meanwhile)."""
        return iter(list(self._entries.values()))

    def cancel(self, job_id: UUID | str, reason: CancelReason) -> Entry | None:
        """Stops the handler of a held job; answers its entry, or None when not held."""
        key = job_id if isinstance(job_id, UUID) else _as_uuid(job_id)
        entry = None if key is None else self._entries.get(key)
        if entry is not None and entry.running:
            entry.cancel(reason)
            return entry
        if entry is not None and entry.cancel_reason is None and not entry.started:
            entry.cancel(reason)  # not started yet: it will not start
            return entry
        return None

    def cancel_active(self, reason: CancelReason) -> int:
        """Stops every handler still running (and every job not started yet)."""
        stopped = 0
        for entry in self.entries():
            if entry.running or not entry.started:
                if entry.cancel_reason is None:
                    stopped += 1
                entry.cancel(reason)
        return stopped

    def stop(self) -> None:
        """The worker stops claiming: wakes the producer so that it sees it."""
        self.stopping = True
        self.wake.signal(WakeReason.OTHER)

    def __len__(self) -> int:
        return len(self._entries)


class _Fences:
    """A bounded memory of fences (a job and a claim number), forgetting the oldest first. Kept
    by the job id's integer: a UUID hashes in Python, and :meth:`Ledger.let_go` adds one a job."""

    __slots__ = ("_known", "_order")

    def __init__(self, size: int) -> None:
        self._order: deque[tuple[int, int, float]] = deque(maxlen=size)
        self._known: set[tuple[int, int, float]] = set()

    def add(self, job: ClaimedJob) -> None:
        # With the job's creation time: a job enqueued again under a chosen id after its
        # namesake was deleted starts its claims from 0 again, and is another job.
        fence = (job.id.int, job.claim, job.created_at)
        if fence in self._known:
            return
        if len(self._order) == self._order.maxlen:
            self._known.discard(self._order[0])
        self._order.append(fence)
        self._known.add(fence)

    def has(self, job: ClaimedJob) -> bool:
        return (job.id.int, job.claim, job.created_at) in self._known


def _as_uuid(text: str) -> UUID | None:
    try:
        return UUID(text)
    except ValueError:
        return None
