"""The routes of the dashboard's Scheduled and Cron pages: jobs due later (and making one due
now), and the periodic tasks with their ticks.

Whether a periodic task still has a live worker is not stored anywhere: workers register tasks
at start and do not say when they stop. It is told from the ticks instead: a tick that came due
since a worker last registered the task, and that no worker enqueued, means none runs it now.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any
from uuid import UUID

from cronsim import CronSim, CronSimError
from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from notifyq.api.deps import StoreDep
from notifyq.api.errors import NOT_FOUND, not_found
from notifyq.api.paging import decode_cursor, encode_cursor
from notifyq.api.schemas import (
    ErrorOut,
    JobOut,
    PeriodicOut,
    PeriodicPage,
    PeriodicState,
    ScheduledJobOut,
    ScheduledPage,
    TickOut,
    WaitReason,
)
from notifyq.models import MAX_NAME_LENGTH

router = APIRouter()

#: Periodic tasks one answer lists, at most.
MAX_PERIODIC = 500
#: How late a tick may be enqueued before it counts as missed: the enqueuer sleeps until the
#: next tick, and after an error 5 s before it tries again.
TICK_GRACE = timedelta(seconds=30)
#: A worker that starts enqueues the ticks of the minute before it (see worker/_periodic.py).
START_CATCH_UP = timedelta(minutes=1)


@router.get("/scheduled", response_model=ScheduledPage, summary="Jobs due later, soonest first")
async def scheduled_jobs(
    store: StoreDep,
    queue: Annotated[
        str | None, Query(max_length=MAX_NAME_LENGTH, description="Only this queue.")
    ] = None,
    task: Annotated[
        str | None, Query(max_length=MAX_NAME_LENGTH, description="Only this task.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="Jobs per page.")] = 50,
    cursor: Annotated[str | None, Query(description="next_cursor of the page before.")] = None,
) -> ScheduledPage:
    """Queued jobs whose run_at is ahead: first runs set for later, retries waiting out their
    backoff, snoozed jobs. Jobs held back behind their group are not here (the Jobs page lists
    them as queued)."""
    after = decode_cursor(cursor, route="GET /scheduled") if cursor else None
    rows = await store.scheduled_jobs(queue=queue, task=task, limit=limit + 1, after=after)
    page = rows[:limit]
    now = rows[0]["now"] if rows else await store.database_now()
    next_cursor = encode_cursor(page[-1]["run_at"], page[-1]["id"]) if len(rows) > limit else None
    return ScheduledPage(jobs=[_scheduled(row) for row in page], next_cursor=next_cursor, now=now)


@router.post(
    "/jobs/{job_id}/run-now",
    response_model=JobOut,
    responses={
        **NOT_FOUND,
        409: {"model": ErrorOut, "description": "The job is not queued for later."},
    },
    summary="Make a job that is due later due now",
)
async def run_job_now(job_id: UUID, store: StoreDep) -> JobOut | JSONResponse:
    """Sets run_at to now and wakes the workers of its queue. The attempt count stays as it
    is: a retry run now is the same retry, sooner."""
    moved = await store.run_job_now(job_id)
    job = await store.get_job(job_id)
    if job is None:
        return not_found(job_id)
    if not moved:
        why = "is due already" if job.status.value == "queued" else f"is {job.status.value}"
        return JSONResponse(
            {"detail": f"job {job_id} {why}; only a queued job due later can run now"},
            status_code=409,
        )
    return JobOut.of(job)


@router.get(
    "/periodic",
    response_model=PeriodicPage,
    summary="Periodic (cron) tasks: schedule, last and next tick, whether a worker runs them",
)
async def periodic_tasks(store: StoreDep) -> PeriodicPage:
    rows = await store.periodic_tasks(limit=MAX_PERIODIC)
    now = rows[0]["now"] if rows else await store.database_now()
    return PeriodicPage(tasks=[_periodic(row) for row in rows], now=now)


def _scheduled(row: dict[str, Any]) -> ScheduledJobOut:
    reason, failed_attempt = _wait_reason(row)
    return ScheduledJobOut(
        job_id=row["id"],
        task=row["task"],
        queue=row["queue"],
        priority=row["priority"],
        run_at=row["run_at"],
        attempt_count=row["attempt_count"],
        max_attempts=row["max_attempts"],
        created_at=row["created_at"],
        reason=reason,
        failed_attempt=failed_attempt,
        error=row["last_error"],
        last_error=row["last_error"],
    )


def _wait_reason(row: dict[str, Any]) -> tuple[WaitReason, int | None]:
    """Why a job due later waits, from its row: never claimed since it was (re)queued; its
    last error came after its last start (a failed attempt, retried later); or its last start
    is after its last error (a snooze: it goes back without an error)."""
    started = row["started_at"]
    if row["claims"] == 0 or started is None:
        return "first_run", None
    failed_at = _parse_time(row["last_error_at"])
    if failed_at is not None and failed_at >= started:
        attempt = row["last_error_attempt"]
        number = int(attempt) if isinstance(attempt, str) and attempt.isdigit() else None
        return "retry", number
    return "snoozed", None


def _parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)


def _periodic(row: dict[str, Any]) -> PeriodicOut:
    now: datetime = row["now"].astimezone(timezone.utc)
    cron: str = row["cron"]
    last = None
    if row["last_tick"] is not None:
        last = TickOut(
            at=row["last_tick"],
            job_id=row["last_job_id"],
            job_status=row["last_job_status"],
            job_finished_at=row["last_job_finished_at"],
        )
    state, reason, next_tick = _tick_state(cron, row["registered_at"], row["last_tick"], now)
    return PeriodicOut(
        name=row["name"],
        cron=cron,
        description=describe_cron(cron) if state != "invalid" else None,
        queue=row["queue"],
        queue_paused=row["queue_paused"],
        registered_at=row["registered_at"],
        last_tick=last,
        next_tick=next_tick,
        state=state,
        reason=reason,
    )


def _tick_state(
    cron: str, registered_at: datetime, last_tick: datetime | None, now: datetime
) -> tuple[PeriodicState, str, datetime | None]:
    """Whether the ticks of ``cron`` are being enqueued, in words, and the next tick."""
    try:
        next_tick = next(iter(CronSim(cron, now)), None)
        due = next(iter(CronSim(cron, now - TICK_GRACE, reverse=True)), None)
    except (CronSimError, ValueError) as exc:
        return "invalid", f"the stored expression {cron!r} does not parse: {exc}", None
    since = registered_at - START_CATCH_UP
    if due is None or due < since:
        # No tick was owed since the last registration; one may have come early anyway.
        if last_tick is not None and last_tick >= since:
            return "ok", "its ticks are enqueued", next_tick
        return "pending", "no tick has come due since a worker registered it", next_tick
    if last_tick is not None and last_tick >= due:
        return "ok", "its ticks are enqueued", next_tick
    return (
        "missed",
        f"the tick of {due:%Y-%m-%d %H:%M} UTC was not enqueued: no live worker has this "
        "task registered (its workers stopped, or no longer import it)",
        next_tick,
    )


_DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_ALIASES = {
    "@yearly": "every year on January 1 at 00:00 UTC",
    "@annually": "every year on January 1 at 00:00 UTC",
    "@monthly": "on day 1 of every month at 00:00 UTC",
    "@weekly": "every Sunday at 00:00 UTC",
    "@daily": "every day at 00:00 UTC",
    "@midnight": "every day at 00:00 UTC",
    "@hourly": "every hour at :00",
}
_STEP = re.compile(r"^\*/([1-9][0-9]?)$")


def describe_cron(cron: str) -> str | None:
    """The schedule in words for the common forms (every N minutes, hourly, daily, weekly,
    monthly at a time); None for the others, which the page shows as the expression only."""
    if cron.strip().lower() in _ALIASES:
        return _ALIASES[cron.strip().lower()]
    fields = cron.split()
    if len(fields) != 5:
        return None
    minute, hour, day, month, weekday = fields
    if month != "*":
        return None
    anyday = day == "*" and weekday == "*"
    step = _STEP.match(minute)
    if minute == "*" and hour == "*" and anyday:
        return "every minute"
    if step and hour == "*" and anyday:
        return f"every {step.group(1)} minutes"
    if not (minute.isdigit() and int(minute) < 60):
        return None
    hour_step = _STEP.match(hour)
    if hour == "*" and anyday:
        return f"every hour at :{int(minute):02d}"
    if hour_step and anyday:
        return f"every {hour_step.group(1)} hours at :{int(minute):02d}"
    if not (hour.isdigit() and int(hour) < 24):
        return None
    at = f"{int(hour):02d}:{int(minute):02d} UTC"
    if anyday:
        return f"every day at {at}"
    if day == "*" and weekday == "1-5":
        return f"every weekday (Monday to Friday) at {at}"
    if day == "*" and weekday.isdigit() and int(weekday) <= 7:
        return f"every {_DAYS[int(weekday)]} at {at}"
    if weekday == "*" and day.isdigit() and 1 <= int(day) <= 31:
        return f"on day {int(day)} of every month at {at}"
    return None
