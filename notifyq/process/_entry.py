"""The worker process that ``notifyq worker`` and ``manage.py notifyq_worker`` run, and the
parts of it that ``notifyq serve`` and ``dev`` share.

The caller has built what needs no database (the settings, the registry of tasks, its logging)
and checked it; :func:`run_worker` then serves the metrics port (a taken port stops it before
the database is touched), migrates or checks the schema, and runs the worker until a signal
drains it, with the heap settled and the idle mark forgotten on a hard exit.
"""

from __future__ import annotations

import gc
import importlib.util
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from notifyq.migrations import check_schema
from notifyq.migrations import migrate as apply_migrations
from notifyq.process._errors import ProcessError
from notifyq.process._signals import before_hard_exit, stop_on_signals
from notifyq.settings import Settings

if TYPE_CHECKING:
    from notifyq.metrics import Metrics
    from notifyq.tasks import Registry


def run_worker(
    settings: Settings, registry: Registry, *, burst: bool = False, metrics_port: int | None = None
) -> None:
    """Runs a worker serving ``registry`` until SIGTERM/SIGINT (the first drains it, a second
    exits at once) or, with ``burst``, until nothing is due. Serves its metrics on
    ``metrics_port`` (None: none), then migrates, or only checks the schema with
    ``auto_migrate`` off, logging each step.

    Raises :class:`ProcessError` when the metrics port cannot be served, and whatever stopped
    the worker (notifyq's errors, or a bug's)."""
    from notifyq.worker import Worker

    metrics = serve_metrics(metrics_port, settings)

    async def run() -> None:
        # Built in the event loop, which a worker's parts may need, but before the migration.
        worker = Worker(settings, registry, burst=burst, metrics=metrics, report_depth=True)
        await migrate_or_check(settings, report=None)
        with before_hard_exit(worker.forget_idle_mark):
            settle_heap()
            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_on_signals, worker.stop)
                await worker.run()
                tg.cancel_scope.cancel()

    anyio.run(run, backend_options={"use_uvloop": has_uvloop()})


async def migrate_or_check(
    settings: Settings, *, report: Callable[[str], None] | None = None
) -> None:
    """Migrates, saying each step to ``report`` (None: to the log), or only checks the schema
    when NOTIFYQ_AUTO_MIGRATE is off."""
    if settings.auto_migrate:
        await apply_migrations(settings, progress=report)
    else:
        await check_schema(settings)


def serve_metrics(port: int | None, settings: Settings) -> Metrics | None:
    """The worker's metrics, served on ``port`` from now on (None: no port, no metrics)."""
    if port is None:
        return None
    from notifyq.metrics import Metrics
    from notifyq.metrics_server import serve_metrics as serve

    metrics = Metrics()
    host = settings.host
    try:
        serve(metrics, settings, host, port)
    except OSError as exc:
        raise ProcessError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from exc
    print(f"notifyq: metrics at http://{host}:{port}/metrics", file=sys.stderr, flush=True)
    return metrics


def has_uvloop() -> bool:
    """Whether uvloop is installed (it is, except on Windows): its event loop spends about
    half the CPU of asyncio's on a worker's round trips to the database."""
    return importlib.util.find_spec("uvloop") is not None


def settle_heap() -> None:
    """Tunes the garbage collector for a long-running server, once everything is imported and
    built: what exists now lives as long as the process, so it is frozen out of collections;
    and the youngest generation is collected every 10,000 allocations instead of 700. A job
    or a request allocates hundreds of objects, nearly all freed by reference counting, and
    with the defaults the collector cost the API and the worker about a tenth of their CPU."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, *gc.get_threshold()[1:])
