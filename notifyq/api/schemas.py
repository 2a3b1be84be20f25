"""The request and response models of the HTTP API, and their conversions from notifyq's own
types. Pydantic only: the CLI prints jobs with :class:`JobOut` without importing a web
framework (a test checks that importing this module imports neither FastAPI nor Starlette).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, create_model

from notifyq.jobspec import JobSpec, options
from notifyq.models import (
    MAX_DEPENDENCIES,
    MAX_GROUP_KEY_LENGTH,
    MAX_NAME_LENGTH,
    Job,
    JobStatus,
)
from notifyq.workflows import MAX_WORKFLOW_JOBS, WorkflowStatus

#: Most jobs one POST /jobs/batch takes.
MAX_BATCH = 10_000


class _JobBody(BaseModel):
    """What every job body has besides its options (see :data:`JobIn`)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"payload": {"to": "a@example.com"}, "task": "send_email", "priority": 5},
                {"payload": {"task": "hello_world"}},
            ]
        },
    )

    payload: dict[str, Any] = Field(
        description="The job's input, a JSON object handed to the task's handler. Strings may "
        "not contain NUL characters."
    )
    task: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        strict=True,
        description="The task to run. Default: payload.task when it is a string, else "
        "NOTIFYQ_DEFAULT_TASK.",
    )

    if TYPE_CHECKING:
        # The options' fields, which JobIn adds (mypy sees each as Any).
        def __getattr__(self, name: str) -> Any: ...

    def spec(
        self,
        default_task: str,
        *,
        depends_on: list[UUID] | None = None,
        workflow_id: UUID | None = None,
        job_id: UUID | None = None,
    ) -> JobSpec:
        """The job to store, with the task resolved as the contract says: task, else
        payload.task when it is a string, else the default task. Raises InvalidJob for what
        PostgreSQL would refuse (the API answers it as a 422 located in the body). Done here
        rather than in a model validator: that cost five times the validation of the model
        itself. A workflow's job gives its resolved ``depends_on``, its workflow and its id."""
        task = self.task
        if task is None:
            from_payload = self.payload.get("task")
            task = from_payload if isinstance(from_payload, str) else default_task
        given = {name: getattr(self, name) for name in options()}
        if depends_on is not None:
            given["depends_on"] = depends_on
        return JobSpec.create(task, self.payload, workflow_id=workflow_id, id=job_id, **given)


def _option_fields() -> dict[str, Any]:
    """The fields of :data:`JobIn` made from the job's options (notifyq.jobspec)."""
    return {
        name: (option.api, Field(default=None, description=option.doc, **option.bounds))
        for name, option in options().items()
    }


if TYPE_CHECKING:
    JobIn = _JobBody
else:
    #: A job to enqueue: ``payload``, ``task`` and every option of
    #: :class:`notifyq.jobspec.JobOptions`. Only ``payload`` is required; unknown fields are
    #: refused.
    JobIn = create_model("JobIn", __base__=_JobBody, __doc__=_JobBody.__doc__, **_option_fields())


class EnqueuedOut(BaseModel):
    """What POST /jobs answers."""

    job_id: UUID
    status: JobStatus = Field(description="queued, or waiting (for the jobs it depends on)")
    duplicate: bool = Field(
        description="True when a queued job with the same (queue, dedup_key) was replaced."
    )
    run_at: datetime
    created_at: datetime


class ProgressOut(BaseModel):
    """A running job's progress, as its handler last reported it (ctx.progress)."""

    fraction: float | None = Field(description="From 0 to 1, or null.")
    message: str | None

    @classmethod
    def of(cls, stored: dict[str, Any] | None) -> ProgressOut | None:
        """From the stored object; anything else (written by hand) reads as none."""
        if not isinstance(stored, dict):
            return None
        fraction, message = stored.get("fraction"), stored.get("message")
        ok_fraction = fraction is None or (
            isinstance(fraction, (int, float))
            and not isinstance(fraction, bool)
            and 0 <= fraction <= 1
        )
        if not ok_fraction or not (message is None or isinstance(message, str)):
            return None
        return cls(fraction=fraction, message=message)


class StepOut(BaseModel):
    """A step a durable job recorded (``ctx.step``)."""

    name: str
    finished_at: datetime


class SignalIn(BaseModel):
    """The body of ``POST /jobs/{id}/signals/{name}`` (optional: no body is ``{}``)."""

    model_config = ConfigDict(extra="forbid")

    payload: dict[str, Any] = Field(
        default_factory=dict,
        description="What the job's ctx.wait_for_signal(name) returns (64 KiB at most).",
    )


class SignalOut(BaseModel):
    """A signal sent (202), or one that a signal of the same name preceded (200)."""

    job_id: UUID
    name: str
    duplicate: bool


class JobOut(BaseModel):
    """A job as stored."""

    job_id: UUID
    status: JobStatus
    task: str
    queue: str
    priority: int
    payload: dict[str, Any]
    attempt_count: int = Field(description="Attempts started so far.")
    max_attempts: int
    result: Any = Field(description="What the handler returned, once completed.")
    error: str | None = Field(
        description="The error of the latest failed attempt while the job has one: null once it "
        "completed (`errors` keeps every attempt's). The column last_error in SQL."
    )
    errors: list[dict[str, Any]] = Field(
        description="Every failed attempt (the newest 25): attempt, error, at, worker."
    )
    dedup_key: str | None
    created_at: datetime
    run_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None = Field(description="The worker holding or last holding the job.")
    lease_expires_at: datetime | None
    cancel_requested_at: datetime | None = Field(
        description="When a cancel was requested while the job ran."
    )
    depends_on: list[UUID] = Field(description="The jobs it waits for (empty: none).")
    group_key: str | None
    workflow_id: UUID | None
    ref: str | None = Field(
        default=None,
        description="Its name in its workflow (the ref of POST /workflows); null outside one.",
    )
    progress: ProgressOut | None = Field(
        description="The handler's last progress report (null: none)."
    )
    archived: bool = Field(
        default=False,
        description="Read from the archive (NOTIFYQ_ARCHIVE_AFTER): it can no longer be "
        "retried, cancelled or deleted.",
    )
    steps: list[StepOut] = Field(
        default_factory=list,
        description="The steps it recorded (ctx.step), in the order they finished.",
    )
    suspended_until: datetime | None = Field(
        default=None,
        description="A suspended job: when it runs again (null: when its signal comes).",
    )
    waiting_for_signal: str | None = Field(
        default=None, description="A suspended job: the signal it waits for."
    )
    fair_key: str | None = Field(
        default=None,
        description="Its key for the fair claims (round-robin across a queue's keys); null: none.",
    )

    @classmethod
    def of(cls, job: Job) -> JobOut:
        return cls(
            job_id=job.id,
            status=job.status,
            task=job.task,
            queue=job.queue,
            priority=job.priority,
            payload=job.payload,
            attempt_count=job.attempt_count,
            max_attempts=job.max_attempts,
            result=job.result,
            error=job.last_error,
            errors=job.errors,
            dedup_key=job.dedup_key,
            created_at=job.created_at,
            run_at=job.run_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            worker_id=job.worker_id,
            lease_expires_at=job.lease_expires_at,
            cancel_requested_at=job.cancel_requested_at,
            depends_on=job.depends_on,
            group_key=job.group_key,
            workflow_id=job.workflow_id,
            ref=job.ref,
            progress=ProgressOut.of(job.progress),
            archived=job.archived,
            steps=[StepOut(name=name, finished_at=at) for name, at in job.steps],
            suspended_until=job.suspended_until,
            waiting_for_signal=job.waiting_for_signal,
            fair_key=job.fair_key,
        )


class WorkflowJobIn(JobIn):
    """A job of a workflow: a POST /jobs body with a ``ref`` naming it, whose ``depends_on``
    names refs of the same workflow (or ids of stored jobs)."""

    ref: str = Field(min_length=1, max_length=MAX_NAME_LENGTH, strict=True)
    depends_on: list[str] | None = Field(
        default=None,
        max_length=MAX_DEPENDENCIES,
        description="Refs of this workflow's jobs, or ids of jobs already stored.",
    )


class WorkflowIn(BaseModel):
    """Jobs that name each other by ref, created in one transaction."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "jobs": [
                        {"ref": "fetch", "task": "echo", "payload": {"url": "..."}},
                        {"ref": "parse", "task": "echo", "payload": {}, "depends_on": ["fetch"]},
                    ]
                }
            ]
        },
    )

    jobs: list[WorkflowJobIn] = Field(min_length=1, max_length=MAX_WORKFLOW_JOBS)


class WorkflowCreatedOut(BaseModel):
    """What POST /workflows answers: the workflow's id and each ref's job id."""

    workflow_id: UUID
    jobs: dict[str, UUID]


class WorkflowOut(BaseModel):
    """A workflow and its jobs, oldest first, each with its ``ref``."""

    workflow_id: UUID
    status: WorkflowStatus = Field(
        description="completed when every job is, failed when one failed, cancelled when one "
        "was cancelled, else running."
    )
    jobs: list[JobOut]


class BatchIn(BaseModel):
    """Many jobs, enqueued in one round trip to the database."""

    model_config = ConfigDict(extra="forbid")

    jobs: list[JobIn] = Field(min_length=1, max_length=MAX_BATCH, description="POST /jobs bodies.")


class BatchOut(BaseModel):
    """One result per job, in the order given."""

    results: list[EnqueuedOut]


class QueueOut(BaseModel):
    """A queue's counts and switches."""

    queue: str
    waiting: int = Field(description="Waiting for the jobs they depend on.")
    queued: int = Field(description="Queued, due or not.")
    due: int = Field(description="Queued and due now.")
    processing: int
    suspended: int = Field(
        default=0, description="Suspended durable jobs (a sleep or a signal wait): no slot held."
    )
    waiting_for_signal: int = Field(
        default=0, description="Of the suspended jobs, those waiting for a signal."
    )
    completed: int
    completed_estimated: bool = Field(description="Counted from a sample on a large table.")
    failed: int
    cancelled: int
    oldest_due_seconds: float | None = Field(description="How long the oldest due job waits.")
    completed_last_minute: int
    failed_last_minute: int
    paused: bool
    notify: bool = Field(description="Whether inserts wake workers (else they poll).")
    rate_limit: float | None = Field(description="Jobs per second across all workers.")
    max_depth: int | None = Field(
        default=None,
        description="Most jobs not yet started (waiting or queued); an enqueue past it is "
        "refused with 429.",
    )


RetryableStatus = Literal["failed", "cancelled"]


class RetriedOut(BaseModel):
    """What POST /jobs/retry answers."""

    requeued: int = Field(description="Jobs put back in the queue.")


class ReadyOut(BaseModel):
    """Readiness, part by part."""

    status: str = Field(description="ready or not_ready")
    database: str
    migrations: str
    listener: str
    worker: str | None = Field(
        default=None, description="Why the worker of this process is not running, if so."
    )


#: What a list page leaves out unless ?include= names it: a job's data, which may be large.
LIST_DATA_FIELDS = ("payload", "result", "errors")


class JobListed(JobOut):
    """A job in a list page: as ``GET /jobs/{id}`` shows it, but ``payload``, ``result`` and
    ``errors`` only when ``?include=`` names them (one job's data may be megabytes, and a page
    holds up to 500 jobs). ``error``, the latest attempt's, is always there."""

    # Widened from JobOut's on purpose: these are absent unless included (documentation only;
    # the route builds its answer with json_of).
    payload: dict[str, Any] | None = Field(  # type: ignore[assignment]
        default=None, description="With ?include=payload."
    )
    result: Any = Field(default=None, description="With ?include=result.")
    errors: list[dict[str, Any]] | None = Field(  # type: ignore[assignment]
        default=None, description="With ?include=errors."
    )

    @staticmethod
    def json_of(job: Job, omitted: frozenset[str]) -> str:
        """The JSON of ``job`` without the ``omitted`` fields, which are never read."""
        if omitted:
            job = dataclasses.replace(job, **{name: _EMPTY[name] for name in omitted})
        return JobOut.of(job).model_dump_json(exclude=set(omitted))


_EMPTY: dict[str, Any] = {"payload": {}, "result": None, "errors": []}


class JobPage(BaseModel):
    """One page of jobs, newest first."""

    jobs: list[JobListed]
    next_cursor: str | None = Field(
        description="Pass as ?cursor= for the next page; null on the last page."
    )
    scanned: int | None = Field(
        default=None,
        description="With ?payload=: the jobs this page looked at (a bounded number), of which "
        "`jobs` matched.",
    )


class BreakerOut(BaseModel):
    """A task's circuit breaker."""

    state: str = Field(description="closed, open (claims paused) or half_open (one probe runs)")
    threshold: int | None = Field(description="Consecutive failures that open it; null: none.")
    cooldown: float
    consecutive_failures: int
    open_until: datetime | None


class TaskOut(BaseModel):
    """A task as registered by the workers that serve it."""

    name: str
    max_attempts: int | None
    options: dict[str, Any]
    breaker: BreakerOut
    registered_at: datetime

    @classmethod
    def of(cls, row: dict[str, Any]) -> TaskOut:
        return cls(
            name=row["name"],
            max_attempts=row["max_attempts"],
            options=row["options"],
            registered_at=row["updated_at"],
            breaker=BreakerOut(
                state=row["breaker_state"],
                threshold=row["breaker_threshold"],
                cooldown=row["breaker_cooldown"],
                consecutive_failures=row["consecutive_failures"],
                open_until=row["breaker_open_until"],
            ),
        )


class ErrorOut(BaseModel):
    """Every 4xx and 5xx answer: what is wrong, and what to do."""

    detail: Any


class HealthOut(BaseModel):
    """Liveness and whether the database answers. With a token set, a request without it gets
    only ``status``: the rest (worker id, driver errors) is for operators."""

    status: str = Field(description="healthy or unhealthy")
    database: str | None = None
    version: str | None = None
    worker: dict[str, Any] | None = None


#: Longest payload filter (its JSON text) that GET /jobs and POST /jobs/bulk take.
MAX_CONTAINS_LENGTH = 2000
#: Most candidates one POST /jobs/bulk step looks at.
MAX_BULK_LIMIT = 1000


class BulkIn(BaseModel):
    """One bounded step of a bulk action on the jobs matching a filter, or (``dry_run``) how
    many jobs it would apply to."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"action": "retry", "status": "failed", "queue": "emails", "dry_run": True},
                {"action": "cancel", "task": "report", "payload": {"account": 42}},
            ]
        },
    )

    action: Literal["retry", "cancel", "delete"] = Field(
        description="retry (failed or cancelled jobs go back to queued), cancel (waiting and "
        "queued jobs are cancelled, running ones' workers are asked to stop them, as POST "
        "/jobs/{id}/cancel does) or delete (finished jobs)."
    )
    status: JobStatus | None = Field(
        default=None,
        description="Only this status; it must be one the action applies to (retry: failed, "
        "cancelled; cancel: waiting, queued, processing; delete: completed, failed, "
        "cancelled). Default: every status the action applies to.",
    )
    queue: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LENGTH)
    task: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LENGTH)
    group_key: str | None = Field(default=None, min_length=1, max_length=MAX_GROUP_KEY_LENGTH)
    payload: dict[str, Any] | None = Field(
        default=None,
        description="Only jobs whose payload contains this object (PostgreSQL's jsonb @>); "
        f"at most {MAX_CONTAINS_LENGTH} characters of JSON.",
    )
    dry_run: bool = Field(
        default=False,
        description="Change nothing; answer how many jobs match (looking at 100,000 rows at "
        "most: `exact` says whether the count is).",
    )
    limit: int = Field(
        default=500,
        ge=1,
        le=MAX_BULK_LIMIT,
        description="Candidates this step looks at, at most; repeat with after=next_after "
        "until it is null.",
    )
    after: UUID | None = Field(
        default=None, description="next_after of the step before: go on after that job id."
    )


class BulkOut(BaseModel):
    """What a step of POST /jobs/bulk did, or (dry run) would apply to."""

    action: str
    dry_run: bool
    matched: int | None = Field(default=None, description="Dry run: the jobs that match.")
    exact: bool | None = Field(
        default=None, description="Dry run: false when the count stopped at its bound."
    )
    affected: int | None = Field(
        default=None,
        description="Jobs requeued, cancelled, asked to stop (cancel of a running job: "
        "`stopping` of them) or deleted by this step.",
    )
    stopping: int | None = Field(
        default=None, description="Cancel: running jobs whose workers were asked to stop them."
    )
    scanned: int | None = Field(default=None, description="Candidates this step looked at.")
    next_after: UUID | None = Field(
        default=None, description="Pass as `after` for the next step; null when done."
    )


class QueueStateOut(BaseModel):
    """Whether a queue's due jobs move, and if not, why."""

    queue: str
    state: str = Field(
        description="ok, idle (nothing due), paused, rate_limited, unregistered (due jobs "
        "of tasks no worker registered), breaker_open, no_workers (due jobs, no worker "
        "listening or running any), busy (every listening worker is running jobs), polling "
        "(notifications off: drained by each worker's poll)"
    )
    reasons: list[str] = Field(description="Every condition found, in words, worst first.")
    due: int
    processing: int
    listening: int = Field(description="Idle workers listening on this queue now.")
    unregistered_tasks: list[str] = Field(description="Up to 5 tasks no worker registered.")


class WorkerJobOut(BaseModel):
    """A job a worker runs now."""

    job_id: UUID
    task: str
    queue: str
    started_at: datetime | None
    lease_expires_at: datetime | None


class WorkerOut(BaseModel):
    """A worker the database knows of: listening idle, or running jobs (or both)."""

    worker_id: str
    listening: bool = Field(description="Idle and listening for new jobs now.")
    queues: list[str] | None = Field(description="The queues it listens on; null: all.")
    listening_until: datetime | None = Field(description="When its idle mark runs out.")
    running: int = Field(description="Jobs it runs now.")
    jobs: list[WorkerJobOut] = Field(description="Up to 20 of them, oldest first.")


class MinuteOut(BaseModel):
    """The jobs that ended in one minute; null counts: not counted yet (a later read will)."""

    minute: datetime = Field(description="The minute's start.")
    completed: int | None
    failed: int | None
    cancelled: int | None
    partial: bool = Field(description="The minute under way: counted so far, not stored.")


class MinutesOut(BaseModel):
    """Jobs ended per minute, oldest first, the minute under way last."""

    minutes: list[MinuteOut]
    since: datetime | None = Field(
        default=None,
        description="When there is anything to count: notifyq's install in this database, or "
        "its oldest finished job if older. Minutes before it are not missing counts (on a new "
        "database, most of the hour): nothing ended then.",
    )


class FairKeyOut(BaseModel):
    """A fair key of a queue, with its jobs queued and running and its weight."""

    queue: str
    fair_key: str
    queued: int = Field(description="Its jobs queued in this queue, due or not.")
    running: int = Field(description="Its jobs of this queue that workers run now.")
    weight: float = Field(description="Its share of the fair claims (1 unless set).")


class FairKeysOut(BaseModel):
    """The fair keys with the most jobs queued or running, most first."""

    keys: list[FairKeyOut]


#: Why a scheduled job waits: its first run is set for later, a failed attempt waits out its
#: backoff, or its task snoozed it (``raise notifyq.Snooze(seconds)``).
WaitReason = Literal["first_run", "retry", "snoozed"]


class ScheduledJobOut(BaseModel):
    """A queued job due later, and why it waits."""

    job_id: UUID
    task: str
    queue: str
    priority: int
    run_at: datetime = Field(description="When it becomes due.")
    attempt_count: int
    max_attempts: int
    created_at: datetime
    reason: WaitReason = Field(
        description="first_run: never started (or retried by hand since); retry: its last "
        "attempt failed and it waits out the backoff; snoozed: its task snoozed it."
    )
    failed_attempt: int | None = Field(
        description="With reason retry: the number of the attempt that failed."
    )
    error: str | None = Field(
        description="The error of the attempt that failed last, cut at 500 characters."
    )
    last_error: str | None = Field(
        deprecated="Deprecated: the same as `error`, its name in SQL; it goes in the next release.",
        description="Deprecated alias of `error` (the same value), kept for one release: every "
        "HTTP answer calls it `error`.",
    )


class ScheduledPage(BaseModel):
    """One page of jobs due later, soonest first."""

    jobs: list[ScheduledJobOut]
    next_cursor: str | None = Field(
        description="Pass as ?cursor= for the next page; null on the last page."
    )
    now: datetime = Field(description="The database's clock, which run_at is compared with.")


class TickOut(BaseModel):
    """One tick of a periodic task that a worker enqueued."""

    at: datetime = Field(description="The tick's time.")
    job_id: UUID | None = Field(description="The job it enqueued.")
    job_status: str | None = Field(description="That job's status; null: the job is gone.")
    job_finished_at: datetime | None


#: ok: its ticks are enqueued; pending: no tick was due since a worker registered it; missed: a
#: tick due since then was not enqueued, so no live worker has it registered; invalid: the stored
#: expression does not parse.
PeriodicState = Literal["ok", "pending", "missed", "invalid"]


class PeriodicOut(BaseModel):
    """A periodic (cron) task that workers registered, its ticks, and whether they happen."""

    name: str
    cron: str = Field(description="Five fields, read in UTC.")
    description: str | None = Field(description="The schedule in words, for common forms.")
    queue: str = Field(description="The queue its jobs go to.")
    queue_paused: bool = Field(description="That queue is paused: ticks' jobs wait there.")
    registered_at: datetime = Field(description="When a worker last registered it (at start).")
    last_tick: TickOut | None
    next_tick: datetime | None = Field(description="The next tick after now (UTC).")
    state: PeriodicState
    reason: str = Field(description="The state in words.")


class PeriodicPage(BaseModel):
    """Every periodic task registered, by name (500 at most)."""

    tasks: list[PeriodicOut]
    now: datetime = Field(description="The database's clock.")
