"""The lead of a database's maintenance: one worker at a time rescues lost jobs and prunes old
ones, so that fifty workers do not run fifty rescue and retention passes.

The lead is a lease in ``notifyq.leaders`` (see notifyq.lead_v1): the leader renews it every
heartbeat, for one job lease; a worker that stops gives it up, so another takes it at its next
renewal; one that dies or hangs loses it when it expires, within a lease. Two leaders for a moment
are harmless: both passes skip what another holds. The others only ask again, one statement a
heartbeat.
"""

from __future__ import annotations

import logging

import anyio
from anyio.abc import TaskStatus

from notifyq.errors import NotifyQError
from notifyq.worker._store import WorkerStore

__all__ = ["MAINTENANCE", "Leadership"]

logger = logging.getLogger(__name__)

#: The role whose leader runs rescue and retention.
MAINTENANCE = "maintenance"


class Leadership:
    """Whether this worker leads its database's maintenance (:attr:`leading`)."""

    def __init__(self, store: WorkerStore, *, worker_id: str, interval: float, ttl: float) -> None:
        self._store = store
        self._worker_id = worker_id
        self._interval = interval
        self._ttl = ttl
        #: Whether this worker led at its latest renewal.
        self.leading = False

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Asks at once (so the maintenance knows before its first pass), then every interval;
        gives the lead up when cancelled."""
        try:
            await self.renew()
            task_status.started()
            while True:
                await anyio.sleep(self._interval)
                await self.renew()
        finally:
            if self.leading:
                self.leading = False
                with anyio.move_on_after(2, shield=True):
                    try:
                        await self._store.resign(MAINTENANCE, self._worker_id)
                    except NotifyQError as exc:
                        logger.debug("could not give up the lead (%s); it expires", exc)

    async def renew(self) -> None:
        """Takes or keeps the lead. While the database cannot say, this worker does not lead:
        the lead it had expires, and whoever asks first then takes it."""
        try:
            leading = await self._store.lead(MAINTENANCE, self._worker_id, self._ttl)
        except NotifyQError as exc:
            logger.warning("could not renew the lead of maintenance: %s", exc)
            leading = False
        if leading != self.leading:
            logger.info(
                "worker %s %s the maintenance (rescue, retention)",
                self._worker_id,
                "leads" if leading else "no longer leads",
            )
        self.leading = leading
