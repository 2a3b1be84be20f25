"""The floor raiser: moves each queue's claim floor up behind the jobs claimed, so that a claim
steps over what those left in the claim index (sql/021: why, and why it is safe).

Only the worker that leads the maintenance raises; a raise takes two of its passes (one
proposes, the next applies what every transaction then running has let through), so a floor
lags the head of its queue by about two intervals: the dead entries of the jobs claimed in them
are all a claim steps over, however long a transaction elsewhere pins them.

The same passes tend the lanes of the fair claims (sql/024): idle lanes that a job reached are
opened, lanes idle for a minute removed, and with the floors' net every minute, the lanes of
queued keys that have none are made. Each lane's own floor is raised in the same two passes
(sql/027), since the slowest key holds its queue's floor."""

from __future__ import annotations

import logging

import anyio
from anyio.abc import TaskStatus

from notifyq.errors import NotifyQError
from notifyq.worker._leadership import Leadership
from notifyq.worker._store import WorkerStore

__all__ = ["FLOOR_INTERVAL", "MEND_EVERY", "FloorRaiser"]

logger = logging.getLogger(__name__)

#: Seconds between passes: at 1,000 jobs a second, a claim steps over about 1,000 dead entries
#: (half a millisecond) behind a pinned horizon.
FLOOR_INTERVAL = 0.5
#: Passes between two casts of the net under the floors (notifyq.mend_floors_v2): a minute.
MEND_EVERY = 120


class FloorRaiser:
    """Raises the claim floors while this worker leads the maintenance."""

    def __init__(
        self, store: WorkerStore, leadership: Leadership, *, interval: float = FLOOR_INTERVAL
    ) -> None:
        self._store = store
        self._leadership = leadership
        self._interval = interval

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """A pass every interval while leading, and the net every MEND_EVERY passes (the first
        as soon as this worker leads), until cancelled."""
        task_status.started()
        passes = 0
        while True:
            await anyio.sleep(self._interval)
            if not self._leadership.leading:
                passes = 0
                continue
            try:
                if passes % MEND_EVERY == 0:
                    await self._mend()
                await self._store.raise_floors()
                await self._store.tend_lanes()
            except NotifyQError as exc:
                logger.warning("raising the claim floors failed: %s", exc)
            passes += 1

    async def _mend(self) -> None:
        mended = await self._store.mend_floors()
        if mended:
            logger.warning(
                "%d claim floor(s) were above a claimable job, and were lowered "
                "(was a trigger of notifyq.jobs switched off?)",
                mended,
            )
        opened = await self._store.mend_lanes()
        if opened:
            logger.info(
                "%d fair lane(s) of queued keys were missing or idle, and were opened", opened
            )
