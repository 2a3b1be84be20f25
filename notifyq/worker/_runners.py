"""The runners: one task per slot, each running the jobs it is given one after the other."""

from __future__ import annotations

import asyncio

import anyio
from anyio.abc import TaskStatus

from notifyq.errors import LeaseLost
from notifyq.worker._executor import Executor, Outcome
from notifyq.worker._ledger import CancelReason, Entry, Ledger
from notifyq.worker._writer import OutcomeWriter

__all__ = ["Runners"]


class Runners:
    """``concurrency`` runner tasks that take claimed jobs from a queue.

    A fixed set of runners, one per slot: a task spawned per job cost a third of the worker's
    time. The jobs of one runner run inside one cancel scope, which :meth:`Entry.cancel` cancels
    while its job runs; only then is a new one opened (a scope per job asked for the current
    task several times a job: a quarter of a busy worker's CPU). The queue is asyncio's, whose
    ``get()`` does not wait when a job is there."""

    def __init__(
        self, ledger: Ledger, executor: Executor, writer: OutcomeWriter, *, concurrency: int
    ) -> None:
        self._ledger = ledger
        self._executor = executor
        self._writer = writer
        self._concurrency = concurrency
        self._queue: asyncio.Queue[Entry | None] = asyncio.Queue()

    def give(self, entry: Entry) -> None:
        """Hands a claimed job to the next free runner."""
        self._queue.put_nowait(entry)

    def close(self) -> None:
        """Each runner stops after the jobs given before this."""
        for _ in range(self._concurrency):
            self._queue.put_nowait(None)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Runs the runners until :meth:`close` (or cancellation)."""
        async with anyio.create_task_group() as runners:
            for _ in range(self._concurrency):
                runners.start_soon(self._runner)
            task_status.started()

    async def _runner(self) -> None:
        while True:
            with anyio.CancelScope() as scope:
                while not scope.cancel_called:
                    entry = await self._queue.get()
                    if entry is None:
                        return
                    await self._run(entry, scope)

    async def _run(self, entry: Entry, scope: anyio.CancelScope) -> None:
        outcome: Outcome | None = None
        try:
            if self._ledger.begin(entry, scope):  # else cancelled before it started
                outcome = await self._executor.attempt(entry.job, entry.task)
        except LeaseLost:
            # A write of the run (a durable step) was refused by the fence: the job is not this
            # worker's any more, or its claim was undone by a crash of the server.
            if self._ledger.write_again(entry.held):
                # ...and made again under the same number since, for this run to go on: give
                # that claim back (a fenced release; the attempt is not counted).
                entry.cancel(CancelReason.STALE_CLAIM)
            else:
                self._ledger.drop(entry)
        finally:
            reason = entry.cancel_reason
            if entry.lost:
                # Dropped as lost: the fence would refuse its outcome, and after a crash of the
                # server its claim number may be a new claim's (see Ledger.redone).
                pass
            elif outcome is not None:
                # Finished, even if a cancel came too late or the handler swallowed it.
                self._writer.record(outcome)
            elif reason is CancelReason.SHUTDOWN or reason is CancelReason.STALE_CLAIM:
                self._writer.release(entry.held)
            elif reason is CancelReason.REQUESTED:
                self._writer.cancelled(entry.held)
            # Else another worker took the job over (nothing to write), or this worker is being
            # cancelled: the job stays held, and the writer's final writes put it back.
            self._ledger.end(entry)
