"""The commands about queues and tasks: ``queue``, ``stats``, ``doctor``, ``top``, ``tasks``
and ``fair``."""

from __future__ import annotations

import sys
import time
from typing import Any

import anyio

from notifyq.cli._args import DoctorArgs, FairArgs, QueueArgs, StatsArgs, TasksArgs, TopArgs
from notifyq.cli._output import fair_table, queue_table, tasks_table, use_color
from notifyq.client import Queue
from notifyq.doctor import Health, examine, render
from notifyq.errors import DatabaseUnavailable
from notifyq.models import MAX_FAIR_KEY_LENGTH, check_key, check_name
from notifyq.settings import Settings


def _queue(settings: Settings) -> Queue:
    return Queue(settings=settings, pool_size=1)


def queue(args: QueueArgs, settings: Settings) -> int:
    """Pauses, resumes, rate-limits or bounds a queue or switches its notifications, then
    prints its row of the queues table."""
    check_name("queue", args.name)

    async def run() -> list[dict[str, Any]]:
        async with _queue(settings) as q:
            await q.store.configure_queue(
                args.name,
                paused=args.paused,
                rate_limit=args.rate_limit,
                notify=args.notifying,
                max_depth=args.max_depth,
            )
            return [row for row in await q.store.queue_stats() if row["queue"] == args.name]

    for line in queue_table(anyio.run(run), color=use_color()):
        print(line)
    return 0


def stats(args: StatsArgs, settings: Settings) -> int:
    """Prints the queues table once."""

    async def run() -> list[dict[str, Any]]:
        async with _queue(settings) as q:
            return await q.store.queue_stats()

    for line in queue_table(anyio.run(run), color=use_color()):
        print(line)
    return 0


def doctor(args: DoctorArgs, settings: Settings) -> int:
    """Prints each check of the database's health and what to do; 1 when one failed."""

    async def run() -> Health:
        async with _queue(settings) as q:
            return await examine(q.store, horizon_warn_after=settings.horizon_warn_after)

    health = anyio.run(run)
    print(health.as_json() if args.json else "\n".join(render(health)))
    return 1 if health.failed else 0


def top(args: TopArgs, settings: Settings) -> int:
    """Prints the queues table every ``--interval`` seconds until Ctrl-C; an outage shows as
    a line, and the table comes back with the database."""
    color = use_color()
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""

    async def run() -> None:
        async with _queue(settings) as q:
            while True:
                try:
                    lines = queue_table(await q.store.queue_stats(), color=color)
                except DatabaseUnavailable as exc:
                    lines = [f"database unavailable ({exc}); retrying"]
                stamp = time.strftime("%H:%M:%S")
                print(f"{clear}notifyq top  {stamp}  (Ctrl-C quits)\n", flush=False)
                print("\n".join(lines), flush=True)
                await anyio.sleep(args.interval)

    try:
        anyio.run(run)
    except KeyboardInterrupt:
        pass
    return 0


def tasks(args: TasksArgs, settings: Settings) -> int:
    """Lists the tasks that workers registered, with their options and breaker state."""

    async def run() -> list[dict[str, Any]]:
        async with _queue(settings) as q:
            return await q.store.list_tasks()

    for line in tasks_table(anyio.run(run)):
        print(line)
    return 0


def fair(args: FairArgs, settings: Settings) -> int:
    """Sets or removes a fair key's weight, then lists the weights and the busiest keys."""
    if args.key is not None:
        check_key("fair_key", args.key, MAX_FAIR_KEY_LENGTH)

    async def run() -> list[str]:
        async with _queue(settings) as q:
            if args.action == "set":
                assert args.key is not None and args.weight is not None
                await q.store.set_fair_weight(args.key, args.weight)
            elif args.action == "unset":
                assert args.key is not None
                await q.store.unset_fair_weight(args.key)
            weights = await q.store.fair_weights()
            keys = await q.store.fair_keys(min(args.limit, 100))
            return fair_table(weights, keys)

    for line in anyio.run(run):
        print(line)
    return 0
