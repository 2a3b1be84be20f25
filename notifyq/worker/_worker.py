"""The worker: the services of one worker process, composed.

:meth:`Worker.run` reads as the table of contents of a worker's life: open the store (or use
the one given), register the tasks, listen, start the outcome writer and the upkeep services,
start the runners, produce until stopped, drain, and write what is left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import anyio
import psycopg
from anyio.abc import TaskStatus

from notifyq.builtins import worker_registry
from notifyq.db import connect_kwargs, connect_sync, listen_url, open_pool
from notifyq.errors import NotifyQError
from notifyq.metrics import Metrics
from notifyq.models import TaskRegistration
from notifyq.notifier import CANCEL_CHANNEL, CHANNEL, Listener
from notifyq.retry import Backoff, CircuitBreaker
from notifyq.settings import Settings
from notifyq.store import Store
from notifyq.tasks import Registry, Task
from notifyq.tracing import tracing
from notifyq.worker._executor import Executor, JobRecord
from notifyq.worker._floors import FloorRaiser
from notifyq.worker._heartbeat import Heartbeat
from notifyq.worker._leadership import Leadership
from notifyq.worker._ledger import CancelReason, Ledger, WakeReason
from notifyq.worker._maintenance import DepthReport, HorizonWatch, Retention
from notifyq.worker._periodic import PeriodicEnqueuer
from notifyq.worker._producer import IdleMark, Producer
from notifyq.worker._progress import ProgressWriter
from notifyq.worker._rescuer import Rescuer
from notifyq.worker._runners import Runners
from notifyq.worker._stats import Signals, WorkerStats
from notifyq.worker._store import WorkerStore
from notifyq.worker._telemetry import Telemetry, telemetry
from notifyq.worker._writer import OutcomeWriter

__all__ = ["Worker", "make_worker_id"]

logger = logging.getLogger("notifyq.worker")

#: A service's ``run``: runs until cancelled, reporting started through its task status.
Service = Callable[..., Coroutine[Any, Any, None]]


def make_worker_id() -> str:
    """host:pid:random, unique per worker process run."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Worker:
    """Runs jobs from the database until :meth:`stop` is called (or, with ``burst``, until
    nothing is due).

    ``store`` and ``listener`` are built at the entry point and may be shared (``notifyq
    serve`` gives its worker the API's pool); without them the worker opens its own, for as
    long as it runs. ``registry`` defaults to the built-in tasks and every ``@task``."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry | None = None,
        *,
        store: WorkerStore | None = None,
        listener: Listener | None = None,
        worker_id: str | None = None,
        burst: bool = False,
        metrics: Metrics | None = None,
        report_depth: bool = False,
    ) -> None:
        self.settings = settings
        self.registry = registry if registry is not None else worker_registry()
        self.id = worker_id or make_worker_id()
        self.stats = WorkerStats()
        self.signals = Signals()
        #: Whether it got as far as listening and claiming (a failure before is a start-up one).
        self.ready = False
        #: The listener it uses: the one given, or its own once :meth:`run` has opened it.
        self.listener = listener
        self._store = store
        self._burst = burst
        self._metrics = metrics
        self._report_depth = report_depth and metrics is not None
        self._telemetry: Telemetry = telemetry(metrics)
        self._tracing = tracing(settings)
        self._ledger: Ledger | None = None
        #: Whether this worker leads its database's maintenance (set once it runs).
        self.leadership: Leadership | None = None
        self._stopping = False
        self._connected_once = False

    # -- control ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Stops claiming; running jobs get ``shutdown_grace`` seconds to finish."""
        if self._stopping:
            return
        self._stopping = True
        logger.info(
            "worker %s stopping: %d running job(s) get %.0fs to finish",
            self.id,
            self.running_jobs,
            self.settings.shutdown_grace,
        )
        if self._ledger is not None:
            self._ledger.stop()

    @property
    def running_jobs(self) -> int:
        """Jobs given to runners and not finished yet."""
        return 0 if self._ledger is None else self._ledger.active

    def forget_idle_mark(self) -> None:
        """Best effort, synchronous, for a process about to exit at once: removes this
        worker's idle mark, which would otherwise make every insert notify until it expires."""
        with contextlib.suppress(NotifyQError, psycopg.Error):
            with connect_sync(
                self.settings, "notifyq-worker", connect_timeout=1, statement_timeout=1.0
            ) as conn:
                conn.execute("SELECT notifyq.mark_busy_v1(%s)", [self.id])

    # -- the life of a worker --------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Runs until stopped; reports started once it listens and is about to claim."""
        settings = self.settings
        async with self._opened_store() as store:
            await self._register_tasks(store)
            limits_exist = await store.limits_exist(self.registry.names())
            ledger = self._ledger = Ledger(settings.concurrency)
            if self._stopping:
                ledger.stop()
            idle = IdleMark(
                store, worker_id=self.id, queues=settings.queues, ttl=settings.lease_seconds
            )
            writer = OutcomeWriter(
                store, ledger, self._telemetry, worker_id=self.id, stats=self.stats,
                signals=self.signals,
            )  # fmt: skip
            progress = ProgressWriter(store, worker_id=self.id, stats=self.stats)
            runners = Runners(
                ledger, self._executor(store, progress), writer, concurrency=settings.concurrency
            )
            producer = self._producer(store, ledger, runners, idle, limits_exist)
            writer.refill = producer
            listener, own_listener = self._listener()
            unsubscribe = self._subscribe(listener, ledger, idle)
            try:
                async with anyio.create_task_group() as services:
                    if own_listener:
                        await services.start(listener.run)  # live before the first claim
                    async with writer.open():
                        await services.start(progress.run)
                        for service in self._upkeep(store, ledger, idle):
                            await services.start(service)
                        try:
                            await self._work(runners, producer, ledger, task_status)
                        finally:
                            with anyio.move_on_after(2, shield=True):
                                await idle.clear()  # whatever this worker believes
                    services.cancel_scope.cancel()
            finally:
                for undo in unsubscribe:
                    undo()
        logger.info("worker %s stopped", self.id)

    async def _work(
        self,
        runners: Runners,
        producer: Producer,
        ledger: Ledger,
        task_status: TaskStatus[None],
    ) -> None:
        """Runs the runners and the producer; then gives running jobs the shutdown grace, and
        stops the rest (they go back to the queue)."""
        settings = self.settings
        async with anyio.create_task_group() as jobs:
            await jobs.start(runners.run)
            self.ready = True
            logger.info(
                "worker %s ready: tasks %s, queues %s, concurrency %d",
                self.id,
                ", ".join(self.registry.names()),
                ", ".join(settings.queues or ["(all)"]),
                settings.concurrency,
            )
            task_status.started()
            try:
                await producer.run()
                with anyio.move_on_after(settings.shutdown_grace):
                    await ledger.idle()
                if ledger.active:
                    logger.warning(
                        "shutdown grace of %.0fs ran out: interrupting %d job(s) and putting "
                        "them back in the queue",
                        settings.shutdown_grace,
                        ledger.active,
                    )
                    ledger.cancel_active(CancelReason.SHUTDOWN)
            finally:
                runners.close()

    # -- how it is put together ------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _opened_store(self) -> AsyncIterator[WorkerStore]:
        if self._store is not None:
            yield self._store
            return
        async with open_pool(self.settings, name="worker", min_size=2, max_size=4) as pool:
            yield Store(pool)

    async def _register_tasks(self, store: WorkerStore) -> None:
        for task in self.registry:
            await store.register_task(_registration(task, self._breaker(task)))

    def _breaker(self, task: Task) -> CircuitBreaker | None:
        if task.breaker is not None:
            return task.breaker
        if self.settings.breaker_threshold is not None:
            return CircuitBreaker(self.settings.breaker_threshold, self.settings.breaker_cooldown)
        return None

    def _executor(self, store: WorkerStore, progress: ProgressWriter) -> Executor:
        s = self.settings
        return Executor(
            durable=JobRecord(store, self.id),
            worker_id=self.id,
            backoff=Backoff(s.retry_base, s.retry_factor, s.retry_cap),
            limiter=anyio.CapacityLimiter(s.concurrency),
            telemetry=self._telemetry,
            progress=progress.report,
            tracing=self._tracing,
        )

    def _producer(
        self,
        store: WorkerStore,
        ledger: Ledger,
        runners: Runners,
        idle: IdleMark,
        limits_exist: bool,
    ) -> Producer:
        s = self.settings
        return Producer(
            store,
            ledger,
            runners,
            self.registry,
            idle,
            self._telemetry,
            worker_id=self.id,
            queues=s.queues,
            lease=s.lease_seconds,
            poll_interval=s.poll_interval,
            guarded=[t.name for t in self.registry if self._breaker(t) is not None],
            limits_exist=limits_exist,
            limits_interval=s.heartbeat,
            burst=self._burst,
            stats=self.stats,
            signals=self.signals,
        )

    def _upkeep(self, store: WorkerStore, ledger: Ledger, idle: IdleMark) -> list[Service]:
        """The services that run beside the producer, each as its ``run``."""
        s = self.settings
        lead = self.leadership = Leadership(
            store, worker_id=self.id, interval=s.heartbeat, ttl=s.lease_seconds
        )
        services: list[Service] = [
            lead.run,  # first: the maintenance asks it before its first pass
            Heartbeat(
                store, ledger, idle, worker_id=self.id, interval=s.heartbeat,
                lease=s.lease_seconds, stats=self.stats, signals=self.signals,
            ).run,
            Rescuer(
                store, ledger, self._telemetry, interval=s.heartbeat, stats=self.stats,
                signals=self.signals, leadership=lead,
            ).run,
            Retention(store, s, lead).run,
            FloorRaiser(store, lead).run,
            HorizonWatch(store, s, lead).run,
        ]  # fmt: skip
        if any(task.cron for task in self.registry):
            services.append(PeriodicEnqueuer(store, list(self.registry)).run)
        if self._report_depth and self._metrics is not None:
            services.append(DepthReport(store, self._metrics).run)
        return services

    def _listener(self) -> tuple[Listener, bool]:
        """The listener to use, and whether it is this worker's own (to run)."""
        if self.listener is not None:
            return self.listener, False
        s = self.settings
        self.listener = Listener(
            listen_url(s),
            connect_kwargs=connect_kwargs(s, "notifyq-listener"),
            probe_interval=min(s.poll_interval, 5.0),
        )
        return self.listener, True

    def _subscribe(
        self, listener: Listener, ledger: Ledger, idle: IdleMark
    ) -> list[Callable[[], None]]:
        """Wires the listener to the producer's wake-ups and to cancel requests."""
        queues = self.settings.queues

        def on_notification(queue: str) -> None:
            self._telemetry.notified()
            if queues is None or queue in queues:
                ledger.wake.signal(WakeReason.NOTIFY)

        def on_cancel(job_id: str) -> None:
            if ledger.cancel(job_id, CancelReason.REQUESTED) is not None:
                logger.info("job %s: cancel requested; stopping its handler", job_id)

        def on_connect() -> None:
            # A reconnect may follow a server restart, which empties the waiting table.
            idle.forget()
            if self._connected_once:
                self._telemetry.reconnected()
            self._connected_once = True
            ledger.wake.signal(WakeReason.CONNECT)

        return [
            listener.subscribe(CHANNEL, on_notification),
            listener.subscribe(CANCEL_CHANNEL, on_cancel),
            listener.on_connect(on_connect),
        ]


def _registration(task: Task, breaker: CircuitBreaker | None) -> TaskRegistration:
    """What the database records of a task a worker serves."""
    return TaskRegistration(
        name=task.name,
        max_attempts=task.max_attempts,
        options_json=task.options_json(),
        breaker_threshold=breaker.threshold if breaker else None,
        breaker_cooldown=breaker.cooldown if breaker else 30.0,
        max_concurrency=task.max_concurrency,
        rate_limit=task.rate_limit,
        key_concurrency=task.key_concurrency,
    )
