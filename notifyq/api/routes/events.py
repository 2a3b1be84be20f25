"""``GET /jobs/{job_id}/events``: a job's changes as server-sent events, pushed by NOTIFY.

Each stream waits on the process's :class:`~notifyq.watching.JobWatcher` (one LISTEN connection
for every stream of the process): an ``event: job`` with the job's JSON at once, then one on
every change of its status or progress, and the stream ends after a final status. While nothing
changes, a comment line every :data:`KEEPALIVE` seconds keeps proxies from closing it (and finds
out a client that went away, whose stream then costs nothing more). Streams are bounded per
process (``NOTIFYQ_MAX_STREAMS``): past the bound, 503.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from notifyq.api.deps import StoreDep
from notifyq.api.errors import NOT_FOUND, not_found
from notifyq.api.schemas import ErrorOut, JobOut
from notifyq.errors import NotifyQError
from notifyq.models import Job
from notifyq.store import Store
from notifyq.watching import JobWatcher

#: Seconds between two keep-alive comments of a quiet stream.
KEEPALIVE = 15.0

router = APIRouter()


async def watcher_of(request: Request) -> JobWatcher:
    """The app's job watcher (set up by its lifespan)."""
    watcher: JobWatcher = request.app.state.watcher
    return watcher


WatcherDep = Annotated[JobWatcher, Depends(watcher_of)]


@router.get(
    "/jobs/{job_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "`event: job` with the job's JSON, at once and on every change of "
            "its status or progress; the stream ends after a final status.",
        },
        **NOT_FOUND,
        503: {"model": ErrorOut, "description": "Too many streams open in this process."},
    },
    summary="Follow a job: its changes, pushed as server-sent events",
)
async def job_events(job_id: UUID, store: StoreDep, watcher: WatcherDep) -> Response:
    job = await store.get_job(job_id)
    if job is None:
        return not_found(job_id)
    if watcher.waiters >= watcher.max_watches:
        return JSONResponse(
            {"detail": f"this API process already serves {watcher.max_watches} event streams "
                       "(NOTIFYQ_MAX_STREAMS); try again later"},
            status_code=503,
            headers={"Retry-After": "5"},
        )  # fmt: skip
    return StreamingResponse(
        _events(job, store, watcher),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _events(first: Job, store: Store, watcher: JobWatcher) -> AsyncIterator[str]:
    yield _event(first)
    if first.status.finished:
        return
    sent = _seen(first)
    try:
        async with watcher.watch(first.id) as changes:
            while True:
                job = await store.get_job(first.id)
                if job is None:
                    return  # deleted
                if _seen(job) != sent:
                    sent = _seen(job)
                    yield _event(job)
                if job.status.finished:
                    return
                while not await changes.wait(KEEPALIVE):
                    if not watcher.connected:
                        break  # no notifications now: look at the job anyway
                    yield ": keep-alive\n\n"
    except NotifyQError as exc:
        # The database went away, or too many waits: say so, and end (EventSource retries).
        yield f"event: error\ndata: {_one_line(str(exc))}\n\n"


def _seen(job: Job) -> tuple[object, ...]:
    # What a client is told about. The attempt counts too: a job that failed and started again
    # between two reads shows the same status, but it went through another in between.
    return (job.status, job.progress, job.attempt_count)


def _event(job: Job) -> str:
    return f"event: job\ndata: {JobOut.of(job).model_dump_json()}\n\n"


def _one_line(text: str) -> str:
    return " ".join(text.split())
