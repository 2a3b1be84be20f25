"""Tasks: :class:`Task` (a handler and its options), :func:`make_task`, the :class:`Registry`
of tasks by name, and the ``@task`` / ``@periodic`` decorators with the registry they fill.

The built-in tasks and the registry a worker serves are in :mod:`notifyq.builtins`; retry
policies (:class:`~notifyq.retry.Backoff`, :class:`~notifyq.retry.CircuitBreaker`) in
:mod:`notifyq.retry`."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar, overload

import anyio
import anyio.to_thread
from cronsim import CronSim, CronSimError
from pydantic import BaseModel, ValidationError

from notifyq.context import JobContext, _current
from notifyq.errors import PermanentFailure, TaskError
from notifyq.models import check_name
from notifyq.retry import Backoff, CircuitBreaker

Handler = Callable[[dict[str, Any]], Any]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Task:
    """A registered handler and its options."""

    name: str
    fn: Handler
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    timeout: float | None = None
    backoff: Backoff | None = None
    breaker: CircuitBreaker | None = None
    max_concurrency: int | None = None
    rate_limit: float | None = None
    key_concurrency: int | None = None
    cron: str | None = None
    cron_payload: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    is_async: bool = False
    payload_model: type[BaseModel] | None = None
    wants_context: bool = False

    @property
    def limited(self) -> bool:
        """Whether the claim must respect a limit of this task across all workers."""
        return self.max_concurrency is not None or self.rate_limit is not None

    def options(self) -> dict[str, Any]:
        """The options as JSON-friendly values, for the tasks table and ``GET /tasks``."""
        return {
            "queue": self.queue,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "timeout": self.timeout,
            "backoff": None if self.backoff is None else dataclasses.asdict(self.backoff),
            "breaker": None if self.breaker is None else dataclasses.asdict(self.breaker),
            "max_concurrency": self.max_concurrency,
            "rate_limit": self.rate_limit,
            "key_concurrency": self.key_concurrency,
            "cron": self.cron,
            "payload_schema": None
            if self.payload_model is None
            else self.payload_model.model_json_schema(),
            "kind": "async" if self.is_async else "thread",
            "description": self.description,
        }

    def options_json(self) -> str:
        """The options as JSON text."""
        return json.dumps(self.options())

    async def run(
        self,
        payload: dict[str, Any],
        limiter: anyio.CapacityLimiter | None,
        context: JobContext | None = None,
    ) -> Any:
        """Calls the handler: awaited when it is a coroutine function, else in a worker thread
        (which sees the job's context too). A payload model validates the payload first: a
        payload that does not fit fails the job at once. A cancelled thread cannot be stopped;
        it is abandoned and its result ignored."""
        argument: Any = payload
        if self.payload_model is not None:
            try:
                argument = self.payload_model.model_validate(payload)
            except ValidationError as exc:
                raise PermanentFailure(
                    f"the payload does not fit {self.payload_model.__name__}: "
                    + "; ".join(
                        f"{'.'.join(map(str, e['loc'])) or '(payload)'}: {e['msg']}"
                        for e in exc.errors()
                    )
                ) from None
        args: tuple[Any, ...] = (argument, context) if self.wants_context else (argument,)
        token = _current.set(context) if context is not None else None
        try:
            if self.is_async:
                result = await self.fn(*args)
            else:
                result = await anyio.to_thread.run_sync(
                    self.fn, *args, abandon_on_cancel=True, limiter=limiter
                )
        finally:
            if token is not None:
                _current.reset(token)
        if isinstance(result, BaseModel):
            return result.model_dump(mode="json")
        return result


def make_task(
    fn: Callable[..., Any],
    name: str | None = None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    timeout: float | None = None,
    backoff: Backoff | None = None,
    breaker: CircuitBreaker | None = None,
    max_concurrency: int | None = None,
    rate_limit: float | None = None,
    key_concurrency: int | None = None,
    cron: str | None = None,
    cron_payload: dict[str, Any] | None = None,
) -> Task:
    """Builds a :class:`Task`, checking its options and its handler's signature."""
    if not callable(fn):
        raise TaskError(f"a task handler must be callable, not {type(fn).__name__}")
    task_name = name or getattr(fn, "__name__", None)
    try:
        check_name("task name", task_name)
        if queue is not None:
            check_name("queue", queue)
    except ValueError as exc:
        raise TaskError(str(exc)) from None
    assert task_name is not None

    def positive(what: str, value: Any, whole: bool = False) -> None:
        if value is None:
            return
        kind = int if whole else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
            raise TaskError(f"task {task_name!r}: {what} must be a positive number")

    positive("max_attempts", max_attempts, whole=True)
    positive("timeout", timeout)
    positive("max_concurrency", max_concurrency, whole=True)
    positive("rate_limit", rate_limit)
    positive("key_concurrency", key_concurrency, whole=True)
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise TaskError(f"task {task_name!r}: priority must be an integer")
    if cron is not None:
        _check_cron(task_name, cron)
    payload_model, wants_context = _inspect_handler(fn, task_name)
    return Task(
        name=task_name,
        fn=fn,
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        timeout=None if timeout is None else float(timeout),
        backoff=backoff,
        breaker=breaker,
        max_concurrency=max_concurrency,
        rate_limit=None if rate_limit is None else float(rate_limit),
        key_concurrency=key_concurrency,
        cron=cron,
        cron_payload=dict(cron_payload or {}),
        description=(inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " "),
        is_async=inspect.iscoroutinefunction(fn),
        payload_model=payload_model,
        wants_context=wants_context,
    )


def _inspect_handler(fn: Callable[..., Any], name: str) -> tuple[type[BaseModel] | None, bool]:
    """The payload model (when the first parameter is annotated with a pydantic model) and
    whether the handler takes a JobContext second."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None, False
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is p.empty]
    if not positional or len(required) > 2:
        raise TaskError(
            f"task {name!r}: the handler must take the payload, and optionally a JobContext"
        )
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    first = hints.get(positional[0].name)
    model = first if isinstance(first, type) and issubclass(first, BaseModel) else None
    wants_context = len(positional) >= 2 and (
        hints.get(positional[1].name) is JobContext or positional[1].name in ("ctx", "context")
    )
    return model, wants_context


def _check_cron(name: str, cron: str) -> None:
    try:
        CronSim(cron, datetime.now(timezone.utc))
    except CronSimError as exc:
        raise TaskError(f"task {name!r}: {cron!r} is not a cron expression: {exc}") from None


class Registry:
    """Tasks by name."""

    def __init__(self, tasks: list[Task] | None = None) -> None:
        self._tasks: dict[str, Task] = {}
        for task in tasks or []:
            self.add(task)

    def add(self, task: Task) -> None:
        """Registers ``task``; TaskError if another handler has its name."""
        existing = self._tasks.get(task.name)
        if (
            existing is not None
            and existing.fn is not task.fn
            and not _same_function(existing.fn, task.fn)
        ):
            raise TaskError(f"two different handlers are registered as task {task.name!r}")
        self._tasks[task.name] = task

    def get(self, name: str) -> Task | None:
        """The task named ``name``, or None."""
        return self._tasks.get(name)

    def names(self) -> list[str]:
        """The tasks' names, sorted."""
        return sorted(self._tasks)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)

    def merged(self, other: Registry) -> Registry:
        """A new registry with this one's tasks and ``other``'s."""
        combined = Registry(list(self))
        for task in other:
            combined.add(task)
        return combined


def _same_function(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    # A module imported twice (as __main__ and by name) defines the "same" handler twice.
    if a is b:
        return True
    return getattr(a, "__qualname__", a) == getattr(b, "__qualname__", b) and getattr(
        a, "__module__", None
    ) == getattr(b, "__module__", None)


#: The tasks registered with ``@task`` and ``@periodic``, filled as modules are imported.
_registry = Registry()


def registered() -> Registry:
    """A new registry holding every task registered with ``@task`` so far."""
    return Registry(list(_registry))


@overload
def task(fn: F, /) -> F: ...
@overload
def task(
    name: str | None = None,
    /,
    *,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    timeout: float | None = None,
    backoff: Backoff | None = None,
    breaker: CircuitBreaker | None = None,
    max_concurrency: int | None = None,
    rate_limit: float | None = None,
    key_concurrency: int | None = None,
    cron: str | None = None,
    cron_payload: dict[str, Any] | None = None,
) -> Callable[[F], F]: ...
def task(fn_or_name: Any = None, /, **options: Any) -> Any:
    """Registers a handler as a task. Use it bare (``@task``, named after the function) or with
    options (``@task("send_email", max_attempts=5, timeout=30)``):

    - ``queue``, ``priority``: defaults for jobs of this task that do not say;
    - ``max_attempts``, ``timeout`` (seconds per attempt), ``backoff`` (a :class:`Backoff`),
      ``breaker`` (a :class:`CircuitBreaker`);
    - ``max_concurrency`` (jobs running at once) and ``rate_limit`` (jobs started per second),
      both across all workers;
    - ``key_concurrency``: at most this many jobs of one ``fair_key`` running at once, across
      all workers (jobs without a key are not limited by it);
    - ``cron`` (five fields, UTC) and ``cron_payload``: enqueue a job every tick.

    The function is returned unchanged, so it can still be called directly."""

    def register(fn: F, name: str | None = None) -> F:
        _registry.add(make_task(fn, name, **options))
        return fn

    if callable(fn_or_name):
        return register(fn_or_name)
    if fn_or_name is not None and not isinstance(fn_or_name, str):
        raise TaskError("@task takes a function, or a task name and options")
    return lambda fn: register(fn, fn_or_name)


def periodic(
    cron: str, /, *, name: str | None = None, payload: dict[str, Any] | None = None, **options: Any
) -> Callable[[F], F]:
    """Registers a task that is enqueued on every tick of ``cron`` (five fields, UTC), once per
    tick however many workers run: ``@periodic("*/5 * * * *")``."""
    decorate: Callable[[F], F] = task(name, cron=cron, cron_payload=payload, **options)
    return decorate


def import_modules(names: list[str]) -> None:
    """Imports the modules that define tasks (``--import`` / ``NOTIFYQ_IMPORT``)."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise TaskError(
                f"cannot import {name!r} (from --import/NOTIFYQ_IMPORT): {type(exc).__name__}: "
                f"{exc}; check the module name and that it is on PYTHONPATH"
            ) from exc
