"""``main``: reads the command line, builds the settings (the environment's, with the flags
over them), finds the database of this process, runs the command and turns its failure into
one line on stderr and an exit code."""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

import anyio

from notifyq import guards
from notifyq.bootstrap import dev_database, require_database, reset_embedded
from notifyq.cli._args import (
    Arguments,
    CancelArgs,
    DevArgs,
    EnqueueArgs,
    GrantArgs,
    JobsArgs,
    MigrateArgs,
    PruneArgs,
    QueueArgs,
    RetryArgs,
    ServeArgs,
    StatsArgs,
    StatusArgs,
    TasksArgs,
    TopArgs,
    WorkerArgs,
)
from notifyq.cli._errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, Failed, one_line
from notifyq.cli._output import (
    duration,
    jobs_table,
    progress,
    queue_table,
    say,
    tasks_table,
    use_color,
)
from notifyq.cli._parser import arguments, build_parser
from notifyq.cli._signals import before_hard_exit, exit_now_if_threads_hang, stop_on_signals
from notifyq.client import Queue
from notifyq.db import database_url, redact
from notifyq.errors import DatabaseUnavailable, InvalidJob, describe
from notifyq.grants import grant as run_grants
from notifyq.grants import statements
from notifyq.logs import configure as configure_logging
from notifyq.migrations import check_schema, latest_version
from notifyq.migrations import migrate as apply_migrations
from notifyq.models import Cancelled, EnqueueResult, Job, JobStatus, check_name
from notifyq.settings import Settings

if TYPE_CHECKING:
    from notifyq.tasks import Registry

A = TypeVar("A", bound=Arguments)

logger = logging.getLogger("notifyq")


@dataclass(frozen=True)
class Invocation:
    """A command with its typed arguments, to run with the settings they lead to."""

    arguments: Arguments
    run: Callable[[Settings], int]


def _command(
    kind: type[A], run: Callable[[A, Settings], int]
) -> Callable[[argparse.Namespace], Invocation]:
    """Pairs a command's function with the type of its arguments."""

    def bind(namespace: argparse.Namespace) -> Invocation:
        args = arguments(kind, namespace)
        return Invocation(args, lambda settings: run(args, settings))

    return bind


# -- from _running ----------------------------------------


def migrate(args: MigrateArgs, settings: Settings) -> int:
    """Brings the schema up to date and says so."""
    applied = anyio.run(lambda: apply_migrations(settings, progress=progress))
    state = f"{len(applied)} migration(s) applied" if applied else "nothing to apply"
    say(f"notifyq: database is up to date (schema version {latest_version()}; {state})")
    return 0


async def _migrate_or_check(
    settings: Settings, *, report: Callable[[str], None] | None = progress
) -> None:
    """Migrates, saying each step to ``report`` (None: to the log), or only checks the schema
    when NOTIFYQ_AUTO_MIGRATE is off."""
    if settings.auto_migrate:
        await apply_migrations(settings, progress=report)
    else:
        await check_schema(settings)


def _prepare_tasks(settings: Settings) -> None:
    # A console script does not have the current folder on sys.path; --import mytasks should
    # find ./mytasks.py as `python -m` would.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    from notifyq.tasks import import_modules

    import_modules(settings.imports)


def _registry(settings: Settings) -> Registry:
    """What a worker of this process serves, with the settings of the built-in tasks: after
    --import, so that every @task is in it."""
    from notifyq.builtins import worker_registry
    from notifyq.contrib import ContribSettings

    return worker_registry(contrib=ContribSettings.load())


def worker(args: WorkerArgs, settings: Settings) -> int:
    """Runs a standalone worker until SIGTERM/SIGINT (or, with --burst, until nothing is due)."""
    from notifyq.worker import Worker

    _prepare_tasks(settings)
    # Built before the database is touched, so a bad contrib setting stops the command before
    # it migrates.
    registry = _registry(settings)

    async def run() -> None:
        await _migrate_or_check(settings, report=None)
        metrics = None
        if args.metrics_port is not None:
            from prometheus_client import start_http_server

            from notifyq.metrics import Metrics

            metrics = Metrics()
            start_http_server(args.metrics_port, addr=settings.host, registry=metrics.registry)
            say(f"notifyq: metrics at http://{settings.host}:{args.metrics_port}/metrics")
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
    url = f"http://{settings.host}:{settings.port}"
    return _serve_api(settings, [f"notifyq: serving {url} (docs at {url}/docs)"])


def dev(args: DevArgs, settings: Settings) -> int:
    """``serve`` on the database of ``notifyq dev`` (an embedded one when DATABASE_URL is
    unset; see notifyq.bootstrap), with a banner that says how to try it."""
    if args.reset:
        folder = reset_embedded(settings, say=progress)
        say(f"notifyq: reset: {folder} is gone; a new cluster is made now")
    with dev_database(settings, say=progress) as database, before_hard_exit(database.release):
        # A second Ctrl-C exits at once, but still lets go of the server (its last user
        # stops it).
        ready = database.settings
        url = f"http://{ready.host}:{ready.port}"
        banner = [
            f"notifyq dev: API      {url}",
            f"notifyq dev: docs     {url}/docs",
            f"notifyq dev: database {redact(database_url(ready))}",
            f"notifyq dev: try      curl -X POST {url}/jobs -H 'content-type: application/json' "
            """-d '{"task": "hello_world", "payload": {}}'""",
            "notifyq dev: Ctrl-C stops it",
        ]
        return _serve_api(ready, banner)


def _serve_api(settings: Settings, banner: list[str]) -> int:
    import uvicorn

    from notifyq.api import create_app
    from notifyq.cli._uvicorn import Server

    refusal = guards.bind_refusal(settings)
    if refusal is not None:
        raise Failed(refusal)
    _prepare_tasks(settings)
    # As for `notifyq worker`: before migrating, and after --import. An API without a worker
    # runs no task, so it does not read the tasks' settings.
    registry = _registry(settings) if settings.run_worker else None
    # Migrate (or check the schema) before uvicorn starts, proving that the database
    # answers: a bad URL is one line of error, not a failed lifespan.
    anyio.run(_migrate_or_check, settings)
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
        say(line)
    _settle_heap()
    with before_hard_exit(forget_idle_mark):
        server.run()
    if not server.started:
        raise Failed("the server did not start; see the log above")
    return 0


def _has_uvloop() -> bool:
    """Whether uvloop is installed (it is, except on Windows): its event loop spends about
    half the CPU of asyncio's on a worker's round trips to the database."""
    return importlib.util.find_spec("uvloop") is not None


def _settle_heap() -> None:
    """Tunes the garbage collector for a long-running server, once everything is imported and
    built: what exists now lives as long as the process, so it is frozen out of collections;
    and the youngest generation is collected every 10,000 allocations instead of 700. A job
    or a request allocates hundreds of objects, nearly all freed by reference counting, and
    with the defaults the collector cost the API and the worker about a tenth of their CPU."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, *gc.get_threshold()[1:])


# -- from _jobs ----------------------------------------


def _queue(settings: Settings) -> Queue:
    return Queue(settings=settings, pool_size=1)


def _job_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise InvalidJob(f"{text!r} is not a job id (a UUID)") from None


def _payload(text: str) -> dict[str, Any]:
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidJob(
            f"PAYLOAD_JSON is not valid JSON ({exc}); quote it: '{{\"n\": 1}}'"
        ) from None
    if not isinstance(payload, dict):
        raise InvalidJob("PAYLOAD_JSON must be a JSON object, like '{\"n\": 1}'")
    return payload


def _print_json(job: Job, *, indent: int | None = None) -> None:
    # The API's own shape of a job (imported here: it brings FastAPI).
    from notifyq.api import JobOut

    print(JobOut.of(job).model_dump_json(indent=indent))


def enqueue(args: EnqueueArgs, settings: Settings) -> int:
    """Enqueues one job and prints its id."""
    payload = _payload(args.payload)

    async def run() -> EnqueueResult:
        async with _queue(settings) as q:
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
        say("notifyq: replaced the queued job with the same dedup key")
    return 0


def status(args: StatusArgs, settings: Settings) -> int:
    """Prints one job as JSON."""

    async def run() -> Job | None:
        async with _queue(settings) as q:
            return await q.get(args.job_id)

    job = anyio.run(run)
    if job is None:
        raise Failed(f"no job with id {args.job_id}")
    _print_json(job, indent=2)
    return 0


def jobs(args: JobsArgs, settings: Settings) -> int:
    """Lists jobs, newest first: a table, or one JSON object a line."""

    async def run() -> list[Job]:
        async with _queue(settings) as q:
            return await q.store.list_jobs(
                status=JobStatus(args.status) if args.status else None,
                task=args.task,
                queue=args.queue,
                limit=args.limit,
            )

    found = anyio.run(run)
    if args.as_json:
        for job in found:
            _print_json(job)
    else:
        for line in jobs_table(found):
            print(line)
    return 0


def retry(args: RetryArgs, settings: Settings) -> int:
    """Requeues the jobs named (each must be failed or cancelled), or every one the filters
    choose; fails naming those it could not requeue, and their state."""
    if not args.job_ids and not (args.task or args.queue or args.every):
        raise Failed("name JOB_IDs, or choose jobs with --task, --queue or --all")
    # Every id is checked before any job is touched.
    ids = [(text, _job_id(text)) for text in args.job_ids]

    async def run() -> tuple[int, list[str]]:
        async with _queue(settings) as q:
            if not ids:
                count = await q.store.retry_jobs(
                    status=JobStatus(args.status), task=args.task, queue=args.queue
                )
                return count, []
            refused = []
            for text, job_id in ids:
                if not await q.store.retry_job(job_id):
                    job = await q.get(job_id)
                    refused.append(f"{text} ({'unknown' if job is None else job.status.value})")
            return len(ids) - len(refused), refused

    count, refused = anyio.run(run)
    print(f"requeued {count} job(s)")
    if refused:
        raise Failed("not requeued, as they are not failed or cancelled: " + ", ".join(refused))
    return 0


@dataclass(frozen=True)
class CancelReport:
    """What ``notifyq cancel`` found for one job: the store's answer, None for no such job."""

    #: As the user typed it.
    job_id: str
    outcome: Cancelled | None

    @property
    def refused(self) -> bool:
        """Whether the job could not be cancelled: unknown, or already finished."""
        return self.outcome is None or self.outcome.was.finished

    def line(self) -> str:
        """The line printed for it."""
        if self.outcome is None:
            return f"{self.job_id}: no such job"
        if self.outcome.was.finished:
            return f"{self.job_id}: already {self.outcome.was.value}"
        if self.outcome.now.finished:
            return f"{self.job_id}: cancelled"
        return f"{self.job_id}: running; its worker was asked to stop it"


def cancel(args: CancelArgs, settings: Settings) -> int:
    """Cancels queued jobs, or asks the workers of running ones to stop them; fails when any
    job is unknown or already finished."""
    # Every id is checked before any job is touched.
    ids = [(text, _job_id(text)) for text in args.job_ids]

    async def run() -> list[CancelReport]:
        async with _queue(settings) as q:
            return [CancelReport(text, await q.store.cancel_job(job_id)) for text, job_id in ids]

    reports = anyio.run(run)
    for report in reports:
        print(report.line())
    refused = [report for report in reports if report.refused]
    if refused:
        raise Failed(f"{len(refused)} of {len(reports)} job(s) could not be cancelled")
    return 0


def prune(args: PruneArgs, settings: Settings) -> int:
    """Deletes the finished jobs past their keep time now, saying what it keeps."""
    from notifyq.worker import prune as delete_finished

    async def run() -> int:
        async with _queue(settings) as q:
            return await delete_finished(q.store, settings, batch=args.batch)

    keeps = ", ".join(
        f"{name} after {duration(value)}"
        for name, value in (
            ("completed", settings.keep_completed),
            ("failed", settings.keep_failed),
            ("cancelled", settings.keep_cancelled),
        )
        if value is not None
    )
    say(f"notifyq: deleting finished jobs: {keeps or 'nothing (all kept for good)'}")
    print(f"deleted {anyio.run(run)} job(s)")
    return 0


# -- from _queues ----------------------------------------


def queue(args: QueueArgs, settings: Settings) -> int:
    """Pauses, resumes, rate-limits a queue or switches its notifications, then prints its
    row of the queues table."""
    check_name("queue", args.name)

    async def run() -> list[dict[str, Any]]:
        async with _queue(settings) as q:
            await q.store.configure_queue(
                args.name, paused=args.paused, rate_limit=args.rate_limit, notify=args.notifying
            )
            return [row for row in await q.store.queue_stats() if row["queue"] == args.name]

    for line in queue_table(anyio.run(run), color=use_color()):
        print(line)
    return 0


def stats(args: StatsArgs, settings: Settings) -> int:
    """Prints the queues table once."""

    async def run() -> list[dict[str, Any]]:
        async with _queue(settings) as q:
            return await q.store.queue_stats()

    for line in queue_table(anyio.run(run), color=use_color()):
        print(line)
    return 0


def top(args: TopArgs, settings: Settings) -> int:
    """Prints the queues table every ``--interval`` seconds until Ctrl-C; an outage shows as
    a line, and the table comes back with the database."""
    color = use_color()
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""

    async def run() -> None:
        async with _queue(settings) as q:
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


def tasks(args: TasksArgs, settings: Settings) -> int:
    """Lists the tasks that workers registered, with their options and breaker state."""

    async def run() -> list[dict[str, Any]]:
        async with _queue(settings) as q:
            return await q.store.list_tasks()

    for line in tasks_table(anyio.run(run)):
        print(line)
    return 0


# -- from _roles ----------------------------------------


def grant(args: GrantArgs, settings: Settings) -> int:
    """Gives ``args.role`` the privileges of its kind, or prints the statements that would."""
    if args.print_only:
        for statement in statements(args.role, args.kind):
            print(f"{statement.as_string(None)};")
        return 0
    run_grants(settings, args.role, args.kind)
    say(f"notifyq: {args.role} has the privileges of a {args.kind} now")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], Invocation]] = {
    "migrate": _command(MigrateArgs, migrate),
    "serve": _command(ServeArgs, serve),
    "worker": _command(WorkerArgs, worker),
    "dev": _command(DevArgs, dev),
    "enqueue": _command(EnqueueArgs, enqueue),
    "status": _command(StatusArgs, status),
    "jobs": _command(JobsArgs, jobs),
    "retry": _command(RetryArgs, retry),
    "cancel": _command(CancelArgs, cancel),
    "prune": _command(PruneArgs, prune),
    "queue": _command(QueueArgs, queue),
    "stats": _command(StatsArgs, stats),
    "top": _command(TopArgs, top),
    "tasks": _command(TasksArgs, tasks),
    "grant": _command(GrantArgs, grant),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``notifyq`` command; answers the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        return _bench(argv[1:])
    namespace = build_parser().parse_args(argv)
    invocation = COMMANDS[namespace.command](namespace)
    try:
        return _run(invocation)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except asyncio.CancelledError:
        # Ctrl-C on Python 3.10: anyio cancels the main task, and the cancellation (not a
        # KeyboardInterrupt, as on 3.11) ends up here. No event loop runs at this level, so
        # nothing else can have cancelled it.
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `notifyq jobs | head`: the reader left; not an error of ours.
        sys.stdout = open(os.devnull, "w")  # nothing more is written
        return 0
    except BaseException as exc:
        message = one_line(exc)
        if message is None:
            raise
        print(f"notifyq: error: {message}", file=sys.stderr)
        return EXIT_ERROR


def _run(invocation: Invocation) -> int:
    args = invocation.arguments
    settings = Settings.load(**args.settings_overrides())
    configure_logging(settings.log_level, settings.log_format)
    if args.needs_database_url():
        require_database(settings)
    code = invocation.run(settings)
    if args.long_running:
        exit_now_if_threads_hang()
    return code


def _bench(argv: list[str]) -> int:
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
        return EXIT_USAGE
    code: int = bench(argv)
    return code
