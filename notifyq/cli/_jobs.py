"""The commands about jobs: ``enqueue``, ``status``, ``wait``, ``jobs``, ``retry``, ``cancel``,
``prune``.

Each opens a :class:`~notifyq.client.Queue` of one connection for its few statements.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import anyio

from notifyq.cli._args import (
    CancelArgs,
    EnqueueArgs,
    JobsArgs,
    PruneArgs,
    RetryArgs,
    StatusArgs,
    WaitArgs,
)
from notifyq.cli._errors import EXIT_JOB_FAILED, EXIT_TIMEOUT, Failed
from notifyq.cli._output import duration, jobs_table, say
from notifyq.client import Queue
from notifyq.errors import InvalidJob
from notifyq.jobspec import JobSpec
from notifyq.models import Cancelled, EnqueueResult, Job, JobStatus
from notifyq.settings import Settings


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
    from notifyq.api.schemas import JobOut

    print(JobOut.of(job).model_dump_json(indent=indent))


def enqueue(args: EnqueueArgs, settings: Settings) -> int:
    """Enqueues one job and prints its id."""
    payload = _payload(args.payload)
    spec = JobSpec.create(args.task, payload, **(args.options or {}))

    async def run() -> EnqueueResult:
        async with _queue(settings) as q:
            return await q.store.enqueue(spec)

    result = anyio.run(run)
    print(result.job_id)
    if result.duplicate:
        say("notifyq: replaced the queued job with the same dedup key")
    if result.status is JobStatus.WAITING:
        say("notifyq: it waits for the jobs it depends on")
    elif result.status is JobStatus.CANCELLED:
        say("notifyq: cancelled at once: a job it depends on failed or was cancelled")
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


def wait(args: WaitArgs, settings: Settings) -> int:
    """Waits until the job is completed, failed or cancelled (woken by a notification) and
    prints it as JSON; fails unless it completed: EXIT_JOB_FAILED when it ended otherwise,
    EXIT_TIMEOUT when --timeout passed first (see the command's help)."""
    job_id = _job_id(args.job_id)
    timeout = math.inf if args.timeout is None else args.timeout

    async def run() -> Job:
        async with _queue(settings) as q:
            return await q.wait(job_id, timeout=timeout)

    try:
        job = anyio.run(run)
    except TimeoutError:
        raise Failed(
            f"job {job_id} has not finished after {duration(timeout)}", exit_code=EXIT_TIMEOUT
        ) from None
    _print_json(job, indent=2)
    if job.status is not JobStatus.COMPLETED:
        error = (job.last_error or "").strip().splitlines()
        raise Failed(
            f"job {job_id} {job.status.value}" + (f": {error[0]}" if error else ""),
            exit_code=EXIT_JOB_FAILED,
        )
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
                retried = await q.store.retry_job(job_id)
                if retried is None:
                    refused.append(f"{text} (unknown)")
                elif retried.refused is not None:
                    refused.append(f"{text} ({retried.refused})")
            return len(ids) - len(refused), refused

    count, refused = anyio.run(run)
    print(f"requeued {count} job(s)")
    if refused:
        raise Failed("not requeued: " + ", ".join(refused))
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
    """Deletes the finished jobs past their keep time now, saying what it keeps; with
    NOTIFYQ_ARCHIVE_AFTER, then runs the archive's pass as the maintenance leader does."""
    from notifyq.worker import archive
    from notifyq.worker import prune as delete_finished

    async def run() -> tuple[int, str | None]:
        async with _queue(settings) as q:
            deleted = await delete_finished(q.store, settings, batch=args.batch)
            if settings.archive_after is None:
                return deleted, None
            done = await archive(q.store, settings, batch=args.batch)
            return deleted, (
                f"archived {done.moved} job(s); {done.created} partition(s) created, "
                f"{done.dropped} dropped"
            )

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
    deleted, archived = anyio.run(run)
    print(f"deleted {deleted} job(s)")
    if archived is not None:
        print(archived)
    return 0
