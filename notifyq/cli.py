"""The ``notifyq`` command: migrate, serve, worker, enqueue, status.

Settings are built here, from the environment and the flags, and passed down. Every failure
ends with one line on stderr saying what to do, and a non-zero exit code.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import anyio

from notifyq import __version__
from notifyq.errors import InvalidJob, NotifyQError

logger = logging.getLogger("notifyq")

EXIT_ERROR = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"notifyq: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="notifyq",
        description="A PostgreSQL job queue that starts jobs the instant they are committed.",
    )
    parser.add_argument("--version", action="version", version=f"notifyq {__version__}")
    parser.add_argument("--database-url", help="libpq URL of the database (default: $DATABASE_URL)")
    parser.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="default: $NOTIFYQ_LOG_LEVEL or INFO",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    commands.add_parser("migrate", help="apply the SQL migrations (idempotent)")

    def worker_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--queues", help="comma-separated queues to serve (default: all)")
        p.add_argument("--concurrency", type=_positive_int, help="jobs run at once (default 10)")
        p.add_argument("--poll-interval", type=_seconds, help="seconds between fallback polls")
        p.add_argument(
            "--import",
            dest="imports",
            action="append",
            metavar="MODULE",
            help="module that registers tasks; repeat or comma-separate",
        )

    serve = commands.add_parser("serve", help="run the HTTP API (with a worker inside)")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=_int, help="port to bind (default 8000)")
    serve.add_argument("--no-worker", action="store_true", help="serve the API only")
    worker_options(serve)

    worker = commands.add_parser("worker", help="run a standalone worker")
    worker_options(worker)
    worker.add_argument("--burst", action="store_true", help="run until no job is due, then exit")

    enqueue = commands.add_parser("enqueue", help="enqueue a job and print its id")
    enqueue.add_argument("task", metavar="TASK")
    enqueue.add_argument("payload", metavar="PAYLOAD_JSON", nargs="?", default="{}")
    enqueue.add_argument("--queue", default="default")
    enqueue.add_argument("--priority", type=_int, default=0)
    enqueue.add_argument("--delay", type=_seconds, help="seconds before the job may start")
    enqueue.add_argument("--dedup-key")
    enqueue.add_argument("--max-attempts", type=_positive_int)

    status = commands.add_parser("status", help="print a job as JSON")
    status.add_argument("job_id", metavar="JOB_ID")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``notifyq`` command; answers the exit code."""
    args = build_parser().parse_args(argv)
    try:
        settings = _settings(args)
        _configure_logging(settings.log_level)
        command: Callable[[argparse.Namespace, Any], int] = _COMMANDS[args.command]
        return command(args, settings)
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        error = _first_notifyq_error(exc)
        if error is None:
            raise
        print(f"notifyq: error: {error}", file=sys.stderr)
        return EXIT_ERROR


def _first_notifyq_error(exc: BaseException) -> NotifyQError | None:
    if isinstance(exc, NotifyQError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _first_notifyq_error(inner)
        if found is not None:
            return found
    return None


def _settings(args: argparse.Namespace) -> Any:
    from notifyq.settings import Settings

    overrides: dict[str, Any] = {
        "database_url": args.database_url,
        "log_level": args.log_level,
    }
    if getattr(args, "queues", None) is not None:
        overrides["queues"] = args.queues
    for name in ("concurrency", "poll_interval", "host", "port"):
        overrides[name] = getattr(args, name, None)
    if getattr(args, "imports", None):
        overrides["imports"] = ",".join(args.imports)
    if getattr(args, "no_worker", False):
        overrides["run_worker"] = False
    return Settings.load(**overrides)


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- commands ---------------------------------------------------------------------------


def _migrate(args: argparse.Namespace, settings: Any) -> int:
    from notifyq.migrations import latest_version, migrate

    applied = anyio.run(lambda: migrate(settings, progress=_say))
    state = f"{len(applied)} migration(s) applied" if applied else "nothing to apply"
    _say(f"notifyq: database is up to date (schema version {latest_version()}; {state})")
    return 0


def _prepare_tasks(settings: Any) -> None:
    # A console script does not have the current folder on sys.path; --import mytasks should
    # find ./mytasks.py as `python -m` would.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    from notifyq.tasks import import_modules

    import_modules(settings.imports)


def _worker(args: argparse.Namespace, settings: Any) -> int:
    from notifyq.migrations import migrate
    from notifyq.worker import Worker

    _prepare_tasks(settings)

    async def run() -> None:
        if settings.auto_migrate:
            await migrate(settings)
        worker = Worker(settings, burst=args.burst)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_stop_on_signals, worker.stop)
            await worker.run()
            tg.cancel_scope.cancel()

    anyio.run(run)
    return 0


async def _stop_on_signals(stop: Callable[[], None]) -> None:
    """The first SIGTERM/SIGINT stops gracefully; a second one exits at once (leases then
    bring the interrupted jobs back)."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        received = 0
        async for signum in signals:
            received += 1
            if received == 1:
                logger.info(
                    "received %s: draining (send it again to exit at once)",
                    signal.Signals(signum).name,
                )
                stop()
            else:
                logger.warning("received %s again: exiting at once", signal.Signals(signum).name)
                logging.shutdown()
                os._exit(128 + signum)


def _serve(args: argparse.Namespace, settings: Any) -> int:
    import uvicorn

    from notifyq.api import create_app
    from notifyq.migrations import migrate

    _prepare_tasks(settings)
    # Migrate (and so prove the database answers) before uvicorn starts, so that a bad URL is
    # one line of error instead of a failed lifespan.
    anyio.run(lambda: migrate(settings, progress=_say))
    app = create_app(settings.model_copy(update={"auto_migrate": False}))
    server = _make_server(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level.lower(),
            lifespan="on",
            timeout_graceful_shutdown=int(settings.shutdown_grace) + 5,
        )
    )
    _say(f"notifyq: serving http://{settings.host}:{settings.port} (docs at /docs)")
    server.run()
    if not server.started:
        raise _Failed("the server did not start; see the log above")
    return 0


class _Failed(NotifyQError):
    """A command could not do its job; the message says why."""


def _make_server(config: Any) -> Any:
    import contextlib

    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, except that a graceful stop exits 0 instead of re-raising the
        signal, and a second signal exits at once."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit:
                logging.shutdown()
                os._exit(128 + sig)
            self.should_exit = True

        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            handled = (signal.SIGINT, signal.SIGTERM)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server(config)


def _enqueue(args: argparse.Namespace, settings: Any) -> int:
    from notifyq.client import Queue

    try:
        payload = json.loads(args.payload)
    except json.JSONDecodeError as exc:
        raise InvalidJob(
            f"PAYLOAD_JSON is not valid JSON ({exc}); quote it: '{{\"n\": 1}}'"
        ) from None
    if not isinstance(payload, dict):
        raise InvalidJob("PAYLOAD_JSON must be a JSON object, like '{\"n\": 1}'")

    async def run() -> Any:
        async with Queue(settings=settings, pool_size=1) as q:
            return await q.enqueue(
                args.task,
                payload,
                queue=args.queue,
                priority=args.priority,
                delay=args.delay,
                dedup_key=args.dedup_key,
                max_attempts=args.max_attempts,
            )

    result = anyio.run(run)
    print(result.job_id)
    if result.duplicate:
        _say("notifyq: replaced the queued job with the same dedup key")
    return 0


def _status(args: argparse.Namespace, settings: Any) -> int:
    from notifyq.api import JobOut
    from notifyq.client import Queue

    async def run() -> Any:
        async with Queue(settings=settings, pool_size=1) as q:
            return await q.get(args.job_id)

    job = anyio.run(run)
    if job is None:
        raise _Failed(f"no job with id {args.job_id}")
    print(JobOut.of(job).model_dump_json(indent=2))
    return 0


_COMMANDS: dict[str, Callable[[argparse.Namespace, Any], int]] = {
    "migrate": _migrate,
    "serve": _serve,
    "worker": _worker,
    "enqueue": _enqueue,
    "status": _status,
}
