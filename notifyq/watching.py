"""Pushed waits: :class:`JobWatcher` tells its waiters when a job they wait on changes.

One watcher per process shares the process's LISTEN connection (channel ``notifyq_job``) among
every waiter: ``Queue.wait`` and each ``GET /jobs/{id}/events`` stream. For each job someone
waits on, it keeps one row in ``notifyq.watched_jobs`` (refreshed while anyone waits, expiring
when its process dies); the statements that change a watched job then announce it at commit,
and the jobs nobody watches cost one look at an empty table. A waiter re-reads the job when
told; notifications are hints, so it also re-reads after a reconnect of the listener (what was
sent meanwhile is gone) and, as a last resort, every ``fallback`` seconds.

A waiter that goes away (a client closing its stream) only leaves the in-memory set; the row
goes when the last waiter of its job does.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
from collections.abc import AsyncIterator
from uuid import UUID

import anyio
from anyio.abc import TaskStatus

from notifyq.errors import NotifyQError
from notifyq.notifier import JOB_CHANNEL, Listener
from notifyq.store import Store

__all__ = ["WATCH_TTL", "Changes", "JobWatcher", "TooManyWatches"]

logger = logging.getLogger(__name__)

#: Seconds a watch row lives unless refreshed; refreshed every third of it.
WATCH_TTL = 60.0


class TooManyWatches(NotifyQError):
    """Raised when a process already waits on as many jobs as it allows."""


class Changes:
    """One waiter's view of one job: :meth:`wait` returns when the job may have changed."""

    def __init__(self, job_id: UUID, watcher: JobWatcher) -> None:
        self.job_id = job_id
        self._watcher = watcher
        self._event = anyio.Event()

    def changed(self) -> None:
        """The job may have changed (a notification, or a reconnect of the listener)."""
        self._event.set()

    async def wait(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Waits until the job may have changed: True. False after ``timeout`` seconds
        without news (by default, and whenever the listener is away, the watcher's fallback
        interval: then the caller should look at the job anyway)."""
        if timeout is None or not self._watcher.connected:
            timeout = self._watcher.fallback
        with anyio.move_on_after(timeout):
            await self._event.wait()
        changed = self._event.is_set()
        if changed:
            self._event = anyio.Event()
        return changed


class JobWatcher:
    """The waits of one process on jobs, over ``listener`` (whose channels include
    ``notifyq_job``). Run it (:meth:`run`) for as long as waits may happen."""

    def __init__(
        self,
        store: Store,
        listener: Listener,
        *,
        fallback: float = 5.0,
        ttl: float = WATCH_TTL,
        max_watches: int = 10_000,
    ) -> None:
        self.id = f"{socket.gethostname()}:{secrets.token_hex(4)}"
        #: Seconds between looks at a waited job when no notification comes.
        self.fallback = fallback
        self._store = store
        self._listener = listener
        self._ttl = ttl
        #: The most waits this process allows at once.
        self.max_watches = max_watches
        self._waiters: dict[UUID, set[Changes]] = {}
        #: Set once the watch row of a job is in (the second waiter of a job waits for it).
        self._registered: dict[UUID, anyio.Event] = {}
        self._running = False
        self._refresh_now = anyio.Event()

    @property
    def connected(self) -> bool:
        """Whether notifications can arrive now."""
        return self._listener.connected

    @property
    def waiters(self) -> int:
        """How many waits are open."""
        return sum(len(waiters) for waiters in self._waiters.values())

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Hands notifications to waiters and keeps the watch rows alive, until cancelled."""
        undo = [
            self._listener.subscribe(JOB_CHANNEL, self._notified),
            self._listener.on_connect(self._reconnected),
        ]
        self._running = True
        task_status.started()
        try:
            while True:
                with anyio.move_on_after(self._ttl / 3):
                    await self._refresh_now.wait()
                reconnected = self._refresh_now.is_set()
                self._refresh_now = anyio.Event()
                if self._waiters:
                    try:
                        await self._store.refresh_watches(self.id, list(self._waiters), self._ttl)
                    except NotifyQError as exc:
                        logger.warning("could not refresh %d job watch(es): %s", len(self), exc)
                if reconnected:
                    # What was announced while the listener was away is gone: look again.
                    for waiters in self._waiters.values():
                        for changes in waiters:
                            changes.changed()
        finally:
            self._running = False
            for callback in undo:
                callback()

    def __len__(self) -> int:
        return len(self._waiters)

    @contextlib.asynccontextmanager
    async def watch(self, job_id: UUID) -> AsyncIterator[Changes]:
        """Waits on ``job_id`` for the duration of the block: read the job after entering it,
        and again after each ``await changes.wait()``. Raises TooManyWatches past the
        process's bound, and DatabaseUnavailable when the watch cannot be registered."""
        if not self._running:
            raise RuntimeError("JobWatcher.watch() before JobWatcher.run() started")
        if self.waiters >= self.max_watches:
            raise TooManyWatches(
                f"this process already waits on {self.max_watches} jobs; try again later"
            )
        changes = Changes(job_id, self)
        waiters = self._waiters.setdefault(job_id, set())
        first = not waiters
        waiters.add(changes)
        try:
            if first:
                registered = self._registered[job_id] = anyio.Event()
                try:
                    # Once registered, a read sees every change that was not announced.
                    await self._store.watch(self.id, job_id, self._ttl)
                finally:
                    registered.set()
            else:
                await self._registered[job_id].wait()
            yield changes
        finally:
            waiters.discard(changes)
            if not waiters and self._waiters.get(job_id) is waiters:
                del self._waiters[job_id]
                self._registered.pop(job_id, None)
                with anyio.move_on_after(2, shield=True), contextlib.suppress(NotifyQError):
                    await self._store.unwatch(self.id, [job_id])

    def _notified(self, payload: str) -> None:
        try:
            job_id = UUID(payload)
        except ValueError:
            return  # not ours: someone else's NOTIFY on the channel
        for changes in self._waiters.get(job_id, ()):
            changes.changed()

    def _reconnected(self) -> None:
        # The rows may be gone too (a crash empties unlogged tables): register them again, and
        # then have every waiter look.
        self._refresh_now.set()
