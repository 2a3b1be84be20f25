"""What every peer driver provides, and the measurements the scenarios take of a peer: a
drain of N no-op jobs and the pickup latency of stamp jobs, both timed from this host."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import psycopg

from notifyq_bench.harness import BenchError, Child, Children, child_env, poll_until
from notifyq_bench.stats import percentiles

#: What a peer's stamp handler prints, one line a job: the job's key and ``time.time()``.
STAMP_LINE = re.compile(r"^stamp (\S+) (\S+)$", re.MULTILINE)


def worker_main(
    prog: str,
    work: Callable[[str, int], Coroutine[Any, Any, None]],
    argv: Sequence[str] | None = None,
) -> int:
    """A peer driver's command line, ``worker CONNINFO --concurrency N``: runs ``work`` until
    it is interrupted."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("command", choices=["worker"])
    parser.add_argument("conninfo")
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args(argv)
    try:
        asyncio.run(work(args.conninfo, args.concurrency))
    except KeyboardInterrupt:
        return 130
    return 0


class Peer:
    """A peer job queue. Subclasses name it and implement the methods that raise here."""

    #: The package name (``pgqueuer``), also the suffix of its scratch database.
    name = ""
    #: The module whose ``main`` runs one worker process (``worker CONNINFO --concurrency N``).
    module = ""

    def label(self) -> str:
        """Name, version and driver, as the table shows them."""
        raise NotImplementedError

    async def install(self, url: str) -> None:
        """Installs the peer's schema in the (new, scratch) database ``url``."""
        raise NotImplementedError

    async def enqueue_noop(self, url: str, jobs: int) -> None:
        """Enqueues ``jobs`` no-op jobs with the peer's batch API, in one transaction."""
        raise NotImplementedError

    async def enqueue_stamps(self, url: str, keys: list[str], rate: float) -> dict[str, float]:
        """Enqueues one stamp job per key, one per transaction, ``rate`` per second, and
        answers the wall-clock time at which each enqueue call returned (its commit)."""
        raise NotImplementedError

    def reset(self, conn: psycopg.Connection[Any]) -> None:
        """Empties the peer's job tables."""
        raise NotImplementedError

    def pending(self, conn: psycopg.Connection[Any]) -> int:
        """Jobs queued or running."""
        raise NotImplementedError

    # -- shared by every peer --------------------------------------------------------------

    def start_workers(
        self, children: Children, url: str, count: int, concurrency: int
    ) -> list[Child]:
        """``count`` worker processes at ``concurrency``, returned once each said it is ready
        and one warm-up job went through."""
        workers = [
            children.start(
                f"{self.name}-worker{index}-c{concurrency}",
                [
                    sys.executable,
                    "-m",
                    self.module,
                    "worker",
                    url,
                    "--concurrency",
                    str(concurrency),
                ],
                child_env(),
            )
            for index in range(count)
        ]
        for worker in workers:
            worker.wait_for(r"\bready\b")
        self.drain(url, 1, workers)
        return workers

    def drain(self, url: str, jobs: int, workers: list[Child]) -> dict[str, Any]:
        """Enqueues ``jobs`` no-op jobs in one call and answers jobs/s from the moment that
        call returned (its commit) to the moment the bench saw no job left, polling every
        10 ms: the peers' tables do not all keep claim and completion times."""
        with psycopg.connect(url, autocommit=True) as conn:
            self.reset(conn)
            asyncio.run(self.enqueue_noop(url, jobs))
            started = time.perf_counter()
            deadline = started + max(120.0, jobs / 20)
            while self.pending(conn):
                if time.perf_counter() > deadline:
                    raise BenchError(f"{self.label()}: {jobs} jobs were not done in time")
                for worker in workers:
                    worker.check_alive()
                time.sleep(0.01)
            seconds = time.perf_counter() - started
        return {"jobs": jobs, "seconds": seconds, "jobs_per_s": jobs / seconds}

    def pickup(self, url: str, count: int, rate: float, workers: list[Child]) -> dict[str, Any]:
        """Enqueues ``count`` stamp jobs at ``rate`` per second and answers the commit to
        handler start latencies in ms (the handlers print their stamps in their logs)."""
        with psycopg.connect(url, autocommit=True) as conn:
            self.reset(conn)
        time.sleep(0.2)  # let the workers settle, as notifyq's are given
        keys = [uuid.uuid4().hex for _ in range(count)]
        commits = asyncio.run(self.enqueue_stamps(url, keys, rate))
        stamps: dict[str, float] = {}

        def all_stamped() -> bool:
            for worker in workers:
                worker.check_alive()
                text = worker.log_path.read_text(errors="replace")
                stamps.update((key, float(t)) for key, t in STAMP_LINE.findall(text))
            return all(key in stamps for key in keys)

        poll_until(all_stamped, 60.0, f"{count} {self.label()} stamp jobs")
        latencies = [(stamps[key] - commits[key]) * 1000 for key in keys]
        p50, p95, p99 = percentiles(latencies)
        return {"jobs": count, "rate": rate, "p50_ms": p50, "p95_ms": p95, "p99_ms": p99}


async def paced(keys: list[str], rate: float, enqueue: Any) -> dict[str, float]:
    """Calls ``await enqueue(key)`` for each key on a fixed schedule of ``rate`` per second and
    answers when each call returned."""
    commits: dict[str, float] = {}
    start = time.perf_counter() + 0.05
    for index, key in enumerate(keys):
        delay = start + index / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await enqueue(key)
        commits[key] = time.time()
    return commits
