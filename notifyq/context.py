"""What a running handler may know about its job, and what it may report.

Declare a second parameter annotated ``JobContext`` (or named ``ctx``) and the worker passes it;
code deeper down can call :func:`current_job` instead. Both are per job: each job runs in its own
task (or thread) with its own context.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from uuid import UUID

#: Longest progress message kept (a longer one is cut).
MAX_PROGRESS_MESSAGE = 1000

#: Where a context sends progress reports: (fraction, message), already checked.
ProgressSink = Callable[[float | None, str | None], None]

_NO_DEPENDENCIES: Mapping[str, Any] = MappingProxyType({})


class Recorded:
    """What :meth:`JobContext.progress` answers: nothing to wait for, but awaitable, so that
    ``await ctx.progress(...)`` reads as naturally in an async handler as the plain call."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # a generator that ends at once


_RECORDED = Recorded()


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
    #: The result of each job this one depends on, by job id (as text).
    dependencies: Mapping[str, Any] = field(default_factory=lambda: _NO_DEPENDENCIES)
    _sink: ProgressSink | None = field(default=None, repr=False, compare=False)

    @property
    def last_attempt(self) -> bool:
        """True when a failure now fails the job for good."""
        return self.attempt >= self.max_attempts

    def progress(self, fraction: float | None = None, message: str | None = None) -> Recorded:
        """Records how far the job got: ``fraction`` from 0 to 1 (or None), ``message`` a short
        text (or None). It returns at once, from a thread or the event loop: the worker writes
        the latest report of each job a few times a second at most, so a tight loop may call
        it freely. Shown by ``GET /jobs/{id}`` and pushed to its event stream."""
        checked = _checked_progress(fraction, message)
        if self._sink is not None:
            self._sink(*checked)
        return _RECORDED


def _checked_progress(fraction: object, message: object) -> tuple[float | None, str | None]:
    if fraction is not None:
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise TypeError("progress(fraction=...): fraction must be a number from 0 to 1")
        if not (math.isfinite(fraction) and 0 <= fraction <= 1):
            raise ValueError(f"progress(fraction=...): {fraction!r} is not from 0 to 1")
        fraction = float(fraction)
    if message is not None:
        if not isinstance(message, str):
            raise TypeError("progress(message=...): message must be a string")
        message = message.replace("\x00", "\\0")[:MAX_PROGRESS_MESSAGE]
        message = message.encode("utf-8", "replace").decode("utf-8")
    return fraction, message


_current: ContextVar[JobContext] = ContextVar("notifyq_current_job")


def current_job() -> JobContext:
    """The job being run by the calling handler; LookupError outside of one."""
    try:
        return _current.get()
    except LookupError:
        raise LookupError("current_job() was called outside of a notifyq job") from None
