"""A long-running notifyq process (``notifyq worker``, ``serve``, ``dev``, Django's
``manage.py notifyq_worker``): its edges, and the one entry of a worker process.

- ``_errors``: :class:`ProcessError`, and :func:`one_line`, what a command tells the user about
  a failure (None for a bug, which keeps its traceback).
- ``_signals``: SIGTERM/SIGINT, the hard exit a second signal asks for, hanging threads.
- ``_entry``: :func:`run_worker`, the worker process that the CLI and the Django command both
  run (metrics endpoint, migration or schema check, signals, the heap, the event loop); and
  the pieces of it that ``serve`` and ``dev`` share.

It sits above :mod:`notifyq.worker` and below the commands (:mod:`notifyq.cli`,
:mod:`notifyq.django`), which decide how their tasks are found and how logs are written.
"""

from notifyq.process._entry import (
    has_uvloop,
    migrate_or_check,
    run_worker,
    serve_metrics,
    settle_heap,
)
from notifyq.process._errors import ProcessError, one_line
from notifyq.process._signals import (
    before_hard_exit,
    exit_now_if_threads_hang,
    hard_exit,
    stop_on_signals,
)

__all__ = [
    "ProcessError",
    "before_hard_exit",
    "exit_now_if_threads_hang",
    "hard_exit",
    "has_uvloop",
    "migrate_or_check",
    "one_line",
    "run_worker",
    "serve_metrics",
    "settle_heap",
    "stop_on_signals",
]
