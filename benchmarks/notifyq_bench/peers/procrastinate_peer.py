"""procrastinate as a peer: its schema applied by its own schema manager, jobs deferred with
``Task.batch_defer_async`` (one statement for a batch) and ``Task.defer_async``, and a worker
process of our own that runs ``App.run_worker_async`` at the given concurrency, with its
defaults otherwise (LISTEN/NOTIFY on, psycopg 3 pool).

Run one worker as ``python -m notifyq_bench.peers.procrastinate_peer worker CONNINFO
--concurrency N``; it prints ``ready`` once it runs.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import sys
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from notifyq_bench.peers.base import Peer, paced, worker_main
from notifyq_bench.tasks import NOOP, STAMP


def make_app(url: str) -> tuple[Any, dict[str, Any]]:
    """A procrastinate App on ``url`` and the bench's two tasks of it, by name."""
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=url))

    @app.task(name=NOOP)
    async def noop() -> None:
        """Does nothing."""

    @app.task(name=STAMP)
    async def stamp(key: str) -> None:
        started = time.time()
        print(f"stamp {key} {started!r}", flush=True)

    return app, {NOOP: noop, STAMP: stamp}


class ProcrastinatePeer(Peer):
    name = "procrastinate"
    module = "notifyq_bench.peers.procrastinate_peer"

    def label(self) -> str:
        return f"procrastinate {importlib.metadata.version('procrastinate')}"

    async def install(self, url: str) -> None:
        app, _ = make_app(url)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def enqueue_noop(self, url: str, jobs: int) -> None:
        app, tasks = make_app(url)
        async with app.open_async():
            await tasks[NOOP].batch_defer_async(*({} for _ in range(jobs)))

    async def enqueue_stamps(self, url: str, keys: list[str], rate: float) -> dict[str, float]:
        app, tasks = make_app(url)
        stamp = tasks[STAMP]

        async def one(key: str) -> None:
            await stamp.defer_async(key=key)

        async with app.open_async():
            return await paced(keys, rate, one)

    def reset(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute("TRUNCATE procrastinate_jobs CASCADE")

    def pending(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
        ).fetchone()
        return int(row[0]) if row else 0


async def work(url: str, concurrency: int) -> None:
    """One procrastinate worker with the bench's two tasks, until it is terminated."""
    app, _ = make_app(url)
    async with app.open_async():
        asyncio.get_running_loop().call_later(
            0.3, lambda: print("procrastinate worker ready", flush=True)
        )
        await app.run_worker_async(concurrency=concurrency, wait=True)


def main(argv: Sequence[str] | None = None) -> int:
    return worker_main("python -m notifyq_bench.peers.procrastinate_peer", work, argv)


if __name__ == "__main__":
    sys.exit(main())
