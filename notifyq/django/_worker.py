"""``manage.py notifyq_worker``: a notifyq worker inside a Django project.

It is ``notifyq worker`` with the project's settings (:func:`notifyq_settings`), the tasks of
every installed app's ``tasks`` module (and of NOTIFYQ["IMPORT"]), and Django's rule for its
database connections: a handler may use the ORM, and the connections it opened are closed
when obsolete or broken (CONN_MAX_AGE, an error), before and after each job, as Django does
around each request. Without that, a connection the database dropped (a restart) would fail
every later job of its thread.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
from asgiref.sync import SyncToAsync, sync_to_async
from django.apps import apps
from django.db import close_old_connections
from django.utils.module_loading import module_has_submodule

from notifyq import process
from notifyq.builtins import worker_registry
from notifyq.contrib import ContribSettings
from notifyq.logs import JsonFormatter
from notifyq.settings import Settings
from notifyq.tasks import Registry, Task, import_modules, registered

__all__ = ["django_registry", "release_orm_thread", "run_worker", "task_modules"]

logger = logging.getLogger("notifyq")


def task_modules(settings: Settings, *, autodiscover: bool) -> list[str]:
    """The modules that define the worker's tasks: each installed app's ``tasks`` module
    (when ``autodiscover``), then NOTIFYQ["IMPORT"] / --import."""
    found = []
    if autodiscover:
        for app in apps.get_app_configs():
            if module_has_submodule(app.module, "tasks"):
                found.append(f"{app.name}.tasks")
    return [*found, *(name for name in settings.imports if name not in found)]


def django_registry(settings: Settings, *, autodiscover: bool) -> Registry:
    """What the worker serves: the built-ins, and every task of :func:`task_modules` (notifyq's
    ``@task`` and, on Django 6, Django's own ``@task`` on notifyq's backend) wrapped in
    Django's connection rule (the built-ins use no Django connection)."""
    modules = task_modules(settings, autodiscover=autodiscover)
    import_modules(modules)
    djangos = Registry(_django_tasks(modules))
    registry = worker_registry(djangos, contrib=ContribSettings.load())
    own = {*registered().names(), *djangos.names()}
    return Registry([_with_django_connections(t) if t.name in own else t for t in registry])


def _django_tasks(modules: list[str]) -> list[Task]:
    """The tasks of Django's ``django.tasks`` (Django 6 or later) in ``modules`` that run on
    notifyq's backend; none on older Django."""
    try:
        import django.tasks  # noqa: F401
    except ImportError:
        return []
    from notifyq.django._tasks import django_tasks

    return django_tasks(sys.modules[name] for name in modules)


def _with_django_connections(task: Task) -> Task:
    if task.is_async:
        return dataclasses.replace(task, fn=_async_closing(task.fn))
    return dataclasses.replace(task, fn=_closing(task.fn))


def _closing(fn: Callable[..., Any]) -> Callable[..., Any]:
    # A plain handler runs in a worker thread, where the ORM's connections are that thread's.
    @functools.wraps(fn)
    def run(*args: Any) -> Any:
        close_old_connections()
        try:
            return fn(*args)
        finally:
            close_old_connections()

    return run


def _async_closing(fn: Callable[..., Any]) -> Callable[..., Any]:
    # The ORM's async methods run in one thread of asgiref's (thread_sensitive), where their
    # connections live, so they are closed there too: one hop to that thread per job, after
    # it. A connection broken during a job is closed before the next one; checking before
    # each job as well would cost a second hop.
    @functools.wraps(fn)
    async def run(*args: Any) -> Any:
        try:
            return await fn(*args)
        finally:
            with anyio.CancelScope(shield=True):
                await sync_to_async(close_old_connections)()

    return run


def run_worker(
    settings: Settings, registry: Registry, *, burst: bool, metrics_port: int | None
) -> None:
    """Runs the worker until SIGTERM/SIGINT (drained, as ``notifyq worker`` is) or, with
    ``burst``, until nothing is due: the worker process of :mod:`notifyq.process`, the one
    ``notifyq worker`` runs, with the project's logging. Migrates first (or checks the schema
    with NOTIFYQ["AUTO_MIGRATE"] off)."""
    log_to_stderr(settings)
    process.run_worker(settings, registry, burst=burst, metrics_port=metrics_port)


def release_orm_thread() -> None:
    """Lets the thread of the ORM's async methods end once it is idle, for a process about to
    exit: asgiref runs them in a ThreadPoolExecutor of one thread, which is no daemon, so that
    the exit would wait for it, or (with notifyq's check for abandoned handler threads) report
    it as stuck. Nothing in the process may use that executor afterwards."""
    executor = getattr(SyncToAsync, "single_thread_executor", None)
    if isinstance(executor, ThreadPoolExecutor):
        executor.shutdown(wait=False)


def log_to_stderr(settings: Settings) -> None:
    """Sends notifyq's logs to stderr, as ``notifyq worker`` does, unless the project's
    LOGGING already gives them (or the root logger) a handler."""
    ours = logging.getLogger("notifyq")
    if ours.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    ours.addHandler(handler)
    ours.setLevel(settings.log_level)
