"""Running one attempt of a job: :class:`Executor`.

The executor calls the task's handler with the payload (and a :class:`~notifyq.JobContext`),
under the task's timeout, and answers what became of it as a value: a
:class:`~notifyq.models.Success` with the result encoded as JSON, a
:class:`~notifyq.models.Failure` saying whether to retry and after how long, or a
:class:`~notifyq.models.Snoozed` when the handler raised :class:`~notifyq.Snooze`. A job's own
errors never leave it as exceptions; cancellation does (the runner that called it decides
why)."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any
from uuid import UUID

import anyio

from notifyq.context import DurableState, DurableStore, JobContext, Suspend
from notifyq.errors import InvalidJob, LeaseLost, PermanentFailure, Snooze
from notifyq.models import (
    ClaimedJob,
    Failure,
    Snoozed,
    Success,
    Suspended,
    Undecodable,
    encode_json,
)
from notifyq.retry import Backoff
from notifyq.tasks import Task
from notifyq.tracing import NO_TRACING, Processing, Tracing
from notifyq.worker._store import WorkerStore
from notifyq.worker._telemetry import Telemetry

__all__ = [
    "MAX_ERROR_LENGTH",
    "Executor",
    "JobRecord",
    "Outcome",
    "ProgressReports",
    "describe_failure",
]

#: What an attempt comes to.
Outcome = Success | Failure | Snoozed | Suspended

#: Where progress reports go: (job id, claim, fraction, message).
ProgressReports = Callable[[UUID, int, float | None, str | None], None]

logger = logging.getLogger("notifyq.worker")

#: Longest error text kept for an attempt.
MAX_ERROR_LENGTH = 4000

_NO_DEPENDENCIES: Mapping[str, Any] = MappingProxyType({})


class JobRecord:
    """What a job's durable calls read and write (``ctx.step``...), through the worker's store,
    fenced by this worker's id and the job's claim."""

    def __init__(self, store: WorkerStore, worker_id: str) -> None:
        self._store = store
        self._worker_id = worker_id

    async def durable_state(self, job_id: UUID) -> list[tuple[str, str, Any]]:
        return await self._store.durable_state(job_id)

    async def record_step(self, job_id: UUID, claim: int, name: str, result_json: str) -> str:
        return await self._store.record_step(self._worker_id, job_id, claim, name, result_json)


class Executor:
    """Runs attempts for one worker: ``backoff`` is the retry policy of tasks that set none;
    ``limiter`` bounds the threads of plain-function handlers; ``progress`` is where the
    progress reports of every attempt go, with the job's id and claim first; ``tracing`` makes
    the span each attempt runs in (see :mod:`notifyq.tracing`)."""

    def __init__(
        self,
        *,
        worker_id: str,
        backoff: Backoff,
        limiter: anyio.CapacityLimiter,
        telemetry: Telemetry,
        progress: ProgressReports | None = None,
        tracing: Tracing = NO_TRACING,
        durable: DurableStore | None = None,
    ) -> None:
        self._durable = durable
        self._worker_id = worker_id
        self._backoff = backoff
        self._limiter = limiter
        self._telemetry = telemetry
        self._progress = progress
        self._tracing = tracing

    async def attempt(self, job: ClaimedJob, task: Task) -> Outcome:
        """Runs the handler once and answers its outcome."""
        started = time.monotonic()
        if self._tracing.enabled:
            with self._tracing.process(job) as span:
                outcome = await self._attempt(job, task, started, span)
                span.ended(_OUTCOMES[type(outcome)])
        else:
            outcome = await self._attempt(job, task, started, _UNTRACED)
        self._telemetry.ran(job, outcome.seconds)
        return outcome

    async def _attempt(
        self, job: ClaimedJob, task: Task, started: float, span: Processing
    ) -> Outcome:
        if isinstance(job.payload, Undecodable):
            # Stored by SQL, unreadable: this job can never run. Fail it at once, and only it.
            reason = f"the job's payload cannot be used: {job.payload.reason}"
            return self._failure(job, task, reason, started, span, retryable=False)
        if isinstance(job.dependencies, Undecodable):
            reason = (
                f"the results of the jobs it depends on cannot be used: {job.dependencies.reason}"
            )
            return self._failure(job, task, reason, started, span, retryable=False)
        context = JobContext(
            job.id,
            job.task,
            job.queue,
            job.attempt,
            job.max_attempts,
            job.priority,
            self._worker_id,
            _NO_DEPENDENCIES if job.dependencies is None else MappingProxyType(job.dependencies),
            # A partial, not a closure: no Python frame per job to make it.
            None if self._progress is None else partial(self._progress, job.id, job.claim),
            # Read from the database only when the handler first asks (ctx.step, ctx.sleep...).
            None
            if self._durable is None
            else DurableState(self._durable, job.id, job.claim, self._limiter),
        )
        timed_out = False
        try:
            if task.timeout is None:
                result = await task.run(job.payload, self._limiter, context)
            else:
                with anyio.move_on_after(task.timeout) as deadline:
                    result = await task.run(job.payload, self._limiter, context)
                timed_out = deadline.cancelled_caught
        except Snooze as snooze:
            return Snoozed(job.id, job.claim, snooze.seconds, time.monotonic() - started)
        except Suspend as suspend:
            return Suspended(
                job.id,
                job.claim,
                suspend.delay,
                suspend.signal,
                suspend.mark,
                suspend.kind,
                time.monotonic() - started,
            )
        except LeaseLost:
            raise  # nothing of this run is written (see Runners._run)
        except PermanentFailure as exc:
            error = describe_failure(exc)
            return self._failure(job, task, error, started, span, retryable=False, exc=exc)
        except Exception as exc:
            logger.warning(
                "job %s (%s) attempt %d/%d failed after %.3fs: %s",
                job.id,
                job.task,
                job.attempt,
                job.max_attempts,
                time.monotonic() - started,
                describe_failure(exc),
                exc_info=logger.isEnabledFor(logging.DEBUG),
            )
            error = describe_failure(exc, with_traceback=True)
            return self._failure(job, task, error, started, span, retryable=True, exc=exc)
        if timed_out:
            error = (
                f"TimeoutError: task {task.name!r} ran past its {task.timeout:g}s timeout and "
                "was cancelled"
            )
            return self._failure(
                job, task, error, started, span, retryable=True, error_type="TimeoutError"
            )
        try:
            result_json = encode_json(result, what=f"the result of task {task.name!r}")
        except InvalidJob as exc:
            return self._failure(job, task, str(exc), started, span, retryable=False, exc=exc)
        return Success(job.id, job.claim, result_json, time.monotonic() - started)

    def _failure(
        self,
        job: ClaimedJob,
        task: Task,
        error: str,
        started: float,
        span: Processing,
        *,
        retryable: bool,
        exc: BaseException | None = None,
        error_type: str = "notifyq.UnusableJob",
    ) -> Failure:
        """The failed attempt, told to its span: ``exc`` when the handler raised it (its class
        is the ``error_type`` then)."""
        backoff = task.backoff or self._backoff
        if exc is not None:
            error_type = _error_type(exc)
        span.failed(
            error,
            exc,
            error_type=error_type,
            will_retry=retryable and job.attempt < job.max_attempts,
        )
        return Failure(
            job.id,
            job.claim,
            error,
            retryable,
            backoff.delay(job.attempt),
            time.monotonic() - started,
        )


#: The span of an attempt that is not traced.
_UNTRACED = Processing()
#: The ``notifyq.outcome`` of each kind of outcome.
_OUTCOMES: dict[type[Outcome], str] = {
    Success: "completed",
    Failure: "failed",
    Snoozed: "snoozed",
    Suspended: "suspended",
}


def _error_type(exc: BaseException) -> str:
    """``error.type`` of an exception: its class, qualified by its module unless a built-in."""
    kind = type(exc)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def describe_failure(exc: BaseException, *, with_traceback: bool = False) -> str:
    """``Type: message``, then (optionally) where it was raised; bounded and free of NUL."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if with_traceback and exc.__traceback__ is not None:
        frames = traceback.extract_tb(exc.__traceback__)[-3:]
        where = "; ".join(f"{_short_path(f.filename)}:{f.lineno} in {f.name}" for f in frames)
        text = f"{text}\n  at {where}"
    text = text.replace("\x00", "\\0")
    if len(text) > MAX_ERROR_LENGTH:
        text = text[: MAX_ERROR_LENGTH - 20] + "... (truncated)"
    return text.encode("utf-8", "replace").decode("utf-8")


def _short_path(filename: str) -> str:
    """A source path without the machine's folders: from the package root of an installed
    module, else relative to the working folder, else the last two parts."""
    path = Path(filename)
    parts = path.parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1 :])
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return "/".join(parts[-2:])
