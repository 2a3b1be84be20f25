"""The statements of a worker's upkeep, besides its jobs: rescue of expired leases, its idle
mark, the maintenance lead, retention, the archive and periodic ticks. Each calls one versioned
function of the schema; part of what :class:`notifyq.worker.WorkerStore` describes."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.rows import dict_row, kwargs_row

from notifyq.models import JobStatus, Rescued
from notifyq.store._runner import Runner

_RESCUED = kwargs_row(Rescued.of)


class Upkeep(Runner):
    """The worker's upkeep statements of :class:`~notifyq.store.Store`."""

    async def rescue_expired(self, limit: int = 100) -> list[Rescued]:
        """Requeues (or fails, or cancels) up to ``limit`` jobs whose lease ran out or that
        have none."""
        return await self._all("rescue_expired", {"limit": limit}, _RESCUED, what="rescuing jobs")

    async def raise_floors(self) -> int:
        """One pass of the claim floors (sql/021): applies the raises proposed and sealed by the
        last pass whose transactions have ended, proposes the next ones, then seals them in a
        transaction of its own. Answers the floors raised."""
        raised = await self._value("raise_floors", None, what="raising the claim floors")
        await self._value("seal_floors", None, what="sealing the claim floors")
        return int(raised or 0)

    async def mend_floors(self) -> int:
        """The net under the claim floors (sql/021): every queue's first claimable job, its
        floor lowered to it (or made) where it is above. Answers the floors mended."""
        return int(await self._value("mend_floors", None, what="mending the claim floors") or 0)

    async def tend_lanes(self) -> int:
        """The leader's pass over the fair lanes (sql/024): opens idle lanes that a job reached,
        removes those idle for a minute. Answers the lanes opened."""
        return int(await self._value("tend_lanes", None, what="tending the fair lanes") or 0)

    async def mend_lanes(self) -> int:
        """The net under the fair lanes (sql/024): opens the lane of every queued key that has
        none open. Answers the lanes opened."""
        return int(await self._value("mend_lanes", None, what="mending the fair lanes") or 0)

    async def mark_waiting(self, worker_id: str, queues: Sequence[str] | None, ttl: float) -> bool:
        """Registers a worker as waiting; True when the registration waited for in-flight
        inserts (so a claim right after it sees them all)."""
        params = {
            "worker_id": worker_id,
            "queues": None if queues is None else list(queues),
            "ttl": ttl,
        }
        return bool(await self._value("mark_waiting", params, what="marking the worker idle"))

    async def unmark_waiting(self, worker_id: str) -> None:
        """Removes a worker's idle mark: inserts stop waking it."""
        await self._execute(
            "unmark_waiting", {"worker_id": worker_id}, what="marking the worker busy"
        )

    async def refresh_waiting(self, worker_id: str, ttl: float) -> None:
        """Keeps a worker's idle mark from expiring."""
        params = {"worker_id": worker_id, "ttl": ttl}
        await self._execute("refresh_waiting", params, what="refreshing the idle mark")

    async def lead(self, role: str, holder: str, ttl: float) -> bool:
        """Takes or keeps the lead of ``role`` for ``ttl`` seconds; answers whether ``holder``
        leads now (see notifyq.lead_v1)."""
        params = {"role": role, "holder": holder, "ttl": ttl}
        return bool(await self._value("lead", params, what="taking the lead"))

    async def resign(self, role: str, holder: str) -> None:
        """Gives up the lead of ``role``, if ``holder`` has it."""
        params = {"role": role, "holder": holder}
        await self._execute("resign", params, what="giving up the lead")

    async def prune_waiting(self) -> None:
        """Deletes the idle marks of workers that stopped refreshing them, and the watches of
        processes that stopped refreshing theirs."""
        await self._execute("prune_waiting", None, what="pruning idle marks")

    async def enqueue_tick(self, task: str, tick: datetime, payload_json: str) -> UUID | None:
        """Enqueues the job of one tick of a periodic task; None when another worker did."""
        job_id: UUID | None = await self._value(
            "enqueue_tick",
            {"task": task, "tick": tick, "payload": payload_json},
            what="enqueueing a periodic job",
        )
        return job_id

    async def horizon_holders(self) -> list[dict[str, Any]]:
        """The snapshots that hold the xmin horizon back, oldest first (at most 5): ``kind``
        (session, replication slot, prepared transaction), ``holder`` (a pid, a slot's name,
        a gid), ``age_seconds`` (None for a slot), ``xid_age`` and ``detail``."""
        return await self._all("horizon_holders", None, dict_row, what="reading the horizon")

    async def database_now(self) -> datetime:
        """The database's clock."""
        now: datetime = await self._value("database_now", None, what="reading the clock")
        return now

    async def prune(self, status: JobStatus, keep: float, *, batch: int = 1000) -> int:
        """Deletes up to ``batch`` jobs in ``status`` finished more than ``keep`` seconds ago;
        answers how many (call again while it answers ``batch``)."""
        params = {"status": status.value, "keep": keep, "limit": batch}
        deleted: int = await self._value("prune_jobs", params, what="pruning jobs")
        return deleted

    async def archive_prepare(self, after: float, *, ahead: int) -> int:
        """Creates up to 8 of the archive's missing partitions that a move of jobs finished
        more than ``after`` seconds ago needs, and those of today and ``ahead`` days after it;
        answers how many (call again while it answers 8)."""
        params = {"after": after, "ahead": ahead}
        made: int = await self._value("archive_prepare", params, what="creating archive partitions")
        return made

    async def archive(self, after: float, *, batch: int = 1000) -> int:
        """Moves up to ``batch`` jobs finished more than ``after`` seconds ago into the
        archive; answers how many (call again while it answers ``batch``)."""
        params = {"after": after, "limit": batch}
        moved: int = await self._value("archive_jobs", params, what="archiving jobs")
        return moved

    async def archive_drop(self, keep: float) -> int:
        """Drops up to 8 of the archive's days that ended more than ``keep`` seconds ago;
        answers how many (call again while it answers 8)."""
        dropped: int = await self._value(
            "archive_drop", {"keep": keep}, what="dropping archive partitions"
        )
        return dropped

    async def prune_ticks(self) -> None:
        """Deletes periodic ticks older than a week."""
        await self._execute("prune_ticks", None, what="pruning periodic ticks")
