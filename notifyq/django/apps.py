"""The Django app: ``INSTALLED_APPS += ["notifyq.django"]``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks


class NotifyQConfig(AppConfig):  # type: ignore[misc]
    """notifyq in a Django project: its settings (``NOTIFYQ``), its schema (a migration),
    ``manage.py notifyq_worker`` and ``notifyq_migrate``. Nothing connects when it loads."""

    name = "notifyq.django"
    label = "notifyq"
    verbose_name = "notifyq"

    def ready(self) -> None:
        from django.core.signals import setting_changed

        from notifyq.django._checks import check_settings

        checks.register(check_settings)
        setting_changed.connect(_settings_changed, dispatch_uid="notifyq-settings-changed")


def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    # A test that overrides NOTIFYQ or DATABASES gets a queue made from the new ones.
    if setting in ("NOTIFYQ", "DATABASES"):
        from notifyq.django._queue import forget_queue

        forget_queue()
