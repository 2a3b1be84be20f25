"""The queue routes: counts by status, what holds each queue back, and the pause switch.

The two lists are pages by queue name: ``?limit=`` (QUEUE_PAGE by default, MAX_QUEUE_PAGE at
most) and ``?after=<the last name of the page before>``; a full page carries a ``Link``
header (``rel="next"``) to the next one."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request, Response
from fastapi.exceptions import RequestValidationError

from notifyq.api.deps import SettingsDep, StoreDep
from notifyq.api.schemas import QueueOut, QueueStateOut
from notifyq.errors import InvalidJob
from notifyq.models import check_name
from notifyq.store import Store

router = APIRouter()

#: Queues of a page by default: the queues that keep a label of their own in the metrics.
QUEUE_PAGE = 500
#: Most queues of a page.
MAX_QUEUE_PAGE = 1000

Limit = Annotated[int, Query(ge=1, le=MAX_QUEUE_PAGE, description="Most queues answered (a page).")]
After = Annotated[
    str | None,
    Query(
        max_length=200, description="The last queue of the page before: this page starts after it."
    ),
]


def _next_page(request: Request, response: Response, names: list[str], limit: int) -> None:
    """A full page names the next one in a Link header."""
    if len(names) == limit:
        query = urlencode({"after": names[-1], "limit": limit})
        response.headers["Link"] = f'<{request.url.path}?{query}>; rel="next"'


@router.get(
    "/queues",
    response_model=list[QueueOut],
    summary="Queues with their counts by status and last minute's throughput, a page of them",
)
async def list_queues(
    store: StoreDep, request: Request, response: Response, limit: Limit = QUEUE_PAGE,
    after: After = None,
) -> list[QueueOut]:  # fmt: skip
    rows = await store.queue_stats(after=after, limit=limit)
    _next_page(request, response, [row["queue"] for row in rows], limit)
    return [QueueOut(**row) for row in rows]


@router.get(
    "/queues/states",
    response_model=list[QueueStateOut],
    summary="Whether each queue's due jobs move, and if not, why, a page of them",
)
async def queue_states(
    store: StoreDep, settings: SettingsDep, request: Request, response: Response,
    limit: Limit = QUEUE_PAGE, after: After = None,
) -> list[QueueStateOut]:  # fmt: skip
    stats = {row["queue"]: row for row in await store.queue_stats(after=after, limit=limit)}
    _next_page(request, response, list(stats), limit)
    conditions = {row["queue"]: row for row in await store.queue_conditions(list(stats))}
    return [
        _state(name, stats[name], conditions.get(name), settings.poll_interval) for name in stats
    ]


def _state(
    queue: str, stats: dict[str, Any], found: dict[str, Any] | None, poll_interval: float
) -> QueueStateOut:
    """The states of a queue, worst first: the first names it."""
    due, processing = stats["due"], stats["processing"]
    listening = found["listening"] if found else 0
    unregistered = list(found["unregistered_tasks"]) if found else []
    broken = list(found["breaker_open_tasks"]) if found else []
    states: list[tuple[str, str]] = []
    if stats["paused"]:
        states.append(("paused", "paused: no job is claimed until it is resumed"))
    if unregistered:
        n = found["unregistered"] if found else 0
        states.append(
            (
                "unregistered",
                f"{n} due job(s) of task(s) no worker registered: {', '.join(unregistered)}",
            )
        )
    if broken:
        states.append(("breaker_open", f"circuit breaker open for {', '.join(broken)}"))
    if due and stats["rate_limit"] is not None:
        states.append(("rate_limited", f"rate-limited to {stats['rate_limit']:g} jobs/s"))
    if due and not stats["paused"]:
        if listening == 0 and processing == 0:
            states.append(("no_workers", "no worker is listening on it or running its jobs"))
        elif listening == 0:
            states.append(("busy", f"every worker serving it is busy ({processing} running)"))
    if not stats["notify"]:
        states.append(
            (
                "polling",
                "notifications off: drained by each worker's poll "
                f"(every {poll_interval:g} s here)",
            )
        )
    if not states:
        states.append(("ok", "jobs move") if due or processing else ("idle", "nothing due"))
    return QueueStateOut(
        queue=queue,
        state=states[0][0],
        reasons=[reason for _, reason in states],
        due=due,
        processing=processing,
        listening=listening,
        unregistered_tasks=unregistered,
    )


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
