"""The job routes: read one, list (or search) a page, cancel, retry, delete, and the bulk
actions by filter. (Submitting is in :mod:`notifyq.api.fast`.)"""

from __future__ import annotations

import json
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Body, Path, Query, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from notifyq.api.deps import MetricsDep, StoreDep
from notifyq.api.errors import NOT_FOUND, not_found
from notifyq.api.paging import decode_cursor, encode_cursor
from notifyq.api.schemas import (
    LIST_DATA_FIELDS,
    MAX_CONTAINS_LENGTH,
    BulkIn,
    BulkOut,
    ErrorOut,
    JobListed,
    JobOut,
    JobPage,
    RetriedOut,
    RetryableStatus,
    SignalIn,
    SignalOut,
)
from notifyq.errors import InvalidJob
from notifyq.models import (
    MAX_GROUP_KEY_LENGTH,
    MAX_NAME_LENGTH,
    MAX_SIGNALS_PER_JOB,
    JobStatus,
    encode_json,
    signal_payload_json,
)
from notifyq.store import JobFilter

router = APIRouter()

#: Rows one page of a payload search looks at, at most (no index serves jsonb @>).
SEARCH_SCAN = 5000
#: Rows a dry run of POST /jobs/bulk counts, at most.
COUNT_SCAN = 100_000
#: The statuses each bulk action applies to.
BULK_STATUSES: dict[str, tuple[JobStatus, ...]] = {
    "retry": (JobStatus.FAILED, JobStatus.CANCELLED),
    "cancel": (JobStatus.WAITING, JobStatus.QUEUED, JobStatus.PROCESSING, JobStatus.SUSPENDED),
    "delete": (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED),
}


@router.get("/jobs/{job_id}", response_model=JobOut, responses=NOT_FOUND, summary="Read a job")
async def get_job(job_id: UUID, store: StoreDep) -> JobOut | JSONResponse:
    job = await store.get_job(job_id)
    if job is None:
        return not_found(job_id)
    return JobOut.of(job)


@router.get("/jobs", response_model=JobPage, summary="List jobs, newest first")
async def list_jobs(
    store: StoreDep,
    status_: Annotated[
        JobStatus | None, Query(alias="status", description="Only this status.")
    ] = None,
    queue: Annotated[
        str | None, Query(max_length=MAX_NAME_LENGTH, description="Only this queue.")
    ] = None,
    task: Annotated[
        str | None, Query(max_length=MAX_NAME_LENGTH, description="Only this task.")
    ] = None,
    group_key: Annotated[
        str | None, Query(max_length=MAX_GROUP_KEY_LENGTH, description="Only this group.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="Jobs per page.")] = 50,
    cursor: Annotated[str | None, Query(description="next_cursor of the page before.")] = None,
    include: Annotated[
        str | None,
        Query(
            max_length=100,
            description="Comma-separated, any of payload, result, errors: the data fields "
            "each job of the page carries (none by default; GET /jobs/{id} has them all).",
        ),
    ] = None,
    payload: Annotated[
        str | None,
        Query(
            max_length=MAX_CONTAINS_LENGTH,
            description="A JSON object: only jobs whose payload contains it (jsonb @>, e.g. "
            '{"account": 42}). Such a page looks at ' + f"{SEARCH_SCAN:,} jobs at most, so it "
            "may hold fewer than `limit` (even none) and still have a next_cursor; the "
            "answer's `scanned` says how many it looked at.",
        ),
    ] = None,
) -> Response:
    omitted = frozenset(LIST_DATA_FIELDS) - _included(include)
    after = decode_cursor(cursor, route="GET /jobs") if cursor else None
    if payload is not None:
        where = JobFilter(queue, task, group_key, _contains(payload, ("query", "payload")))
        found = await store.search_jobs(
            where, status=status_, limit=limit + 1, scan=SEARCH_SCAN, after=after
        )
        page = found.jobs[:limit]
        if len(found.jobs) > limit:
            next_cursor: str | None = encode_cursor(page[-1].created_at, page[-1].id)
        elif found.scanned == SEARCH_SCAN and found.last is not None:
            next_cursor = encode_cursor(*found.last)
        else:
            next_cursor = None
        extra = f',"scanned":{found.scanned}'
    else:
        jobs = await store.list_jobs(
            status=status_,
            queue=queue,
            task=task,
            group_key=group_key,
            limit=limit + 1,
            after=after,
        )
        page = jobs[:limit]
        next_cursor = encode_cursor(page[-1].created_at, page[-1].id) if len(jobs) > limit else None
        extra = ""
    cursor_json = f'"{next_cursor}"' if next_cursor else "null"  # base64: no escapes
    listed = ",".join(JobListed.json_of(job, omitted) for job in page)
    return Response(
        f'{{"jobs":[{listed}],"next_cursor":{cursor_json}{extra}}}',
        media_type="application/json",
    )


@router.post(
    "/jobs/bulk",
    response_model=BulkOut,
    response_model_exclude_none=True,
    summary="Retry, cancel or delete the jobs matching a filter, a bounded step at a time",
)
async def bulk_jobs(body: BulkIn, store: StoreDep) -> BulkOut:
    """Each step looks at ``limit`` candidates at most (in id order after ``after``) and
    answers ``next_after`` to go on from, until it is null; ``dry_run`` answers the count the
    action applies to, to show before confirming. Jobs locked by a worker or another request at
    that moment are skipped. Cancel goes the way of ``POST /jobs/{id}/cancel``: running jobs'
    workers are told to stop them, and jobs waiting for a cancelled one are cancelled too."""
    allowed = BULK_STATUSES[body.action]
    if body.status is not None and body.status not in allowed:
        raise RequestValidationError(
            [
                {
                    "loc": ("body", "status"),
                    "msg": f"{body.action} applies to "
                    f"{', '.join(s.value for s in allowed)} jobs, not {body.status.value}",
                    "type": "value_error",
                }
            ]
        )
    statuses = [body.status] if body.status is not None else list(allowed)
    contains = None
    if body.payload is not None:
        contains = encode_json(body.payload, what="the payload filter")
        _check_contains_length(contains, ("body", "payload"))
    where = JobFilter(body.queue, body.task, body.group_key, contains)
    if body.dry_run:
        matched, scanned = await store.count_matching(where, statuses=statuses, scan=COUNT_SCAN)
        return BulkOut(
            action=body.action, dry_run=True, matched=matched, exact=scanned < COUNT_SCAN
        )
    done = await store.bulk_jobs(
        body.action, where, statuses=statuses, limit=body.limit, after=body.after
    )
    return BulkOut(
        action=body.action,
        dry_run=False,
        affected=done.changed + done.stopping,
        stopping=done.stopping if body.action == "cancel" else None,
        scanned=done.scanned,
        next_after=done.last if done.scanned >= body.limit else None,
    )


@router.post(
    "/jobs/{job_id}/signals/{name}",
    response_model=SignalOut,
    status_code=202,
    responses={
        200: {"model": SignalOut, "description": "A signal of that name came first: unchanged."},
        **NOT_FOUND,
        409: {
            "model": ErrorOut,
            "description": f"The job has ended, or has received {MAX_SIGNALS_PER_JOB} signals.",
        },
    },
    summary="Send a signal to a job (its ctx.wait_for_signal(name))",
)
async def signal_job(
    job_id: UUID,
    name: Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH)],
    store: StoreDep,
    metrics: MetricsDep,
    body: Annotated[SignalIn | None, Body()] = None,
) -> JSONResponse:
    """The first signal of a name wins; a job suspended waiting for it runs again at once."""
    payload_json = signal_payload_json(name, {} if body is None else body.payload)
    outcome = await store.signal_job(job_id, name, payload_json)
    if outcome == "unknown":
        return not_found(job_id)
    if outcome == "final":
        detail = f"job {job_id} has ended: no signal can reach it"
        return JSONResponse({"detail": detail}, status_code=409)
    if outcome == "too_many":
        detail = f"job {job_id} has received {MAX_SIGNALS_PER_JOB} signals, the most one job may"
        return JSONResponse({"detail": detail}, status_code=409)
    duplicate = outcome == "duplicate"
    metrics.signals.labels("duplicate" if duplicate else "sent").inc()
    answer = SignalOut(job_id=job_id, name=name, duplicate=duplicate)
    return JSONResponse(answer.model_dump(mode="json"), status_code=200 if duplicate else 202)


@router.post(
    "/jobs/{job_id}/retry",
    response_model=JobOut,
    responses={
        **NOT_FOUND,
        409: {
            "model": ErrorOut,
            "description": "Not requeued: the job is not failed or cancelled, a newer one with "
            "its dedup_key replaces it, a job it depends on failed, or it is archived.",
        },
    },
    summary="Requeue a failed or cancelled job",
)
async def retry_job(job_id: UUID, store: StoreDep) -> JobOut | JSONResponse:
    retried = await store.retry_job(job_id)
    job = await store.get_job(job_id)
    if retried is None or job is None:
        return not_found(job_id)
    if retried.refused is not None:
        detail = f"job {job_id} not requeued: {retried.refused}"
        return JSONResponse({"detail": detail}, status_code=409)
    return JobOut.of(job)


@router.post(
    "/jobs/{job_id}/cancel",
    response_model=JobOut,
    responses={
        202: {"model": JobOut, "description": "Running: its worker was asked to stop it."},
        **NOT_FOUND,
        409: {"model": ErrorOut, "description": "The job already finished."},
    },
    summary="Cancel a queued job, or stop a running one",
)
async def cancel_job(job_id: UUID, store: StoreDep) -> JSONResponse:
    outcome = await store.cancel_job(job_id)
    job = await store.get_job(job_id)
    if outcome is None or job is None:
        return not_found(job_id)
    if outcome.was.finished:
        return JSONResponse(
            {"detail": f"job {job_id} already {outcome.was.value}; nothing to cancel"},
            status_code=409,
        )
    # 202 only while a live worker holds the job and was asked to stop it.
    code = 202 if outcome.now is JobStatus.PROCESSING else 200
    return JSONResponse(JobOut.of(job).model_dump(mode="json"), status_code=code)


@router.delete(
    "/jobs/{job_id}",
    status_code=204,
    responses={
        **NOT_FOUND,
        409: {
            "model": ErrorOut,
            "description": "The job has not finished, or it is archived.",
        },
    },
    summary="Delete a finished job",
)
async def delete_job(job_id: UUID, store: StoreDep) -> Response:
    if await store.delete_job(job_id):
        return Response(status_code=204)
    job = await store.get_job(job_id)
    if job is None:
        return not_found(job_id)
    if job.archived:
        detail = (f"job {job_id} is archived; archived jobs go with their day's partition, "
                  "once it is past NOTIFYQ_KEEP_*")  # fmt: skip
        return JSONResponse({"detail": detail}, status_code=409)
    return JSONResponse(
        {"detail": f"job {job_id} is {job.status.value}; cancel it first"}, status_code=409
    )


@router.post(
    "/jobs/retry",
    response_model=RetriedOut,
    summary="Requeue every failed (or cancelled) job of a queue or task",
)
async def retry_jobs(
    store: StoreDep,
    status_: Annotated[
        RetryableStatus, Query(alias="status", description="failed or cancelled")
    ] = "failed",
    queue: Annotated[str | None, Query(max_length=MAX_NAME_LENGTH)] = None,
    task: Annotated[str | None, Query(max_length=MAX_NAME_LENGTH)] = None,
) -> RetriedOut:
    count = await store.retry_jobs(status=JobStatus(status_), queue=queue, task=task)
    return RetriedOut(requeued=count)


def _included(include: str | None) -> frozenset[str]:
    """The data fields ``?include=`` names; a 422 for a name that is not one."""
    names = frozenset(part.strip() for part in (include or "").split(",") if part.strip())
    unknown = sorted(names - set(LIST_DATA_FIELDS))
    if unknown:
        raise RequestValidationError(
            [
                {
                    "loc": ("query", "include"),
                    "msg": f"unknown field(s) {', '.join(unknown)}: "
                    f"include takes {', '.join(LIST_DATA_FIELDS)}",
                    "type": "value_error",
                }
            ]
        )
    return names


def _contains(text: str, loc: tuple[str, str]) -> str:
    """A payload filter's JSON text, checked: an object that jsonb can hold; a 422 otherwise."""

    def refuse(msg: str) -> RequestValidationError:
        return RequestValidationError([{"loc": loc, "msg": msg, "type": "value_error"}])

    try:
        value: Any = json.loads(text)
    except RecursionError:
        raise refuse("the payload filter nests too deeply") from None
    except ValueError as exc:
        raise refuse(f"the payload filter is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise refuse('the payload filter must be a JSON object, such as {"account": 42}')
    try:
        return encode_json(value, what="the payload filter")
    except InvalidJob as exc:
        raise refuse(str(exc)) from None


def _check_contains_length(text: str, loc: tuple[str, str]) -> None:
    if len(text) > MAX_CONTAINS_LENGTH:
        raise RequestValidationError(
            [
                {
                    "loc": loc,
                    "msg": f"the payload filter is longer than {MAX_CONTAINS_LENGTH} "
                    "characters of JSON",
                    "type": "value_error",
                }
            ]
        )
