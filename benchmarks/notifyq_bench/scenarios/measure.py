"""Measurements that several scenarios share: a drain of N jobs timed from the table, the
pickup latency of stamp jobs, resident memory sampling."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql

from notifyq_bench.harness import BenchError, Child, poll_until, postgres_cpu
from notifyq_bench.scenarios.context import Context
from notifyq_bench.stats import percentiles
from notifyq_bench.tasks import NOOP, STAMP


def settle(conn: psycopg.Connection[Any]) -> None:
    """A checkpoint before a measured run, so that one does not land in the middle of it."""
    try:
        conn.execute("CHECKPOINT")
    except psycopg.Error:
        pass  # not a superuser: the run is a little noisier, that is all


def truncate(conn: psycopg.Connection[Any], table: sql.Composable) -> None:
    conn.execute(sql.SQL("TRUNCATE {}").format(table))


def unfinished(conn: psycopg.Connection[Any], table: sql.Composable) -> bool:
    row = conn.execute(
        sql.SQL(
            "SELECT EXISTS (SELECT 1 FROM {t} WHERE status = 'queued') "
            "OR EXISTS (SELECT 1 FROM {t} WHERE status = 'processing')"
        ).format(t=table)
    ).fetchone()
    return bool(row and row[0])


def drain(
    ctx: Context,
    table: sql.Composable,
    jobs: int,
    processes: list[Child],
    *,
    group_keys: int | None = None,
) -> dict[str, Any]:
    """Inserts ``jobs`` no-op jobs in one transaction (so every worker wakes at its commit),
    waits until they are all done, and answers jobs/s from the first claim to the last
    completion as the table records them. With ``group_keys``, job n has the group key
    ``k<n mod group_keys>``: the first ``group_keys`` jobs head their groups, the others wait
    their turn."""
    if group_keys is None:
        insert = sql.SQL(
            "INSERT INTO {} (task, payload, max_attempts) "
            "SELECT %s, '{{}}'::jsonb, 1 FROM generate_series(1, %s)"
        ).format(table)
        params: list[Any] = [NOOP, jobs]
    else:
        insert = sql.SQL(
            "INSERT INTO {} (task, payload, max_attempts, group_key) "
            "SELECT %s, '{{}}'::jsonb, 1, 'k' || (g %% %s) FROM generate_series(1, %s) AS g "
            "ORDER BY g"
        ).format(table)
        params = [NOOP, group_keys, jobs]
    with ctx.connect() as conn:
        truncate(conn, table)
        settle(conn)
        cpu_before = [child.cpu() or 0.0 for child in processes]
        conn.execute(insert, params)
        pg_before, wall_before = postgres_cpu(), time.monotonic()
        deadline = time.monotonic() + max(120.0, jobs / 100)
        while unfinished(conn, table):
            for child in processes:
                child.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"{jobs} jobs were not done after {max(120.0, jobs / 100):.0f}s")
            time.sleep(0.1)
        wall = time.monotonic() - wall_before
        pg_after = postgres_cpu()
        cpu = sum(
            (child.cpu() or 0.0) - before
            for child, before in zip(processes, cpu_before, strict=True)
        )
        row = conn.execute(
            sql.SQL(
                "SELECT count(*) FILTER (WHERE status = 'completed'), count(*), "
                "extract(epoch FROM max(finished_at) - min(started_at))::float8, "
                "count(DISTINCT (worker_id, started_at)), count(DISTINCT (worker_id, finished_at)) "
                "FROM {}"
            ).format(table)
        ).fetchone()
    assert row is not None
    completed, total, span, claims, writes = row
    if completed != jobs or total != jobs:
        raise BenchError(f"{completed} of {jobs} jobs completed ({total} rows)")
    # Every row a statement writes carries that transaction's now(): distinct start times are
    # the claim statements, distinct finish times the completion writes.
    return {
        "jobs": jobs,
        "seconds": span,
        "jobs_per_s": jobs / span if span else float("nan"),
        "claims": claims,
        "jobs_per_claim": jobs / claims if claims else float("nan"),
        "completion_writes": writes,
        "jobs_per_write": jobs / writes if writes else float("nan"),
        # Where the time went: CPU of the consumer process(es) per job, and the share of one
        # CPU that they and the database's processes used while the queue drained.
        "consumer_cpu_us_per_job": cpu / jobs * 1e6,
        "consumer_cpu_share": cpu / wall if wall else float("nan"),
        "postgres_cpu_share": (pg_after - pg_before) / wall
        if pg_after is not None and pg_before is not None and wall
        else None,
    }


def pickup(ctx: Context, table: sql.Composable, count: int, rate: float | None) -> dict[str, Any]:
    """Submits ``count`` stamp jobs, one INSERT per transaction, ``rate`` per second (None:
    back to back), and answers the commit-to-handler-start latencies in ms."""
    insert = sql.SQL(
        "INSERT INTO {} (task, payload, max_attempts) VALUES (%s, '{{}}'::jsonb, 1) RETURNING id"
    ).format(table)
    commits: dict[UUID, float] = {}
    with ctx.connect() as conn:
        truncate(conn, table)
        time.sleep(0.2)  # let the worker settle after the TRUNCATE
        start = time.perf_counter() + 0.05
        for index in range(count):
            if rate is not None:
                delay = start + index / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            cursor = conn.execute(insert, [STAMP], prepare=True)
            committed = time.time()  # autocommit: execute returns once the COMMIT is done
            row = cursor.fetchone()
            assert row is not None
            commits[row[0]] = committed
        ids = list(commits)
        count_done = sql.SQL(
            "SELECT count(*) FILTER (WHERE status = 'completed'), "
            "count(*) FILTER (WHERE status IN ('failed', 'cancelled')) "
            "FROM {} WHERE id = ANY(%s)"
        ).format(table)

        def finished() -> bool:
            row = conn.execute(count_done, [ids]).fetchone()
            assert row is not None
            if row[1]:
                raise BenchError(f"{row[1]} stamp job(s) failed")
            return bool(row[0] == len(ids))

        poll_until(finished, 60.0, f"{count} stamp jobs to complete")
        stamps = conn.execute(
            sql.SQL("SELECT id, (result->>'t')::float8 FROM {} WHERE id = ANY(%s)").format(table),
            [ids],
        ).fetchall()
    latencies = [(started - commits[job_id]) * 1000 for job_id, started in stamps]
    p50, p95, p99 = percentiles(latencies)
    return {
        "jobs": count,
        "rate": rate,
        "p50_ms": p50,
        "p95_ms": p95,
        "p99_ms": p99,
        "max_ms": max(latencies),
        "latencies_ms": latencies,
    }


class RssSampler:
    """Samples the resident memory of processes every 50 ms in a thread; keeps the peak."""

    def __init__(self, children: list[Child]) -> None:
        self.children = children
        self.peak_kb = {child.pid: 0 for child in children}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.sample()

    def sample(self) -> None:
        for child in self.children:
            rss = child.rss_kb()
            if rss is not None and rss > self.peak_kb[child.pid]:
                self.peak_kb[child.pid] = rss

    @contextmanager
    def running(self) -> Iterator[RssSampler]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()
            self.sample()


def kb_to_mb(kb: float) -> float:
    return kb * 1024 / 1e6
