"""What a worker did: counters (:class:`WorkerStats`) and signals (:class:`Signals`) that tests
and operators wait on instead of polling counters."""

from __future__ import annotations

from dataclasses import dataclass

import anyio

__all__ = ["Pulse", "Signals", "WorkerStats"]


@dataclass
class WorkerStats:
    """Counters of what this worker did, for logs, tests and metrics."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    retried: int = 0
    released: int = 0
    lost: int = 0
    rescued: int = 0
    cancelled: int = 0
    snoozed: int = 0
    suspended: int = 0
    #: Statements that recorded progress reports (each for every job that reported).
    progress_writes: int = 0
    claims: int = 0
    empty_claims: int = 0


class Pulse:
    """Something that happens again and again (a claim that found nothing, a heartbeat): counts
    the times, and lets a task wait until it has happened a number of times."""

    def __init__(self) -> None:
        self.count = 0
        self._event: anyio.Event | None = None

    def fire(self) -> None:
        """It happened once more."""
        self.count += 1
        if self._event is not None:
            self._event.set()
            self._event = None

    async def reached(self, count: int) -> None:
        """Returns once it happened at least ``count`` times in all."""
        while self.count < count:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()

    async def next(self) -> None:
        """Returns once it happens again."""
        await self.reached(self.count + 1)


class Signals:
    """The pulses of one worker's services."""

    def __init__(self) -> None:
        #: The producer claimed and found nothing (it is about to sleep).
        self.idle = Pulse()
        #: The producer began to wait for a wake-up, its next run_at or its poll.
        self.asleep = Pulse()
        #: The producer claimed at least one job.
        self.claimed = Pulse()
        #: The writer wrote a batch of outcomes.
        self.written = Pulse()
        #: The heartbeat renewed the leases of the jobs held.
        self.heartbeat = Pulse()
        #: The rescuer made a pass.
        self.rescue_pass = Pulse()
