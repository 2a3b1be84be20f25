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

Nothing is read or opened at import: the settings are built, and the process's
:class:`notifyq.SyncQueue` (:func:`queue`) made, on first use.
"""

from __future__ import annotations

from notifyq.django._queue import (
    enqueue,
    enqueue_many,
    enqueue_workflow,
    forget_queue,
    psycopg_connection,
    queue,
)
from notifyq.django._settings import notifyq_settings

__all__ = [
    "enqueue",
    "enqueue_many",
    "enqueue_workflow",
    "forget_queue",
    "notifyq_settings",
    "psycopg_connection",
    "queue",
]
