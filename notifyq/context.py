"""What a running handler may know about its job.

Declare a second parameter annotated ``JobContext`` (or named ``ctx``) and the worker passes it;
code deeper down can call :func:`current_job` instead. Both are per job: each job runs in its own
task (or thread) with its own context.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from uuid import UUID


@dataclass(frozen=True, slots=True)
class JobContext:
    """The job a handler is running."""

    job_id: UUID
    task: str
    queue: str
    attempt: int
    max_attempts: int
    priority: int
    worker_id: str

    @property
    def last_attempt(self) -> bool:
        """True when a failure now fails the job for good."""
        return self.attempt >= self.max_attempts


_current: ContextVar[JobContext] = ContextVar("notifyq_current_job")


def current_job() -> JobContext:
    """The job being run by the calling handler; LookupError outside of one."""
    try:
        return _current.get()
    except LookupError:
        raise LookupError("current_job() was called outside of a notifyq job") from None
