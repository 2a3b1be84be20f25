"""What a worker needs from the database: the :class:`WorkerStore` protocol.

:class:`notifyq.store.Store` is the real one. The worker's services ask only for this, so that a
test can give a service a fake store (to make one write fail, say) without a database."""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from notifyq.models import (
    ClaimedJob,
    ClaimRequest,
    Failure,
    Held,
    JobStatus,
    Progress,
    Rescued,
    Snoozed,
    Success,
    Suspended,
    TaskRegistration,
)

__all__ = ["WorkerStore"]


class WorkerStore(Protocol):
    """The statements a worker runs; each raises :class:`~notifyq.errors.NotifyQError` (never a
    driver error): :class:`~notifyq.errors.DatabaseUnavailable` while the database is away, a
    :class:`~notifyq.errors.DatabaseError` when it refuses the statement."""

    async def register_task(self, task: TaskRegistration) -> None: ...

    async def limits_exist(self, tasks: Sequence[str]) -> bool: ...

    async def claim(
        self,
        *,
        worker_id: str,
        tasks: Sequence[str],
        queues: Sequence[str] | None,
        limit: int,
        lease: float,
        probe: bool = False,
    ) -> list[ClaimedJob]: ...

    async def look_and_claim(
        self,
        *,
        worker_id: str,
        tasks: Sequence[str],
        queues: Sequence[str] | None,
        limit: int,
        lease: float,
    ) -> tuple[float | None, list[ClaimedJob]]: ...

    async def claim_limited(
        self,
        *,
        worker_id: str,
        tasks: Sequence[str],
        queues: Sequence[str] | None,
        limit: int,
        lease: float,
    ) -> list[ClaimedJob]: ...

    async def take_breaker_probes(self, tasks: Sequence[str]) -> list[str]: ...

    async def mark_waiting(
        self, worker_id: str, queues: Sequence[str] | None, ttl: float
    ) -> bool: ...

    async def unmark_waiting(self, worker_id: str) -> None: ...

    async def refresh_waiting(self, worker_id: str, ttl: float) -> None: ...

    async def lead(self, role: str, holder: str, ttl: float) -> bool: ...

    async def resign(self, role: str, holder: str) -> None: ...

    async def prune_waiting(self) -> None: ...

    async def complete(self, worker_id: str, done: Sequence[Success]) -> set[UUID]: ...

    async def complete_and_claim(
        self, worker_id: str, done: Sequence[Success], claim: ClaimRequest
    ) -> tuple[set[UUID], list[ClaimedJob]]: ...

    async def fail(self, worker_id: str, failed: Sequence[Failure]) -> dict[UUID, JobStatus]: ...

    async def release(self, worker_id: str, held: Iterable[Held]) -> set[UUID]: ...

    async def cancel_running(self, worker_id: str, held: Iterable[Held]) -> set[UUID]: ...

    async def snooze(self, worker_id: str, snoozed: Sequence[Snoozed]) -> set[UUID]: ...

    async def suspend(
        self, worker_id: str, suspended: Sequence[Suspended]
    ) -> dict[UUID, JobStatus]: ...

    async def durable_state(self, job_id: UUID) -> list[tuple[str, str, Any]]: ...

    async def record_step(
        self, worker_id: str, job_id: UUID, claim: int, name: str, result_json: str
    ) -> str: ...

    async def report_progress(self, worker_id: str, reports: Sequence[Progress]) -> set[UUID]: ...

    async def beat(
        self, worker_id: str, held: Iterable[Held], running: Container[UUID], lease: float
    ) -> dict[UUID, bool]: ...

    async def rescue_expired(self, limit: int = 100) -> list[Rescued]: ...

    async def raise_floors(self) -> int: ...

    async def mend_floors(self) -> int: ...

    async def tend_lanes(self) -> int: ...

    async def mend_lanes(self) -> int: ...

    async def prune(self, status: JobStatus, keep: float, *, batch: int = 1000) -> int: ...

    async def archive_prepare(self, after: float, *, ahead: int) -> int: ...

    async def archive(self, after: float, *, batch: int = 1000) -> int: ...

    async def archive_drop(self, keep: float) -> int: ...

    async def prune_ticks(self) -> None: ...

    async def queue_stats(
        self,
        *,
        exact_below: int = 200_000,
        sample_percent: float = 2.0,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]: ...

    async def fair_keys(self, limit: int = 20) -> list[dict[str, Any]]: ...

    async def enqueue_tick(self, task: str, tick: datetime, payload_json: str) -> UUID | None: ...

    async def horizon_holders(self) -> list[dict[str, Any]]: ...

    async def database_now(self) -> datetime: ...
