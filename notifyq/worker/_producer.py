"""The producer: claims jobs whenever a slot is free and there may be work, and sleeps exactly as
long as nothing can be due.

It waits for whichever comes first: a notification, a freed slot when it was saturated, the
fallback poll timer, the next known ``run_at``, a half-open circuit breaker's probe time, or the
stop; then claims up to the number of free slots in one statement (jobs under a limit first),
and again while a claim comes back full. Before it sleeps it registers the worker as idle
(:class:`IdleMark`), so that inserts of its queues notify, and claims once more under the lock
that waits for inserts in flight (see notifyq.mark_waiting_v1): an insert that looked just before
the registration, and did not notify, is seen then.

The look for the next ``run_at`` comes before the claim that ends in a sleep, never after it: a
job that falls due between the two statements is then due for the claim (or counted by the
look), where a look made after the claim would leave it out (it is due already) while the claim
found it not due yet, and the worker would sleep until its poll with the job due. The two are
one statement (``look_and_claim``), so they read the same now() and the look costs a wake-up no
round trip.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import anyio
import anyio.lowlevel

from notifyq.errors import NotifyQError
from notifyq.models import ClaimedJob, ClaimRequest
from notifyq.tasks import Registry
from notifyq.worker._ledger import CancelReason, Ledger, Redone, WakeReason
from notifyq.worker._runners import Runners
from notifyq.worker._stats import Signals, WorkerStats
from notifyq.worker._store import WorkerStore
from notifyq.worker._telemetry import Telemetry

__all__ = [
    "BREAKER_TICK",
    "LIMIT_TICK",
    "MARK_RETRY",
    "MAX_CLAIM_BATCH",
    "STALE_CLAIM",
    "UNSURE_RECHECK",
    "IdleMark",
    "Producer",
    "sleep_for",
]

logger = logging.getLogger(__name__)

#: Most jobs one claim statement takes, however many slots are free.
MAX_CLAIM_BATCH = 500
#: Seconds between looks for half-open circuit breakers (only with breakers configured).
BREAKER_TICK = 1.0
#: While registered as waiting without the lock (an insert's transaction stayed open), claim
#: again this often until a registration gets it.
UNSURE_RECHECK = 0.25
#: The share of a lease after which a claim's answer is too late to start its jobs: the heartbeat
#: renews leases every quarter lease, so a job started later than this might be rescued (and run
#: by another worker) before its first renewal.
STALE_CLAIM = 0.5
#: While the worker's idle mark could not be written (the database away a moment, a pool still
#: replacing its connections after a failover), claim and mark again this often: without the
#: mark no insert wakes the worker, which would hear of new jobs only at its poll.
MARK_RETRY = 1.0
#: While some task or queue has a limit, claim this often: tokens refill and slots free up
#: without notifications.
LIMIT_TICK = 0.25


def sleep_for(
    *,
    poll_interval: float,
    next_due: float | None,
    probe_in: float | None,
    unsure: bool,
    unmarked: bool,
    limited: bool,
) -> float:
    """How long an idle producer may sleep: until the fallback poll, the next known ``run_at``
    (``next_due`` seconds), the next breaker probe (``probe_in``), and at most UNSURE_RECHECK
    while its idle mark is ``unsure``, MARK_RETRY while it is ``unmarked`` (writing it failed)
    and LIMIT_TICK while jobs are under a limit."""
    timeout = poll_interval
    if next_due is not None:
        timeout = min(timeout, max(next_due, 0.0))
    if probe_in is not None:
        timeout = min(timeout, max(probe_in, 0.0))
    if unsure:
        timeout = min(timeout, UNSURE_RECHECK)
    if unmarked:
        timeout = min(timeout, MARK_RETRY)
    if limited:
        timeout = min(timeout, LIMIT_TICK)
    return timeout


class IdleMark:
    """This worker's row in notifyq.waiting_workers. While it is there, inserts of its queues
    notify; busy workers leave it out, and claim again as slots free."""

    def __init__(
        self, store: WorkerStore, *, worker_id: str, queues: Sequence[str] | None, ttl: float
    ) -> None:
        self._store = store
        self._worker_id = worker_id
        self._queues = queues
        self._ttl = ttl
        #: Whether this worker believes its mark is in the table.
        self.registered = False
        #: Whether the registration waited for the inserts in flight.
        self.sure = False

    async def mark(self) -> bool:
        """Registers the worker as waiting; answers whether the registration waited for the
        inserts in flight (then a claim right after it sees them all)."""
        try:
            sure = await self._store.mark_waiting(self._worker_id, self._queues, self._ttl)
        except NotifyQError as exc:
            logger.warning(
                "could not mark the worker idle (%s); trying again in %.0fs", exc, MARK_RETRY
            )
            return False
        self.registered, self.sure = True, sure
        return sure

    async def clear(self) -> None:
        """The worker is busy (or stopping): inserts stop waking it."""
        self.registered = self.sure = False
        try:
            await self._store.unmark_waiting(self._worker_id)
        except NotifyQError as exc:
            logger.debug("could not unmark the worker (%s); its mark expires", exc)

    async def refresh(self) -> None:
        """Keeps the mark from expiring while the worker still waits."""
        if self.registered:
            await self._store.refresh_waiting(self._worker_id, self._ttl)

    def forget(self) -> None:
        """After a reconnect: a server restart empties the (unlogged) table, so register
        again before the next sleep."""
        self.registered = self.sure = False


class Producer:
    """Claims jobs for one worker and hands them to its runners."""

    def __init__(
        self,
        store: WorkerStore,
        ledger: Ledger,
        runners: Runners,
        registry: Registry,
        idle: IdleMark,
        telemetry: Telemetry,
        *,
        worker_id: str,
        queues: Sequence[str] | None,
        lease: float,
        poll_interval: float,
        guarded: Sequence[str],
        limits_exist: bool,
        limits_interval: float,
        burst: bool,
        stats: WorkerStats,
        signals: Signals,
    ) -> None:
        self._store = store
        self._ledger = ledger
        self._runners = runners
        self._registry = registry
        self._tasks = registry.names()
        self._idle = idle
        self._telemetry = telemetry
        self._worker_id = worker_id
        self._queues = queues
        self._lease = lease
        self._poll_interval = poll_interval
        self._guarded = list(guarded)
        self._next_probe = 0.0
        self._limits_exist = limits_exist
        self._limits_interval = limits_interval
        self._limits_read_at = time.monotonic()
        self._burst = burst
        self._stats = stats
        self._signals = signals
        ledger.wake_when_idle = burst

    async def run(self) -> None:
        """Claims until the worker stops (or, in burst mode, until nothing is due and nothing
        runs)."""
        failures = 0
        ledger = self._ledger
        # Whether the next claim may be the last before a sleep: then the look for the next
        # run_at is made first (see the module's docstring). Not while a backlog drains.
        look_first = True
        while not ledger.stopping:
            # Taken before the look and the claim: a wake-up that arrives while they run sets
            # this event, so the wait below returns at once instead of missing it.
            wake = ledger.wake.waiter
            if ledger.free == 0:
                ledger.starve()
                if self._idle.registered and ledger.reserved == 0:
                    await self._idle.clear()  # a busy worker claims as slots free
                # Slots only set aside for the outcome writer's claim, which is answered in a
                # moment: the worker is not busy, and its mark stays (inserts keep waking it, and
                # it need not register again under the lock, and claim once more, after).
                await wake.wait()
                continue
            if self._guarded and time.monotonic() >= self._next_probe:
                await self._probe_breakers()
            # The slots a claim may fill are set aside while it runs: the outcome writer claims
            # too (in its completion statement), and must not fill the same ones.
            limited: list[ClaimedJob] = []
            if self._limits_exist:
                sent = time.monotonic()
                with ledger.reserving(MAX_CLAIM_BATCH) as limit:
                    limited = await self._claim_limited(limit) if limit else []
                self._start(limited, sent)
            claimed: list[ClaimedJob] | None = None
            failure: NotifyQError | None = None
            due_at: float | None = None
            sent = time.monotonic()
            with ledger.reserving(MAX_CLAIM_BATCH) as limit:
                if limit == 0:
                    continue
                try:
                    if look_first:
                        # The look and the claim are one statement: no round trip between
                        # a wake-up and its claim.
                        due, claimed = await self._store.look_and_claim(
                            worker_id=self._worker_id,
                            tasks=self._tasks,
                            queues=self._queues,
                            limit=limit,
                            lease=self._lease,
                        )
                        due_at = None if due is None else sent + due
                    else:
                        claimed = await self._store.claim(
                            worker_id=self._worker_id,
                            tasks=self._tasks,
                            queues=self._queues,
                            limit=limit,
                            lease=self._lease,
                        )
                    failures = 0
                except NotifyQError as exc:
                    failure = exc
            if claimed is None:
                failures += 1
                delay = min(0.2 * 2**failures, self._poll_interval)
                logger.warning("claim failed (%s); retrying in %.1fs", failure, delay)
                with anyio.move_on_after(delay):
                    await wake.wait()
                continue
            self._claimed(claimed, sent)
            if claimed:
                # The runners call the handlers before this producer sends its next statement.
                await anyio.lowlevel.checkpoint()
            # Not between a wake-up and its claim: the jobs are with the runners already.
            await self._read_limits_if_due()
            if len(claimed) == limit:
                look_first = False
                continue
            if not claimed and not limited:
                self._stats.empty_claims += 1
                self._signals.idle.fire()
                if self._burst and ledger.active == 0:
                    return
            if not look_first:
                # The backlog ran out, and no look came before this claim: look, claim again.
                look_first = True
                continue
            if not self._idle.sure and await self._idle.mark():
                # Registered under the lock that waits for in-flight inserts: look and claim
                # once more, as those inserts did not notify.
                continue
            await self._sleep(wake, due_at)

    # -- the outcome writer's claims (a Refill) ------------------------------------------------

    def reserve(self) -> ClaimRequest | None:
        """A claim for the outcome writer's next completion statement: the free slots, set
        aside until :meth:`hand_over`, but one while the worker is marked idle. None in burst
        mode (a draining worker claims only here, where it decides when it is done) and while
        the worker stops."""
        if self._burst:
            return None
        wanted = MAX_CLAIM_BATCH
        if self._idle.registered and self._ledger.free > 1:
            # An idle worker's next job comes with a notification, which may arrive while this
            # statement runs: the slot left lets the producer claim it at once, instead of
            # waiting for this statement's answer and then claiming.
            wanted = min(wanted, self._ledger.free - 1)
        limit = self._ledger.reserve(wanted)
        if limit == 0:
            return None
        return ClaimRequest(self._tasks, self._queues, limit, self._lease)

    def hand_over(self, claim: ClaimRequest, jobs: list[ClaimedJob], sent: float) -> None:
        """Starts the jobs the writer's claim brought (sent at monotonic time ``sent``); the
        slots they did not fill are free again (and wake this producer if it waits for one)."""
        self._ledger.unreserve(claim.limit)
        if jobs:
            self._stats.claims += 1
            self._telemetry.claimed(True, WakeReason.COMPLETION)
            self._signals.claimed.fire()
            self._start(jobs, sent)
        self._ledger.offer_free_slots()

    def _claimed(self, jobs: list[ClaimedJob], sent: float) -> None:
        self._stats.claims += 1
        self._telemetry.claimed(bool(jobs), self._ledger.wake.reason)
        self._ledger.wake.reason = WakeReason.LOOP
        if jobs:
            self._signals.claimed.fire()
        self._start(jobs, sent)

    def _start(self, jobs: list[ClaimedJob], sent: float) -> None:
        """Gives claimed jobs to the runners. A claim whose answer came more than
        STALE_CLAIM leases after it was ``sent`` (a network partition held it back) may have
        lost its jobs to the rescue of another worker, which runs them now: they go back to the
        queue without running (a fenced release, a no-op for those another worker took)."""
        waited = time.monotonic() - sent
        stale = bool(jobs) and waited > self._lease * STALE_CLAIM
        if stale:
            logger.warning(
                "a claim's answer took %.1fs, over %.0f%% of the %.0fs lease: its %d job(s) go "
                "back to the queue without running here",
                waited,
                STALE_CLAIM * 100,
                self._lease,
                len(jobs),
            )
        taken: list[ClaimedJob] = []
        for job in jobs:
            redone = self._ledger.redone(job)
            if redone is Redone.GOES_ON:
                logger.warning(
                    "job %s came back under claim %d, which this worker holds (a crash of the "
                    "server undid the claim): the run in progress goes on as this claim's",
                    job.id,
                    job.claim,
                )
                continue
            task = self._registry.get(job.task)
            assert task is not None, "claimed a task this worker does not serve"
            entry = self._ledger.take(job, task)
            if redone is Redone.RELEASE:
                logger.warning(
                    "job %s came back under claim %d, which a run of this worker had (a crash "
                    "of the server undid the claim): back to the queue, to run under a claim of "
                    "its own",
                    job.id,
                    job.claim,
                )
                entry.cancel(CancelReason.STALE_CLAIM)
            else:
                if stale:
                    entry.cancel(CancelReason.STALE_CLAIM)
                taken.append(job)
            self._runners.give(entry)
        self._stats.claimed += len(taken)
        self._telemetry.started(taken)

    async def _claim_limited(self, limit: int) -> list[ClaimedJob]:
        try:
            return await self._store.claim_limited(
                worker_id=self._worker_id,
                tasks=self._tasks,
                queues=self._queues,
                limit=limit,
                lease=self._lease,
            )
        except NotifyQError as exc:
            logger.warning("limited claim failed: %s", exc)
            return []

    async def _read_limits_if_due(self) -> None:
        """Limits are set by workers and operators at any time: read whether any exists every
        so often (the limited claim costs a statement of its own)."""
        if time.monotonic() - self._limits_read_at < self._limits_interval:
            return
        self._limits_read_at = time.monotonic()
        try:
            self._limits_exist = await self._store.limits_exist(self._tasks)
        except NotifyQError as exc:
            logger.warning("reading limits failed: %s", exc)

    async def _probe_breakers(self) -> None:
        """Once a second: for each task whose breaker is half-open, try to win its probe and
        run one job of it."""
        self._next_probe = time.monotonic() + BREAKER_TICK
        try:
            won = await self._store.take_breaker_probes(self._guarded)
            for name in won:
                with self._ledger.reserving(1) as limit:
                    if limit == 0:
                        break
                    logger.info("task %s: circuit breaker half-open, running one probe job", name)
                    sent = time.monotonic()
                    claimed = await self._store.claim(
                        worker_id=self._worker_id,
                        tasks=[name],
                        queues=self._queues,
                        limit=1,
                        lease=self._lease,
                        probe=True,
                    )
                self._start(claimed, sent)
        except NotifyQError as exc:
            logger.warning("circuit breaker probe failed: %s", exc)

    async def _sleep(self, wake: anyio.Event, due_at: float | None) -> None:
        """Waits for a wake-up, or as long as :func:`sleep_for` allows; ``due_at`` is what the
        look made before the last claim answered."""
        timeout = sleep_for(
            poll_interval=self._poll_interval,
            next_due=None if due_at is None else due_at - time.monotonic(),
            probe_in=self._next_probe - time.monotonic() if self._guarded else None,
            unsure=self._idle.registered and not self._idle.sure,
            # It marks itself before every sleep: not registered now, the mark failed.
            unmarked=not self._idle.registered,
            limited=self._limits_exist,
        )
        self._signals.asleep.fire()
        with anyio.move_on_after(timeout) as waited:
            await wake.wait()
        if waited.cancelled_caught:
            self._ledger.wake.reason = WakeReason.POLL
