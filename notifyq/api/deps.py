"""What a route receives from the app it runs in, as ``Annotated`` dependencies.

:func:`~notifyq.api.application.create_app` puts the settings, the metrics and the scrape lock
on ``app.state``; its lifespan adds the store and, with an in-process worker, the supervisor. A
route declares what it needs (``store: StoreDep``) instead of reading ``request.app.state``.
The providers are coroutines on purpose: FastAPI runs a plain ``def`` dependency in a thread.
The submission routes of :mod:`notifyq.api.fast`, which skip dependency solving, await them
directly.
"""

from __future__ import annotations

from typing import Annotated, Protocol

import anyio
from fastapi import Depends, Request
from fastapi.params import Depends as DependsParam
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from notifyq.metrics import Metrics
from notifyq.notifier import Listener
from notifyq.settings import Settings
from notifyq.store import Store


class HostedWorker(Protocol):
    """What /ready and /health read of the worker running in this process."""

    @property
    def id(self) -> str: ...

    @property
    def running_jobs(self) -> int: ...

    @property
    def listener(self) -> Listener | None: ...


class WorkerHost(Protocol):
    """What the routes read of the supervisor of the worker running in this process: the
    routes know the worker only through this, and only ``create_app``'s lifespan, which
    starts a :class:`notifyq.worker.Supervisor`, knows the worker package."""

    @property
    def worker(self) -> HostedWorker | None: ...

    @property
    def problem(self) -> str | None: ...


async def store_of(request: Request) -> Store:
    """The store of the app's pool (there once the lifespan has started)."""
    store: Store = request.app.state.store
    return store


async def settings_of(request: Request) -> Settings:
    """The settings the app was built with."""
    settings: Settings = request.app.state.settings
    return settings


async def metrics_of(request: Request) -> Metrics:
    """The app's metrics, shared with its in-process worker."""
    metrics: Metrics = request.app.state.metrics
    return metrics


async def supervisor_of(request: Request) -> WorkerHost | None:
    """The supervisor of the worker running in this process, or None when there is none."""
    supervisor: WorkerHost | None = getattr(request.app.state, "supervisor", None)
    return supervisor


async def scrape_lock_of(request: Request) -> anyio.Lock:
    """The lock that lets one /metrics scrape run at a time."""
    lock: anyio.Lock = request.app.state.scrape_lock
    return lock


StoreDep = Annotated[Store, Depends(store_of)]
SettingsDep = Annotated[Settings, Depends(settings_of)]
MetricsDep = Annotated[Metrics, Depends(metrics_of)]
SupervisorDep = Annotated[WorkerHost | None, Depends(supervisor_of)]
ScrapeLockDep = Annotated[anyio.Lock, Depends(scrape_lock_of)]

#: Declares the bearer scheme in the OpenAPI document (so /docs can send it); TokenGuard
#: enforces it.
_bearer = HTTPBearer(auto_error=False, description="NOTIFYQ_API_TOKEN, when it is set.")


async def _documented_bearer(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    return None


def documented_guard(settings: Settings) -> list[DependsParam]:
    """The dependencies of every route that needs the token: with a token set, one that
    documents the bearer scheme (it checks nothing, TokenGuard does); else none."""
    return [Depends(_documented_bearer)] if settings.api_token is not None else []
