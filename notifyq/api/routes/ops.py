"""The operators' routes: liveness, readiness, Prometheus metrics, the registered tasks, the
workers the database knows of, jobs ended per minute, the busiest fair keys, and the dashboard
(a page and its assets).

``router`` needs the token when one is set; ``open_router`` (``/health``) and the dashboard's
files do not (the app lists them in its open paths): liveness probes carry no token, and the
page asks for the token and sends it with every call it makes.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles
from starlette.staticfiles import PathLike
from starlette.types import Scope

from notifyq._version import __version__
from notifyq.api.deps import (
    MetricsDep,
    ScrapeLockDep,
    SettingsDep,
    StoreDep,
    SupervisorDep,
    WorkerHost,
)
from notifyq.api.middleware import authenticated
from notifyq.api.schemas import FairKeysOut, HealthOut, MinutesOut, ReadyOut, TaskOut, WorkerOut
from notifyq.doctor import examine
from notifyq.errors import DatabaseUnavailable, NotifyQError
from notifyq.metrics import CONTENT_TYPE_LATEST, MAX_FAIR_KEYS
from notifyq.migrations import latest_version
from notifyq.store import Store

HEALTH_TIMEOUT = 2.0
#: Queue depth is read from the database at most this often, however often /metrics is scraped.
DEPTH_MAX_AGE = 2.0
#: Fair keys GET /stats/fair-keys answers by default, and at most (notifyq.fair_keys_v1 answers
#: no more).
FAIR_KEYS_PAGE = 20
MAX_FAIR_KEYS_PAGE = 100
STATIC = Path(__file__).resolve().parent.parent.parent / "static"
#: The dashboard's script: ES modules in static/dashboard/, loaded by main.js (the test of the
#: dashboard's modules checks this list against the folder).
DASHBOARD_MODULES = (
    "api.js",
    "bulk.js",
    "bus.js",
    "charts.js",
    "conn.js",
    "cron.js",
    "detail.js",
    "dom.js",
    "fair.js",
    "format.js",
    "hash.js",
    "jobs.js",
    "main.js",
    "messages.js",
    "poll.js",
    "queues.js",
    "router.js",
    "scheduled.js",
    "state.js",
    "stream.js",
    "workers.js",
    "workflow.js",
)
#: The dashboard runs only its own scripts (its modules, from this app) and talks only to this
#: API.
_DASHBOARD_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
}

router = APIRouter()
open_router = APIRouter()


@router.get(
    "/ready",
    response_model=ReadyOut,
    responses={503: {"model": ReadyOut, "description": "Not ready; the fields say why."}},
    summary="Readiness: database, migrations, listener",
)
async def ready(store: StoreDep, supervisor: SupervisorDep) -> JSONResponse:
    body = {"status": "ready", "database": "ok", "migrations": "current", "listener": "ok"}
    try:
        with anyio.fail_after(HEALTH_TIMEOUT):
            version = await store.schema_version()
    except (NotifyQError, TimeoutError) as exc:
        body.update(database=str(exc) or "timed out", migrations="unknown")
    else:
        latest = latest_version()
        if version != latest:
            body["migrations"] = f"at version {version}, this notifyq needs {latest}"
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


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    summary="Prometheus metrics (text format)",
)
async def prometheus(
    store: StoreDep, metrics: MetricsDep, scraping: ScrapeLockDep, settings: SettingsDep
) -> Response:
    # One scrape at a time: concurrent ones would each render in a thread of their own.
    async with scraping:
        if time.monotonic() - metrics.depth_read_at > DEPTH_MAX_AGE:
            with contextlib.suppress(NotifyQError, TimeoutError):
                with anyio.fail_after(HEALTH_TIMEOUT):
                    metrics.know_tasks(row["name"] for row in await store.list_tasks())
                    metrics.set_depth(await store.queue_stats())
                    # What `notifyq doctor` reads (the horizon, dead rows, listeners, ...).
                    after = settings.horizon_warn_after
                    health = await examine(store, horizon_warn_after=after)
                    metrics.set_health(**health.figures())
                    # The busiest fair keys only: clients name keys, so the rest get no series.
                    metrics.set_fair_keys(await store.fair_keys(limit=MAX_FAIR_KEYS))
        # Rendering takes CPU in proportion to the series; off the loop, other requests (and
        # the in-process worker) go on meanwhile.
        text = await anyio.to_thread.run_sync(metrics.render)
    return Response(text, media_type=CONTENT_TYPE_LATEST)


@router.get(
    "/tasks",
    response_model=list[TaskOut],
    summary="Tasks registered by workers, with their options and circuit breakers",
)
async def list_tasks(store: StoreDep) -> list[TaskOut]:
    return [TaskOut.of(row) for row in await store.list_tasks()]


@router.get(
    "/workers",
    response_model=list[WorkerOut],
    summary="Workers listening for jobs or running them, with what each runs now",
)
async def list_workers(store: StoreDep) -> list[WorkerOut]:
    """From what the database holds: idle workers' marks (a busy worker has none) and the
    running jobs' worker ids; 500 workers at most, 20 jobs each."""
    return [WorkerOut(**row) for row in await store.list_workers(limit=500)]


@router.get(
    "/stats/minutes",
    response_model=MinutesOut,
    summary="Jobs completed, failed and cancelled per minute, for the last hour's charts",
)
async def minute_stats(
    store: StoreDep,
    minutes: Annotated[int, Query(ge=1, le=60, description="Whole minutes back.")] = 60,
) -> MinutesOut:
    """Each whole minute is counted once from the finished jobs and stored (the first read
    after it ended does it; at most 10 per read), so every API process answers the same; the
    minute under way is counted on each read. ``since`` tells the minutes not counted yet from
    those before the database had jobs."""
    rows = await store.minute_stats(minutes=minutes, fill=10)
    since = await store.counted_since()
    return MinutesOut.model_validate({"minutes": rows, "since": since})


@router.get(
    "/stats/fair-keys",
    response_model=FairKeysOut,
    summary="The fair keys with the most jobs queued or running, for the dashboard",
)
async def fair_key_stats(
    store: StoreDep,
    limit: Annotated[
        int, Query(ge=1, le=MAX_FAIR_KEYS_PAGE, description="Most keys answered.")
    ] = FAIR_KEYS_PAGE,
) -> FairKeysOut:
    """Each fair key of each queue with its jobs queued (due or not) and running, and the
    key's weight, counted on each read; most jobs first. A key with no job queued or running
    is not listed, nor are jobs without a fair_key."""
    return FairKeysOut.model_validate({"keys": await store.fair_keys(limit=limit)})


@open_router.get(
    "/health",
    response_model=HealthOut,
    responses={503: {"model": HealthOut, "description": "The database does not answer."}},
    summary="Liveness and database reachability",
)
async def health(
    request: Request, store: StoreDep, settings: SettingsDep, supervisor: SupervisorDep
) -> JSONResponse:
    body = await _health(store, supervisor)
    code = 200 if body["status"] == "healthy" else 503
    if settings.api_token is not None and not authenticated(request.scope):
        body = {"status": body["status"]}
    return JSONResponse(body, status_code=code)


async def _health(store: Store, supervisor: WorkerHost | None) -> dict[str, Any]:
    """The body of GET /health with every detail."""
    worker = None if supervisor is None else supervisor.worker
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
            await store.ping()
    except (DatabaseUnavailable, TimeoutError) as exc:
        body.update(status="unhealthy", database=str(exc) or "timed out")
    return body


async def dashboard() -> FileResponse:
    return FileResponse(STATIC / "dashboard.html", headers=_DASHBOARD_HEADERS)


class _DashboardFiles(StaticFiles):
    """The dashboard's folder. A script goes out as text/javascript whatever the host's table
    of types says (a browser refuses a module of another type, and some hosts map .js to
    text/plain). Every file is sent with no-cache: the page's modules must all come from the
    same version after an upgrade, so the browser asks each time, and the ETag makes that a
    304."""

    def file_response(
        self,
        full_path: PathLike,
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        if response.status_code != 304 and os.fspath(full_path).endswith(".js"):
            response.headers["Content-Type"] = "text/javascript; charset=utf-8"
        response.headers["Cache-Control"] = "no-cache"
        return response


def add_dashboard(app: FastAPI) -> None:
    """Adds the dashboard's page and its assets to ``app`` itself, not through a router:
    ``include_router`` leaves out what is mounted on a router, so the folder must be mounted
    on the app."""
    app.add_api_route("/dashboard", dashboard, include_in_schema=False)
    app.mount("/static", _DashboardFiles(directory=STATIC), name="static")
