"""The Django app (notifyq.django), tested as a Django project tests itself: Django's
own test runner runs the tiny project of tests/django_project (its tests are in
tests/django_project/shop/tests.py) on this server, in a test database it creates from the
migrations, notifyq's schema included, and drops.

The tests of this that need no database are in tests/unit/test_django.py.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

from tests.conftest import PREFIX
from tests.helpers import ROOT

pytest.importorskip("django")

MANAGE = "tests/django_project/manage.py"


def _project_env(server_url: str, database: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFYQ_", "SHOP_"))}
    env.update(
        DATABASE_URL=server_url,
        SHOP_DATABASE=database,
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def test_the_django_apps_tests_pass_under_djangos_test_runner(server_url: str) -> None:
    # The project's own database is never made: the runner makes the test database instead,
    # named as the other tests' are, so that a killed run's is dropped by the next run.
    name = f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}_django"
    env = _project_env(server_url, f"{name}_unused", SHOP_TEST_DATABASE=name)
    run = subprocess.run(
        [sys.executable, MANAGE, "test", "tests.django_project.shop", "--noinput", "-v", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK" in run.stderr
    assert "Applying notifyq.0001_schema... OK" in run.stdout


def test_the_worker_command_says_in_one_line_why_it_cannot_start(server_url: str) -> None:
    missing = f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}_missing"
    run = subprocess.run(
        [sys.executable, MANAGE, "notifyq_worker"],
        cwd=ROOT,
        env=_project_env(server_url, missing),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stderr.startswith("CommandError: "), run.stderr
    assert missing in run.stderr
    assert "Traceback" not in run.stderr


def test_the_worker_commands_help_shows_the_defaults_in_effect(server_url: str) -> None:
    """The project's settings.NOTIFYQ says CONCURRENCY 4 and POLL_INTERVAL 30, the environment
    NOTIFYQ_QUEUES: --help shows those, not notifyq's own 10, 5 and all."""
    env = _project_env(server_url, "unused", NOTIFYQ_QUEUES="mail,default")
    run = subprocess.run(
        [sys.executable, MANAGE, "notifyq_worker", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    shown = " ".join(run.stdout.split())
    assert "jobs run at once (default 4)" in shown
    assert "seconds between fallback polls (default 30)" in shown
    assert "queues to serve (default: mail,default)" in shown
    assert "default 10" not in shown and "default 5)" not in shown
