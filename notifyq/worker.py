"""The worker: claim, run, finish.

One process runs one :class:`Worker`: a LISTEN connection (:mod:`notifyq.notifier`) that wakes
the claim loop, a small pool for everything else, and these duties, each its own task:

- the producer claims up to the number of free slots in one statement whenever it is woken (a
  notification, the fallback poll timer, the next known ``run_at``, a freed slot when it was
  saturated, a reconnect) and hands each job to one of ``concurrency`` runner tasks;
- the writer records outcomes in batches, one statement per kind, fenced by (worker, claim);
- the maintainer renews the leases of held jobs by heartbeat, cancels jobs whose lease was lost,
  and requeues other workers' jobs whose lease ran out.

Stopping happens in two phases: stop claiming and give running jobs ``shutdown_grace`` seconds;
then cancel the rest and put them back in the queue at once, inside a shielded scope.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from uuid import UUID

import anyio
import anyio.lowlevel
import psycopg
from anyio.abc import TaskStatus
from cronsim import CronSim

from notifyq.builtins import worker_registry
from notifyq.context import JobContext
from notifyq.db import connect_kwargs, database_url, first_line, open_pool
from notifyq.errors import (
    DatabaseError,
    DatabaseUnavailable,
    InvalidJob,
    NotifyQError,
    PermanentFailure,
)
from notifyq.metrics import Metrics
from notifyq.models import (
    ClaimedJob,
    Failure,
    Held,
    JobStatus,
    Success,
    TaskRegistration,
    Undecodable,
    encode_json,
)
from notifyq.notifier import CANCEL_CHANNEL, CHANNEL, Listener
from notifyq.retry import Backoff, CircuitBreaker
from notifyq.settings import Settings
from notifyq.store import Store
from notifyq.tasks import Registry, Task

logger = logging.getLogger(__name__)

#: Most jobs one claim statement takes, however many slots are free.
MAX_CLAIM_BATCH = 500
#: Seconds between looks for half-open circuit breakers (only with breakers configured).
BREAKER_TICK = 1.0
#: While registered as waiting without the lock (an insert's transaction stayed open), claim again
#: this often until a registration gets it.
UNSURE_RECHECK = 0.25
#: While some task or queue has a limit, claim this often: tokens refill and slots free up
#: without notifications.
LIMIT_TICK = 0.25
#: Seconds between readings of queue depth for a worker's own metrics port.
DEPTH_INTERVAL = 10.0
#: How long the final writes of a stopping worker may take.
FINAL_WRITE_TIMEOUT = 10.0
MAX_ERROR_LENGTH = 4000


def make_worker_id() -> str:
    """host:pid:random, unique per worker process run."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass
class WorkerStats:
    """Counters of what this worker did, for logs, tests and metrics."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    retried: int = 0
    released: int = 0
    lost: int = 0
    rescued: int = 0
    cancelled: int = 0
    claims: int = 0
    empty_claims: int = 0


@dataclass(slots=True)
class _Running:
    """A claimed job on its way through a runner. ``cancel`` stops its handler by cancelling
    the runner's scope while the handler runs; a job not started yet is not started."""

    job: ClaimedJob
    task: Task
    scope: anyio.CancelScope | None = None
    cancel_reason: str | None = None
    #: Whether its handler was called: the heartbeat confirms only those (see beat_v1).
    started: bool = False

    def cancel(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
        if self.scope is not None:
            self.scope.cancel()


@dataclass
class _Outbox:
    done: list[Success] = field(default_factory=list)
    failed: list[Failure] = field(default_factory=list)
    released: list[Held] = field(default_factory=list)
    cancelled: list[Held] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.done or self.failed or self.released or self.cancelled)


class Worker:
    """Runs jobs from the database until :meth:`stop` is called (or, with ``burst``, until
    nothing is due)."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry | None = None,
        *,
        worker_id: str | None = None,
        burst: bool = False,
        metrics: Metrics | None = None,
        report_depth: bool = False,
    ) -> None:
        self.settings = settings
        self.registry = registry if registry is not None else worker_registry()
        self.id = worker_id or make_worker_id()
        self.stats = WorkerStats()
        #: Whether it got as far as listening and claiming (a failure before is a start-up one).
        self.ready = False
        self._burst = burst
        self._metrics = metrics
        self._report_depth = report_depth and metrics is not None
        self._wake_reason = "start"
        self._connected_once = False
        self._tasks = self.registry.names()
        self._guarded = [t.name for t in self.registry if self._breaker(t) is not None]
        self._next_probe = 0.0
        self._queues = settings.queues
        self._backoff = Backoff(settings.retry_base, settings.retry_factor, settings.retry_cap)
        self._free = settings.concurrency
        self._starved = False
        self._waiting = False
        self._waiting_sure = False
        self._limits_exist = any(task.limited for task in self.registry)
        self._periodic = [task for task in self.registry if task.cron]
        self._running: dict[UUID, _Running] = {}
        # Claimed and not yet written back: the heartbeat renews these leases.
        self._held: dict[UUID, ClaimedJob] = {}
        self._outbox = _Outbox()
        self._refused: dict[Success, str] = {}
        self._stopping = False
        self._store: Store | None = None
        self.listener: Listener | None = None
        # Created in run(): anyio primitives need the event loop.
        self._wake_event: anyio.Event | None = None
        self._outbox_event: anyio.Event | None = None
        self._idle_event: anyio.Event | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        self._flush_lock: anyio.Lock | None = None
        self._jobs: asyncio.Queue[_Running | None] | None = None

    # -- control ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Stops claiming; running jobs get ``shutdown_grace`` seconds to finish."""
        if not self._stopping:
            self._stopping = True
            logger.info(
                "worker %s stopping: %d running job(s) get %.0fs to finish",
                self.id,
                len(self._running),
                self.settings.shutdown_grace,
            )
            self._wake()

    def forget_idle_mark(self) -> None:
        """Best effort, synchronous, for a process about to exit at once: removes this
        worker's idle mark, which would otherwise make every insert notify until it expires."""
        if not self.settings.database_url:
            return
        try:
            with psycopg.connect(
                self.settings.database_url,
                connect_timeout=1,
                autocommit=True,
                options="-c statement_timeout=1000",
            ) as conn:
                conn.execute("DELETE FROM notifyq.waiting_workers WHERE worker_id = %s", [self.id])
        except psycopg.Error:
            pass

    @property
    def running_jobs(self) -> int:
        """Jobs whose handler is running now."""
        return len(self._running)

    # -- main ------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Runs until stopped; reports started once it listens and is about to claim."""
        settings = self.settings
        self._wake_event = anyio.Event()
        self._outbox_event = anyio.Event()
        self._idle_event = anyio.Event()
        self._limiter = anyio.CapacityLimiter(settings.concurrency)
        self._flush_lock = anyio.Lock()
        url = database_url(settings)
        async with open_pool(settings, name="worker", min_size=2, max_size=4) as pool:
            self._store = Store(pool)
            await self._register_tasks()
            self._limits_exist = await self._store.limits_exist(self._tasks)
            self.listener = Listener(
                settings.listen_url or url,
                handlers={CHANNEL: self._on_notification, CANCEL_CHANNEL: self._on_cancel},
                on_connect=self._on_connect,
                connect_kwargs=connect_kwargs(settings, "notifyq-listener"),
                probe_interval=min(settings.poll_interval, 5.0),
            )
            try:
                async with anyio.create_task_group() as services:
                    await services.start(self.listener.run)
                    services.start_soon(self._maintain)
                    services.start_soon(self._write_outcomes)
                    services.start_soon(self._housekeep)
                    if self._periodic:
                        services.start_soon(self._schedule)
                    logger.info(
                        "worker %s ready: tasks %s, queues %s, concurrency %d",
                        self.id,
                        ", ".join(self._tasks),
                        ", ".join(self._queues or ["(all)"]),
                        settings.concurrency,
                    )
                    async with anyio.create_task_group() as jobs:
                        # A fixed set of runners, one per slot, takes claimed jobs from a
                        # queue: a task spawned per job cost a third of the worker's time.
                        self._jobs = asyncio.Queue()
                        for _ in range(settings.concurrency):
                            jobs.start_soon(self._runner, self._jobs)
                        self.ready = True
                        task_status.started()
                        try:
                            await self._produce()
                            await self._drain()
                        finally:
                            for _ in range(settings.concurrency):
                                self._jobs.put_nowait(None)  # one stop sign per runner
                    # Every job has ended: write what is left while the heartbeat still runs.
                    with anyio.move_on_after(FINAL_WRITE_TIMEOUT, shield=True):
                        await self._final_writes()
                    services.cancel_scope.cancel()
            finally:
                if self._held:  # stopped by an error or an outer cancellation
                    with anyio.move_on_after(FINAL_WRITE_TIMEOUT, shield=True):
                        await self._final_writes()
        logger.info("worker %s stopped", self.id)

    def _breaker(self, task: Task) -> CircuitBreaker | None:
        if task.breaker is not None:
            return task.breaker
        if self.settings.breaker_threshold is not None:
            return CircuitBreaker(self.settings.breaker_threshold, self.settings.breaker_cooldown)
        return None

    async def _register_tasks(self) -> None:
        assert self._store is not None
        for task in self.registry:
            breaker = self._breaker(task)
            await self._store.register_task(
                TaskRegistration(
                    name=task.name,
                    max_attempts=task.max_attempts,
                    options_json=task.options_json(),
                    breaker_threshold=breaker.threshold if breaker else None,
                    breaker_cooldown=breaker.cooldown if breaker else 30.0,
                    max_concurrency=task.max_concurrency,
                    rate_limit=task.rate_limit,
                )
            )

    # -- producer --------------------------------------------------------------------------

    def _on_notification(self, queue: str) -> None:
        if self._metrics is not None:
            self._metrics.notifications.inc()
        if self._queues is None or queue in self._queues:
            self._wake("notify")

    def _on_cancel(self, job_id: str) -> None:
        for running in self._running.values():
            if str(running.job.id) == job_id:
                logger.info("job %s: cancel requested; stopping its handler", job_id)
                running.cancel("cancel")

    def _wake(self, reason: str = "other") -> None:
        event = self._wake_event
        if event is not None:
            self._wake_reason = reason
            self._wake_event = anyio.Event()
            event.set()

    async def _produce(self) -> None:
        assert self._store is not None and self._wake_event is not None
        settings = self.settings
        failures = 0
        while not self._stopping:
            # Taken before the claim: a notification that arrives while the claim runs sets
            # this event, so the wait below returns at once instead of missing it.
            wake = self._wake_event
            if self._free == 0:
                self._starved = True
                if self._waiting:
                    await self._mark_busy()  # a busy worker claims as slots free: no wake-ups
                await wake.wait()
                continue
            if self._guarded and time.monotonic() >= self._next_probe:
                await self._probe_breakers()
            limit = min(self._free, MAX_CLAIM_BATCH)
            if limit == 0:
                continue
            limited: list[ClaimedJob] = []
            if self._limits_exist:
                # First, so that a backlog of unlimited jobs cannot starve the limited ones
                # (their limits keep them from taking many slots).
                limited = await self._claim_limited(limit)
                for job in limited:
                    self._start(job)
                limit -= len(limited)
                if limit == 0:
                    continue
            try:
                claimed = await self._store.claim(
                    worker_id=self.id,
                    tasks=self._tasks,
                    queues=self._queues,
                    limit=limit,
                    lease=settings.lease_seconds,
                )
                failures = 0
            except NotifyQError as exc:
                failures += 1
                delay = min(0.2 * 2**failures, settings.poll_interval)
                logger.warning("claim failed (%s); retrying in %.1fs", first_line(exc), delay)
                with anyio.move_on_after(delay):
                    await wake.wait()
                continue
            self.stats.claims += 1
            if self._metrics is not None:
                found = "yes" if claimed else "no"
                self._metrics.claims.labels(found, self._wake_reason).inc()
            self._wake_reason = "loop"
            for job in claimed:
                self._start(job)
            if len(claimed) == limit:
                continue
            claimed += limited
            if not claimed:
                self.stats.empty_claims += 1
                if self._burst and not self._running:
                    return
            if not self._waiting_sure and await self._mark_waiting():
                # Registered under the lock that waits for in-flight inserts: claim once more,
                # as those inserts did not notify.
                continue
            await self._sleep(wake)

    async def _claim_limited(self, limit: int) -> list[ClaimedJob]:
        assert self._store is not None
        try:
            return await self._store.claim_limited(
                worker_id=self.id,
                tasks=self._tasks,
                queues=self._queues,
                limit=limit,
                lease=self.settings.lease_seconds,
            )
        except NotifyQError as exc:
            logger.warning("limited claim failed: %s", first_line(exc))
            return []

    async def _sleep(self, wake: anyio.Event) -> None:
        """Waits for a notification, the fallback poll, the next known run_at, or stop."""
        assert self._store is not None
        timeout = self.settings.poll_interval
        try:
            due = await self._store.seconds_to_next_job(tasks=self._tasks, queues=self._queues)
        except NotifyQError:
            due = None
        if due is not None:
            timeout = min(timeout, max(due, 0.0))
        if self._guarded:
            timeout = min(timeout, max(self._next_probe - time.monotonic(), 0.0))
        if self._waiting and not self._waiting_sure:
            timeout = min(timeout, UNSURE_RECHECK)
        if self._limits_exist:
            # Tokens refill and limited slots free up without a notification.
            timeout = min(timeout, LIMIT_TICK)
        with anyio.move_on_after(timeout) as waited:
            await wake.wait()
        if waited.cancelled_caught:
            self._wake_reason = "poll"

    async def _mark_waiting(self) -> bool:
        """Registers this worker as waiting, so that inserts notify; answers whether the
        registration waited for in-flight inserts (see notifyq.mark_waiting_v1)."""
        assert self._store is not None
        try:
            sure = await self._store.mark_waiting(
                self.id, self._queues, self.settings.lease_seconds
            )
        except NotifyQError as exc:
            logger.warning("could not mark the worker idle (%s); polling", first_line(exc))
            return False
        self._waiting, self._waiting_sure = True, sure
        return sure

    async def _mark_busy(self) -> None:
        assert self._store is not None
        self._waiting = self._waiting_sure = False
        try:
            await self._store.unmark_waiting(self.id)
        except NotifyQError as exc:
            logger.debug("could not unmark the worker (%s); its mark expires", first_line(exc))

    def _on_connect(self) -> None:
        # A reconnect may follow a server restart, which empties the (unlogged) waiting table.
        self._waiting = self._waiting_sure = False
        if self._connected_once and self._metrics is not None:
            self._metrics.reconnects.inc()
        self._connected_once = True
        self._wake("connect")

    async def _probe_breakers(self) -> None:
        """Once a second: for each task whose breaker is half-open, try to win its probe and
        run one job of it."""
        assert self._store is not None
        self._next_probe = time.monotonic() + BREAKER_TICK
        try:
            won = await self._store.take_breaker_probes(self._guarded)
            for name in won:
                if self._free == 0:
                    break
                logger.info("task %s: circuit breaker half-open, running one probe job", name)
                claimed = await self._store.claim(
                    worker_id=self.id,
                    tasks=[name],
                    queues=self._queues,
                    limit=1,
                    lease=self.settings.lease_seconds,
                    probe=True,
                )
                for job in claimed:
                    self._start(job)
        except NotifyQError as exc:
            logger.warning("circuit breaker probe failed: %s", first_line(exc))

    def _start(self, job: ClaimedJob) -> None:
        task = self.registry.get(job.task)
        assert task is not None, "claimed a task this worker does not serve"
        self._free -= 1
        self._held[job.id] = job
        self.stats.claimed += 1
        if self._metrics is not None:
            self._metrics.started.labels(job.queue, job.task).inc()
            due = max(job.created_at, job.run_at)
            self._metrics.pickup.labels(job.queue).observe(max(0.0, time.time() - due))
        running = _Running(job, task)
        self._running[job.id] = running
        assert self._jobs is not None
        self._jobs.put_nowait(running)

    # -- running one job -------------------------------------------------------------------

    async def _runner(self, jobs: asyncio.Queue[_Running | None]) -> None:
        """One slot: runs the jobs it is given, one after the other, until a stop sign.

        The jobs run inside one cancel scope, which ``_Running.cancel`` cancels while its job
        runs; only then is it left and a new one opened. A scope per job, and anyio's memory
        stream, asked for the current task several times a job: a quarter of a busy worker's
        CPU. The queue is asyncio's, whose get() does not wait when a job is there."""
        while True:
            with anyio.CancelScope() as scope:
                while not scope.cancel_called:
                    running = await jobs.get()
                    if running is None:
                        return
                    await self._run_job(running, scope)

    async def _run_job(self, running: _Running, scope: anyio.CancelScope) -> None:
        job = running.job
        outcome: Success | Failure | None = None
        try:
            if running.cancel_reason is None:  # else cancelled before it started
                running.scope = scope
                running.started = True
                outcome = await self._attempt(job, running.task)
        finally:
            running.scope = None
            del self._running[job.id]
            self._free += 1
            if outcome is not None:
                # Finished, even if a cancel came too late or the handler swallowed it.
                if isinstance(outcome, Success):
                    self._outbox.done.append(outcome)
                else:
                    self._outbox.failed.append(outcome)
                self._signal_outbox()
            elif running.cancel_reason == "shutdown":
                self._outbox.released.append(Held(job.id, job.claim))
                self._signal_outbox()
            elif running.cancel_reason == "cancel":
                self._outbox.cancelled.append(Held(job.id, job.claim))
                self._signal_outbox()
            # Else the worker itself is being cancelled: the job stays held, and the final
            # writes put it back in the queue.
            if self._starved:
                self._starved = False
                self._wake("slot")
            if not self._running:
                if self._idle_event is not None:
                    self._idle_event.set()
                if self._burst:
                    self._wake()

    async def _attempt(self, job: ClaimedJob, task: Task) -> Success | Failure:
        started = time.monotonic()
        outcome = await self._attempt_timed(job, task, started)
        if self._metrics is not None:
            self._metrics.runtime.labels(job.queue, job.task).observe(outcome.seconds)
        return outcome

    async def _attempt_timed(
        self, job: ClaimedJob, task: Task, started: float
    ) -> Success | Failure:
        timed_out = False
        if isinstance(job.payload, Undecodable):
            # Stored by SQL, unreadable: this job can never run. Fail it at once, and only it.
            return self._failure(
                job,
                task,
                f"the job's payload cannot be used: {job.payload.reason}",
                started,
                retryable=False,
            )
        try:
            context = JobContext(
                job.id, job.task, job.queue, job.attempt, job.max_attempts, job.priority, self.id
            )
            if task.timeout is None:
                result = await task.run(job.payload, self._limiter, context)
            else:
                with anyio.move_on_after(task.timeout) as deadline:
                    result = await task.run(job.payload, self._limiter, context)
                if deadline.cancelled_caught:
                    timed_out = True
        except PermanentFailure as exc:
            return self._failure(job, task, _describe(exc), started, retryable=False)
        except Exception as exc:
            logger.warning(
                "job %s (%s) attempt %d/%d failed after %.3fs: %s",
                job.id,
                job.task,
                job.attempt,
                job.max_attempts,
                time.monotonic() - started,
                _describe(exc),
                exc_info=logger.isEnabledFor(logging.DEBUG),
            )
            return self._failure(
                job, task, _describe(exc, with_traceback=True), started, retryable=True
            )
        if timed_out:
            return self._failure(
                job,
                task,
                f"TimeoutError: task {task.name!r} ran past its {task.timeout:g}s "
                "timeout and was cancelled",
                started,
                retryable=True,
            )
        try:
            result_json = encode_json(result, what=f"the result of task {task.name!r}")
        except InvalidJob as exc:
            return self._failure(job, task, str(exc), started, retryable=False)
        return Success(job.id, job.claim, result_json, time.monotonic() - started)

    def _failure(
        self, job: ClaimedJob, task: Task, error: str, started: float, *, retryable: bool
    ) -> Failure:
        backoff = task.backoff or self._backoff
        return Failure(
            job.id,
            job.claim,
            error,
            retryable,
            backoff.delay(job.attempt),
            time.monotonic() - started,
        )

    # -- writer ----------------------------------------------------------------------------

    def _signal_outbox(self) -> None:
        if self._outbox_event is not None:
            self._outbox_event.set()

    async def _write_outcomes(self) -> None:
        failures = 0
        while True:
            assert self._outbox_event is not None
            await self._outbox_event.wait()
            self._outbox_event = anyio.Event()
            try:
                await self._flush()
                failures = 0
            except DatabaseUnavailable as exc:
                failures += 1
                delay = min(0.2 * 2**failures, 5.0)
                logger.warning("recording outcomes failed (%s); retrying in %.1fs", exc, delay)
                await anyio.sleep(delay)
                self._signal_outbox()

    async def _flush(self) -> None:
        """Writes what the outbox holds. Items leave the outbox only once written, so a write
        interrupted by cancellation or a broken connection is retried."""
        assert self._flush_lock is not None
        async with self._flush_lock:
            await self._flush_locked()

    async def _flush_locked(self) -> None:
        assert self._store is not None
        box = self._outbox
        if box.done:
            batch = list(box.done)
            written = await self._write_batch(self._store.complete, batch, set())
            del box.done[: len(batch)]
            self._forget(batch, written, "completed")
            self.stats.completed += len(written)
            # A result the database refused (too large, say) fails its job instead.
            box.failed.extend(
                Failure(s.job_id, s.claim, "could not store the result: " + refused, False, 0)
                for s, refused in self._refused.items()
            )
            self._refused.clear()
        if box.failed:
            batch_f = list(box.failed)
            rows = await self._write_batch(self._store.fail, batch_f, {})
            del box.failed[: len(batch_f)]
            self._forget(batch_f, rows, "failed")
            retried = sum(1 for status in rows.values() if status is JobStatus.QUEUED)
            self.stats.retried += retried
            self.stats.failed += len(rows) - retried
            if retried:
                self._wake()  # the retry's run_at may be sooner than the current sleep
        if box.cancelled:
            batch_c = list(box.cancelled)
            stopped = await self._write_batch(self._store.cancel_running, batch_c, set())
            del box.cancelled[: len(batch_c)]
            self._forget(batch_c, stopped, "cancelled")
            self.stats.cancelled += len(stopped)
        if box.released:
            batch_r = list(box.released)
            released = await self._write_batch(self._store.release, batch_r, set())
            del box.released[: len(batch_r)]
            self._forget(batch_r, released, "released")
            self.stats.released += len(released)

    async def _write_batch(self, write: Any, batch: list[Any], merged: Any) -> Any:
        """One statement for the batch; if the database refuses it for a reason other than the
        connection, item by item (adding to ``merged``), so that one bad row cannot block the
        others."""
        try:
            return await write(self.id, batch)
        except DatabaseError as exc:
            logger.error(
                "batch write refused (%s); writing %d item(s) one by one",
                first_line(exc),
                len(batch),
            )
        for item in batch:
            try:
                part = await write(self.id, [item])
            except DatabaseError as exc:
                logger.error(
                    "job %s: the database refused its outcome: %s", item.job_id, first_line(exc)
                )
                if isinstance(item, Success):
                    self._refused[item] = first_line(exc)
                continue
            merged |= part
        return merged

    def _forget(
        self,
        batch: list[Any],
        written: set[UUID] | dict[UUID, JobStatus],
        kind: str,
    ) -> None:
        """Lets go of written jobs (and of those whose write was discarded)."""
        for item in batch:
            job = self._held.pop(item.job_id, None)
            if job is not None and item.job_id in written:
                status = written.get(item.job_id) if isinstance(written, dict) else None
                self._record(job, kind, status, getattr(item, "seconds", 0.0))
            if item.job_id not in written:
                if self._metrics is not None:
                    self._metrics.lost.inc()
                self.stats.lost += 1
                logger.warning(
                    "job %s: outcome discarded, this worker no longer holds its lease",
                    item.job_id,
                )

    def _record(self, job: ClaimedJob, kind: str, status: JobStatus | None, seconds: float) -> None:
        """Metrics and the job's log line, once its outcome is in the database."""
        event = kind
        if kind == "failed" and status is JobStatus.QUEUED:
            event = "retried"
        if self._metrics is not None:
            counter = {
                "completed": self._metrics.completed,
                "failed": self._metrics.failed,
                "retried": self._metrics.retried,
                "cancelled": self._metrics.cancelled,
            }.get(event)
            if counter is not None:
                counter.labels(job.queue, job.task).inc()
        if event == "released":
            return
        # Completions are the bulk (thousands a second): DEBUG. Metrics count them.
        level = {"failed": logging.WARNING, "completed": logging.DEBUG}.get(event, logging.INFO)
        if logger.isEnabledFor(level):
            logger.log(
                level,
                "job %s %s (task %s, attempt %d/%d, %.1f ms)",
                job.id,
                event,
                job.task,
                job.attempt,
                job.max_attempts,
                seconds * 1000,
                extra={
                    "job_id": str(job.id),
                    "task": job.task,
                    "queue": job.queue,
                    "attempt": job.attempt,
                    "duration_ms": round(seconds * 1000, 3),
                    "event": event,
                },
            )

    async def _final_writes(self) -> None:
        """Writes outcomes still pending and puts interrupted jobs back in the queue."""
        if self._store is None:
            return
        # Whatever this worker believes (a reconnect forgets the mark without deleting it).
        await self._mark_busy()
        box = self._outbox
        pending = {s.job_id for s in box.done} | {f.job_id for f in box.failed}
        pending |= {h.job_id for h in (*box.released, *box.cancelled)}
        for job_id, job in self._held.items():
            if job_id not in pending:
                self._outbox.released.append(Held(job_id, job.claim))
        if not self._outbox:
            return
        try:
            await self._flush()
        except DatabaseUnavailable as exc:
            logger.error(
                "could not record %d job(s) before stopping (%s); they stay processing and "
                "are requeued when their lease runs out",
                len(self._held),
                exc,
            )

    # -- stopping --------------------------------------------------------------------------

    async def _drain(self) -> None:
        assert self._idle_event is not None
        with anyio.move_on_after(self.settings.shutdown_grace):
            while self._running:
                self._idle_event = anyio.Event()
                await self._idle_event.wait()
        if self._running:
            logger.warning(
                "shutdown grace of %.0fs ran out: interrupting %d job(s) and putting them back "
                "in the queue",
                self.settings.shutdown_grace,
                len(self._running),
            )
            for running in list(self._running.values()):
                running.cancel("shutdown")

    # -- maintenance -----------------------------------------------------------------------

    async def _maintain(self) -> None:
        while True:
            await anyio.sleep(self.settings.heartbeat)
            # Each duty on its own: a failed rescue must not stop the next heartbeat.
            for duty in (self._heartbeat, self._rescue):
                try:
                    await duty()
                except NotifyQError as exc:
                    logger.warning("%s failed: %s", duty.__name__.strip("_"), first_line(exc))

    async def _heartbeat(self) -> None:
        assert self._store is not None
        if not self._held:
            return
        snapshot = [Held(job_id, job.claim) for job_id, job in self._held.items()]
        # Confirmed: every held job but those still waiting for a runner. A rescue gives the
        # attempt of an unconfirmed one back (its handler may never have started).
        waiting = {job_id for job_id, r in self._running.items() if not r.started}
        confirmed = {held.job_id for held in snapshot} - waiting
        still = await self._store.beat(self.id, snapshot, confirmed, self.settings.lease_seconds)
        for job_id, cancel_requested in still.items():
            running = self._running.get(job_id)
            if cancel_requested and running is not None:
                running.cancel("cancel")
        for held in snapshot:
            current = self._held.get(held.job_id)
            if held.job_id in still or current is None or current.claim != held.claim:
                continue
            running = self._running.get(held.job_id)
            if running is not None:
                self._held.pop(held.job_id, None)
                self.stats.lost += 1
                logger.warning(
                    "job %s: lease lost (another worker rescued it); cancelling this attempt",
                    held.job_id,
                )
                running.cancel("lease_lost")

    async def _rescue(self) -> None:
        assert self._store is not None
        if self._waiting:
            await self._store.refresh_waiting(self.id, self.settings.lease_seconds)
        await self._store.prune_waiting()
        self._limits_exist = await self._store.limits_exist(self._tasks)
        rescued = await self._store.rescue_expired()
        if rescued:
            self.stats.rescued += len(rescued)
            if self._metrics is not None:
                self._metrics.rescued.inc(len(rescued))
            logger.warning(
                "rescued %d job(s) whose worker stopped renewing its lease", len(rescued)
            )
            self._wake()

    # -- housekeeping ------------------------------------------------------------------------

    async def _housekeep(self) -> None:
        """Retention: deletes finished jobs past their keep time, in small batches, so the hot
        table stays small. Every worker does it; SKIP LOCKED keeps them out of each other's way.
        """
        assert self._store is not None
        next_prune = 0.0
        while True:
            try:
                if time.monotonic() >= next_prune:
                    next_prune = time.monotonic() + self.settings.prune_interval
                    deleted = await prune(self._store, self.settings)
                    if deleted:
                        logger.info("retention: deleted %d finished job(s)", deleted)
                    await self._store.prune_ticks()
                if self._report_depth:
                    assert self._metrics is not None
                    self._metrics.set_depth(await self._store.queue_stats())
            except NotifyQError as exc:
                logger.warning("housekeeping failed: %s", first_line(exc))
            pause = max(next_prune - time.monotonic(), 0.05)
            await anyio.sleep(min(pause, DEPTH_INTERVAL) if self._report_depth else pause)

    async def _schedule(self) -> None:
        """Enqueues periodic tasks on their ticks. Every worker tries every tick; the tick's row
        in notifyq.periodic_ticks lets exactly one of them enqueue it. Ticks are computed on the
        database's clock, so workers agree even when their own clocks drift."""
        assert self._store is not None
        last: dict[str, datetime] = {}
        while True:
            try:
                # Cron expressions are read in UTC, whatever the server's TimeZone.
                now = (await self._store.database_now()).astimezone(timezone.utc)
                for task in self._periodic:
                    assert task.cron is not None
                    # On start, the latest tick of the last minute still counts: a worker that
                    # restarts right after a tick does not lose it (the row dedups).
                    since = last.get(task.name, now - timedelta(minutes=1))
                    for tick in _ticks(task.cron, since, now):
                        job_id = await self._store.enqueue_tick(
                            task.name, tick, json.dumps(task.cron_payload)
                        )
                        if job_id is not None:
                            logger.info(
                                "periodic %s: enqueued tick %s as job %s",
                                task.name,
                                tick.isoformat(),
                                job_id,
                            )
                        last[task.name] = tick
                upcoming = min(next(iter(CronSim(t.cron or "", now))) for t in self._periodic)
                pause = (upcoming - now).total_seconds()
            except NotifyQError as exc:
                logger.warning("periodic scheduling failed: %s", first_line(exc))
                pause = 5.0
            await anyio.sleep(min(max(pause, 0.05), 60.0))


async def prune(store: Store, settings: Settings, *, batch: int = 1000) -> int:
    """Deletes finished jobs older than their keep setting, ``batch`` rows per statement;
    answers how many."""
    total = 0
    for status, keep in (
        (JobStatus.COMPLETED, settings.keep_completed),
        (JobStatus.FAILED, settings.keep_failed),
        (JobStatus.CANCELLED, settings.keep_cancelled),
    ):
        if keep is None:
            continue
        while True:
            deleted = await store.prune(status, keep, batch=batch)
            total += deleted
            if deleted < batch:
                break
            await anyio.lowlevel.checkpoint()
    return total


def _ticks(cron: str, after: datetime, until: datetime) -> list[datetime]:
    """The ticks of ``cron`` in (after, until], at most 100 (a long outage is not replayed)."""
    found: list[datetime] = []
    for tick in CronSim(cron, after):
        if tick > until or len(found) == 100:
            break
        if tick > after:
            found.append(tick)
    return found[-100:]


def _short_path(filename: str) -> str:
    """A source path without the machine's folders: from the package root of an installed
    module, else relative to the working folder, else the last two parts."""
    path = Path(filename)
    parts = path.parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1 :])
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return "/".join(parts[-2:])


def _describe(exc: BaseException, *, with_traceback: bool = False) -> str:
    """``Type: message``, then (optionally) where it was raised; bounded and free of NUL."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if with_traceback and exc.__traceback__ is not None:
        frames = traceback.extract_tb(exc.__traceback__)[-3:]
        where = "; ".join(f"{_short_path(f.filename)}:{f.lineno} in {f.name}" for f in frames)
        text = f"{text}\n  at {where}"
    text = text.replace("\x00", "\\0")
    if len(text) > MAX_ERROR_LENGTH:
        text = text[: MAX_ERROR_LENGTH - 20] + "... (truncated)"
    return text.encode("utf-8", "replace").decode("utf-8")
