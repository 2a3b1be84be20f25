"""The exceptions notifyq raises, rooted at :class:`NotifyQError`.

psycopg's own errors are translated into these at one seam (:mod:`notifyq.db`), with the original
exception chained as ``__cause__``.
"""

from __future__ import annotations


class NotifyQError(Exception):
    """Base class of every error notifyq raises on purpose."""


class ConfigurationError(NotifyQError, ValueError):
    """Raised when settings are missing or inconsistent (for example a heartbeat slower than a
    third of the lease)."""


class DatabaseUnavailable(NotifyQError):
    """Raised when the database cannot be reached or the connection broke mid-operation; the
    operation may be retried once the database is back."""


class StatementTimeout(DatabaseUnavailable):
    """Raised when a statement ran past NOTIFYQ_STATEMENT_TIMEOUT and PostgreSQL cancelled it:
    the database is too busy (or locked) to answer in time; retry later."""


class DatabaseError(NotifyQError):
    """Raised when the database refused a statement for a reason other than its connection;
    ``sqlstate`` is PostgreSQL's code for it."""

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class RefusedInput(DatabaseError):
    """Raised when PostgreSQL refused the values of a statement (a data exception or an
    integrity violation, such as a time out of range or a column only workers may set)."""


#: The SQLSTATE of an insert refused by a queue's max_depth (sql/022).
QUEUE_FULL_SQLSTATE = "NQ429"


class QueueFull(DatabaseError):
    """Raised when an enqueue would take a queue past its ``max_depth`` (``notifyq queue NAME
    --max-depth N``): nothing of the statement was stored; retry later. ``queue`` names the
    queue (PostgreSQL's SQLSTATE for it is ``NQ429``)."""

    def __init__(self, message: str, *, queue: str | None) -> None:
        super().__init__(message, sqlstate=QUEUE_FULL_SQLSTATE)
        self.queue = queue


class SchemaMismatch(DatabaseError):
    """Raised when a table or function notifyq needs is missing: the database has no notifyq
    schema, or an older one (run ``notifyq migrate``)."""


class MigrationError(NotifyQError):
    """Raised when the schema cannot be brought up to date, or when an applied migration file
    was changed after it ran."""


class InvalidJob(NotifyQError, ValueError):
    """Raised when a job submission is malformed: payload not a JSON object, a string holding a
    NUL character, a value out of range."""


class JobNotFound(NotifyQError, LookupError):
    """Raised when a job id names no job."""


class TaskError(NotifyQError):
    """Raised when a task is registered wrongly (a duplicate name, a handler with the wrong
    signature) or a module given to ``--import`` cannot be imported."""


class PermanentFailure(NotifyQError):
    """Raise from a task handler to fail the job at once, without the retries it has left
    (for input that will never work, such as a malformed payload)."""


#: Longest snooze: ten years, as the longest delay of a submission.
MAX_SNOOZE_SECONDS = 10 * 366 * 86_400


class Snooze(NotifyQError):
    """Raise from a task handler to run the job again ``seconds`` from now: it goes back to
    ``queued`` with its ``run_at`` that far ahead, its lease released and the attempt not
    counted (a resource not ready yet, a rate limit of someone else's). A grouped job keeps its
    place at the head of its group."""

    def __init__(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError("Snooze(seconds): seconds must be a number")
        if not 0 <= seconds <= MAX_SNOOZE_SECONDS:  # also refuses NaN
            raise ValueError(f"Snooze(seconds): seconds must be from 0 to {MAX_SNOOZE_SECONDS}")
        super().__init__(f"snoozed for {seconds:g}s")
        self.seconds = float(seconds)


class SignalTimeout(PermanentFailure, TimeoutError):
    """Raised by ``ctx.wait_for_signal(name, timeout=...)`` when no signal of that name came
    within ``timeout`` seconds. Left uncaught, it fails the job at once (every retry would time
    out again: the wait's deadline is recorded with the job)."""

    def __init__(self, name: str, timeout: float | None = None) -> None:
        after = f" within {timeout:g}s" if timeout is not None else ""
        super().__init__(f"no signal {name!r} came{after}")
        self.name = name
        self.timeout = timeout


class InvalidStepResult(PermanentFailure, ValueError):
    """Raised by ``ctx.step`` when its function's result cannot be stored: not JSON-encodable,
    or larger than :data:`notifyq.context.MAX_STEP_RESULT_BYTES`. It fails the job at once (the
    step would give the same result again)."""


class LeaseLost(NotifyQError):
    """Raised by ``ctx.step`` when the worker no longer holds the job (its lease ran out and
    the job was requeued, or it was cancelled): the step's result is refused, and the attempt
    stops there; the worker that holds the job now runs it."""


class SignalRefused(NotifyQError):
    """Raised by ``Queue.signal`` and ``SyncQueue.signal`` when the job has ended (no signal can
    reach it) or has received the most signals it may; :class:`JobNotFound` for an unknown job."""


def describe(exc: BaseException) -> str:
    """``Type: first line of the message`` of ``exc``, looking inside exception groups of one
    (a task group wraps the error of the task that failed), for one-line reports."""
    while len(getattr(exc, "exceptions", ())) == 1:
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
