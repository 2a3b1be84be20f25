"""``main``: reads the command line, builds the settings (the environment's, with the flags
over them), finds the database of this process, runs the command and turns its failure into
one line on stderr and an exit code."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TypeVar

from notifyq.bootstrap import require_database
from notifyq.cli import _jobs as jobs
from notifyq.cli import _queues as queues
from notifyq.cli import _roles as roles
from notifyq.cli import _running as running
from notifyq.cli._args import (
    Arguments,
    CancelArgs,
    DevArgs,
    DoctorArgs,
    EnqueueArgs,
    FairArgs,
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
    WaitArgs,
    WorkerArgs,
)
from notifyq.cli._errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, Failed, one_line
from notifyq.cli._parser import arguments, build_parser
from notifyq.logs import configure as configure_logging
from notifyq.process import exit_now_if_threads_hang
from notifyq.settings import Settings

A = TypeVar("A", bound=Arguments)


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


COMMANDS: dict[str, Callable[[argparse.Namespace], Invocation]] = {
    "migrate": _command(MigrateArgs, running.migrate),
    "serve": _command(ServeArgs, running.serve),
    "worker": _command(WorkerArgs, running.worker),
    "dev": _command(DevArgs, running.dev),
    "enqueue": _command(EnqueueArgs, jobs.enqueue),
    "status": _command(StatusArgs, jobs.status),
    "wait": _command(WaitArgs, jobs.wait),
    "jobs": _command(JobsArgs, jobs.jobs),
    "retry": _command(RetryArgs, jobs.retry),
    "cancel": _command(CancelArgs, jobs.cancel),
    "prune": _command(PruneArgs, jobs.prune),
    "queue": _command(QueueArgs, queues.queue),
    "stats": _command(StatsArgs, queues.stats),
    "doctor": _command(DoctorArgs, queues.doctor),
    "top": _command(TopArgs, queues.top),
    "tasks": _command(TasksArgs, queues.tasks),
    "fair": _command(FairArgs, queues.fair),
    "grant": _command(GrantArgs, roles.grant),
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
        return exc.exit_code if isinstance(exc, Failed) else EXIT_ERROR


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


#: How to install the bench, which ``notifyq bench`` says when it is missing.
BENCH_INSTALL = "pip install -e ./benchmarks"

#: ``notifyq bench --help`` without the bench: what it is and how to install it.
BENCH_HELP = f"""usage: notifyq bench [OPTIONS]

Measures notifyq's latency and throughput against its targets, and against other queues
(see docs/concepts/benchmark.md). The bench is a distribution of its own,
notifyq-bench, which is not installed here. From a source checkout:

  {BENCH_INSTALL}

Then `notifyq bench --help` lists its options."""


def _bench(argv: list[str]) -> int:
    # The bench parses its own options (argparse would take them for ours). It is a
    # distribution of its own, notifyq-bench, so that the notifyq wheel carries none of it; it
    # declares itself as the entry point "bench" of the group "notifyq.commands".
    found = entry_points(group="notifyq.commands", name="bench")
    if not found:
        if "-h" in argv or "--help" in argv:
            print(BENCH_HELP)  # asked for help, and got it: not an error
            return 0
        message = f"notifyq bench: needs notifyq-bench; from a source checkout: {BENCH_INSTALL}"
        print(message, file=sys.stderr)
        return EXIT_USAGE
    # A bench that is installed but broken raises here: its traceback says more than we could.
    bench = next(iter(found)).load()
    code: int = bench(argv)
    return code
