"""The HTTP API: ``create_app(settings)`` builds the FastAPI app.

Its lifespan applies migrations (unless told not to), opens the connection pool and, unless
``run_worker`` is off, runs a worker in the same process. The routes are thin: validate, call
the store, answer.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import time
from collections.abc import (
    AsyncIterator,
)
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import anyio
import anyio.to_thread
from fastapi import FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles

from notifyq._version import __version__
from notifyq.api import errors, fast, middleware
from notifyq.api.deps import documented_guard
from notifyq.api.errors import NOT_FOUND, not_found
from notifyq.api.schemas import (
    LIST_DATA_FIELDS,
    ErrorOut,
    HealthOut,
    JobListed,
    JobOut,
    JobPage,
    QueueOut,
    ReadyOut,
    RetriedOut,
    RetryableStatus,
    TaskOut,
)
from notifyq.db import database_url, open_pool
from notifyq.errors import (
    DatabaseUnavailable,
    InvalidJob,
    NotifyQError,
)
from notifyq.metrics import CONTENT_TYPE_LATEST, Metrics
from notifyq.migrations import latest_version, migrate
from notifyq.models import (
    MAX_NAME_LENGTH,
    Job,
    JobStatus,
    check_name,
)
from notifyq.settings import Settings, explicit_max_attempts
from notifyq.store import Store
from notifyq.supervisor import Supervisor
from notifyq.tasks import Registry
from notifyq.worker import Worker

logger = logging.getLogger(__name__)

HEALTH_TIMEOUT = 2.0
#: Queue depth is read from the database at most this often, however often /metrics is scraped.
DEPTH_MAX_AGE = 2.0
# -- the app ------------------------------------------------------------------------------


def create_app(
    settings: Settings | None = None,
    *,
    registry: Registry | None = None,
) -> FastAPI:
    """Builds the app. ``settings`` default to the environment's; ``registry`` is what the
    in-process worker serves (default: built-ins and every ``@task``)."""
    settings = settings if settings is not None else Settings.load()
    # Only `notifyq dev` starts an embedded PostgreSQL (and passes its URL in): a forgotten
    # DATABASE_URL in production must not create a second, empty job store.
    database_url(settings)
    metrics = Metrics()
    scraping = anyio.Lock()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.auto_migrate:
            await migrate(settings)
        async with open_pool(settings, name="api", min_size=1, wait=False) as pool:
            app.state.store = Store(pool, default_max_attempts=explicit_max_attempts(settings))
            if not settings.run_worker:
                yield
                return
            supervisor = Supervisor(lambda: Worker(settings, registry, metrics=metrics))
            app.state.supervisor = supervisor
            async with anyio.create_task_group() as tg:
                await tg.start(supervisor.run)
                try:
                    yield
                finally:
                    supervisor.stop()

    app = FastAPI(
        title="notifyq",
        version=__version__,
        description="A PostgreSQL job queue: jobs start the instant they are committed.",
        lifespan=lifespan,
        responses={503: {"model": ErrorOut, "description": "The database is unreachable."}},
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.add_middleware(middleware.BodyLimit, max_bytes=settings.max_body_bytes)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
        )
    # Added last, so it runs first: a request without the token (or, without a token set,
    # with a foreign Host or from another site) is refused before its body is read.
    middleware.install(app, settings, OPEN_PATHS)
    errors.install(app)
    fast.document_bodies(app)

    guard = documented_guard(settings)
    app.include_router(fast.router, dependencies=guard)

    @app.get(
        "/jobs/{job_id}",
        response_model=JobOut,
        dependencies=guard,
        responses=NOT_FOUND,
        summary="Read a job",
    )
    async def get_job(job_id: UUID, request: Request) -> JobOut | JSONResponse:
        job = await _store(request).get_job(job_id)
        if job is None:
            return not_found(job_id)
        return JobOut.of(job)

    @app.get(
        "/jobs",
        response_model=JobPage,
        dependencies=guard,
        summary="List jobs, newest first",
    )
    async def list_jobs(
        request: Request,
        status_: JobStatus | None = Query(None, alias="status", description="Only this status."),
        queue: str | None = Query(None, max_length=MAX_NAME_LENGTH, description="Only this queue."),
        task: str | None = Query(None, max_length=MAX_NAME_LENGTH, description="Only this task."),
        limit: int = Query(50, ge=1, le=500, description="Jobs per page."),
        cursor: str | None = Query(None, description="next_cursor of the page before."),
        include: str | None = Query(
            None,
            max_length=100,
            description="Comma-separated, any of payload, result, errors: the data fields "
            "each job of the page carries (none by default; GET /jobs/{id} has them all).",
        ),
    ) -> Response:
        omitted = frozenset(LIST_DATA_FIELDS) - _included(include)
        after = _decode_cursor(cursor) if cursor else None
        jobs = await _store(request).list_jobs(
            status=status_, queue=queue, task=task, limit=limit + 1, after=after
        )
        page, more = jobs[:limit], len(jobs) > limit
        cursor_json = f'"{_encode_cursor(page[-1])}"' if more else "null"  # base64: no escapes
        listed = ",".join(JobListed.json_of(job, omitted) for job in page)
        return Response(
            f'{{"jobs":[{listed}],"next_cursor":{cursor_json}}}', media_type="application/json"
        )

    @app.post(
        "/jobs/{job_id}/retry",
        response_model=JobOut,
        dependencies=guard,
        responses={
            **NOT_FOUND,
            409: {"model": ErrorOut, "description": "The job is not failed or cancelled."},
        },
        summary="Requeue a failed or cancelled job",
    )
    async def retry_job(job_id: UUID, request: Request) -> JobOut | JSONResponse:
        store = _store(request)
        retried = await store.retry_job(job_id)
        job = await store.get_job(job_id)
        if job is None:
            return not_found(job_id)
        if not retried:
            if job.status in (JobStatus.FAILED, JobStatus.CANCELLED):
                reason = (
                    f"a newer job with the same queue and dedup_key {job.dedup_key!r} is "
                    "queued and replaces it"
                )
            else:
                reason = f"it is {job.status.value}; only failed or cancelled jobs go back"
            return JSONResponse({"detail": f"job {job_id} not requeued: {reason}"}, status_code=409)
        return JobOut.of(job)

    @app.post(
        "/jobs/{job_id}/cancel",
        response_model=JobOut,
        dependencies=guard,
        responses={
            202: {"model": JobOut, "description": "Running: its worker was asked to stop it."},
            **NOT_FOUND,
            409: {"model": ErrorOut, "description": "The job already finished."},
        },
        summary="Cancel a queued job, or stop a running one",
    )
    async def cancel_job(job_id: UUID, request: Request) -> JSONResponse:
        store = _store(request)
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

    @app.delete(
        "/jobs/{job_id}",
        status_code=204,
        dependencies=guard,
        responses={
            **NOT_FOUND,
            409: {"model": ErrorOut, "description": "The job has not finished."},
        },
        summary="Delete a finished job",
    )
    async def delete_job(job_id: UUID, request: Request) -> Response:
        store = _store(request)
        if await store.delete_job(job_id):
            return Response(status_code=204)
        job = await store.get_job(job_id)
        if job is None:
            return not_found(job_id)
        return JSONResponse(
            {"detail": f"job {job_id} is {job.status.value}; cancel it first"}, status_code=409
        )

    @app.get(
        "/queues",
        response_model=list[QueueOut],
        dependencies=guard,
        summary="Queues with their counts by status and last minute's throughput",
    )
    async def list_queues(request: Request) -> list[QueueOut]:
        return [QueueOut(**row) for row in await _store(request).queue_stats()]

    @app.post(
        "/queues/{queue}/pause",
        response_model=QueueOut,
        dependencies=guard,
        summary="Stop workers from claiming this queue's jobs",
    )
    async def pause_queue(queue: str, request: Request) -> QueueOut:
        return await _set_paused(request, queue, True)

    @app.post(
        "/queues/{queue}/resume",
        response_model=QueueOut,
        dependencies=guard,
        summary="Let workers claim this queue's jobs again",
    )
    async def resume_queue(queue: str, request: Request) -> QueueOut:
        return await _set_paused(request, queue, False)

    @app.get(
        "/ready",
        response_model=ReadyOut,
        dependencies=guard,
        responses={503: {"model": ReadyOut, "description": "Not ready; the fields say why."}},
        summary="Readiness: database, migrations, listener",
    )
    async def ready(request: Request) -> JSONResponse:
        body = {"status": "ready", "database": "ok", "migrations": "current", "listener": "ok"}
        try:
            with anyio.fail_after(HEALTH_TIMEOUT):
                version = await _store(request).schema_version()
        except (NotifyQError, TimeoutError) as exc:
            body.update(database=str(exc) or "timed out", migrations="unknown")
        else:
            latest = latest_version()
            if version != latest:
                body["migrations"] = f"at version {version}, this notifyq needs {latest}"
        supervisor: Supervisor | None = getattr(request.app.state, "supervisor", None)
        worker = None if supervisor is None else supervisor.worker
        if supervisor is None:
            body["listener"] = "no worker in this process"
        elif supervisor.problem is not None:
            body["listener"] = "disconnected"
            body["worker"] = supervisor.problem
        elif worker is None or worker.listener is None or not worker.listener.connected:
            body["listener"] = "disconnected"
        failing = body["database"] != "ok" or body["migrations"] != "current"
        if failing or body["listener"] == "disconnected":
            body["status"] = "not_ready"
            return JSONResponse(body, status_code=503)
        return JSONResponse(body)

    @app.get(
        "/metrics",
        dependencies=guard,
        response_class=PlainTextResponse,
        summary="Prometheus metrics (text format)",
    )
    async def prometheus(request: Request) -> Response:
        # One scrape at a time: concurrent ones would each render in a thread of their own.
        async with scraping:
            if time.monotonic() - metrics.depth_read_at > DEPTH_MAX_AGE:
                store = _store(request)
                with contextlib.suppress(NotifyQError, TimeoutError):
                    with anyio.fail_after(HEALTH_TIMEOUT):
                        metrics.know_tasks(row["name"] for row in await store.list_tasks())
                        metrics.set_depth(await store.queue_stats())
            # Rendering takes CPU in proportion to the series; off the loop, other requests
            # (and the in-process worker) go on meanwhile.
            text = await anyio.to_thread.run_sync(metrics.render)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    @app.post(
        "/jobs/retry",
        response_model=RetriedOut,
        dependencies=guard,
        summary="Requeue every failed (or cancelled) job of a queue or task",
    )
    async def retry_jobs(
        request: Request,
        status_: RetryableStatus = Query(
            "failed", alias="status", description="failed or cancelled"
        ),
        queue: str | None = Query(None, max_length=MAX_NAME_LENGTH),
        task: str | None = Query(None, max_length=MAX_NAME_LENGTH),
    ) -> RetriedOut:
        count = await _store(request).retry_jobs(status=JobStatus(status_), queue=queue, task=task)
        return RetriedOut(requeued=count)

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(STATIC / "dashboard.html", headers=_DASHBOARD_HEADERS)

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get(
        "/tasks",
        response_model=list[TaskOut],
        dependencies=guard,
        summary="Tasks registered by workers, with their options and circuit breakers",
    )
    async def list_tasks(request: Request) -> list[TaskOut]:
        return [TaskOut.of(row) for row in await _store(request).list_tasks()]

    @app.get(
        "/health",
        response_model=HealthOut,
        responses={503: {"model": HealthOut, "description": "The database does not answer."}},
        summary="Liveness and database reachability",
    )
    async def health(request: Request) -> JSONResponse:
        body = await _health(request)
        code = 200 if body["status"] == "healthy" else 503
        if settings.api_token is not None and not middleware.authenticated(request.scope):
            body = {"status": body["status"]}
        return JSONResponse(body, status_code=code)

    return app


async def _health(request: Request) -> dict[str, Any]:
    """The body of GET /health with every detail."""
    worker = _worker_of(request)
    body: dict[str, Any] = {"status": "healthy", "database": "ok", "version": __version__}
    if worker is not None:
        listener = worker.listener
        body["worker"] = {
            "id": worker.id,
            "running_jobs": worker.running_jobs,
            "listener_connected": bool(listener and listener.connected),
        }
    try:
        with anyio.fail_after(HEALTH_TIMEOUT):
            await _store(request).ping()
    except (DatabaseUnavailable, TimeoutError) as exc:
        body.update(status="unhealthy", database=str(exc) or "timed out")
    return body


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


async def _set_paused(request: Request, queue: str, paused: bool) -> QueueOut:
    try:
        check_name("queue", queue)
    except InvalidJob as exc:
        raise RequestValidationError(
            [{"loc": ("path", "queue"), "msg": str(exc), "type": "value_error"}]
        ) from None
    store = _store(request)
    await store.configure_queue(queue, paused=paused)
    rows = {row["queue"]: row for row in await store.queue_stats()}
    return QueueOut(**rows[queue])


def _worker_of(request: Request) -> Worker | None:
    """The worker running in this process now, if any."""
    supervisor: Supervisor | None = getattr(request.app.state, "supervisor", None)
    return None if supervisor is None else supervisor.worker


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


# -- auth ---------------------------------------------------------------------------------


#: Open with a token set: liveness, the API's own documentation, and the dashboard's page and
#: assets (none holds job data; the page asks for the token and sends it with every call).
OPEN_PATHS = frozenset(
    {
        "/health",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
        "/openapi.json",
        "/dashboard",
        "/static/dashboard.js",
        "/static/dashboard.css",
    }
)
STATIC = Path(__file__).resolve().parent.parent / "static"
#: The dashboard runs only its own script and talks only to this API.
_DASHBOARD_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
}
