"""``manage.py notifyq_worker``: ``notifyq worker`` with the project's settings and tasks."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from notifyq.django._settings import autodiscover, effective_defaults, notifyq_settings
from notifyq.django._worker import django_registry, release_orm_thread, run_worker
from notifyq.process import exit_now_if_threads_hang, one_line


class Command(BaseCommand):  # type: ignore[misc]
    help = (
        "Runs a notifyq worker with settings.NOTIFYQ and the tasks of every installed app's "
        "tasks module, until SIGTERM or SIGINT (which drain it)."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        # The defaults shown are those in effect: settings.NOTIFYQ, the environment, notifyq's.
        now = effective_defaults()
        queues = ",".join(now.queues).replace("%", "%%") if now.queues else "all"
        host = now.host.replace("%", "%%")  # argparse formats help with %
        parser.add_argument("--queues", help=f"comma-separated queues to serve (default: {queues})")
        parser.add_argument(
            "--concurrency", type=int, help=f"jobs run at once (default {now.concurrency})"
        )
        parser.add_argument(
            "--poll-interval",
            type=float,
            help=f"seconds between fallback polls (default {now.poll_interval:g})",
        )
        parser.add_argument(
            "--import",
            dest="imports",
            action="append",
            metavar="MODULE",
            help="module that registers tasks, besides the apps' tasks modules; repeatable",
        )
        parser.add_argument(
            "--burst", action="store_true", help="run until no job is due, then exit"
        )
        parser.add_argument(
            "--metrics-port", type=int, help="serve Prometheus metrics on this port"
        )
        parser.add_argument("--host", help=f"address for --metrics-port (default {host})")

    def handle(self, *args: Any, **options: Any) -> None:
        imports = options["imports"]
        try:
            settings = notifyq_settings(
                queues=options["queues"],
                concurrency=options["concurrency"],
                poll_interval=options["poll_interval"],
                host=options["host"],
            )
            if imports:
                settings = settings.model_copy(
                    update={"imports": [*settings.imports, *_names(imports)]}
                )
            registry = django_registry(settings, autodiscover=autodiscover())
            run_worker(
                settings, registry, burst=options["burst"], metrics_port=options["metrics_port"]
            )
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        except Exception as exc:
            message = one_line(exc)
            if message is None:
                raise  # a bug: its traceback says more
            raise CommandError(message) from exc
        if getattr(self, "_called_from_command_line", False):
            # The process ends now: without waiting for abandoned handler threads, as `notifyq
            # worker` does. (From call_command, in a test say, the caller goes on.)
            release_orm_thread()
            exit_now_if_threads_hang()


def _names(imports: list[str]) -> list[str]:
    return [name.strip() for value in imports for name in value.split(",") if name.strip()]
