"""PgQueuer as a peer: its schema installed by its own ``Queries.install``, jobs enqueued with
``Queries.enqueue`` (lists: one statement for a batch), and a worker process of our own that
runs ``PgQueuer.run`` with a cap of in-flight jobs equal to the concurrency (see :func:`work`).
It talks to PostgreSQL through asyncpg when that is installed (PgQueuer's fastest driver, the
one of its own benchmarks), else through psycopg.

Run one worker as ``python -m notifyq_bench.peers.pgqueuer_peer worker CONNINFO --concurrency
N``; it prints ``ready`` once it runs.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from notifyq_bench.peers.base import Peer, paced, worker_main
from notifyq_bench.tasks import NOOP, STAMP


def _driver_name() -> str:
    return "asyncpg" if importlib.util.find_spec("asyncpg") is not None else "psycopg"


async def _connect(url: str) -> tuple[Any, Callable[[], Awaitable[None]]]:
    """A PgQueuer driver on a new connection to ``url``, and what closes it."""
    if _driver_name() == "asyncpg":
        import asyncpg
        from pgqueuer import AsyncpgDriver

        params = conninfo_to_dict(url)
        conn = await asyncpg.connect(
            host=params.get("host"),
            port=int(params.get("port") or 5432),
            user=params.get("user"),
            password=params.get("password"),
            database=params.get("dbname"),
        )
        return AsyncpgDriver(conn), conn.close
    from pgqueuer import PsycopgDriver

    aconn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    return PsycopgDriver(aconn), aconn.close


class PgQueuerPeer(Peer):
    name = "pgqueuer"
    module = "notifyq_bench.peers.pgqueuer_peer"

    def label(self) -> str:
        return f"PgQueuer {importlib.metadata.version('pgqueuer')} ({_driver_name()})"

    async def install(self, url: str) -> None:
        from pgqueuer import Queries

        driver, close = await _connect(url)
        try:
            await Queries(driver).install()
        finally:
            await close()

    async def enqueue_noop(self, url: str, jobs: int) -> None:
        from pgqueuer import Queries

        driver, close = await _connect(url)
        try:
            await Queries(driver).enqueue([NOOP] * jobs, [None] * jobs, [0] * jobs)
        finally:
            await close()

    async def enqueue_stamps(self, url: str, keys: list[str], rate: float) -> dict[str, float]:
        from pgqueuer import Queries

        driver, close = await _connect(url)
        queries = Queries(driver)

        async def one(key: str) -> None:
            await queries.enqueue(STAMP, key.encode())

        try:
            return await paced(keys, rate, one)
        finally:
            await close()

    def reset(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute("TRUNCATE pgqueuer, pgqueuer_log")

    def pending(self, conn: psycopg.Connection[Any]) -> int:
        # PgQueuer deletes a job from its queue table once it is done (its log keeps a row).
        row = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()
        return int(row[0]) if row else 0


async def work(url: str, concurrency: int) -> None:
    """One PgQueuer worker with the bench's two handlers, until it is terminated."""
    from pgqueuer import PgQueuer

    driver, close = await _connect(url)
    pgq = PgQueuer(driver)
    # PgQueuer wants its cap of in-flight jobs to be at least twice its batch: N slots are a
    # cap of N with batches of N/2; one slot is a per-entrypoint limit of 1 with batches of 1.
    limit = 1 if concurrency == 1 else 0
    batch = max(1, concurrency // 2)
    cap = concurrency if concurrency > 1 else None

    @pgq.entrypoint(NOOP, concurrency_limit=limit)
    async def noop(job: Any) -> None:
        """Does nothing."""

    @pgq.entrypoint(STAMP, concurrency_limit=limit)
    async def stamp(job: Any) -> None:
        started = time.time()
        print(f"stamp {job.payload.decode()} {started!r}", flush=True)

    asyncio.get_running_loop().call_later(0.3, lambda: print("pgqueuer worker ready", flush=True))
    try:
        await pgq.run(batch_size=batch, max_concurrent_tasks=cap)
    finally:
        await close()


def main(argv: Sequence[str] | None = None) -> int:
    return worker_main("python -m notifyq_bench.peers.pgqueuer_peer", work, argv)


if __name__ == "__main__":
    sys.exit(main())
