"""The store: the one class that runs notifyq's queries, one method per named query.

It works on a connection pool, or on a connection the caller passes (to enqueue inside the
caller's own transaction). Connection failures come out as
:class:`~notifyq.errors.DatabaseUnavailable`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from itertools import count, islice
from typing import Any, Literal, TypeVar
from uuid import UUID

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from notifyq.db import translate_errors
from notifyq.models import ClaimedJob, EnqueueResult, Job, JobSpec, JobStatus
from notifyq.queries import load_queries
from notifyq.retry import CircuitBreaker
from notifyq.tasks import Task


@dataclass(frozen=True, slots=True)
class Success:
    """A finished attempt, its result already encoded as JSON. ``claim`` is the claim number
    that fences the write (see notifyq.holds_v1)."""

    job_id: UUID
    claim: int
    result_json: str
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt: retried after ``delay`` seconds while attempts are left and it is
    ``retryable``, else final."""

    job_id: UUID
    claim: int
    error: str
    retryable: bool
    delay: float
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Held:
    """A job a worker holds: its id and the claim number that fences its writes."""

    job_id: UUID
    claim: int


@dataclass(frozen=True, slots=True)
class Rescued:
    """A job whose lease ran out, the status the rescue gave it, and whether the attempt
    counted (False: no heartbeat had confirmed its handler running, so it was given back)."""

    job_id: UUID
    status: JobStatus
    counted: bool = True


@dataclass(frozen=True, slots=True)
class Cancelled:
    """What a cancel request found (``was``) and left (``now``): ``now`` is still
    ``processing`` when the job's worker was asked to stop it."""

    was: JobStatus
    now: JobStatus


#: Most rows one batch statement writes (see Store._in_chunks).
WRITE_CHUNK = 100

#: Jobs per statement of Store.enqueue_many. Sent in one pipeline, chunks of 250 moved 1,000
#: jobs x1.35 as fast as one statement did; smaller chunks added statements for no gain.
ENQUEUE_CHUNK = 250

T = TypeVar("T")
R = TypeVar("R")


class Store:
    """Runs notifyq's queries against ``pool``."""

    def __init__(
        self, pool: AsyncConnectionPool, *, default_max_attempts: int | None = None
    ) -> None:
        """``default_max_attempts`` applies to jobs whose submission and task set none; None
        leaves it to the database's default (``notifyq.settings``)."""
        self._pool = pool
        self._q = load_queries()
        self._default_max_attempts = default_max_attempts

    async def _run(
        self,
        name: str,
        params: dict[str, Any] | None,
        *,
        what: str,
        fetch: Literal["all", "one", "none", "rowcount"] = "all",
        conn: psycopg.AsyncConnection[Any] | None = None,
        as_dicts: bool = False,
    ) -> Any:
        """Runs query ``name`` and fetches its rows. On a pooled connection that the server had
        closed while it sat idle (a restart, pg_terminate_backend), the query never ran, so it
        is run again on another connection, up to the size of the pool."""
        query = self._q[name]

        async def on(c: psycopg.AsyncConnection[Any]) -> Any:
            cursor = c.cursor(row_factory=dict_row) if as_dicts else c.cursor()
            await cursor.execute(query, params)
            if fetch == "all":
                return await cursor.fetchall()
            if fetch == "one":
                return await cursor.fetchone()
            if fetch == "rowcount":
                return cursor.rowcount
            return None

        return await self._on_connection(on, what=what, conn=conn)

    async def _on_connection(
        self,
        on: Callable[[psycopg.AsyncConnection[Any]], Awaitable[R]],
        *,
        what: str,
        conn: psycopg.AsyncConnection[Any] | None,
    ) -> R:
        """``on(conn)``, else ``on`` a pooled connection, run again on another one while the
        pool hands out connections that the server had closed (see :meth:`_run`)."""
        with translate_errors(what):
            if conn is not None:
                return await on(conn)
            tries = (self._pool.max_size or 1) + 1
            for attempt in range(1, tries + 1):
                pooled: psycopg.AsyncConnection[Any] | None = None
                try:
                    async with self._pool.connection() as pooled:
                        return await on(pooled)
                except psycopg.OperationalError:
                    if attempt < tries and pooled is not None and pooled.broken:
                        continue
                    raise
        raise AssertionError("unreachable")

    # -- submitting --------------------------------------------------------------------------

    async def enqueue(
        self, spec: JobSpec, *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> EnqueueResult:
        """Enqueues one job with the duplicate rule; in ``conn``'s transaction when given."""
        params = _spec_params(spec) | {"fallback": self._default_max_attempts}
        # Without a dedup key or a task to resolve in SQL, a plain INSERT does it.
        query = "enqueue_plain" if spec.dedup_key is None and spec.task is not None else "enqueue"
        row = await self._run(query, params, what="enqueue", fetch="one", conn=conn)
        return EnqueueResult(row[0], JobStatus(row[2]), row[1], row[3], row[4])

    async def enqueue_many(
        self, specs: Iterable[JobSpec], *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> list[EnqueueResult]:
        """Enqueues many jobs in one transaction (within ``conn``'s when given); one result per
        spec, in order. ``specs`` may be lazy, and may raise (InvalidJob, say): then nothing
        is stored.

        Up to ENQUEUE_CHUNK jobs go as one statement. A larger batch goes as one statement per
        chunk, in one pipeline: each chunk is sent as soon as ``specs`` has yielded it, so that
        PostgreSQL inserts it while the next one is validated and encoded."""
        pending = iter(specs)
        chunks = [list(islice(pending, ENQUEUE_CHUNK))]
        if not chunks[0]:
            return []
        if len(chunks[0]) < ENQUEUE_CHUNK:
            name, params = self._enqueue_many_statement(chunks[0])
            rows = await self._run(name, params, what="enqueue", conn=conn)
            return _enqueue_many_results(name, chunks[0], rows)

        async def on(c: psycopg.AsyncConnection[Any]) -> list[EnqueueResult]:
            # The chunks taken so far are kept, so that a retry on another connection sends
            # them again before taking more.
            sent = []
            async with c.transaction(), c.pipeline():
                for index in count():
                    if index == len(chunks):
                        chunk = list(islice(pending, ENQUEUE_CHUNK))
                        if not chunk:
                            break
                        chunks.append(chunk)
                    name, params = self._enqueue_many_statement(chunks[index])
                    cursor = c.cursor()
                    await cursor.execute(self._q[name], params)
                    sent.append((name, chunks[index], cursor))
                results = []
                for name, chunk, cursor in sent:
                    results += _enqueue_many_results(name, chunk, await cursor.fetchall())
            return results

        return await self._on_connection(on, what="enqueue", conn=conn)

    def _enqueue_many_statement(self, specs: list[JobSpec]) -> tuple[str, dict[str, Any]]:
        """The query that enqueues ``specs`` (see :func:`_enqueue_many_results`), and its
        parameters."""
        tasks = [s.task for s in specs]
        payloads = [s.payload_json for s in specs]
        queues = [s.queue for s in specs]
        priorities = [s.priority for s in specs]
        run_ats = [s.run_at for s in specs]
        max_attempts = [s.max_attempts for s in specs]
        dedup_keys = [s.dedup_key for s in specs]
        if dedup_keys.count(None) != len(specs) or None in tasks:
            return "enqueue_many", {
                "tasks": tasks,
                "payloads": payloads,
                "queues": queues,
                "priorities": priorities,
                "run_ats": run_ats,
                "delays": [s.delay if s.delay is not None else 0.0 for s in specs],
                "dedup_keys": dedup_keys,
                "max_attempts": max_attempts,
                "fallback": self._default_max_attempts,
            }
        # No duplicates to look for and every task known: one INSERT ... SELECT, which answers
        # the ids in input order. A column that no job sets goes as one NULL.
        return "enqueue_many_plain", {
            "tasks": tasks,
            "payloads": payloads,
            "queues": _sparse(queues),
            "priorities": _sparse(priorities),
            "run_ats": _sparse(run_ats),
            "delays": _sparse([s.delay for s in specs]),
            "max_attempts": _sparse(max_attempts),
            "fallback": self._default_max_attempts,
        }

    async def get_job(self, job_id: UUID) -> Job | None:
        """The job, or None."""
        row = await self._run(
            "get_job", {"id": job_id}, what="reading a job", fetch="one", as_dicts=True
        )
        return Job.from_row(row) if row else None

    async def ping(self) -> None:
        """Raises DatabaseUnavailable unless the database answers."""
        await self._run("ping", None, what="health check", fetch="one")

    # -- working -----------------------------------------------------------------------------

    async def claim(
        self,
        *,
        worker_id: str,
        tasks: Sequence[str],
        queues: Sequence[str] | None,
        limit: int,
        lease: float,
        probe: bool = False,
    ) -> list[ClaimedJob]:
        """Claims up to ``limit`` due jobs. ``probe`` ignores open circuit breakers: only for a
        worker that took the probe of ``tasks``."""
        params: dict[str, Any] = {
            "worker_id": worker_id,
            "tasks": list(tasks),
            "queues": None if queues is None else list(queues),
            "limit": limit,
            "lease": lease,
            "probe": probe,
        }
        rows = await self._run("claim_jobs", params, what="claiming jobs")
        return [ClaimedJob(*row) for row in rows]

    async def seconds_to_next_job(
        self, *, tasks: Sequence[str], queues: Sequence[str] | None
    ) -> float | None:
        """Seconds until the earliest queued job of these tasks that is not due yet."""
        params = {"tasks": list(tasks), "queues": None if queues is None else list(queues)}
        row = await self._run(
            "seconds_to_next_job", params, what="looking for delayed jobs", fetch="one"
        )
        return row[0] if row else None

    async def complete(self, worker_id: str, done: Sequence[Success]) -> set[UUID]:
        """Records successes; answers the ids written (the others had lost their lease)."""
        rows = await self._in_chunks(
            "complete_jobs",
            done,
            lambda chunk: {
                "worker_id": worker_id,
                "ids": [d.job_id for d in chunk],
                "claims": [d.claim for d in chunk],
                "results": [d.result_json for d in chunk],
            },
            "recording results",
        )
        return {row[0] for row in rows}

    async def fail(self, worker_id: str, failed: Sequence[Failure]) -> dict[UUID, JobStatus]:
        """Records failed attempts; answers the new status of each row written."""
        rows = await self._in_chunks(
            "fail_jobs",
            failed,
            lambda chunk: {
                "worker_id": worker_id,
                "ids": [f.job_id for f in chunk],
                "claims": [f.claim for f in chunk],
                "errors": [f.error for f in chunk],
                "retryable": [f.retryable for f in chunk],
                "delays": [f.delay for f in chunk],
            },
            "recording failures",
        )
        return {row[0]: JobStatus(row[1]) for row in rows}

    async def release(self, worker_id: str, held: Iterable[Held]) -> set[UUID]:
        """Puts interrupted jobs back in the queue, attempt not counted."""
        rows = await self._in_chunks(
            "release_jobs", list(held), partial(_held_params, worker_id), "releasing jobs"
        )
        return {row[0] for row in rows}

    async def beat(
        self, worker_id: str, held: Iterable[Held], running: Container[UUID], lease: float
    ) -> dict[UUID, bool]:
        """Renews leases, and confirms the jobs whose handler is ``running`` (a rescue then
        counts their attempt); answers the ids still held by this worker, each with whether a
        cancel was requested."""
        rows = await self._in_chunks(
            "beat",
            list(held),
            lambda chunk: (
                _held_params(worker_id, chunk)
                | {"running": [h.job_id in running for h in chunk], "lease": lease}
            ),
            "renewing leases",
        )
        return {row[0]: row[1] for row in rows}

    async def cancel_running(self, worker_id: str, held: Iterable[Held]) -> set[UUID]:
        """Records attempts stopped by a cancel request."""
        rows = await self._in_chunks(
            "cancel_running",
            list(held),
            partial(_held_params, worker_id),
            "recording cancellations",
        )
        return {row[0] for row in rows}

    async def _in_chunks(
        self,
        name: str,
        items: Sequence[T],
        params_of: Callable[[Sequence[T]], dict[str, Any]],
        what: str,
    ) -> list[Any]:
        """Runs a batch statement over ``items`` at most WRITE_CHUNK at a time. Most of these
        statements join their unnest()ed arrays to the jobs they update; with the generic plan
        of a prepared statement that join is a nested loop, quadratic in the batch (1.4 s for
        600 rows), so the batches stay small enough for it not to matter. complete_jobs and
        fail_jobs are linear (see sql/002)."""
        rows: list[Any] = []
        for start in range(0, len(items), WRITE_CHUNK):
            chunk = items[start : start + WRITE_CHUNK]
            rows += await self._run(name, params_of(chunk), what=what)
        return rows

    async def cancel_job(self, job_id: UUID) -> Cancelled | None:
        """Cancels a queued job (or a running one that no live worker holds), or asks the
        worker of a running one to stop it; None: no such job."""
        row = await self._run("cancel_job", {"id": job_id}, what="cancelling a job", fetch="one")
        return Cancelled(JobStatus(row[0]), JobStatus(row[1])) if row else None

    async def delete_job(self, job_id: UUID) -> bool:
        """Deletes a finished job; False when it is not finished or unknown."""
        row = await self._run("delete_job", {"id": job_id}, what="deleting a job", fetch="one")
        return row is not None

    async def queue_stats(
        self, *, exact_below: int = 200_000, sample_percent: float = 2.0
    ) -> list[dict[str, Any]]:
        """Counts by status per queue (completed ones estimated on a large table), the oldest
        due job's wait, last minute's throughput, and the queue's switches."""
        rows: list[dict[str, Any]] = await self._run(
            "queue_stats",
            {"exact_below": exact_below, "sample_percent": sample_percent},
            what="counting jobs",
            as_dicts=True,
        )
        return rows

    async def configure_queue(
        self,
        queue: str,
        *,
        paused: bool | None = None,
        rate_limit: float | None = None,
        notify: bool | None = None,
    ) -> None:
        """Changes a queue's switches; None leaves one as it is (a rate limit of 0 removes
        it)."""
        params = {"queue": queue, "paused": paused, "rate_limit": rate_limit, "notify": notify}
        await self._run("configure_queue", params, what="configuring a queue", fetch="one")

    async def schema_version(self) -> int | None:
        """The newest applied migration."""
        row = await self._run(
            "schema_version", None, what="reading the schema version", fetch="one"
        )
        return row[0] if row else None

    async def rescue_expired(self, limit: int = 100) -> list[Rescued]:
        """Requeues (or fails, or cancels) up to ``limit`` jobs whose lease ran out or that
        have none."""
        rows = await self._run("rescue_expired", {"limit": limit}, what="rescuing jobs")
        return [Rescued(row[0], JobStatus(row[1]), row[2]) for row in rows]

    async def mark_waiting(self, worker_id: str, queues: Sequence[str] | None, ttl: float) -> bool:
        """Registers a worker as waiting; True when the registration waited for in-flight
        inserts (so a claim right after it sees them all)."""
        params = {
            "worker_id": worker_id,
            "queues": None if queues is None else list(queues),
            "ttl": ttl,
        }
        row = await self._run("mark_waiting", params, what="marking the worker idle", fetch="one")
        return bool(row[0])

    async def unmark_waiting(self, worker_id: str) -> None:
        """Removes a worker's idle mark: inserts stop waking it."""
        await self._run(
            "unmark_waiting", {"worker_id": worker_id}, what="marking the worker busy", fetch="none"
        )

    async def refresh_waiting(self, worker_id: str, ttl: float) -> None:
        """Keeps a worker's idle mark from expiring."""
        await self._run(
            "refresh_waiting",
            {"worker_id": worker_id, "ttl": ttl},
            what="refreshing the idle mark",
            fetch="none",
        )

    async def prune_waiting(self) -> None:
        """Deletes the idle marks of workers that stopped refreshing them."""
        await self._run("prune_waiting", None, what="pruning idle marks", fetch="none")

    async def register_task(self, task: Task, breaker: CircuitBreaker | None) -> None:
        """Records a task, its options, limits and breaker, for all workers and the API."""
        params = {
            "name": task.name,
            "max_attempts": task.max_attempts,
            "options": task.options_json(),
            "breaker_threshold": breaker.threshold if breaker else None,
            "breaker_cooldown": breaker.cooldown if breaker else 30.0,
            "max_concurrency": task.max_concurrency,
            "rate_limit": task.rate_limit,
            "rate_burst": None if task.rate_limit is None else max(task.rate_limit, 1.0),
        }
        await self._run("register_task", params, what="registering tasks", fetch="none")

    async def claim_limited(
        self,
        *,
        worker_id: str,
        tasks: Sequence[str],
        queues: Sequence[str] | None,
        limit: int,
        lease: float,
    ) -> list[ClaimedJob]:
        """Claims jobs under a task's or queue's limit (see notifyq.claim_limited_v2)."""
        params = {
            "worker_id": worker_id,
            "tasks": list(tasks),
            "queues": None if queues is None else list(queues),
            "limit": limit,
            "lease": lease,
        }
        rows = await self._run("claim_limited_jobs", params, what="claiming limited jobs")
        return [ClaimedJob(*row) for row in rows]

    async def limits_exist(self, tasks: Sequence[str]) -> bool:
        """Whether any of these tasks, or any queue, has a concurrency or rate limit."""
        row = await self._run(
            "limits_exist", {"tasks": list(tasks)}, what="reading limits", fetch="one"
        )
        return bool(row[0])

    async def enqueue_tick(self, task: str, tick: datetime, payload_json: str) -> UUID | None:
        """Enqueues the job of one tick of a periodic task; None when another worker did."""
        row = await self._run(
            "enqueue_tick",
            {"task": task, "tick": tick, "payload": payload_json},
            what="enqueueing a periodic job",
            fetch="one",
        )
        return row[0] if row else None

    async def database_now(self) -> datetime:
        """The database's clock."""
        row = await self._run("database_now", None, what="reading the clock", fetch="one")
        now: datetime = row[0]
        return now

    async def prune(self, status: JobStatus, keep: float, *, batch: int = 1000) -> int:
        """Deletes up to ``batch`` jobs in ``status`` finished more than ``keep`` seconds ago;
        answers how many (call again while it answers ``batch``)."""
        params = {"status": status.value, "keep": keep, "limit": batch}
        deleted: int = await self._run("prune_jobs", params, what="pruning jobs", fetch="rowcount")
        return deleted

    async def prune_ticks(self) -> None:
        """Deletes periodic ticks older than a week."""
        await self._run("prune_ticks", None, what="pruning periodic ticks", fetch="none")

    async def take_breaker_probes(self, tasks: Sequence[str]) -> list[str]:
        """The tasks whose half-open breaker this caller won the probe of."""
        rows = await self._run(
            "take_breaker_probes", {"tasks": list(tasks)}, what="probing circuit breakers"
        )
        return [row[0] for row in rows]

    async def list_tasks(self) -> list[dict[str, Any]]:
        """The registered tasks with their breaker state."""
        rows: list[dict[str, Any]] = await self._run(
            "list_tasks", None, what="listing tasks", as_dicts=True
        )
        return rows

    async def list_jobs(
        self,
        *,
        status: JobStatus | None = None,
        queue: str | None = None,
        task: str | None = None,
        limit: int = 50,
        after: tuple[datetime, UUID] | None = None,
    ) -> list[Job]:
        """Jobs newest first; ``after`` is the (created_at, id) of the last job of the page
        before."""
        params = {
            "status": status.value if status else None,
            "queue": queue,
            "task": task,
            "limit": limit,
            "after_created": after[0] if after else None,
            "after_id": after[1] if after else None,
        }
        rows = await self._run("list_jobs", params, what="listing jobs", as_dicts=True)
        return [Job.from_row(row) for row in rows]

    async def retry_job(self, job_id: UUID) -> bool:
        """Requeues one failed or cancelled job; False if it is in another state or unknown."""
        row = await self._run("retry_job", {"id": job_id}, what="retrying a job", fetch="one")
        return row is not None

    async def retry_jobs(
        self,
        *,
        status: JobStatus = JobStatus.FAILED,
        queue: str | None = None,
        task: str | None = None,
        batch: int = 1000,
    ) -> int:
        """Requeues every job in ``status`` (failed or cancelled) matching the filters, in
        batches; answers how many."""
        if status not in (JobStatus.FAILED, JobStatus.CANCELLED):
            raise ValueError("only failed or cancelled jobs can be retried")
        params: dict[str, Any] = {
            "status": status.value,
            "queue": queue,
            "task": task,
            "limit": batch,
            "after": UUID(int=0),
        }
        total = 0
        while True:
            row = await self._run("retry_jobs", params, what="retrying jobs", fetch="one")
            retried: int = row[0]
            scanned, last = row[1], row[2]
            total += retried
            if scanned < batch:
                return total
            params["after"] = last

    async def _ids(self, query: str, params: dict[str, Any], what: str) -> set[UUID]:
        return {row[0] for row in await self._run(query, params, what=what)}


def _enqueue_many_results(query: str, specs: list[JobSpec], rows: list[Any]) -> list[EnqueueResult]:
    """The results of ``specs``, from the rows of the statement that enqueued them."""
    if query == "enqueue_many":
        return [EnqueueResult(r[1], JobStatus(r[3]), r[2], r[4], r[5]) for r in rows]
    now: datetime = rows[0][0]
    ids: list[UUID] = rows[0][2]
    return [
        EnqueueResult(
            job_id,
            JobStatus.QUEUED,
            False,
            spec.run_at or (now + timedelta(seconds=spec.delay) if spec.delay else now),
            now,
        )
        for job_id, spec in zip(ids, specs, strict=True)
    ]


def _sparse(values: list[Any]) -> list[Any] | None:
    """``values``, or None when every one is None (one NULL instead of an array of them)."""
    return None if values.count(None) == len(values) else values


def _held_params(worker_id: str, held: Iterable[Held]) -> dict[str, Any]:
    items = list(held)
    return {
        "worker_id": worker_id,
        "ids": [h.job_id for h in items],
        "claims": [h.claim for h in items],
    }


def _spec_params(spec: JobSpec) -> dict[str, Any]:
    return {
        "task": spec.task,
        "payload": spec.payload_json,
        "queue": spec.queue,
        "priority": spec.priority,
        "run_at": spec.run_at,
        "delay": spec.delay if spec.delay is not None else 0.0,
        "dedup_key": spec.dedup_key,
        "max_attempts": spec.max_attempts,
    }
