"""notifyq: a PostgreSQL job queue that starts jobs the instant they are committed.

An INSERT into ``notifyq.jobs`` notifies listening workers, which claim work with
``FOR UPDATE SKIP LOCKED``; a slow fallback poll covers missed notifications.

Public names::

    from notifyq import task, Queue, SyncQueue

    @task
    async def resize(payload: dict) -> dict: ...

    async with Queue("postgresql://...") as q:
        result = await q.enqueue("resize", {"path": "a.png"})

    with SyncQueue("postgresql://...") as q:      # blocking, for threads and sync views
        result = q.enqueue("resize", {"path": "a.png"})
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from notifyq._version import __version__

__all__ = [
    "Backoff",
    "CircuitBreaker",
    "ConfigurationError",
    "DatabaseUnavailable",
    "EnqueueResult",
    "InvalidJob",
    "Job",
    "JobContext",
    "JobNotFound",
    "JobOptions",
    "JobSpec",
    "JobStatus",
    "MigrationError",
    "NotifyQError",
    "PermanentFailure",
    "Queue",
    "QueueFull",
    "Settings",
    "SignalRefused",
    "SignalTimeout",
    "Snooze",
    "SyncQueue",
    "TaskError",
    "Worker",
    "WorkflowResult",
    "__version__",
    "chain",
    "chord",
    "create_app",
    "current_job",
    "group",
    "periodic",
    "step",
    "task",
]

if TYPE_CHECKING:
    from notifyq.api import create_app
    from notifyq.client import Queue
    from notifyq.context import JobContext, current_job
    from notifyq.errors import (
        ConfigurationError,
        DatabaseUnavailable,
        InvalidJob,
        JobNotFound,
        MigrationError,
        NotifyQError,
        PermanentFailure,
        QueueFull,
        SignalRefused,
        SignalTimeout,
        Snooze,
        TaskError,
    )
    from notifyq.jobspec import JobOptions, JobSpec
    from notifyq.models import EnqueueResult, Job, JobStatus
    from notifyq.retry import Backoff, CircuitBreaker
    from notifyq.settings import Settings
    from notifyq.sync_client import SyncQueue
    from notifyq.tasks import periodic, task
    from notifyq.worker import Worker
    from notifyq.workflows import WorkflowResult, chain, chord, group, step

_LOCATIONS = {
    "create_app": "notifyq.api",
    "Queue": "notifyq.client",
    "SyncQueue": "notifyq.sync_client",
    "Worker": "notifyq.worker",
    "Settings": "notifyq.settings",
    "task": "notifyq.tasks",
    "Backoff": "notifyq.retry",
    "CircuitBreaker": "notifyq.retry",
    "periodic": "notifyq.tasks",
    "JobContext": "notifyq.context",
    "current_job": "notifyq.context",
    "EnqueueResult": "notifyq.models",
    "Job": "notifyq.models",
    "JobOptions": "notifyq.jobspec",
    "JobSpec": "notifyq.jobspec",
    "JobStatus": "notifyq.models",
    "WorkflowResult": "notifyq.workflows",
    "chain": "notifyq.workflows",
    "chord": "notifyq.workflows",
    "group": "notifyq.workflows",
    "step": "notifyq.workflows",
}


def __getattr__(name: str) -> Any:
    # Submodules load on first use, so `import notifyq` stays cheap (no FastAPI for a worker).
    import importlib

    module = _LOCATIONS.get(name)
    if module is None and name in __all__:
        module = "notifyq.errors"
    if module is None:
        raise AttributeError(f"module 'notifyq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
