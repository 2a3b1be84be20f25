"""The commands that run processes: ``migrate``, ``worker``, ``serve`` and ``dev``.

Each builds and checks what it can (its tasks, their settings, the address or port it binds)
before it touches the database, so that a mistake costs one line and changes nothing; then it
migrates (or checks the schema, for a role that may not change it), then runs.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import TYPE_CHECKING

import anyio

from notifyq import guards
from notifyq.bootstrap import dev_database, reset_embedded
from notifyq.cli._args import DevArgs, MigrateArgs, ServeArgs, WorkerArgs
from notifyq.cli._errors import Failed
from notifyq.cli._output import progress, say
from notifyq.db import database_url, redact
from notifyq.errors import describe
from notifyq.migrations import latest_version
from notifyq.migrations import migrate as apply_migrations
from notifyq.process import before_hard_exit, migrate_or_check, one_line, run_worker, settle_heap
from notifyq.settings import Settings

if TYPE_CHECKING:
    from notifyq.tasks import Registry

logger = logging.getLogger("notifyq")


def migrate(args: MigrateArgs, settings: Settings) -> int:
    """Brings the schema up to date and says so."""
    applied = anyio.run(lambda: apply_migrations(settings, progress=progress))
    state = f"{len(applied)} migration(s) applied" if applied else "nothing to apply"
    say(f"notifyq: database is up to date (schema version {latest_version()}; {state})")
    return 0


def _prepare_tasks(settings: Settings) -> None:
    # A console script does not have the current folder on sys.path; --import mytasks should
    # find ./mytasks.py as `python -m` would.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    from notifyq.tasks import import_modules

    import_modules(settings.imports)


def _registry(settings: Settings) -> Registry:
    """What a worker of this process serves, with the settings of the built-in tasks (a bad
    one stops the command here): after --import, so that every @task is in it."""
    from notifyq.builtins import worker_registry
    from notifyq.contrib import ContribSettings

    return worker_registry(contrib=ContribSettings.load())


def worker(args: WorkerArgs, settings: Settings) -> int:
    """Runs a standalone worker until SIGTERM/SIGINT (or, with --burst, until nothing is due)."""
    # All that needs no database first: a mistake in any of it stops the command before it
    # migrates (run_worker serves the metrics port before it does).
    _prepare_tasks(settings)
    registry = _registry(settings)
    try:
        run_worker(settings, registry, burst=args.burst, metrics_port=args.metrics_port)
    except Exception as exc:
        if one_line(exc) is not None:
            raise  # a failure main() reports in one line
        # A bug: keep its traceback in the log, end with one line, exit 1 (a supervisor
        # restarts the worker; its jobs come back when their leases run out).
        logger.error("the worker stopped on an unexpected error", exc_info=exc)
        raise Failed(
            f"the worker stopped on an unexpected error ({describe(exc)}); its traceback is "
            "in the log above"
        ) from exc
    return 0


def serve(args: ServeArgs, settings: Settings) -> int:
    """Serves the API (with a worker inside, unless --no-worker) until SIGTERM/SIGINT."""
    registry = _prepare_server(settings)
    url = f"http://{settings.host}:{settings.port}"
    return _run_server(settings, registry, [f"notifyq: serving {url} (docs at {url}/docs)"])


def dev(args: DevArgs, settings: Settings) -> int:
    """``serve`` on the database of ``notifyq dev`` (an embedded one when DATABASE_URL is
    unset; see notifyq.bootstrap), with a banner that says how to try it."""
    # Before any server is started (or any data deleted): the checks need no database.
    registry = _prepare_server(settings)
    if args.reset:
        folder = reset_embedded(settings, say=progress)
        say(f"notifyq: reset: {folder} is gone; a new cluster is made now")
    with dev_database(settings, say=progress) as database, before_hard_exit(database.release):
        # A second Ctrl-C exits at once, but still lets go of the server (its last user
        # stops it).
        ready = database.settings
        url = f"http://{ready.host}:{ready.port}"
        banner = dev_banner(url, redact(database_url(ready)))
        return _run_server(ready, registry, banner)


def dev_banner(url: str, database: str) -> list[str]:
    """What ``notifyq dev`` says before it serves (the README's first screen shows it). The
    docs come first: the page where a new user sees every route and tries it."""
    return [
        f"notifyq dev: docs     {url}/docs (start here: every route, and a Try it out button)",
        f"notifyq dev: API      {url}",
        f"notifyq dev: database {database}",
        f"notifyq dev: try      curl -X POST {url}/jobs -H 'content-type: application/json' "
        """-d '{"task": "hello_world", "payload": {}}'""",
        "notifyq dev: Ctrl-C stops it",
    ]


def _prepare_server(settings: Settings) -> Registry | None:
    """What ``serve`` and ``dev`` check and build before they touch a database: the address
    they bind (refused when public without a token), the tasks, and the registry of the
    worker inside (None without one: an API without a worker runs no task, so it does not
    read the tasks' settings)."""
    refusal = guards.bind_refusal(settings)
    if refusal is not None:
        raise Failed(refusal)
    _prepare_tasks(settings)
    return _registry(settings) if settings.run_worker else None


def _run_server(settings: Settings, registry: Registry | None, banner: list[str]) -> int:
    import uvicorn

    from notifyq.api import create_app
    from notifyq.cli._uvicorn import Server

    # Migrate (or check the schema) before uvicorn starts, proving that the database
    # answers: a bad URL is one line of error, not a failed lifespan.
    anyio.run(functools.partial(migrate_or_check, settings, report=progress))
    app = create_app(settings.model_copy(update={"auto_migrate": False}), registry=registry)
    server = Server(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level.lower(),
            log_config=None,
            lifespan="on",
            timeout_graceful_shutdown=int(settings.shutdown_grace) + 5,
            # A request's line and headers, the time to send them and the body, and the
            # connections are bounded before any middleware runs.
            **guards.uvicorn_http_options(settings),
        )
    )

    def forget_idle_mark() -> None:
        supervisor = getattr(app.state, "supervisor", None)
        if supervisor is not None and supervisor.worker is not None:
            supervisor.worker.forget_idle_mark()

    for line in banner:
        say(line)
    settle_heap()
    with before_hard_exit(forget_idle_mark):
        server.run()
    if not server.started:
        raise Failed("the server did not start; see the log above")
    return 0
