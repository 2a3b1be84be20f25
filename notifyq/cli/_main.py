"""The ``notifyq`` command: migrate, serve, worker, enqueue, status.

Settings are built here, from the environment and the flags, and passed down. Every failure
ends with one line on stderr saying what to do, and a non-zero exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import anyio

from notifyq._version import __version__
from notifyq.bootstrap import dev_database, require_database, reset_embedded
from notifyq.cli._errors import EXIT_ERROR, EXIT_USAGE
from notifyq.cli._errors import Failed as _Failed
from notifyq.cli._errors import one_line as _one_line
from notifyq.cli._output import duration, jobs_table, progress, queue_table, tasks_table, use_color
from notifyq.cli._output import say as _say
from notifyq.cli._signals import before_hard_exit, exit_now_if_threads_hang, stop_on_signals
from notifyq.db import redact
from notifyq.errors import InvalidJob, describe
from notifyq.logs import configure as configure_logging

logger = logging.getLogger("notifyq")


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

    def common_options(p: argparse.ArgumentParser, default: Any) -> None:
        p.add_argument(
            "--database-url",
            default=default,
            help="libpq URL of the database (default: $DATABASE_URL)",
        )
        p.add_argument(
            "--log-level",
            choices=["DEBUG", "INFO", "WARNING", "ERROR"],
            type=str.upper,
            default=default,
            help="default: $NOTIFYQ_LOG_LEVEL or INFO",
        )

    common_options(parser, None)
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
    worker.add_argument(
        "--metrics-port", type=_int, help="serve Prometheus metrics on this port (host: --host)"
    )
    worker.add_argument("--host", help="address for --metrics-port (default 127.0.0.1)")

    enqueue = commands.add_parser("enqueue", help="enqueue a job and print its id")
    enqueue.add_argument("task", metavar="TASK")
    enqueue.add_argument("payload", metavar="PAYLOAD_JSON", nargs="?", default="{}")
    enqueue.add_argument("--queue", help="default: the task's queue, else 'default'")
    enqueue.add_argument("--priority", type=_int, help="default: the task's, else 0")
    enqueue.add_argument("--delay", type=_seconds, help="seconds before the job may start")
    enqueue.add_argument("--dedup-key")
    enqueue.add_argument("--max-attempts", type=_positive_int)

    dev = commands.add_parser(
        "dev",
        help="zero setup: embedded PostgreSQL (when DATABASE_URL is unset), API and worker",
    )
    dev.add_argument("--host", help="address to bind (default 127.0.0.1)")
    dev.add_argument("--port", type=_int, help="port to bind (default 8000)")
    dev.add_argument(
        "--reset", action="store_true", help="delete the embedded PostgreSQL's data first"
    )
    worker_options(dev)

    status = commands.add_parser("status", help="print a job as JSON")
    status.add_argument("job_id", metavar="JOB_ID")

    retry = commands.add_parser(
        "retry", help="requeue failed (or cancelled) jobs: by id, or all matching the filters"
    )
    retry.add_argument("job_ids", metavar="JOB_ID", nargs="*")
    retry.add_argument("--task", help="every failed job of this task")
    retry.add_argument("--queue", help="every failed job of this queue")
    retry.add_argument("--status", choices=["failed", "cancelled"], default="failed")
    retry.add_argument("--all", action="store_true", help="every failed job, whatever its task")

    cancel = commands.add_parser(
        "cancel", help="cancel queued jobs, or ask the workers of running ones to stop them"
    )
    cancel.add_argument("job_ids", metavar="JOB_ID", nargs="+")

    commands.add_parser("tasks", help="list the tasks workers registered, with their options")

    grant = commands.add_parser(
        "grant",
        help="give a database role the least privileges of a producer or of a worker (and API)",
    )
    grant.add_argument("role", metavar="ROLE")
    grant.add_argument(
        "--as",
        dest="kind",
        choices=["producer", "worker"],
        required=True,
        help="producer: enqueue and read jobs; worker: run workers and the API (no DDL)",
    )
    grant.add_argument(
        "--print", action="store_true", help="print the GRANT statements instead of running them"
    )

    prune = commands.add_parser(
        "prune", help="delete finished jobs past their keep time (NOTIFYQ_KEEP_*) now"
    )
    prune.add_argument("--batch", type=_positive_int, default=1000)

    commands.add_parser(
        "bench",
        help="measure latency and throughput against targets (needs notifyq-bench; "
        "notifyq bench --help)",
    )

    queue = commands.add_parser(
        "queue", help="pause, resume, rate-limit a queue, or switch its notifications"
    )
    queue.add_argument("name", metavar="QUEUE")
    state = queue.add_mutually_exclusive_group()
    state.add_argument("--pause", action="store_true", help="workers stop claiming its jobs")
    state.add_argument("--resume", action="store_true", help="workers claim its jobs again")
    queue.add_argument(
        "--rate-limit",
        type=_seconds,
        metavar="JOBS_PER_SECOND",
        help="jobs started per second across all workers; 0 removes the limit",
    )
    queue.add_argument(
        "--notify",
        choices=["on", "off"],
        help="whether inserts wake workers (off: a bulk-fed queue drained by polling)",
    )

    commands.add_parser("stats", help="a table of the queues and their counts")
    top = commands.add_parser("top", help="the queues table, refreshed until Ctrl-C")
    top.add_argument("--interval", type=_seconds, default=1.0, help="seconds between refreshes")

    jobs = commands.add_parser("jobs", help="list jobs, newest first")
    jobs.add_argument(
        "--status", choices=["queued", "processing", "completed", "failed", "cancelled"]
    )
    jobs.add_argument("--task")
    jobs.add_argument("--queue")
    jobs.add_argument("--limit", type=_positive_int, default=20)
    jobs.add_argument("--json", action="store_true", help="one JSON object per line")
    # The common options after the command too (`notifyq serve --log-level WARNING`); SUPPRESS
    # keeps a command from overwriting a value given before it.
    for command in commands.choices.values():
        if command.prog.split()[-1] != "bench":
            common_options(command, argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``notifyq`` command; answers the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        # The bench parses its own options (argparse would take them for ours). It is a
        # distribution of its own, notifyq-bench, so that the notifyq wheel carries none of it.
        try:
            from notifyq_bench import main as bench
        except ModuleNotFoundError as exc:
            if exc.name != "notifyq_bench":
                raise  # the bench is there but broken: its traceback says more than we could
            print(
                "notifyq bench: needs notifyq-bench; from a source checkout: "
                "pip install -e ./benchmarks",
                file=sys.stderr,
            )
            return 2
        code: int = bench(argv[1:])
        return code
    args = build_parser().parse_args(argv)
    try:
        settings = _settings(args)
        configure_logging(settings.log_level, settings.log_format)
        command: Callable[[argparse.Namespace, Any], int] = _COMMANDS[args.command]
        # `notifyq dev` finds its own database (see notifyq.bootstrap), after its checks.
        if args.command != "dev" and not (args.command == "grant" and args.print):
            require_database(settings)
        code = command(args, settings)
        if args.command in ("worker", "serve", "dev"):
            exit_now_if_threads_hang()
        return code
    except KeyboardInterrupt:
        return 130
    except asyncio.CancelledError:
        # Ctrl-C on Python 3.10: anyio cancels the main task, and the cancellation (not a
        # KeyboardInterrupt, as on 3.11) ends up here. No event loop runs at this level, so
        # nothing else can have cancelled it.
        return 130
    except BrokenPipeError:
        # `notifyq jobs | head`: the reader left; not an error of ours.
        sys.stdout = open(os.devnull, "w")  # nothing more is written
        return 0
    except BaseException as exc:
        message = _one_line(exc)
        if message is None:
            raise
        print(f"notifyq: error: {message}", file=sys.stderr)
        return EXIT_ERROR


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


# -- commands ---------------------------------------------------------------------------


def _migrate(args: argparse.Namespace, settings: Any) -> int:
    from notifyq.migrations import latest_version, migrate

    applied = anyio.run(lambda: migrate(settings, progress=progress))
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
    from notifyq.builtins import worker_registry
    from notifyq.contrib import ContribSettings
    from notifyq.migrations import check_schema, migrate
    from notifyq.worker import Worker

    _prepare_tasks(settings)
    # Built before the database is touched, so a bad contrib setting stops the command before
    # it migrates; and after --import, so that every @task is in it.
    registry = worker_registry(contrib=ContribSettings.load())

    async def run() -> None:
        if settings.auto_migrate:
            await migrate(settings)
        else:
            await check_schema(settings)
        metrics = None
        if args.metrics_port is not None:
            from prometheus_client import start_http_server

            from notifyq.metrics import Metrics

            metrics = Metrics()
            start_http_server(args.metrics_port, addr=settings.host, registry=metrics.registry)
            _say(f"notifyq: metrics at http://{settings.host}:{args.metrics_port}/metrics")
        worker = Worker(settings, registry, burst=args.burst, metrics=metrics, report_depth=True)
        with before_hard_exit(worker.forget_idle_mark):
            _settle_heap()
            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_on_signals, worker.stop)
                await worker.run()
                tg.cancel_scope.cancel()

    try:
        anyio.run(run, backend_options={"use_uvloop": _has_uvloop()})
    except Exception as exc:
        if _one_line(exc) is not None:
            raise  # a failure main() reports in one line
        # A bug: keep its traceback in the log, end with one line, exit 1 (a supervisor
        # restarts the worker; its jobs come back when their leases run out).
        logger.error("the worker stopped on an unexpected error", exc_info=exc)
        raise _Failed(
            f"the worker stopped on an unexpected error ({describe(exc)}); its traceback is "
            "in the log above"
        ) from exc
    return 0


def _has_uvloop() -> bool:
    """Whether uvloop is installed (it is, except on Windows): its event loop spends about
    half the CPU of asyncio's on a worker's round trips to the database."""
    import importlib.util

    return importlib.util.find_spec("uvloop") is not None


def _settle_heap() -> None:
    """Tunes the garbage collector for a long-running server, once everything is imported and
    built: what exists now lives as long as the process, so it is frozen out of collections;
    and the youngest generation is collected every 10,000 allocations instead of 700. A job
    or a request allocates hundreds of objects, nearly all freed by reference counting, and
    with the defaults the collector cost the API and the worker about a tenth of their CPU."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, *gc.get_threshold()[1:])


def _dev(args: argparse.Namespace, settings: Any) -> int:
    if args.reset:
        folder = reset_embedded(settings, say=progress)
        _say(f"notifyq: reset: {folder} is gone; a new cluster is made now")
    with dev_database(settings, say=progress) as database, before_hard_exit(database.release):
        # A second Ctrl-C exits at once, but still lets go of the server (its last user
        # stops it).
        return _dev_server(database.settings)


def _dev_server(settings: Any) -> int:
    url = f"http://{settings.host}:{settings.port}"
    banner = [
        f"notifyq dev: API      {url}",
        f"notifyq dev: docs     {url}/docs",
        f"notifyq dev: database {redact(settings.database_url)}",
        f"notifyq dev: try      curl -X POST {url}/jobs -H 'content-type: application/json' "
        """-d '{"task": "hello_world", "payload": {}}'""",
        "notifyq dev: Ctrl-C stops it",
    ]
    return _run_server(settings, banner)


def _serve(args: argparse.Namespace, settings: Any) -> int:
    url = f"http://{settings.host}:{settings.port}"
    return _run_server(settings, [f"notifyq: serving {url} (docs at {url}/docs)"])


def _run_server(settings: Any, banner: list[str]) -> int:
    import uvicorn

    from notifyq import guards
    from notifyq.api import create_app
    from notifyq.builtins import worker_registry
    from notifyq.cli._uvicorn import Server
    from notifyq.contrib import ContribSettings
    from notifyq.migrations import check_schema, migrate

    refusal = guards.bind_refusal(settings)
    if refusal is not None:
        raise _Failed(refusal)
    _prepare_tasks(settings)
    # As for `notifyq worker`: before migrating, and after --import. An API without a worker
    # runs no task, so it does not read the tasks' settings.
    registry = worker_registry(contrib=ContribSettings.load()) if settings.run_worker else None
    # Migrate (or check the schema, for a role that may not change it) before uvicorn starts,
    # proving that the database answers: a bad URL is one line of error, not a failed lifespan.
    if settings.auto_migrate:
        anyio.run(lambda: migrate(settings, progress=progress))
    else:
        anyio.run(check_schema, settings)
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
            # A request's line and headers are capped before any middleware runs.
            **guards.uvicorn_http_options(settings.max_header_bytes),
        )
    )

    def forget_idle_mark() -> None:
        supervisor = getattr(app.state, "supervisor", None)
        if supervisor is not None and supervisor.worker is not None:
            supervisor.worker.forget_idle_mark()

    for line in banner:
        _say(line)
    _settle_heap()
    with before_hard_exit(forget_idle_mark):
        server.run()
    if not server.started:
        raise _Failed("the server did not start; see the log above")
    return 0


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


def _retry(args: argparse.Namespace, settings: Any) -> int:
    from notifyq.client import Queue
    from notifyq.models import JobStatus

    if not args.job_ids and not (args.task or args.queue or args.all):
        raise _Failed("name JOB_IDs, or choose jobs with --task, --queue or --all")

    async def run() -> tuple[int, list[str]]:
        async with Queue(settings=settings, pool_size=1) as q:
            if not args.job_ids:
                count = await q.store.retry_jobs(
                    status=JobStatus(args.status), task=args.task, queue=args.queue
                )
                return count, []
            refused = []
            for job_id in args.job_ids:
                if not await q.store.retry_job(_parse_job_id(job_id)):
                    job = await q.get(job_id)
                    state = "unknown" if job is None else job.status.value
                    refused.append(f"{job_id} ({state})")
            return len(args.job_ids) - len(refused), refused

    count, refused = anyio.run(run)
    print(f"requeued {count} job(s)")
    if refused:
        raise _Failed("not requeued, as they are not failed or cancelled: " + ", ".join(refused))
    return 0


def _jobs(args: argparse.Namespace, settings: Any) -> int:
    from notifyq.api import JobOut
    from notifyq.client import Queue
    from notifyq.models import JobStatus

    async def run() -> Any:
        async with Queue(settings=settings, pool_size=1) as q:
            return await q.store.list_jobs(
                status=JobStatus(args.status) if args.status else None,
                task=args.task,
                queue=args.queue,
                limit=args.limit,
            )

    jobs = anyio.run(run)
    if args.json:
        for job in jobs:
            print(JobOut.of(job).model_dump_json())
        return 0
    for line in jobs_table(jobs):
        print(line)
    return 0


def _queue(args: argparse.Namespace, settings: Any) -> int:
    from notifyq.client import Queue

    async def run() -> list[dict[str, Any]]:
        async with Queue(settings=settings, pool_size=1) as q:
            await q.store.configure_queue(
                args.name,
                paused=True if args.pause else False if args.resume else None,
                rate_limit=args.rate_limit,
                notify=None if args.notify is None else args.notify == "on",
            )
            return [r for r in await q.store.queue_stats() if r["queue"] == args.name]

    from notifyq.models import check_name

    check_name("queue", args.name)
    for line in queue_table(anyio.run(run), color=use_color()):
        print(line)
    return 0


def _stats(args: argparse.Namespace, settings: Any) -> int:
    from notifyq.client import Queue

    async def run() -> list[dict[str, Any]]:
        async with Queue(settings=settings, pool_size=1) as q:
            return await q.store.queue_stats()

    for line in queue_table(anyio.run(run), color=use_color()):
        print(line)
    return 0


def _top(args: argparse.Namespace, settings: Any) -> int:
    from notifyq.client import Queue
    from notifyq.errors import DatabaseUnavailable

    color = use_color()
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""

    async def run() -> None:
        async with Queue(settings=settings, pool_size=1) as q:
            while True:
                try:
                    lines = queue_table(await q.store.queue_stats(), color=color)
                except DatabaseUnavailable as exc:
                    lines = [f"database unavailable ({exc}); retrying"]
                stamp = time.strftime("%H:%M:%S")
                print(f"{clear}notifyq top  {stamp}  (Ctrl-C quits)\n", flush=False)
                print("\n".join(lines), flush=True)
                await anyio.sleep(args.interval)

    try:
        anyio.run(run)
    except KeyboardInterrupt:
        pass
    return 0


def _parse_job_id(text: str) -> Any:
    from uuid import UUID

    try:
        return UUID(text)
    except ValueError:
        raise InvalidJob(f"{text!r} is not a job id (a UUID)") from None


def _cancel(args: argparse.Namespace, settings: Any) -> int:
    from notifyq.client import Queue

    async def run() -> list[str]:
        lines = []
        async with Queue(settings=settings, pool_size=1) as q:
            for text in args.job_ids:
                outcome = await q.store.cancel_job(_parse_job_id(text))
                if outcome is None:
                    lines.append(f"{text}: no such job")
                elif outcome.was.finished:
                    lines.append(f"{text}: already {outcome.was.value}")
                elif outcome.now.finished:
                    lines.append(f"{text}: cancelled")
                else:
                    lines.append(f"{text}: running; its worker was asked to stop it")
        return lines

    lines = anyio.run(run)
    for line in lines:
        print(line)
    failed = [line for line in lines if line.endswith("no such job") or "already" in line]
    if failed:
        raise _Failed(f"{len(failed)} of {len(lines)} job(s) could not be cancelled")
    return 0


def _tasks(args: argparse.Namespace, settings: Any) -> int:
    from notifyq.client import Queue

    async def run() -> list[dict[str, Any]]:
        async with Queue(settings=settings, pool_size=1) as q:
            return await q.store.list_tasks()

    for line in tasks_table(anyio.run(run)):
        print(line)
    return 0


def _prune(args: argparse.Namespace, settings: Any) -> int:
    from notifyq.client import Queue
    from notifyq.worker import prune

    async def run() -> int:
        async with Queue(settings=settings, pool_size=1) as q:
            return await prune(q.store, settings, batch=args.batch)

    keeps = ", ".join(
        f"{name} after {duration(value)}"
        for name, value in (
            ("completed", settings.keep_completed),
            ("failed", settings.keep_failed),
            ("cancelled", settings.keep_cancelled),
        )
        if value is not None
    )
    _say(f"notifyq: deleting finished jobs: {keeps or 'nothing (all kept for good)'}")
    print(f"deleted {anyio.run(run)} job(s)")
    return 0


def _grant(args: argparse.Namespace, settings: Any) -> int:
    from notifyq.grants import grant, statements

    if args.print:
        for statement in statements(args.role, args.kind):
            print(f"{statement.as_string(None)};")
        return 0
    grant(settings, args.role, args.kind)
    _say(f"notifyq: {args.role} has the privileges of a {args.kind} now")
    return 0


_COMMANDS: dict[str, Callable[[argparse.Namespace, Any], int]] = {
    "grant": _grant,
    "cancel": _cancel,
    "tasks": _tasks,
    "prune": _prune,
    "dev": _dev,
    "stats": _stats,
    "queue": _queue,
    "top": _top,
    "retry": _retry,
    "jobs": _jobs,
    "migrate": _migrate,
    "serve": _serve,
    "worker": _worker,
    "enqueue": _enqueue,
    "status": _status,
}
