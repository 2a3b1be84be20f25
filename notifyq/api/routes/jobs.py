"""The job routes: read one, list a page, cancel, retry, delete. (Submitting is in
:mod:`notifyq.api.fast`.)"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from notifyq.api.deps import StoreDep
from notifyq.api.errors import NOT_FOUND, not_found
from notifyq.api.schemas import (
    LIST_DATA_FIELDS,
    ErrorOut,
    JobListed,
    JobOut,
    JobPage,
    RetriedOut,
    RetryableStatus,
)
from notifyq.errors import InvalidJob
from notifyq.models import MAX_GROUP_KEY_LENGTH, MAX_NAME_LENGTH, Job, JobStatus

router = APIRouter()


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
) -> Response:
    omitted = frozenset(LIST_DATA_FIELDS) - _included(include)
    after = _decode_cursor(cursor) if cursor else None
    jobs = await store.list_jobs(
        status=status_, queue=queue, task=task, group_key=group_key, limit=limit + 1, after=after
    )
    page, more = jobs[:limit], len(jobs) > limit
    cursor_json = f'"{_encode_cursor(page[-1])}"' if more else "null"  # base64: no escapes
    listed = ",".join(JobListed.json_of(job, omitted) for job in page)
    return Response(
        f'{{"jobs":[{listed}],"next_cursor":{cursor_json}}}', media_type="application/json"
    )


@router.post(
    "/jobs/{job_id}/retry",
    response_model=JobOut,
    responses={
        **NOT_FOUND,
        409: {
            "model": ErrorOut,
            "description": "Not requeued: the job is not failed or cancelled, a newer one with "
            "its dedup_key replaces it, or a job it depends on failed.",
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
        409: {"model": ErrorOut, "description": "The job has not finished."},
    },
    summary="Delete a finished job",
)
async def delete_job(job_id: UUID, store: StoreDep) -> Response:
    if await store.delete_job(job_id):
        return Response(status_code=204)
    job = await store.get_job(job_id)
    if job is None:
        return not_found(job_id)
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


def _encode_cursor(job: Job) -> str:
    raw = f"{job.created_at.isoformat()}|{job.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created, job_id = raw.split("|")
        return datetime.fromisoformat(created), UUID(job_id)
    except (ValueError, UnicodeDecodeError):
        raise InvalidJob("cursor is not one that GET /jobs gave out") from None
