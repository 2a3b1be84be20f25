"""notifyq's schema in a Django project's database: applied by the app's Django migration
(so ``manage.py migrate``, and the test runner's test databases, create it) and by
``manage.py notifyq_migrate`` (after an upgrade of notifyq brings new SQL)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import anyio

from notifyq.django._settings import database_alias, database_url_of, notifyq_settings
from notifyq.migrations import migrate
from notifyq.queries import Migration
from notifyq.settings import Settings

__all__ = ["migrate_django_database", "migrate_schema"]


def migrate_schema(
    settings: Settings, *, progress: Callable[[str], None] | None = None
) -> list[Migration]:
    """Applies notifyq's missing migrations to the database of ``settings``; answers them."""
    return anyio.run(functools.partial(migrate, settings, progress=progress))


def migrate_django_database(wrapper: Any) -> None:
    """What the app's Django migration runs on the connection ``wrapper`` it migrates: notifyq's
    schema, in that very database, when it is notifyq's (NOTIFYQ["DATABASE"]) and PostgreSQL;
    nothing otherwise (another alias of a multi-database project, or notifyq in a database
    of its own: then ``manage.py notifyq_migrate`` or the worker creates it)."""
    if wrapper.alias != database_alias():
        return
    url = database_url_of(wrapper.alias)
    if url is None:
        return
    # That database even when NOTIFYQ names a DATABASE_URL: under the test runner, it is the
    # test database, and the one views write to.
    migrate_schema(notifyq_settings(database_url=url))
