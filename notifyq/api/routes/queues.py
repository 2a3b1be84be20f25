"""The queue routes: counts by status, and the pause switch."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError

from notifyq.api.deps import StoreDep
from notifyq.api.schemas import QueueOut
from notifyq.errors import InvalidJob
from notifyq.models import check_name
from notifyq.store import Store

router = APIRouter()


@router.get(
    "/queues",
    response_model=list[QueueOut],
    summary="Queues with their counts by status and last minute's throughput",
)
async def list_queues(store: StoreDep) -> list[QueueOut]:
    return [QueueOut(**row) for row in await store.queue_stats()]


@router.post(
    "/queues/{queue}/pause",
    response_model=QueueOut,
    summary="Stop workers from claiming this queue's jobs",
)
async def pause_queue(queue: str, store: StoreDep) -> QueueOut:
    return await _set_paused(store, queue, True)


@router.post(
    "/queues/{queue}/resume",
    response_model=QueueOut,
    summary="Let workers claim this queue's jobs again",
)
async def resume_queue(queue: str, store: StoreDep) -> QueueOut:
    return await _set_paused(store, queue, False)


async def _set_paused(store: Store, queue: str, paused: bool) -> QueueOut:
    try:
        check_name("queue", queue)
    except InvalidJob as exc:
        raise RequestValidationError(
            [{"loc": ("path", "queue"), "msg": str(exc), "type": "value_error"}]
        ) from None
    await store.configure_queue(queue, paused=paused)
    rows = {row["queue"]: row for row in await store.queue_stats()}
    return QueueOut(**rows[queue])
