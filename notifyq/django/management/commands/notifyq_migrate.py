"""``manage.py notifyq_migrate``: ``notifyq migrate`` on the project's notifyq database."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from notifyq.django._schema import migrate_schema
from notifyq.django._settings import notifyq_settings
from notifyq.migrations import latest_version
from notifyq.process import one_line


class Command(BaseCommand):  # type: ignore[misc]
    help = (
        "Brings notifyq's schema up to date (manage.py migrate creates it; this applies what "
        "a newer notifyq brings). Idempotent, safe to run from several processes at once."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            applied = migrate_schema(notifyq_settings(), progress=self.stdout.write)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        except Exception as exc:
            message = one_line(exc)
            if message is None:
                raise
            raise CommandError(message) from exc
        state = f"{len(applied)} migration(s) applied" if applied else "nothing to apply"
        self.stdout.write(
            f"notifyq: database is up to date (schema version {latest_version()}; {state})"
        )
