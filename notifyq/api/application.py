"""``create_app(settings)``: the FastAPI app of notifyq, put together from its parts.

The lifespan applies migrations (unless told not to), opens the connection pool and the
process's one LISTEN connection (shared by the job watcher of the event streams and the
worker) and, unless ``run_worker`` is off, runs a worker in the same process. What the app is
made of lives one level down: the middleware (:mod:`.middleware`), the error answers
(:mod:`.errors`), the submission routes (:mod:`.fast`) and the routers of :mod:`.routes`, whose
routes receive the store and settings as dependencies (:mod:`.deps`) and answer with the models
of :mod:`.schemas`.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

import anyio
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi_offline import FastAPIOffline

from notifyq._version import __version__
from notifyq.api import errors, fast, middleware
from notifyq.api.deps import WorkerHost, documented_guard
from notifyq.api.routes import events, jobs, ops, queues, schedule, workflows
from notifyq.api.schemas import ErrorOut
from notifyq.bootstrap import require_database
from notifyq.db import connect_kwargs, listen_url, open_pool
from notifyq.errors import ConfigurationError, DatabaseUnavailable
from notifyq.guards import cors_refusal
from notifyq.metrics import Metrics
from notifyq.migrations import migrate
from notifyq.notifier import CANCEL_CHANNEL, CHANNEL, JOB_CHANNEL, Listener
from notifyq.settings import Settings, explicit_max_attempts
from notifyq.store import Store
from notifyq.tasks import Registry
from notifyq.tracing import Tracing, tracing
from notifyq.watching import JobWatcher
from notifyq.worker import Supervisor, Worker

logger = logging.getLogger(__name__)

#: Connections the pool keeps for the in-process worker, on top of NOTIFYQ_POOL_SIZE.
WORKER_CONNECTIONS = 4

#: Where /docs (Swagger UI) and /redoc load their scripts, style and icon from: the app itself,
#: serving the files the fastapi-offline package ships, so that the pages work without internet
#: access and name no other origin.
DOCS_ASSETS = "/docs/assets"
#: The files of DOCS_ASSETS that the two pages load.
DOCS_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")
#: What /redoc is served with. ReDoc's script draws its vendor's logo from the vendor's CDN
#: (an image that hides itself when it cannot load): img-src keeps the browser from asking.
#: Its search runs in a worker made from a blob, and it styles the page with inline styles.
REDOC_CSP = (
    "default-src 'none'; script-src 'self'; worker-src blob:; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
#: What /docs is served with: Swagger UI from DOCS_ASSETS, and the page's own inline script,
#: named by its hash (added per page, see _add_docs). The token is pasted there: no script of
#: another origin, no frame, no form sent elsewhere.
DOCS_CSP = (
    "default-src 'none'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)

#: Open with a token set: liveness, the API's own documentation and its assets, and the
#: dashboard's page and assets (none holds job data; the page asks for the token and sends it
#: with every call).
OPEN_PATHS = frozenset(
    {
        "/health",
        "/docs",
        "/redoc",
        "/openapi.json",
        *(f"{DOCS_ASSETS}/{name}" for name in DOCS_FILES),
        "/dashboard",
        "/static/dashboard.css",
        *(f"/static/dashboard/{name}" for name in ops.DASHBOARD_MODULES),
    }
)


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
    require_database(settings)
    refusal = cors_refusal(settings)
    if refusal is not None:
        raise ConfigurationError(refusal)
    metrics = Metrics()
    tracer = tracing(settings)

    app = FastAPIOffline(
        title="notifyq",
        version=__version__,
        description="A PostgreSQL job queue: jobs start the instant they are committed.",
        lifespan=_lifespan(settings, registry, metrics, tracer),
        responses={503: {"model": ErrorOut, "description": "The database is unreachable."}},
        static_url=DOCS_ASSETS,
        # Swagger UI's validator badge would send the schema's address to a public validator.
        swagger_ui_parameters={"validatorUrl": None},
        docs_url=None,  # both added below, with their CSP
        redoc_url=None,
    )
    _add_docs(app)
    _add_redoc(app)
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.scrape_lock = anyio.Lock()
    if tracer.enabled:
        app.add_middleware(middleware.TraceContext, tracing=tracer)
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
    fast.add_routes(app, guard)
    app.include_router(events.router, dependencies=guard)
    app.include_router(jobs.router, dependencies=guard)
    app.include_router(workflows.router, dependencies=guard)
    app.include_router(queues.router, dependencies=guard)
    app.include_router(schedule.router, dependencies=guard)
    app.include_router(ops.router, dependencies=guard)
    app.include_router(ops.open_router)
    ops.add_dashboard(app)
    return app


def _lifespan(
    settings: Settings, registry: Registry | None, metrics: Metrics, tracer: Tracing
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: migrates (with ``auto_migrate``), opens the pool, starts the
    listener and the job watcher, and, with ``run_worker``, the in-process worker under its
    supervisor; stops them all, in reverse, at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.auto_migrate:
            await migrate(settings)
        # One pool for the API and its worker, with room for the worker's own statements
        # (a claim, a flush, a heartbeat and a rescue may run at once).
        size = settings.pool_size + (WORKER_CONNECTIONS if settings.run_worker else 0)
        async with (
            open_pool(settings, name="api", min_size=1, max_size=size, wait=False) as pool,
            anyio.create_task_group() as background,
        ):
            store = Store(
                pool, default_max_attempts=explicit_max_attempts(settings), tracing=tracer
            )
            app.state.store = store
            listener = _listener(settings)
            if settings.run_worker:
                # Like a worker with a listener of its own: live before its first claim, and
                # a LISTEN that cannot work (a pooler between) stops the start with its reason.
                await background.start(listener.run)
            else:
                background.start_soon(_keep_listening, listener)
            watcher = JobWatcher(
                store, listener, fallback=settings.poll_interval, max_watches=settings.max_streams
            )
            await background.start(watcher.run)
            app.state.watcher = watcher
            try:
                if not settings.run_worker:
                    yield
                    return
                supervisor = Supervisor(
                    lambda: Worker(
                        settings, registry, metrics=metrics, store=store, listener=listener
                    )
                )
                # What the routes read of it (checked here, where both are known).
                host: WorkerHost = supervisor
                app.state.supervisor = host
                async with anyio.create_task_group() as tg:
                    await tg.start(supervisor.run)
                    try:
                        yield
                    finally:
                        supervisor.stop()
            finally:
                background.cancel_scope.cancel()

    return lifespan


def _add_docs(app: FastAPI) -> None:
    """/docs: Swagger UI, from DOCS_ASSETS, under DOCS_CSP with the hash of its inline script
    (which holds the page's parameters)."""

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
            swagger_ui_parameters=app.swagger_ui_parameters,
        )
        scripts = _INLINE_SCRIPT.findall(bytes(page.body).decode())
        hashes = " ".join(
            f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'"
            for s in scripts
        )
        page.headers["Content-Security-Policy"] = DOCS_CSP.format(hashes=hashes)
        return page


def _add_redoc(app: FastAPI) -> None:
    """/redoc: ReDoc, from DOCS_ASSETS, under REDOC_CSP."""

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,
        )
        page.headers["Content-Security-Policy"] = REDOC_CSP
        return page


def _listener(settings: Settings) -> Listener:
    """The process's LISTEN connection: the event streams' channel, and the worker's."""
    channels = (JOB_CHANNEL, CHANNEL, CANCEL_CHANNEL) if settings.run_worker else (JOB_CHANNEL,)
    return Listener(
        listen_url(settings),
        channels=channels,
        connect_kwargs=connect_kwargs(settings, "notifyq-listener"),
    )


async def _keep_listening(listener: Listener) -> None:
    """Runs the listener, and runs it again when its first connection fails: the API serves
    while the database is away, and its streams and worker fall back to polling meanwhile."""
    delay = 0.5
    while True:
        try:
            await listener.run()
        except (DatabaseUnavailable, ConfigurationError) as exc:
            logger.warning("listener: %s; retrying in %.1fs", exc, delay)
            await anyio.sleep(delay)
            delay = min(delay * 2, 5.0)
