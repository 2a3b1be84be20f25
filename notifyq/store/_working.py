"""The statements a worker runs for its jobs: claims, outcomes, progress, heartbeats, task
registrations, limits and breakers. Each calls one versioned function of the schema; with
:class:`~notifyq.store._upkeep.Upkeep` (rescue, idle mark, lead, retention, archive, ticks) these
methods are what :class:`notifyq.worker.WorkerStore` describes."""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import Any
from uuid import UUID

from psycopg.rows import scalar_row, tuple_row

from notifyq.models import (
    ClaimedJob,
    ClaimRequest,
    Failure,
    Held,
    JobStatus,
    Progress,
    Snoozed,
    Success,
    Suspended,
    TaskRegistration,
)
from notifyq.store._runner import (
    _JOB_ID_INT,
    WRITE_CHUNK,
    Runner,
    fields_and_row,
    fields_row,
)

_CLAIMED = fields_row(ClaimedJob)
#: The rows of look_and_claim_jobs: each claimed job with a null due, then (None, the look's due).
_CLAIMED_THEN_DUE = fields_and_row(ClaimedJob, "due")


class Working(Runner):
    """The worker's statements of :class:`~notifyq.store.Store`."""

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
        return await self._all("claim_jobs", params, _CLAIMED, what="claiming jobs")

    async def look_and_claim(
        self,
        *,
        worker_id: str,
        tasks: Sequence[str],
        queues: Sequence[str] | None,
        limit: int,
        lease: float,
    ) -> tuple[float | None, list[ClaimedJob]]:
        """:meth:`claim` and the look for the next run_at (seconds until the earliest queued
        job of these tasks that is not due yet, notifyq.next_due_v3), in one statement: the
        look costs the claim no round trip, and reads the same now(). Answers both."""
        params: dict[str, Any] = {
            "worker_id": worker_id,
            "tasks": list(tasks),
            "queues": None if queues is None else list(queues),
            "limit": limit,
            "lease": lease,
        }
        rows = await self._all(
            "look_and_claim_jobs", params, _CLAIMED_THEN_DUE, what="claiming jobs"
        )
        due: float | None = None
        claimed: list[ClaimedJob] = []
        for job, row_due in rows:
            if job is None:
                due = row_due
            else:
                claimed.append(job)
        return due, claimed

    async def claim_limited(
        self,
        *,
        worker_id: str,
        tasks: Sequence[str],
        queues: Sequence[str] | None,
        limit: int,
        lease: float,
    ) -> list[ClaimedJob]:
        """Claims jobs under a task's or queue's limit (see notifyq.claim_limited_v4)."""
        params = {
            "worker_id": worker_id,
            "tasks": list(tasks),
            "queues": None if queues is None else list(queues),
            "limit": limit,
            "lease": lease,
        }
        return await self._all("claim_limited_jobs", params, _CLAIMED, what="claiming limited jobs")

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
            tuple_row,
            what="recording results",
        )
        return _ids(rows)

    async def complete_and_claim(
        self, worker_id: str, done: Sequence[Success], claim: ClaimRequest
    ) -> tuple[set[UUID], list[ClaimedJob]]:
        """Records successes and claims up to ``claim.limit`` due jobs for the same worker, in
        one statement (see notifyq.complete_and_claim_v2); answers the ids written and the jobs
        claimed. A batch larger than one write chunk is written as :meth:`complete` writes it,
        and claims nothing."""
        if claim.limit <= 0 or len(done) > WRITE_CHUNK:
            return await self.complete(worker_id, done), []
        ordered = sorted(done, key=_JOB_ID_INT)  # the lock order of every batch write
        params = {
            "worker_id": worker_id,
            "ids": [d.job_id for d in ordered],
            "claims": [d.claim for d in ordered],
            "results": [d.result_json for d in ordered],
            "tasks": list(claim.tasks),
            "queues": None if claim.queues is None else list(claim.queues),
            "take": claim.limit,
            "lease": claim.lease,
        }
        rows = await self._all(
            "complete_and_claim_jobs", params, tuple_row, what="recording results"
        )
        written = {row[0] for row in rows if row[1] is None}
        return written, [ClaimedJob(*row) for row in rows if row[1] is not None]

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
            tuple_row,
            what="recording failures",
        )
        return {job_id: JobStatus(status) for job_id, status in rows}

    async def release(self, worker_id: str, held: Iterable[Held]) -> set[UUID]:
        """Puts interrupted jobs back in the queue, attempt not counted."""
        rows = await self._in_chunks(
            "release_jobs",
            list(held),
            lambda chunk: _held_params(worker_id, chunk),
            tuple_row,
            what="releasing jobs",
        )
        return _ids(rows)

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
            tuple_row,
            what="renewing leases",
        )
        return dict(rows)

    async def cancel_running(self, worker_id: str, held: Iterable[Held]) -> set[UUID]:
        """Records attempts stopped by a cancel request."""
        rows = await self._in_chunks(
            "cancel_running",
            list(held),
            lambda chunk: _held_params(worker_id, chunk),
            tuple_row,
            what="recording cancellations",
        )
        return _ids(rows)

    async def snooze(self, worker_id: str, snoozed: Sequence[Snoozed]) -> set[UUID]:
        """Puts snoozed jobs back in the queue for later, attempt not counted; answers the ids
        written."""
        rows = await self._in_chunks(
            "snooze_jobs",
            snoozed,
            lambda chunk: {
                "worker_id": worker_id,
                "ids": [s.job_id for s in chunk],
                "claims": [s.claim for s in chunk],
                "delays": [s.delay for s in chunk],
            },
            tuple_row,
            what="snoozing jobs",
        )
        return _ids(rows)

    async def suspend(
        self, worker_id: str, suspended: Sequence[Suspended]
    ) -> dict[UUID, JobStatus]:
        """Suspends jobs whose handler slept or waits for a signal (see notifyq.suspend_v1);
        answers the status of each job written: ``suspended``, or ``queued`` when its signal
        or its time came already."""
        rows = await self._in_chunks(
            "suspend_jobs",
            suspended,
            lambda chunk: {
                "worker_id": worker_id,
                "ids": [s.job_id for s in chunk],
                "claims": [s.claim for s in chunk],
                "delays": [s.delay for s in chunk],
                "signals": [s.signal for s in chunk],
                "marks": [s.mark for s in chunk],
                "kinds": [s.kind for s in chunk],
            },
            tuple_row,
            what="suspending jobs",
        )
        return {job_id: JobStatus(status) for job_id, status in rows}

    async def durable_state(self, job_id: UUID) -> list[tuple[str, str, Any]]:
        """A job's recorded steps and marks, its signals, and the database's time (see
        notifyq.durable_state_v1)."""
        return await self._all(
            "durable_state", {"job_id": job_id}, tuple_row, what="reading a job's steps"
        )

    async def record_step(
        self, worker_id: str, job_id: UUID, claim: int, name: str, result_json: str
    ) -> str:
        """Stores a step's result, fenced by the claim: ``written``, ``exists`` or
        ``refused`` (see notifyq.record_step_v1)."""
        params = {
            "worker_id": worker_id,
            "job_id": job_id,
            "claim": claim,
            "name": name,
            "result": result_json,
        }
        return str(await self._value("record_step", params, what="recording a step"))

    async def report_progress(self, worker_id: str, reports: Sequence[Progress]) -> set[UUID]:
        """Records the progress of running jobs; answers the ids written (the others are no
        longer this worker's)."""
        rows = await self._in_chunks(
            "report_progress",
            reports,
            lambda chunk: {
                "worker_id": worker_id,
                "ids": [p.job_id for p in chunk],
                "claims": [p.claim for p in chunk],
                "fractions": [p.fraction for p in chunk],
                "messages": [p.message for p in chunk],
            },
            tuple_row,
            what="recording progress",
        )
        return _ids(rows)

    async def register_task(self, task: TaskRegistration) -> None:
        """Records a task, its options, limits and breaker, for all workers and the API."""
        params = {
            "name": task.name,
            "max_attempts": task.max_attempts,
            "options": task.options_json,
            "breaker_threshold": task.breaker_threshold,
            "breaker_cooldown": task.breaker_cooldown,
            "max_concurrency": task.max_concurrency,
            "rate_limit": task.rate_limit,
            "rate_burst": None if task.rate_limit is None else max(task.rate_limit, 1.0),
            "key_concurrency": task.key_concurrency,
        }
        await self._execute("register_task", params, what="registering tasks")

    async def limits_exist(self, tasks: Sequence[str]) -> bool:
        """Whether any of these tasks, or any queue, has a concurrency or rate limit."""
        return bool(
            await self._value("limits_exist", {"tasks": list(tasks)}, what="reading limits")
        )

    async def take_breaker_probes(self, tasks: Sequence[str]) -> list[str]:
        """The tasks whose half-open breaker this caller won the probe of."""
        return await self._all(
            "take_breaker_probes", {"tasks": list(tasks)}, scalar_row, what="probing breakers"
        )


def _held_params(worker_id: str, held: Sequence[Held]) -> dict[str, Any]:
    return {
        "worker_id": worker_id,
        "ids": [h.job_id for h in held],
        "claims": [h.claim for h in held],
    }


def _ids(rows: list[tuple[Any, ...]]) -> set[UUID]:
    """The job ids a batch write answers, one a row (tuple rows and a comprehension: the
    ``scalar_row`` factory is a Python call per row)."""
    return {job_id for (job_id,) in rows}
