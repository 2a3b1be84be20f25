"""The command line's grammar: every command, its flags and their types, and the options all
commands share. Each command's values land in a dataclass of :mod:`notifyq.cli._args` (a flag's
``dest`` is the name of its field there)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, NoReturn, TypeAlias, TypeVar, get_args

from notifyq._version import __version__
from notifyq.cli._args import Arguments, JobStatusName
from notifyq.cli._errors import EXIT_ERROR, EXIT_JOB_FAILED, EXIT_TIMEOUT, EXIT_USAGE
from notifyq.grants import KINDS
from notifyq.jobspec import Option, options
from notifyq.models import MAX_FAIR_WEIGHT, MIN_FAIR_WEIGHT

A = TypeVar("A", bound=Arguments)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"notifyq: error: {message}\n")


#: What add_subparsers answers: each add_parser of it makes one command.
_Commands: TypeAlias = "argparse._SubParsersAction[_Parser]"


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``notifyq`` command (all but ``notifyq bench``, which parses its own)."""
    parser = _Parser(
        prog="notifyq",
        description="A PostgreSQL job queue that starts jobs the instant they are committed.",
    )
    parser.add_argument("--version", action="version", version=f"notifyq {__version__}")
    _common_options(parser, None)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    _process_commands(commands)
    _job_commands(commands)
    _queue_commands(commands)
    _role_commands(commands)
    commands.add_parser(
        "bench",
        help="measure latency and throughput against targets (needs notifyq-bench; "
        "notifyq bench --help)",
    )
    # The common options after the command too (`notifyq serve --log-level WARNING`); SUPPRESS
    # keeps a command from overwriting a value given before it.
    for name, command in commands.choices.items():
        if name != "bench":
            _common_options(command, argparse.SUPPRESS)
    return parser


def arguments(kind: type[A], namespace: argparse.Namespace) -> A:
    """The parsed ``namespace`` as the typed arguments of its command."""
    return kind(
        **{field.name: getattr(namespace, field.name) for field in dataclasses.fields(kind)}
    )


# -- types of values ----------------------------------------------------------------------


def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if not 0 <= value <= 2**62:
        raise argparse.ArgumentTypeError(f"{text!r} must be from 0 to {2**62}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


class _JobOption(argparse.Action):
    """A flag of ``notifyq enqueue`` made from a job option (notifyq.jobspec): its text read by
    the option's ``parse`` into ``namespace.options``, checked with the rest by JobSpec."""

    def __init__(self, option_strings: list[str], dest: str, *, option: Option, **kwargs: Any):
        super().__init__(option_strings, dest, **kwargs)
        self.option = option

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        assert self.option.parse is not None
        try:
            value = self.option.parse(values)
        except ValueError:
            parser.error(
                f"{option_string}: {values!r} is not {self.option.sql} ({self.option.doc})"
            )
        given = dict(namespace.options or {})
        if self.option.many:
            value = [*given.get(self.option.name, ()), *value]
        namespace.options = given | {self.option.name: value}


# -- options ------------------------------------------------------------------------------


def _common_options(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument(
        "--database-url",
        default=default,
        help="libpq URL of the database (default: $DATABASE_URL)",
    )
    parser.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        default=default,
        help="default: $NOTIFYQ_LOG_LEVEL or INFO",
    )


def _worker_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queues", help="comma-separated queues to serve (default: all)")
    parser.add_argument("--concurrency", type=_positive_int, help="jobs run at once (default 10)")
    parser.add_argument("--poll-interval", type=_seconds, help="seconds between fallback polls")
    parser.add_argument(
        "--archive-after",
        type=_seconds,
        help="seconds after which finished jobs move to the archive (default: "
        "$NOTIFYQ_ARCHIVE_AFTER, else no archive)",
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        metavar="MODULE",
        help="module that registers tasks; repeat or comma-separate",
    )


def _bind_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=_int, help="port to bind (default 8000)")


# -- commands, by concern -----------------------------------------------------------------


def _process_commands(commands: _Commands) -> None:
    commands.add_parser("migrate", help="apply the SQL migrations (idempotent)")

    serve = commands.add_parser("serve", help="run the HTTP API (with a worker inside)")
    _bind_options(serve)
    serve.add_argument("--no-worker", action="store_true", help="serve the API only")
    _worker_options(serve)

    worker = commands.add_parser("worker", help="run a standalone worker")
    _worker_options(worker)
    worker.add_argument("--burst", action="store_true", help="run until no job is due, then exit")
    worker.add_argument(
        "--metrics-port", type=_int, help="serve Prometheus metrics on this port (host: --host)"
    )
    worker.add_argument("--host", help="address for --metrics-port (default 127.0.0.1)")

    dev = commands.add_parser(
        "dev",
        help="zero setup: embedded PostgreSQL (when DATABASE_URL is unset), API and worker",
    )
    _bind_options(dev)
    dev.add_argument(
        "--reset", action="store_true", help="delete the embedded PostgreSQL's data first"
    )
    _worker_options(dev)


def _job_commands(commands: _Commands) -> None:
    enqueue = commands.add_parser("enqueue", help="enqueue a job and print its id")
    enqueue.add_argument("task", metavar="TASK")
    enqueue.add_argument("payload", metavar="PAYLOAD_JSON", nargs="?", default="{}")
    enqueue.set_defaults(options=None)
    for option in options().values():
        enqueue.add_argument(
            f"--{option.name.replace('_', '-')}",
            action=_JobOption,
            option=option,
            metavar=option.name.upper(),
            help=option.doc.replace("%", "%%")
            + (" Repeat or comma-separate." if option.many else ""),
        )

    status = commands.add_parser("status", help="print a job as JSON")
    status.add_argument("job_id", metavar="JOB_ID")

    wait = commands.add_parser(
        "wait",
        help="wait until a job finishes and print it as JSON; exit 0 only if it completed",
        description="Waits until the job is completed, failed or cancelled (woken by a "
        "notification, not by polling) and prints it as JSON.",
        epilog=f"exit status: 0 the job completed; {EXIT_JOB_FAILED} it failed or was "
        f"cancelled (printed all the same); {EXIT_TIMEOUT} --timeout passed before it ended; "
        f"{EXIT_ERROR} it could not wait (no such job, database unreachable); {EXIT_USAGE} "
        "bad arguments.",
    )
    wait.add_argument("job_id", metavar="JOB_ID")
    wait.add_argument(
        "--timeout",
        type=_positive_seconds,
        help="give up after this many seconds (default: never)",
    )

    jobs = commands.add_parser("jobs", help="list jobs, newest first")
    jobs.add_argument("--status", choices=list(get_args(JobStatusName)))
    jobs.add_argument("--task")
    jobs.add_argument("--queue")
    jobs.add_argument("--limit", type=_positive_int, default=20)
    jobs.add_argument(
        "--json", dest="as_json", action="store_true", help="one JSON object per line"
    )

    retry = commands.add_parser(
        "retry", help="requeue failed (or cancelled) jobs: by id, or all matching the filters"
    )
    retry.add_argument("job_ids", metavar="JOB_ID", nargs="*")
    retry.add_argument("--task", help="every failed job of this task")
    retry.add_argument("--queue", help="every failed job of this queue")
    retry.add_argument("--status", choices=["failed", "cancelled"], default="failed")
    retry.add_argument(
        "--all", dest="every", action="store_true", help="every failed job, whatever its task"
    )

    cancel = commands.add_parser(
        "cancel", help="cancel queued jobs, or ask the workers of running ones to stop them"
    )
    cancel.add_argument("job_ids", metavar="JOB_ID", nargs="+")

    prune = commands.add_parser(
        "prune",
        help="delete finished jobs past their keep time (NOTIFYQ_KEEP_*) now, and with "
        "NOTIFYQ_ARCHIVE_AFTER run the archive's pass",
    )
    prune.add_argument("--batch", type=_positive_int, default=1000)


def _queue_commands(commands: _Commands) -> None:
    queue = commands.add_parser(
        "queue", help="pause, resume, rate-limit or bound a queue, or switch its notifications"
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
        "--max-depth",
        type=_non_negative_int,
        metavar="JOBS",
        help="most jobs not yet started (waiting or queued); an enqueue past it is refused "
        "(HTTP 429, notifyq.QueueFull, SQLSTATE NQ429); 0 removes the bound",
    )
    queue.add_argument(
        "--notify",
        choices=["on", "off"],
        help="whether inserts wake workers (off: a bulk-fed queue drained by polling)",
    )

    commands.add_parser("stats", help="a table of the queues and their counts")
    doctor = commands.add_parser(
        "doctor",
        help="check the database's health (the xmin horizon, dead rows, listeners, leases, "
        "leadership, schema, grants) and say what to do; exits 1 when something is wrong",
    )
    doctor.add_argument("--json", action="store_true", help="one JSON document")
    doctor.add_argument(
        "--horizon-warn-after",
        type=_seconds,
        metavar="SECONDS",
        help="age of a snapshot holding the horizon that fails the check "
        "(NOTIFYQ_HORIZON_WARN_AFTER, default 300)",
    )
    top = commands.add_parser("top", help="the queues table, refreshed until Ctrl-C")
    top.add_argument("--interval", type=_seconds, default=1.0, help="seconds between refreshes")
    commands.add_parser("tasks", help="list the tasks workers registered, with their options")
    _fair_commands(commands)


def _weight(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not MIN_FAIR_WEIGHT <= value <= MAX_FAIR_WEIGHT:
        raise argparse.ArgumentTypeError(
            f"a weight is {MIN_FAIR_WEIGHT:g} to {MAX_FAIR_WEIGHT:g}, not {text}"
        )
    return value


def _fair_commands(commands: _Commands) -> None:
    fair = commands.add_parser(
        "fair", help="weigh the fair keys of jobs (a key of weight 4 gets 4 claims for 1's one)"
    )
    fair.set_defaults(key=None, weight=None, limit=20)
    actions = fair.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    actions.required = True
    weigh = actions.add_parser("set", help="set a key's weight (1 to 1000; 1 by default)")
    weigh.add_argument("key", metavar="KEY")
    weigh.add_argument("weight", metavar="WEIGHT", type=_weight)
    unset = actions.add_parser("unset", help="give a key back the default weight, 1")
    unset.add_argument("key", metavar="KEY")
    listing = actions.add_parser("list", help="the weights set, and the busiest keys")
    listing.add_argument(
        "--limit", type=_positive_int, default=20, help="keys to show (at most 100)"
    )


def _role_commands(commands: _Commands) -> None:
    grant = commands.add_parser(
        "grant",
        help="give a database role the least privileges of a producer or of a worker (and API)",
    )
    grant.add_argument("role", metavar="ROLE")
    grant.add_argument(
        "--as",
        dest="kind",
        choices=KINDS,
        required=True,
        help="producer: enqueue and read jobs; worker: run workers and the API (no DDL)",
    )
    grant.add_argument(
        "--login-password-env",
        metavar="VARIABLE",
        help="first make ROLE a role that logs in with the password in this environment "
        "variable (created when missing, its password set when not)",
    )
    grant.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="print the GRANT statements instead of running them",
    )
