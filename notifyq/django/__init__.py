"""notifyq in a Django project (4.2 or later, on psycopg 3).

``settings.py``::

    INSTALLED_APPS = [..., "notifyq.django"]
    NOTIFYQ = {"CONCURRENCY": 20}        # optional: notifyq's variables without NOTIFYQ_

The database is ``DATABASES["default"]`` (``NOTIFYQ["DATABASE"]`` names another alias, and
``NOTIFYQ["DATABASE_URL"]`` another route to it). ``manage.py migrate`` creates notifyq's
schema there; ``manage.py notifyq_worker`` runs a worker with the tasks of every installed
app's ``tasks`` module; in a view, :func:`enqueue` writes the job in the request's
transaction::

    from django.db import transaction
    from notifyq.django import enqueue

    with transaction.atomic():
        order = Order.objects.create(total=42)
        enqueue("send_receipt", {"order": order.pk})   # committed with the order, or never

On Django 6 or later, Django's own tasks (``django.tasks``) run on notifyq too:
``TASKS = {"default": {"BACKEND": "notifyq.django.TaskBackend"}}`` (:class:`TaskBackend`).

Nothing is read or opened at import: the settings are built, and the process's
:class:`notifyq.SyncQueue` (:func:`queue`) made, on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from notifyq.django._queue import (
    enqueue,
    enqueue_many,
    enqueue_workflow,
    forget_queue,
    psycopg_connection,
    queue,
)
from notifyq.django._settings import notifyq_settings

if TYPE_CHECKING:
    from notifyq.django._tasks import JobCancelled, TaskBackend

__all__ = [
    "JobCancelled",
    "TaskBackend",
    "enqueue",
    "enqueue_many",
    "enqueue_workflow",
    "forget_queue",
    "notifyq_settings",
    "psycopg_connection",
    "queue",
]


def __getattr__(name: str) -> Any:
    # TaskBackend needs django.tasks (Django 6): imported when Django's TASKS setting names it,
    # so that the app keeps working on older Django.
    if name in ("TaskBackend", "JobCancelled"):
        try:
            from notifyq.django import _tasks
        except ModuleNotFoundError as exc:
            if exc.name != "django.tasks":
                raise
            import django

            raise ImportError(
                "notifyq.django.TaskBackend runs Django's own tasks (django.tasks), which "
                f"Django 6.0 added; this is Django {django.get_version()}"
            ) from exc
        return getattr(_tasks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
