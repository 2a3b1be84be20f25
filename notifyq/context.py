"""What a running handler may know about its job, and what it may report.

Declare a second parameter annotated ``JobContext`` (or named ``ctx``) and the worker passes it;
code deeper down can call :func:`current_job` instead. Both are per job: each job runs in its own
task (or thread) with its own context.
"""

from __future__ import annotations

import inspect
import json
import math
import time
from collections.abc import Awaitable, Callable, Generator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from types import MappingProxyType
from typing import Any, Protocol, TypeVar
from uuid import UUID

import anyio

from notifyq.errors import InvalidJob, InvalidStepResult, LeaseLost, SignalTimeout
from notifyq.models import MAX_DELAY_SECONDS, encode_json

#: Longest progress message kept (a longer one is cut).
MAX_PROGRESS_MESSAGE = 1000
#: Longest name of a step or a signal.
MAX_STEP_NAME = 200
#: Largest result of a step, as JSON (the database's bound too).
MAX_STEP_RESULT_BYTES = 1024 * 1024

T = TypeVar("T")

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


class DurableStore(Protocol):
    """What a job's durable calls need from the database (the worker gives it)."""

    async def durable_state(self, job_id: UUID) -> list[tuple[str, str, Any]]:
        """The job's recorded steps and marks and the signals sent to it, as (kind, name,
        value) rows, and a row ("now", "", the database's time as epoch seconds)."""
        ...

    async def record_step(self, job_id: UUID, claim: int, name: str, result_json: str) -> str:
        """Stores a step's result, fenced by the claim: "written", "exists" or "refused"."""
        ...


class Suspend(BaseException):
    """Raised by ``ctx.sleep`` and ``ctx.wait_for_signal`` to suspend the job: the worker
    writes it ``suspended`` and gives back its slot. A BaseException, so that a handler's
    ``except Exception`` does not swallow it. Never raised outside of a worker's job."""

    def __init__(self, delay: float | None, signal: str | None, mark: str, kind: str) -> None:
        super().__init__(f"suspended ({kind} {mark})")
        self.delay = delay
        self.signal = signal
        self.mark = mark
        self.kind = kind


class DurableState:
    """One attempt's view of its job's durable record: read from the database at the first
    durable call, kept up to date by the steps this attempt records."""

    def __init__(
        self,
        store: DurableStore,
        job_id: UUID,
        claim: int,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> None:
        self._store = store
        self._job_id = job_id
        self._claim = claim
        self._limiter = limiter
        self._loaded = False
        #: Made at the first step: most jobs take none (a lock is a microsecond of the ~25 a
        #: worker spends in Python on a job).
        self._lock: anyio.Lock | None = None
        self.steps: dict[str, Any] = {}
        self.marks: dict[tuple[str, str], Any] = {}
        self.signals: dict[str, Any] = {}
        self.sleeps = 0
        #: The database's clock minus this process's, read at load.
        self._skew = 0.0

    def now(self) -> float:
        """The database's time, as epoch seconds."""
        return time.time() + self._skew

    async def load(self) -> None:
        if self._loaded:
            return
        rows = await self._store.durable_state(self._job_id)
        for kind, name, value in rows:
            if kind == "step":
                self.steps[name] = value
            elif kind == "signal":
                self.signals[name] = value
            elif kind == "now":
                self._skew = float(value) - time.time()
            else:
                self.marks[(kind, name)] = value
        self._loaded = True

    async def step(self, name: str, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        _check_name(name, "a step's name")
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:  # two steps of one name started together run once
            await self.load()
            if name in self.steps:
                return self.steps[name]
            if inspect.iscoroutinefunction(fn):
                result = await fn(*args, **kwargs)
            else:
                result = await anyio.to_thread.run_sync(
                    partial(fn, *args, **kwargs), limiter=self._limiter
                )
                if inspect.isawaitable(result):
                    result = await result
            try:
                encoded = encode_json(result, what=f"the result of step {name!r}")
            except InvalidJob as exc:
                raise InvalidStepResult(str(exc)) from exc
            if len(encoded.encode()) > MAX_STEP_RESULT_BYTES:
                raise InvalidStepResult(
                    f"the result of step {name!r} is larger than {MAX_STEP_RESULT_BYTES} bytes "
                    "as JSON; store it elsewhere and return a reference to it"
                )
            outcome = await self._store.record_step(self._job_id, self._claim, name, encoded)
            if outcome == "refused":
                raise LeaseLost(
                    f"job {self._job_id}: the result of step {name!r} was refused: this worker "
                    "no longer holds the job"
                )
            if outcome == "exists":
                # Recorded meanwhile by this attempt (the first result stays): read it.
                self._loaded = False
                await self.load()
                return self.steps[name]
            value = json.loads(encoded)
            self.steps[name] = value
            return value

    async def sleep(self, seconds: float | None, until: datetime | None) -> None:
        await self.load()
        self.sleeps += 1
        mark = str(self.sleeps)
        recorded = self.marks.get(("sleep", mark))
        if recorded is not None:
            left = _until(recorded) - self.now()
            if left <= 0:
                return
            raise Suspend(left, None, mark, "sleep")
        if until is not None:
            delay = until.timestamp() - self.now()
        else:
            assert seconds is not None
            delay = seconds
        if delay <= 0:
            return
        raise Suspend(min(delay, MAX_DELAY_SECONDS), None, mark, "sleep")

    async def wait_for_signal(self, name: str, timeout: float | None) -> Any:  # noqa: ASYNC109
        _check_name(name, "a signal's name")
        await self.load()
        if name in self.signals:
            return self.signals[name]
        recorded = self.marks.get(("wait", name))
        if recorded is None:
            raise Suspend(timeout, name, name, "wait")
        until = recorded.get("until") if isinstance(recorded, dict) else None
        if until is None:
            raise Suspend(None, name, name, "wait")
        left = float(until) - self.now()
        if left <= 0:
            raise SignalTimeout(name, timeout)
        raise Suspend(left, name, name, "wait")


def _until(recorded: Any) -> float:
    until = recorded.get("until") if isinstance(recorded, dict) else None
    return 0.0 if until is None else float(until)


def _check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_STEP_NAME:
        raise ValueError(f"{what} must be a string of 1 to {MAX_STEP_NAME} characters")
    if "\x00" in name:
        raise ValueError(f"{what} must not contain a NUL character")


def _check_seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds")
    if not (math.isfinite(value) and 0 <= value <= MAX_DELAY_SECONDS):
        raise ValueError(f"{what} must be from 0 to {MAX_DELAY_SECONDS} seconds")
    return float(value)


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
    _durable: DurableState | None = field(default=None, repr=False, compare=False)

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

    async def step(
        self,
        name: str,
        fn: Callable[..., Awaitable[T]] | Callable[..., T],
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """Runs ``fn(*args, **kwargs)`` once for this job: its JSON-encodable result is stored
        under ``name`` (1 to 200 characters) before it is returned, and every later attempt or
        resumption of the job gets the stored result (decoded from JSON) without calling
        ``fn``. A plain function runs in a worker thread, a coroutine function on the loop. A
        step that raises stores nothing (the next attempt calls it again)."""
        return await self._durability().step(name, fn, args, kwargs)

    async def sleep(self, seconds: float | None = None, *, until: datetime | None = None) -> None:
        """Suspends the job for ``seconds`` (or until the aware datetime ``until``): it gives
        back its worker slot, becomes ``suspended``, and runs again from the top when the time
        has passed; its steps return their stored results and this same call returns at once.
        No attempt is counted and no worker waits meanwhile."""
        if (seconds is None) == (until is None):
            raise TypeError("sleep() takes seconds or until=, one of them")
        if until is not None and (not isinstance(until, datetime) or until.tzinfo is None):
            raise TypeError("sleep(until=...) takes a timezone-aware datetime")
        if seconds is not None:
            seconds = _check_seconds(seconds, "sleep(seconds)")
        await self._durability().sleep(seconds, until)

    async def wait_for_signal(
        self,
        name: str,
        timeout: float | None = None,  # noqa: ASYNC109 (the contract's name: a durable deadline)
    ) -> Any:
        """The payload of the signal ``name`` sent to this job (``POST
        /jobs/{id}/signals/{name}``, ``Queue.signal``, ``notifyq.signal`` in SQL). If none came
        yet, the job is suspended (slot given back, no attempt counted) until one commits, and
        then runs again from the top; past ``timeout`` seconds it runs again and this raises
        :class:`~notifyq.SignalTimeout`. A signal sent before the wait is kept for it."""
        if timeout is not None:
            timeout = _check_seconds(timeout, "wait_for_signal(timeout)")
        return await self._durability().wait_for_signal(name, timeout)

    def _durability(self) -> DurableState:
        if self._durable is None:
            raise RuntimeError(
                "ctx.step, ctx.sleep and ctx.wait_for_signal work only in a job run by a worker"
            )
        return self._durable


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
