"""Django's own tasks (``django.tasks``, Django 6 or later) run on notifyq.

``TASKS = {"default": {"BACKEND": "notifyq.django.TaskBackend"}}`` in ``settings.py``, and a
function decorated with ``django.tasks.task`` is a notifyq job when it is enqueued:

- its task is the function's module path (``shop.tasks.send_receipt``), its payload
  ``{"args": [...], "kwargs": {...}}``, its queue the task's ``queue_name``, its priority
  Django's (-100 to 100, higher first: notifyq's own order, and 0 for both by default), its
  ``run_at`` the task's ``run_after``;
- it is written on Django's connection, as :func:`notifyq.django.enqueue` writes: inside
  ``transaction.atomic()`` (or a request with ``ATOMIC_REQUESTS``) it exists once the block
  commits, and never if it rolls back;
- ``manage.py notifyq_worker`` runs it: the worker serves every Django task of the modules it
  imports (each installed app's ``tasks`` module, and ``NOTIFYQ["IMPORT"]``), each registered
  under its module path, so a worker that does not know a task leaves its jobs queued;
- ``get_result(id)`` answers a ``TaskResult`` read from the job: ``queued`` and ``waiting`` are
  ``READY``, ``processing`` is ``RUNNING``, ``completed`` is ``SUCCESSFUL`` (with its return
  value), ``failed`` and ``cancelled`` are ``FAILED``. Each failed attempt is one of its
  ``errors``; a failed attempt with attempts left goes back to ``READY``, as Django's status says
  ("ready to be executed again").

Nothing here runs at import but the class definitions; Django builds the backend when a task is
first declared or used.
"""

from __future__ import annotations

import builtins
import functools
import importlib
from collections.abc import Callable, Iterable
from inspect import iscoroutinefunction
from types import ModuleType
from typing import Any
from uuid import UUID

from django.apps import apps
from django.core import checks
from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json

from notifyq import tasks as notifyq_tasks
from notifyq.context import JobContext
from notifyq.django._queue import enqueue, queue
from notifyq.errors import InvalidJob, PermanentFailure, Snooze
from notifyq.models import Job, JobStatus

__all__ = ["JobCancelled", "TaskBackend", "django_tasks"]

#: notifyq's statuses as Django's.
_STATUS = {
    JobStatus.WAITING: TaskResultStatus.READY,
    JobStatus.QUEUED: TaskResultStatus.READY,
    JobStatus.PROCESSING: TaskResultStatus.RUNNING,
    # A durable job between its steps (a sleep, a signal wait) has started and not ended.
    JobStatus.SUSPENDED: TaskResultStatus.RUNNING,
    JobStatus.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobStatus.FAILED: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
}


class JobCancelled(Exception):
    """The exception class a cancelled job's ``TaskResult`` names in its last error
    (``notifyq.django.JobCancelled``): the job was cancelled (``notifyq cancel``,
    ``POST /jobs/{id}/cancel``, the dashboard) and never raised anything itself."""


JobCancelled.__module__ = "notifyq.django"  # its public path, which Django imports


class TaskBackend(BaseTaskBackend):  # type: ignore[misc]
    """A ``django.tasks`` backend that stores each enqueued task as a notifyq job.

    ``QUEUES`` (Django's own key) lists the queue names tasks may use (``["default"]`` unless
    set; an empty list allows any). ``OPTIONS`` may set ``MAX_ATTEMPTS``: how many times a task
    that raises is tried, with notifyq's backoff between attempts (default
    ``NOTIFYQ_MAX_ATTEMPTS``, 3; 1 for Django's own rule of one run)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        max_attempts = self.options.get("MAX_ATTEMPTS")
        if max_attempts is not None and (
            isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1
        ):
            raise InvalidTask(
                f"TASKS[{alias!r}]['OPTIONS']['MAX_ATTEMPTS'] must be a whole number of at "
                f"least 1, not {max_attempts!r}"
            )
        self.max_attempts: int | None = max_attempts

    def enqueue(self, task: Task, args: Iterable[Any], kwargs: dict[str, Any]) -> TaskResult:
        """Stores the task as a job in the current transaction of Django's connection."""
        self.validate_task(task)
        result = self._result(
            task, id="", status=TaskResultStatus.READY, args=list(args), kwargs=kwargs
        )
        run_at = task.run_after
        if run_at is not None and timezone.is_naive(run_at):
            run_at = timezone.make_aware(run_at)  # USE_TZ off: the project's time zone
        try:
            job = enqueue(
                task.module_path,
                {"args": result.args, "kwargs": result.kwargs},
                queue=task.queue_name,
                priority=task.priority,
                run_at=run_at,
                max_attempts=self.max_attempts,
            )
        except InvalidJob as exc:
            raise InvalidTask(f"{task.module_path}: {exc}") from exc
        object.__setattr__(result, "id", str(job.job_id))
        object.__setattr__(result, "enqueued_at", job.created_at)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result as its job stands now (read on a connection of notifyq's own, so
        a job enqueued in a transaction not yet committed is not found)."""
        try:
            job_id = UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(f"{result_id!r} is not a task result id") from None
        job = queue().get(job_id)
        task = None if job is None else _task_at(job.task)
        if job is None or task is None:
            raise TaskResultDoesNotExist(f"no task result has the id {result_id}")
        return _result_of(job, task, self.alias)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        """Django's system checks: the app that creates notifyq's schema must be installed."""
        if not apps.is_installed("notifyq.django"):
            yield checks.Error(
                f"TASKS[{self.alias!r}] uses notifyq.django.TaskBackend, but notifyq.django "
                "is not in INSTALLED_APPS, so `manage.py migrate` does not create notifyq's "
                "schema",
                hint='add "notifyq.django" to INSTALLED_APPS',
                id="notifyq.E002",
            )

    def _result(self, task: Task, **fields: Any) -> TaskResult:
        values: dict[str, Any] = {
            "enqueued_at": None,
            "started_at": None,
            "finished_at": None,
            "last_attempted_at": None,
            "backend": self.alias,
            "errors": [],
            "worker_ids": [],
            **fields,
        }
        return TaskResult(task=task, **values)


def _task_at(path: str) -> Task | None:
    """The Django task whose module path is ``path``, or None when it names none."""
    module_name, _, name = path.rpartition(".")
    if not module_name:
        return None
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    found = getattr(module, name, None)
    return found if isinstance(found, Task) else None


def _result_of(job: Job, task: Task, alias: str) -> TaskResult:
    payload = job.payload
    args = payload.get("args")
    kwargs = payload.get("kwargs")
    status = _STATUS[job.status]
    errors = [_task_error(e["error"]) for e in job.errors if isinstance(e.get("error"), str)]
    if job.status is JobStatus.CANCELLED:
        why = job.last_error or "the job was cancelled"
        errors.append(TaskError(exception_class_path=_path(JobCancelled), traceback=why))
    result = TaskResult(
        task=task,
        id=str(job.id),
        status=status,
        enqueued_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        last_attempted_at=job.started_at,
        args=args if isinstance(args, list) else [],
        kwargs=kwargs if isinstance(kwargs, dict) else {},
        backend=alias,
        errors=errors,
        # notifyq keeps the worker of the latest attempt only: it stands for each attempt, so
        # that Django's `attempts` (their count) is the job's.
        worker_ids=[job.worker_id or ""] * job.attempt_count,
    )
    if status is TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", job.result)
    return result


def _task_error(text: str) -> TaskError:
    """Django's error from notifyq's text of a failed attempt, ``Type: message`` then where it
    was raised: a built-in exception by its name, any other by its path (see :class:`_Raised`)."""
    kind = text.split(":", 1)[0].split("\n", 1)[0].strip()
    if "." not in kind:
        found = getattr(builtins, kind, None)
        is_exception = isinstance(found, type) and issubclass(found, BaseException)
        kind = f"builtins.{kind}" if is_exception else f"{Exception.__module__}.Exception"
    return TaskError(exception_class_path=kind, traceback=text)


def _path(kind: type[BaseException]) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


class _Raised(Exception):
    """What a Django task raised, retold under the name of its class's path, which notifyq's
    error text keeps (``shop.errors.Refused: ...``) and Django's ``TaskError`` needs.
    Subclasses are made per class, named by that path."""


class _RaisedPermanently(_Raised, PermanentFailure):
    """The same, for a ``notifyq.PermanentFailure``: the job fails without another attempt."""


@functools.cache
def _raised_as(path: str, permanent: bool) -> type[_Raised]:
    base = _RaisedPermanently if permanent else _Raised
    return type(path, (base,), {"__module__": __name__, "__qualname__": path})


def _retold(exc: Exception) -> Exception:
    """``exc``, or for a class that is not a built-in, the same message and traceback under its
    class's path. notifyq's ``Snooze`` passes as it is."""
    kind = type(exc)
    if isinstance(exc, Snooze) or kind.__module__ == "builtins":
        return exc
    told = _raised_as(_path(kind), isinstance(exc, PermanentFailure))(*exc.args)
    return told.with_traceback(exc.__traceback__)


def _handler(task: Task, alias: str) -> Callable[..., Any]:
    """notifyq's handler of a Django task: calls its function with the job's args and kwargs
    (and Django's TaskContext when the task takes it), sending Django's task signals."""

    def running(ctx: JobContext, payload: dict[str, Any]) -> tuple[TaskResult, list[Any]]:
        now = timezone.now()
        result = TaskResult(
            task=task,
            id=str(ctx.job_id),
            status=TaskResultStatus.RUNNING,
            enqueued_at=None,
            started_at=now,
            finished_at=None,
            last_attempted_at=now,
            args=payload.get("args") or [],
            kwargs=payload.get("kwargs") or {},
            backend=alias,
            errors=[],
            worker_ids=[ctx.worker_id] * ctx.attempt,
        )
        task_started.send(TaskBackend, task_result=result)
        args = list(result.args)
        if task.takes_context:
            args.insert(0, TaskContext(task_result=result))
        return result, args

    def finished(result: TaskResult, failed: BaseException | None) -> None:
        object.__setattr__(result, "finished_at", timezone.now())
        status = TaskResultStatus.FAILED if failed is not None else TaskResultStatus.SUCCESSFUL
        object.__setattr__(result, "status", status)
        task_finished.send(TaskBackend, task_result=result)

    if iscoroutinefunction(task.func):

        async def run_async(payload: dict[str, Any], ctx: JobContext) -> Any:
            result, args = running(ctx, payload)
            try:
                value = normalize_json(await task.func(*args, **result.kwargs))
            except Exception as exc:
                finished(result, exc)
                raise _retold(exc) from None
            finished(result, None)
            return value

        run_async.__name__, run_async.__doc__ = task.name, task.func.__doc__
        return run_async

    def run(payload: dict[str, Any], ctx: JobContext) -> Any:
        result, args = running(ctx, payload)
        try:
            value = normalize_json(task.func(*args, **result.kwargs))
        except Exception as exc:
            finished(result, exc)
            raise _retold(exc) from None
        finished(result, None)
        return value

    run.__name__, run.__doc__ = task.name, task.func.__doc__
    return run


def django_tasks(modules: Iterable[ModuleType]) -> list[notifyq_tasks.Task]:
    """The Django tasks defined in ``modules`` whose backend is notifyq's, as notifyq tasks
    named by their module path (their jobs' task), for a worker to serve."""
    from django.tasks import task_backends

    found: dict[str, notifyq_tasks.Task] = {}
    for module in modules:
        for value in vars(module).values():
            if not isinstance(value, Task) or value.module_path in found:
                continue
            if value.func.__module__ != module.__name__:
                continue  # imported from elsewhere: found in its own module
            if not isinstance(task_backends[value.backend], TaskBackend):
                continue
            found[value.module_path] = notifyq_tasks.make_task(
                _handler(value, value.backend), value.module_path
            )
    return list(found.values())
