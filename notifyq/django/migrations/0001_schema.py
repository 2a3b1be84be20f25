"""Creates notifyq's schema (``notifyq.jobs`` and the rest, the SQL of ``notifyq migrate``) in
the project's database, so that ``manage.py migrate`` and the test runner's test databases
have it. Later versions of notifyq bring their SQL with ``manage.py notifyq_migrate`` or the
worker's start. Unapplying it keeps the schema and its jobs (drop it by hand if you mean to).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def _create_schema(apps: Any, schema_editor: Any) -> None:
    from notifyq.django._schema import migrate_django_database

    migrate_django_database(schema_editor.connection)


class Migration(migrations.Migration):  # type: ignore[misc]
    # notifyq's migrations run on a connection of their own, each in its own transaction.
    atomic = False
    # Tuples: Django copies both into lists of its own.
    dependencies = ()
    operations = (migrations.RunPython(_create_schema, migrations.RunPython.noop),)
