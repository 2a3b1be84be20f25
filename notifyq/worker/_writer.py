"""The outcome writer: what became of the attempts a worker ran, written in batches.

Runners hand it outcomes as values (:meth:`OutcomeWriter.record`, :meth:`~OutcomeWriter.release`,
:meth:`~OutcomeWriter.cancelled`); a task of its own writes them, one statement per kind, each
fenced in the database by (worker, claim), as soon as there is something to write. An outcome
leaves the writer only once written, so a write cut by a broken connection is made again. If
the database refuses a batch for a reason other than its connection, the items are written one
by one, so one bad row cannot hold back the others.

It is an async context manager (:meth:`OutcomeWriter.open`): on exit, shielded and bounded in
time, it writes what is left and puts every job the worker still holds without an outcome back
in the queue, attempt not counted.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar
from uuid import UUID

import anyio

from notifyq.errors import DatabaseError, DatabaseUnavailable
from notifyq.models import (
    ClaimedJob,
    ClaimRequest,
    Failure,
    Held,
    JobStatus,
    OutcomeKind,
    Snoozed,
    Success,
    Suspended,
)
from notifyq.worker._ledger import Ledger, Redone, WakeReason
from notifyq.worker._stats import Signals, WorkerStats
from notifyq.worker._store import WorkerStore
from notifyq.worker._telemetry import Telemetry, WrittenJob

__all__ = ["FINAL_WRITE_TIMEOUT", "OutcomeWriter", "Refill"]

logger = logging.getLogger(__name__)

#: How long the final writes of a stopping worker may take.
FINAL_WRITE_TIMEOUT = 10.0

Item = TypeVar("Item", Success, Failure, Snoozed, Suspended, Held)
Written = TypeVar("Written", set[UUID], dict[UUID, JobStatus])


class Refill(Protocol):
    """Who lets the writer claim jobs in its completion statement (the producer): it sets
    slots aside for a claim, and takes the jobs claimed."""

    def reserve(self) -> ClaimRequest | None:
        """A claim for the slots free now (set aside until :meth:`hand_over`), or None."""
        ...

    def hand_over(self, claim: ClaimRequest, jobs: list[ClaimedJob], sent: float) -> None:
        """The jobs ``claim`` brought (maybe none), sent at monotonic time ``sent``: they start;
        the slots left are free."""
        ...


class OutcomeWriter:
    """Writes the outcomes of one worker's jobs. With a :attr:`refill`, the statement that
    records completions also claims jobs for the slots free then: a dependent that a completion
    unblocked starts on this worker at once, and a busy worker claims its next jobs without a
    statement of its own."""

    def __init__(
        self,
        store: WorkerStore,
        ledger: Ledger,
        telemetry: Telemetry,
        *,
        worker_id: str,
        stats: WorkerStats,
        signals: Signals,
        final_timeout: float = FINAL_WRITE_TIMEOUT,
    ) -> None:
        self._store = store
        self._ledger = ledger
        self._telemetry = telemetry
        self._worker_id = worker_id
        self._stats = stats
        self._signals = signals
        self._final_timeout = final_timeout
        self._done: list[Success] = []
        self._failed: list[Failure] = []
        self._snoozed: list[Snoozed] = []
        self._suspended: list[Suspended] = []
        self._released: list[Held] = []
        self._cancelled: list[Held] = []
        self._lock = anyio.Lock()
        self._pending = anyio.Event()
        #: Who takes the jobs claimed with completions; None: completions claim nothing.
        self.refill: Refill | None = None

    # -- what runners hand over ------------------------------------------------------------

    def record(self, outcome: Success | Failure | Snoozed | Suspended) -> None:
        """A finished attempt, to be written."""
        if isinstance(outcome, Success):
            self._done.append(outcome)
        elif isinstance(outcome, Failure):
            self._failed.append(outcome)
        elif isinstance(outcome, Suspended):
            self._suspended.append(outcome)
        else:
            self._snoozed.append(outcome)
        self._pending.set()

    def release(self, held: Held) -> None:
        """A job interrupted by the shutdown: back to the queue, attempt not counted."""
        self._released.append(held)
        self._pending.set()

    def cancelled(self, held: Held) -> None:
        """A job whose handler a cancel request stopped."""
        self._cancelled.append(held)
        self._pending.set()

    def __bool__(self) -> bool:
        return bool(
            self._done
            or self._failed
            or self._snoozed
            or self._suspended
            or self._released
            or self._cancelled
        )

    # -- writing ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[OutcomeWriter]:
        """Writes outcomes as they come while the block runs, and what is left at its end."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._keep_writing)
                try:
                    yield self
                finally:
                    tg.cancel_scope.cancel()
        finally:
            with anyio.move_on_after(self._final_timeout, shield=True):
                await self._final_writes()

    async def _keep_writing(self) -> None:
        failures = 0
        while True:
            await self._pending.wait()
            self._pending = anyio.Event()
            try:
                # Shielded: a write cancelled halfway may commit while its answer is lost (the
                # final writes would then write it again, and count it as discarded).
                with anyio.CancelScope(shield=True):
                    await self.flush()
                failures = 0
            except DatabaseUnavailable as exc:
                failures += 1
                delay = min(0.2 * 2**failures, 5.0)
                logger.warning("recording outcomes failed (%s); retrying in %.1fs", exc, delay)
                await anyio.sleep(delay)
                self._pending.set()

    async def flush(self) -> None:
        """Writes everything handed over so far. Raises DatabaseUnavailable (what is not
        written stays here) while the database is away."""
        async with self._lock:
            for pending, write in (
                (self._done, self._write_completions),
                (self._failed, self._write_failures),
                (self._snoozed, self._write_snoozes),
                (self._suspended, self._write_suspensions),
            ):
                # Before each batch: a claim that comes back while one is written may void more.
                self._drop_void(pending)
                if pending:
                    await write()
            if self._cancelled:
                batch = list(self._cancelled)
                stopped = await self._write(self._store.cancel_running, batch, set())
                del self._cancelled[: len(batch)]
                self._let_go(batch, stopped, OutcomeKind.CANCELLED)
                self._stats.cancelled += len(stopped)
            if self._released:
                batch = list(self._released)
                released = await self._write(self._store.release, batch, set())
                del self._released[: len(batch)]
                self._let_go(batch, released, OutcomeKind.RELEASED)
                self._stats.released += len(released)
            self._signals.written.fire()

    async def _write_completions(self) -> None:
        batch = list(self._done)
        refused: dict[UUID, str] = {}
        written = await self._complete_and_claim(batch)
        if written is None:
            written = await self._write(self._store.complete, batch, set(), refused)
        del self._done[: len(batch)]
        self._stats.completed += len(written)
        if not refused:
            self._let_go(batch, written, OutcomeKind.COMPLETED)
            return
        self._let_go([s for s in batch if s.job_id not in refused], written, OutcomeKind.COMPLETED)
        # A result the database refused (too large, say) fails its job instead.
        self._failed.extend(
            Failure(s.job_id, s.claim, "could not store the result: " + refused[s.job_id], False, 0)
            for s in batch
            if s.job_id in refused
        )

    async def _complete_and_claim(self, batch: list[Success]) -> set[UUID] | None:
        """Writes ``batch`` and claims jobs for the free slots in one statement; answers the
        ids written, or None when it claimed nothing because it could not (no refill, no free
        slot) or the database refused the batch (then it is written as without a refill)."""
        claim = self.refill.reserve() if self.refill is not None else None
        if claim is None:
            return None
        jobs: list[ClaimedJob] = []
        sent = time.monotonic()
        try:
            written, jobs = await self._store.complete_and_claim(self._worker_id, batch, claim)
        except DatabaseError as exc:
            logger.error("batch write refused (%s); writing it without a claim", exc)
            return None
        finally:
            assert self.refill is not None
            if self._ledger.stopping:
                # Claimed while the worker began to stop: back to the queue at once (but for a
                # claim a crash undid, which a run in progress goes on as, see Ledger.redone).
                self._released.extend(
                    Held(job.id, job.claim)
                    for job in jobs
                    if self._ledger.redone(job) is not Redone.GOES_ON
                )
                self._pending.set()
                jobs = []
            self.refill.hand_over(claim, jobs, sent)
        return written

    async def _write_snoozes(self) -> None:
        batch = list(self._snoozed)
        snoozed = await self._write(self._store.snooze, batch, set())
        del self._snoozed[: len(batch)]
        self._let_go(batch, snoozed, OutcomeKind.SNOOZED)
        self._stats.snoozed += len(snoozed)
        if snoozed:
            # Its run_at may be sooner than the time the producer sleeps until.
            self._ledger.wake.signal(WakeReason.OTHER)

    async def _write_suspensions(self) -> None:
        batch = list(self._suspended)
        rows = await self._write(self._store.suspend, batch, {})
        del self._suspended[: len(batch)]
        self._let_go(batch, rows, OutcomeKind.SUSPENDED)
        self._stats.suspended += len(rows)
        if rows:
            # A suspension's time may be sooner than the time the producer sleeps until, and a
            # job whose signal came meanwhile is queued already.
            self._ledger.wake.signal(WakeReason.OTHER)

    async def _write_failures(self) -> None:
        batch = list(self._failed)
        rows = await self._write(self._store.fail, batch, {})
        del self._failed[: len(batch)]
        self._let_go(batch, rows, OutcomeKind.FAILED)
        retried = sum(1 for status in rows.values() if status is JobStatus.QUEUED)
        self._stats.retried += retried
        self._stats.failed += len(rows) - retried
        if retried:
            # The retry's run_at may be sooner than the time the producer sleeps until.
            self._ledger.wake.signal(WakeReason.OTHER)

    async def _write(
        self,
        write: Callable[[str, Sequence[Item]], Awaitable[Written]],
        batch: list[Item],
        merged: Written,
        refused: dict[UUID, str] | None = None,
    ) -> Written:
        """One statement for the batch; if the database refuses it for a reason other than the
        connection, item by item (adding to ``merged``; a refused item's reason goes to
        ``refused``, when given), so that one bad row cannot block the others."""
        try:
            return await write(self._worker_id, batch)
        except DatabaseError as exc:
            logger.error("batch write refused (%s); writing %d item(s) one by one", exc, len(batch))
        for item in batch:
            try:
                part = await write(self._worker_id, [item])
            except DatabaseError as exc:
                logger.error("job %s: the database refused its outcome: %s", item.job_id, exc)
                if refused is not None:
                    refused[item.job_id] = str(exc)
                continue
            merged |= part
        return merged

    def _let_go(
        self,
        batch: Sequence[Success | Failure | Snoozed | Suspended | Held],
        written: set[UUID] | dict[UUID, JobStatus],
        kind: OutcomeKind,
    ) -> None:
        """Forgets the jobs of a written batch (and those whose write was discarded; but an
        outcome refused for a job claimed again under its claim number meanwhile is written once
        more, see Ledger.write_again)."""
        let_go = self._ledger.let_go
        recorded: list[WrittenJob] = []
        for item in batch:
            if item.job_id not in written and self._ledger.write_again(item):
                if not isinstance(item, Held):
                    self.record(item)  # by the next flush
                else:
                    cancelled = kind is OutcomeKind.CANCELLED
                    (self._cancelled if cancelled else self._released).append(item)
                    self._pending.set()
                continue
            entry = let_go(item)
            if item.job_id not in written:
                self._stats.lost += 1
                self._telemetry.discarded(item.job_id)
            elif entry is not None:
                recorded.append((entry.job, item))
        if recorded:
            self._telemetry.recorded(kind, recorded, written if isinstance(written, dict) else None)

    def _drop_void(self, pending: list[Any]) -> None:
        """Drops from ``pending`` the outcomes of runs stopped after their handler returned,
        because their claim came back changed (Ledger.void): they must not be written."""
        if self._ledger.voiding:
            for item in [item for item in pending if self._ledger.void(item)]:
                pending.remove(item)
                self._stats.lost += 1
                self._telemetry.discarded(item.job_id)

    async def _final_writes(self) -> None:
        """Writes outcomes still pending and puts interrupted jobs back in the queue."""
        pending = {s.job_id for s in self._done} | {f.job_id for f in self._failed}
        pending |= {s.job_id for s in self._snoozed} | {s.job_id for s in self._suspended}
        pending |= {h.job_id for h in (*self._released, *self._cancelled)}
        for held in self._ledger.held():
            if held.job_id not in pending:
                self._released.append(held)
        if not self:
            return
        try:
            await self.flush()
            if self:  # an outcome to write once more (see _let_go)
                await self.flush()
        except DatabaseUnavailable as exc:
            logger.error(
                "could not record %d job(s) before stopping (%s); they stay processing and are "
                "requeued when their lease runs out",
                len(self._ledger),
                exc,
            )
