"""Django's own tasks (``django.tasks``, Django 6 or later) on notifyq's backend
(``notifyq.django.TaskBackend``), tested as a Django project tests itself: Django's test runner
runs the newsletter app of tests/django_project (its tests are in
tests/django_project/newsletter/tests.py) on this server, in a test database it makes from the
migrations and drops. Older Django has no django.tasks: skipped there (CI runs this file on
Django 6.1, in its Python 3.13 venv)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

from tests.conftest import PREFIX
from tests.helpers import ROOT

pytest.importorskip("django.tasks", reason="Django's own tasks came with Django 6.0")


def test_djangos_tasks_run_on_notifyq_under_djangos_test_runner(server_url: str) -> None:
    name = f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}_django_tasks"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFYQ_", "SHOP_"))}
    env.update(
        DATABASE_URL=server_url,
        SHOP_DATABASE=f"{name}_unused",
        SHOP_TEST_DATABASE=name,
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    run = subprocess.run(
        [
            sys.executable,
            "tests/django_project/manage.py",
            "test",
            "tests.django_project.newsletter",
            "--noinput",
            "-v",
            "2",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK" in run.stderr
    assert "Applying newsletter.0001_initial... OK" in run.stdout
