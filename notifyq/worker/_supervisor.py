"""Keeps the worker inside an API process (``notifyq serve``) running.

A worker that stops on an error it cannot handle (a bug, or a listener that a pooler turned into
a no-op) must not leave behind an API whose pool is closed and that answers 503 for ever. The
:class:`Supervisor` starts a new worker after a pause that doubles from one second to a minute,
and says why in :attr:`Supervisor.problem` meanwhile (``GET /ready`` shows it). A worker that
fails before it is first ready is not retried: the process fails to start, with the worker's
reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
from anyio.abc import TaskStatus

from notifyq.errors import describe
from notifyq.worker._worker import Worker

__all__ = ["Supervisor"]

logger = logging.getLogger(__name__)

FIRST_PAUSE = 1.0
LONGEST_PAUSE = 60.0
#: A worker that ran this long before it failed is followed after the first pause again.
STEADY = 60.0


class Supervisor:
    """Runs the worker that ``make`` builds, and a new one each time one fails."""

    def __init__(self, make: Callable[[], Worker]) -> None:
        self._make = make
        self._stopping = False
        self._stopped: anyio.Event | None = None
        self.worker: Worker | None = None
        #: Why no worker runs now, or None while one does.
        self.problem: str | None = None
        self.restarts = 0

    def stop(self) -> None:
        """Stops the running worker gracefully, and starts no other."""
        self._stopping = True
        if self._stopped is not None:
            self._stopped.set()
        if self.worker is not None:
            self.worker.stop()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Runs workers until :meth:`stop`. The first worker reports started once it is ready;
        its error before then is raised, so that the process fails to start."""
        self._stopped = anyio.Event()
        ready = _Ready(self, task_status)
        pause = FIRST_PAUSE
        while not self._stopping:
            worker = self.worker = self._make()
            began = anyio.current_time()
            try:
                await worker.run(task_status=ready)
                return  # stopped
            except Exception as exc:
                if ready.first:
                    raise  # the first worker never got ready: the process cannot start
                if anyio.current_time() - began > STEADY:
                    pause = FIRST_PAUSE
                await self._pause_after(exc, pause)
                pause = min(pause * 2, LONGEST_PAUSE)
                self.restarts += 1

    async def _pause_after(self, exc: Exception, pause: float) -> None:
        reason = describe(exc)
        self.problem = f"the worker stopped ({reason}); starting a new one in {pause:g}s"
        logger.error(
            "the worker of this process stopped: %s; starting a new one in %.0fs",
            reason,
            pause,
            exc_info=exc,
        )
        assert self._stopped is not None
        with anyio.move_on_after(pause):
            await self._stopped.wait()
        if not self._stopping:
            self.problem = f"a new worker is starting after the last one stopped ({reason})"


class _Ready:
    """The task status each worker reports to: the first report reaches the caller of
    :meth:`Supervisor.run`; every one clears the supervisor's problem."""

    def __init__(self, supervisor: Supervisor, outer: TaskStatus[None]) -> None:
        self._supervisor = supervisor
        self._outer = outer
        self.first = True

    def started(self, value: None = None) -> None:
        self._supervisor.problem = None
        if self.first:
            self.first = False
            self._outer.started()
