"""What a worker tells the world about its jobs: log lines and, when it has them, metrics.

:func:`telemetry` answers a :class:`Telemetry` that only logs, or a :class:`MeteredTelemetry`
that also counts in a :class:`~notifyq.metrics.Metrics`: the services call the same methods
either way, never ``if metrics is not None``."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from uuid import UUID

from notifyq.metrics import Metrics
from notifyq.models import (
    ClaimedJob,
    Failure,
    Held,
    JobStatus,
    OutcomeKind,
    Snoozed,
    Success,
    Suspended,
)

__all__ = ["MeteredTelemetry", "Telemetry", "WrittenJob", "telemetry"]

logger = logging.getLogger("notifyq.worker")

#: A job whose outcome is in the database, and that outcome.
WrittenJob = tuple[ClaimedJob, Success | Failure | Snoozed | Suspended | Held]

#: Completions are the bulk (thousands a second): DEBUG. Metrics count them.
_LEVELS = {"failed": logging.WARNING, "completed": logging.DEBUG}
#: The least level of a log line of each kind of outcome (a failed attempt retried is INFO):
#: below it, a written batch costs the log nothing, whatever its size.
_LEAST_LEVELS = {
    OutcomeKind.COMPLETED: logging.DEBUG,
    OutcomeKind.FAILED: logging.INFO,
    OutcomeKind.CANCELLED: logging.INFO,
    OutcomeKind.SNOOZED: logging.INFO,
    OutcomeKind.SUSPENDED: logging.INFO,
}


class Telemetry:
    """Log lines of a worker's job events; the metric hooks do nothing.

    Jobs are told of in batches (a claim's, a written batch's), as the producer and the writer
    handle them: at thousands of jobs a second, a call per job that does nothing was a cost of
    its own."""

    def started(self, jobs: Sequence[ClaimedJob]) -> None:
        """Claimed jobs were handed to runners."""

    def ran(self, job: ClaimedJob, seconds: float) -> None:
        """A handler returned or raised after ``seconds``."""

    def claimed(self, found: bool, woken_by: str) -> None:
        """A claim statement ran; ``woken_by`` may be a :class:`str` enum, which only the
        metrics turn into its text."""

    def notified(self) -> None:
        """A notification arrived."""

    def reconnected(self) -> None:
        """The listener connected again."""

    def rescued(self, count: int) -> None:
        """This worker requeued ``count`` jobs of workers that stopped renewing their leases."""

    def discarded(self, job_id: object) -> None:
        """An outcome was discarded: this worker no longer held the job's lease."""
        logger.warning("job %s: outcome discarded, this worker no longer holds its lease", job_id)

    def recorded(
        self,
        kind: OutcomeKind,
        written: Sequence[WrittenJob],
        statuses: Mapping[UUID, JobStatus] | None = None,
    ) -> None:
        """A batch of outcomes of one kind is in the database: each job's log line.
        ``statuses``: the status each failed attempt left its job in (queued: a retry)."""
        least = _LEAST_LEVELS.get(kind)
        if least is None or not logger.isEnabledFor(least):
            return  # released jobs have no line of their own
        for job, outcome, event in _events(kind, written, statuses):
            level = _LEVELS.get(event, logging.INFO)
            if not logger.isEnabledFor(level):
                continue
            seconds = 0.0 if isinstance(outcome, Held) else outcome.seconds
            delay = outcome.delay if isinstance(outcome, Snoozed) else None
            logger.log(
                level,
                "job %s %s (task %s, attempt %d/%d, %.1f ms)%s",
                job.id,
                event,
                job.task,
                job.attempt,
                job.max_attempts,
                seconds * 1000,
                f"; runs again in {delay:g}s, attempt not counted" if delay is not None else "",
                extra={
                    "job_id": str(job.id),
                    "task": job.task,
                    "queue": job.queue,
                    "attempt": job.attempt,
                    "duration_ms": round(seconds * 1000, 3),
                    "event": event,
                },
            )


class MeteredTelemetry(Telemetry):
    """Log lines and metrics."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics
        self._counters = {
            "completed": metrics.completed,
            "failed": metrics.failed,
            "retried": metrics.retried,
            "cancelled": metrics.cancelled,
            "snoozed": metrics.snoozed,
            "suspended": metrics.suspended,
        }

    def started(self, jobs: Sequence[ClaimedJob]) -> None:
        now = time.time()
        for job in jobs:
            self._m.started.labels(job.queue, job.task).inc()
            due = max(job.created_at, job.run_at)
            self._m.pickup.labels(job.queue).observe(max(0.0, now - due))

    def ran(self, job: ClaimedJob, seconds: float) -> None:
        self._m.runtime.labels(job.queue, job.task).observe(seconds)

    def claimed(self, found: bool, woken_by: str) -> None:
        self._m.claims.labels("yes" if found else "no", str(woken_by)).inc()

    def notified(self) -> None:
        self._m.notifications.inc()

    def reconnected(self) -> None:
        self._m.reconnects.inc()

    def rescued(self, count: int) -> None:
        self._m.rescued.inc(count)

    def discarded(self, job_id: object) -> None:
        self._m.lost.inc()
        super().discarded(job_id)

    def recorded(
        self,
        kind: OutcomeKind,
        written: Sequence[WrittenJob],
        statuses: Mapping[UUID, JobStatus] | None = None,
    ) -> None:
        for job, _, event in _events(kind, written, statuses):
            counter = self._counters.get(event)
            if counter is not None:
                counter.labels(job.queue, job.task).inc()
        super().recorded(kind, written, statuses)


def telemetry(metrics: Metrics | None) -> Telemetry:
    """The telemetry of a worker with these metrics (or none)."""
    return Telemetry() if metrics is None else MeteredTelemetry(metrics)


def _events(
    kind: OutcomeKind, written: Iterable[WrittenJob], statuses: Mapping[UUID, JobStatus] | None
) -> Iterable[tuple[ClaimedJob, Success | Failure | Snoozed | Suspended | Held, str]]:
    """Each written job with the event name of its outcome: a failed attempt that went back to
    the queue is a retry."""
    name = kind.value
    if kind is not OutcomeKind.FAILED or statuses is None:
        return ((job, outcome, name) for job, outcome in written)
    return (
        (job, outcome, "retried" if statuses.get(job.id) is JobStatus.QUEUED else name)
        for job, outcome in written
    )
