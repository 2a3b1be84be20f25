"""What a worker tells the world about its jobs: log lines and, when it has them, metrics.

:func:`telemetry` answers a :class:`Telemetry` that only logs, or a :class:`MeteredTelemetry`
that also counts in a :class:`~notifyq.metrics.Metrics`: the services call the same methods
either way, never ``if metrics is not None``."""

from __future__ import annotations

import logging
import time

from notifyq.metrics import Metrics
from notifyq.models import ClaimedJob, JobStatus, OutcomeKind

__all__ = ["MeteredTelemetry", "Telemetry", "telemetry"]

logger = logging.getLogger("notifyq.worker")

#: Completions are the bulk (thousands a second): DEBUG. Metrics count them.
_LEVELS = {"failed": logging.WARNING, "completed": logging.DEBUG}


class Telemetry:
    """Log lines of a worker's job events; the metric hooks do nothing."""

    def started(self, job: ClaimedJob) -> None:
        """A job was claimed and handed to a runner."""

    def ran(self, job: ClaimedJob, seconds: float) -> None:
        """A handler returned or raised after ``seconds``."""

    def claimed(self, found: bool, woken_by: str) -> None:
        """A claim statement ran."""

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
        job: ClaimedJob,
        kind: OutcomeKind,
        status: JobStatus | None,
        seconds: float,
        delay: float | None = None,
    ) -> None:
        """An outcome is in the database: the job's log line (``delay``: a snooze's)."""
        event = _event(kind, status)
        if event == "released":
            return
        level = _LEVELS.get(event, logging.INFO)
        if logger.isEnabledFor(level):
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
        }

    def started(self, job: ClaimedJob) -> None:
        self._m.started.labels(job.queue, job.task).inc()
        due = max(job.created_at, job.run_at)
        self._m.pickup.labels(job.queue).observe(max(0.0, time.time() - due))

    def ran(self, job: ClaimedJob, seconds: float) -> None:
        self._m.runtime.labels(job.queue, job.task).observe(seconds)

    def claimed(self, found: bool, woken_by: str) -> None:
        self._m.claims.labels("yes" if found else "no", woken_by).inc()

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
        job: ClaimedJob,
        kind: OutcomeKind,
        status: JobStatus | None,
        seconds: float,
        delay: float | None = None,
    ) -> None:
        counter = self._counters.get(_event(kind, status))
        if counter is not None:
            counter.labels(job.queue, job.task).inc()
        super().recorded(job, kind, status, seconds, delay)


def telemetry(metrics: Metrics | None) -> Telemetry:
    """The telemetry of a worker with these metrics (or none)."""
    return Telemetry() if metrics is None else MeteredTelemetry(metrics)


def _event(kind: OutcomeKind, status: JobStatus | None) -> str:
    """The event name of an outcome: a failed attempt that went back to the queue is a retry."""
    if kind is OutcomeKind.FAILED and status is JobStatus.QUEUED:
        return "retried"
    return kind.value
