"""A worker's upkeep besides rescue: retention of finished jobs (and their archive, when on),
a warning when the xmin horizon is held back, and queue depth (with the busiest fair keys) for
its own metrics port."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus

from notifyq.doctor import describe_holder
from notifyq.errors import NotifyQError
from notifyq.metrics import MAX_FAIR_KEYS, Metrics
from notifyq.models import JobStatus
from notifyq.settings import Settings
from notifyq.worker._leadership import Leadership
from notifyq.worker._store import WorkerStore

__all__ = ["ARCHIVE_AHEAD_DAYS", "DEPTH_INTERVAL", "Archived", "DepthReport", "HorizonWatch",
           "Retention", "archive", "archive_keep", "prune"]  # fmt: skip

logger = logging.getLogger(__name__)

#: Seconds between readings of queue depth for a worker's own metrics port.
DEPTH_INTERVAL = 10.0
#: Seconds before the same holder of the horizon is named again in the log.
HORIZON_REPEAT = 60.0
#: Days after today whose archive partitions exist before any job can finish in them, so that a
#: pass that runs across midnight (or a clock a little ahead) never meets a missing one.
ARCHIVE_AHEAD_DAYS = 2
#: Most partitions one statement creates or drops (notifyq.archive_prepare_v1, _drop_v1).
_PARTITIONS_PER_CALL = 8


@dataclass(frozen=True, slots=True)
class Archived:
    """What one archive pass did: partitions created, jobs moved, partitions dropped."""

    created: int = 0
    moved: int = 0
    dropped: int = 0


def archive_keep(settings: Settings) -> float | None:
    """Seconds after which an archived day is dropped: the longest keep of the three statuses,
    so that every row in it is past its own keep; None (kept for good) when one of them is kept
    for good."""
    keeps = (settings.keep_completed, settings.keep_failed, settings.keep_cancelled)
    if any(keep is None for keep in keeps):
        return None
    return max(keep for keep in keeps if keep is not None)


async def prune(store: WorkerStore, settings: Settings, *, batch: int = 1000) -> int:
    """Deletes finished jobs older than their keep setting, ``batch`` rows per statement;
    answers how many."""
    total = 0
    for status, keep in (
        (JobStatus.COMPLETED, settings.keep_completed),
        (JobStatus.FAILED, settings.keep_failed),
        (JobStatus.CANCELLED, settings.keep_cancelled),
    ):
        if keep is None:
            continue
        while True:
            deleted = await store.prune(status, keep, batch=batch)
            total += deleted
            if deleted < batch:
                break
            await anyio.lowlevel.checkpoint()
    return total


async def archive(store: WorkerStore, settings: Settings, *, batch: int = 1000) -> Archived:
    """With NOTIFYQ_ARCHIVE_AFTER set, one archive pass: creates the partitions the move needs
    (and those of the next days), moves the finished jobs older than it into the archive
    ``batch`` rows per statement, and drops the archived days past the longest keep
    (:func:`archive_keep`). Each statement is its own transaction. Off: does nothing."""
    after = settings.archive_after
    if after is None:
        return Archived()
    created = dropped = moved = 0
    while True:  # partitions before rows: a row without its partition fails the whole batch
        made = await store.archive_prepare(after, ahead=ARCHIVE_AHEAD_DAYS)
        created += made
        if made < _PARTITIONS_PER_CALL:
            break
    while True:
        done = await store.archive(after, batch=batch)
        moved += done
        if done < batch:
            break
        await anyio.lowlevel.checkpoint()
    keep = archive_keep(settings)
    while keep is not None:
        gone = await store.archive_drop(keep)
        dropped += gone
        if gone < _PARTITIONS_PER_CALL:
            break
    return Archived(created, moved, dropped)


class Retention:
    """Deletes finished jobs past their keep time, in small batches, every
    ``NOTIFYQ_PRUNE_INTERVAL``, so that the hot table stays small; with NOTIFYQ_ARCHIVE_AFTER,
    then moves the finished jobs older than it to the archive and drops its old days. Only the
    worker that leads the maintenance does it (without ``leadership``: this one); SKIP LOCKED
    keeps two out of each other's way while the lead moves."""

    def __init__(
        self, store: WorkerStore, settings: Settings, leadership: Leadership | None = None
    ) -> None:
        self._store = store
        self._settings = settings
        self._leadership = leadership

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Prunes at once, then every interval, until cancelled."""
        task_status.started()
        while True:
            if self._leadership is not None and not self._leadership.leading:
                await anyio.sleep(self._settings.heartbeat)  # ask again when the lead may move
                continue
            try:
                deleted = await prune(self._store, self._settings)
                if deleted:
                    logger.info("retention: deleted %d finished job(s)", deleted)
                await self._store.prune_ticks()
                # After the prune: a job past its keep is deleted, not moved and dropped later.
                # Last: an archive that fails (a role not granted it yet) skips nothing else.
                archived = await archive(self._store, self._settings)
                if archived.moved or archived.created or archived.dropped:
                    logger.info(
                        "archive: moved %d finished job(s); %d partition(s) created, %d dropped",
                        archived.moved,
                        archived.created,
                        archived.dropped,
                    )
            except NotifyQError as exc:
                logger.warning("retention failed: %s", exc)
            await anyio.sleep(self._settings.prune_interval)


class HorizonWatch:
    """Warns in the log when the oldest snapshot that holds the xmin horizon back is older
    than NOTIFYQ_HORIZON_WARN_AFTER: dead rows pile up behind it and every claim steps over
    them, and nothing else says so. Only the maintenance leader looks, every quarter of the
    setting (from 0.25 to 30 s); a holder is named again only after a minute."""

    def __init__(self, store: WorkerStore, settings: Settings, leadership: Leadership) -> None:
        self._store = store
        self._warn_after = settings.horizon_warn_after
        self._leadership = leadership
        self._interval = min(30.0, max(0.25, settings.horizon_warn_after / 4))
        self._warned: dict[tuple[str, str], float] = {}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Looks every interval while leading, until cancelled."""
        task_status.started()
        while True:
            if self._leadership.leading:
                try:
                    self._judge(await self._store.horizon_holders())
                except NotifyQError as exc:
                    logger.debug("could not read the horizon: %s", exc)
            await anyio.sleep(self._interval)

    def _judge(self, holders: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        for row in holders:
            if (row["age_seconds"] or 0.0) <= self._warn_after:
                continue
            key = (row["kind"], row["holder"])
            if now - self._warned.get(key, -HORIZON_REPEAT) < HORIZON_REPEAT:
                continue
            self._warned[key] = now
            logger.warning(
                "the xmin horizon is held back: %s; older than NOTIFYQ_HORIZON_WARN_AFTER=%gs, "
                "so dead rows pile up and claims slow down (see `notifyq doctor`)",
                describe_holder(row),
                self._warn_after,
            )


class DepthReport:
    """Reads the queues' depth and the busiest fair keys into a worker's own metrics
    (``--metrics-port``), which has no API to read them when scraped."""

    def __init__(self, store: WorkerStore, metrics: Metrics) -> None:
        self._store = store
        self._metrics = metrics

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Reads at once, then every DEPTH_INTERVAL, until cancelled."""
        task_status.started()
        while True:
            try:
                self._metrics.set_depth(await self._store.queue_stats())
                self._metrics.set_fair_keys(await self._store.fair_keys(limit=MAX_FAIR_KEYS))
            except NotifyQError as exc:
                logger.warning("reading queue depth failed: %s", exc)
            await anyio.sleep(DEPTH_INTERVAL)
