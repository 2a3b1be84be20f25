"""The app's system check (``manage.py check``, and before every command and the server):
NOTIFYQ's keys and values, and a database to use."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from notifyq.django._settings import database_alias, notifyq_settings


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """notifyq.E001: NOTIFYQ is wrong; notifyq.E002: no database; notifyq.W001: notifyq's
    database is not a psycopg 3 PostgreSQL one, so enqueue() cannot join its transactions."""
    try:
        settings = notifyq_settings()
        alias = database_alias()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="notifyq.E001")]
    if settings.database_url is None:
        return [
            checks.Error(
                "notifyq has no database",
                hint="make DATABASES['default'] (or NOTIFYQ['DATABASE']) PostgreSQL, or set "
                "NOTIFYQ['DATABASE_URL']",
                id="notifyq.E002",
            )
        ]
    wrapper = connections[alias]
    if wrapper.vendor != "postgresql" or not _psycopg3():
        return [
            checks.Warning(
                f"DATABASES[{alias!r}] is not PostgreSQL on psycopg 3: "
                "notifyq.django.enqueue() cannot write in its transactions",
                hint="queue().enqueue(...) still works, committing on its own",
                id="notifyq.W001",
            )
        ]
    return []


def _psycopg3() -> bool:
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)
