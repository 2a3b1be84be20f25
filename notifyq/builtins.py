"""The tasks every worker serves, and the registry a worker is given.

The small built-ins (``hello_world``, ``echo``, ``sleep``, ``fail``) are defined here; the ones
that talk to the outside world (``send_email``, ``http_request``, ``file_digest``, ``file_gzip``)
come from :mod:`notifyq.contrib`, bound to a :class:`~notifyq.contrib.ContribSettings`. This is
the one module that knows both :mod:`notifyq.tasks` and :mod:`notifyq.contrib`, so that neither
knows the other. An entry point builds the registry once, before it starts anything::

    registry = worker_registry(contrib=ContribSettings.load())
"""

from __future__ import annotations

from typing import Any

import anyio

from notifyq.contrib import ContribSettings, contrib_tasks
from notifyq.errors import PermanentFailure
from notifyq.tasks import Registry, make_task, registered

__all__ = ["builtin_registry", "echo", "fail", "hello_world", "sleep", "worker_registry"]


async def hello_world(payload: dict[str, Any]) -> dict[str, Any]:
    """Answers a greeting; the smallest useful job."""
    name = payload.get("name", "world")
    return {"message": f"Hello, {name}!"}


async def echo(payload: dict[str, Any]) -> dict[str, Any]:
    """Answers its payload."""
    return payload


async def sleep(payload: dict[str, Any]) -> dict[str, Any]:
    """Sleeps ``payload["seconds"]`` seconds (at most an hour)."""
    seconds = payload.get("seconds", 1)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise PermanentFailure("sleep needs {'seconds': <number>}")
    if not 0 <= seconds <= 3600:
        raise PermanentFailure("sleep takes from 0 to 3600 seconds")
    await anyio.sleep(seconds)
    return {"slept": seconds}


async def fail(payload: dict[str, Any]) -> None:
    """Raises with ``payload["message"]``; every attempt fails, for trying retries."""
    raise RuntimeError(str(payload.get("message", "failed on purpose")))


def builtin_registry(contrib: ContribSettings | None = None) -> Registry:
    """A new registry holding the built-in tasks: hello_world, echo, sleep, fail, and
    send_email, http_request, file_digest and file_gzip configured by ``contrib`` (default:
    read from the environment now, for tests and library users; an entry point passes its
    own)."""
    tasks = [make_task(fn) for fn in (hello_world, echo, sleep, fail)]
    tasks += contrib_tasks(contrib if contrib is not None else ContribSettings.load())
    return Registry(tasks)


def worker_registry(
    extra: Registry | None = None, *, contrib: ContribSettings | None = None
) -> Registry:
    """What a worker serves: the built-ins, every ``@task`` registered so far, and ``extra``. A
    task of the application with a built-in's name (its own ``send_email``, say) replaces the
    built-in."""
    own = registered()
    if extra is not None:
        own = own.merged(extra)
    builtins = [task for task in builtin_registry(contrib) if task.name not in own]
    return Registry(builtins).merged(own)
