"""``horizon``: a steady stream of jobs while a long transaction elsewhere pins the xmin
horizon, the storage issue's check that such a transaction does not turn the claim into a scan
of dead rows.

Each run has a PostgreSQL cluster of its own (:mod:`notifyq_bench.pgserver`: the shared server
may run with autovacuum off, and this run leaves it bloated), with the default settings:
autovacuum on, durable commits. One worker (concurrency 50) runs there; a separate session
takes a ``REPEATABLE READ`` snapshot in the same database and holds it for the whole run, so
that no row version that any job leaves behind can be removed, by autovacuum or by pruning.
Then stamp jobs are inserted at 1,000 a second for ``horizon_seconds``: one INSERT per
transaction while the producer keeps up, the jobs that fell due meanwhile in one statement
(at most 50) when it does not.

Pickup latency is taken as the ``latency`` scenario takes it (the handler's stamp minus the
time the insert's COMMIT returned) and compared between the first and the last tenth of the
stream (a minute each in a full run). The backlog, jobs committed and not yet started by a
handler, is counted for every second of the stream from those same times after the run, so
that counting it costs the measured server nothing; every 10 s a watcher reads the queued
jobs and the dead tuples of ``notifyq.jobs`` for the progress line.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from notifyq_bench.harness import BenchError, Child, Scratch, free_port
from notifyq_bench.pgserver import BenchServer
from notifyq_bench.report import RATIO, Figure, Target
from notifyq_bench.scenarios.context import WORKER_CONCURRENCY, Context, Scenario
from notifyq_bench.stats import percentiles
from notifyq_bench.tasks import STAMP

NAME = "horizon"
#: Jobs a second the producer inserts.
RATE = 1_000.0
#: The most jobs one INSERT carries when the producer has fallen behind its schedule.
MAX_BATCH = 50
#: The share of the stream at each end whose pickups are compared.
WINDOW_SHARE = 0.1
#: Seconds between the watcher's looks at the table (and progress lines).
WATCH_S = 10.0
#: Seconds the jobs left at the end of the stream get to finish.
DRAIN_S = 120.0
ADDRESS = "127.0.0.1"

INSERT = (
    "INSERT INTO notifyq.jobs (task, payload, max_attempts) "
    "SELECT %s, jsonb_build_object('n', n), 1 FROM generate_series(%s::int, %s::int) AS n"
)
UNFINISHED = "SELECT EXISTS (SELECT 1 FROM notifyq.jobs WHERE status IN ('queued', 'processing'))"
STAMPS = "SELECT (payload->>'n')::int, (result->>'t')::float8 FROM notifyq.jobs WHERE task = %s"
DEAD_TUPLES = (
    "SELECT n_dead_tup, n_live_tup, autovacuum_count, vacuum_count "
    "FROM pg_stat_user_tables WHERE schemaname = 'notifyq' AND relname = 'jobs'"
)


class Snapshot:
    """A session that holds a ``REPEATABLE READ`` snapshot open, pinning the database's xmin
    horizon until :meth:`release`."""

    def __init__(self, ctx: Context, url: str) -> None:
        self.conn = ctx.connect(url)
        self.pid = self.conn.info.backend_pid
        self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        # The snapshot is taken by the first statement, not by BEGIN.
        self.conn.execute("SELECT 1")

    def release(self) -> None:
        try:
            self.conn.execute("ROLLBACK")
        except psycopg.Error:
            pass  # the connection is closed below either way
        finally:
            self.conn.close()


def xmin_of(conn: psycopg.Connection[Any], pid: int) -> dict[str, Any]:
    """The xmin that session ``pid`` holds and how many transactions have begun since."""
    row = conn.execute(
        "SELECT backend_xmin::text, age(backend_xmin) FROM pg_stat_activity WHERE pid = %s",
        [pid],
    ).fetchone()
    if row is None:
        return {"xmin": None, "age": None}
    return {"xmin": row[0], "age": row[1]}


def dead_tuples(conn: psycopg.Connection[Any]) -> dict[str, int]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(DEAD_TUPLES).fetchone()
    if row is None:
        raise BenchError("notifyq.jobs has no row in pg_stat_user_tables")
    keys = ("dead_tuples", "live_tuples", "autovacuums", "vacuums")
    return {key: int(value or 0) for key, value in zip(keys, row, strict=True)}


@dataclass
class Watcher:
    """Every ``WATCH_S`` seconds, in a thread: the queued jobs and the table's dead tuples,
    kept and shown on the progress line. It reads only; the producer never waits for it."""

    ctx: Context
    url: str
    duration: float
    producer: Producer
    samples: list[dict[str, Any]] = field(default_factory=list)
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        started = time.monotonic()
        try:
            with self.ctx.connect(self.url) as conn:
                while not self._stop.wait(WATCH_S):
                    row = conn.execute(
                        "SELECT count(*) FROM notifyq.jobs WHERE status = 'queued'"
                    ).fetchone()
                    queued = int(row[0]) if row else 0
                    sample = {
                        "s": round(time.monotonic() - started, 1),
                        "inserted": self.producer.sent,
                        "queued": queued,
                        **dead_tuples(conn),
                    }
                    self.samples.append(sample)
                    self.ctx.step(
                        f"{sample['s']:.0f} of {self.duration:.0f} s: "
                        f"{sample['inserted']:,} jobs in, {queued:,} queued, "
                        f"{sample['dead_tuples']:,} dead tuples, xmin pinned"
                    )
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self.error is not None:
            raise BenchError(f"the horizon watcher failed: {self.error}")


@dataclass
class Producer:
    """Inserts stamp jobs at ``RATE`` a second on a schedule, job ``n`` due ``n / RATE``
    seconds after the start; keeps each job's commit time, by ``n``."""

    total: int
    commits: array[float] = field(default_factory=lambda: array("d"))
    sent: int = 0
    transactions: int = 0

    def run(self, conn: psycopg.Connection[Any], worker: Child) -> None:
        start = time.perf_counter() + 0.05
        next_check = start
        while self.sent < self.total:
            now = time.perf_counter()
            due = min(self.total, int((now - start) * RATE) + 1)
            if due <= self.sent:
                time.sleep(max(0.0, start + self.sent / RATE - now))
                continue
            count = min(due - self.sent, MAX_BATCH)
            conn.execute(INSERT, [STAMP, self.sent, self.sent + count - 1], prepare=True)
            committed = time.time()  # autocommit: execute returns once the COMMIT is done
            self.commits.extend([committed] * count)
            self.sent += count
            self.transactions += 1
            if now >= next_check:
                worker.check_alive()
                next_check = now + 1.0


def run(ctx: Context) -> None:
    """A stream of jobs under a pinned xmin, once per repeat, each on a fresh cluster."""
    runs = []
    for r in range(ctx.repeat):
        runs.append(_one_run(ctx, r))
    ctx.results.raw[NAME] = {
        "rate_asked_per_s": RATE,
        "seconds": ctx.sizes.horizon_seconds,
        "window_share": WINDOW_SHARE,
        "runs": runs,
    }
    _add_figures(ctx, runs)


def _one_run(ctx: Context, r: int) -> dict[str, Any]:
    ctx.step(f"starting a PostgreSQL cluster of its own, round {r + 1} of {ctx.repeat}")
    server = BenchServer(ADDRESS, free_port())
    with server:
        scratch = Scratch(server.url)
        workers: list[Child] = []
        snapshot: Snapshot | None = None
        try:
            url = scratch.create("_horizon")
            dbname = str(conninfo_to_dict(url)["dbname"])
            workers = ctx.start_workers(
                1,
                WORKER_CONCURRENCY,
                url=server.url_without_password(dbname),
                PGPASSWORD=server.password,
                NOTIFYQ_AUTO_MIGRATE="false",
            )
            snapshot = Snapshot(ctx, url)
            ctx.done()
            data = _stream(ctx, url, workers[0], snapshot)
            data["server"] = {
                "version": server.version(),
                "port": server.port,
                "postmaster_pid": server.proc.pid if server.proc else None,
                "folder": str(server.dir),
            }
            data["worker_pid"] = workers[0].pid
            return data
        finally:
            if snapshot is not None:
                snapshot.release()
            ctx.children.stop(*workers)
            scratch.drop_all()


def _stream(ctx: Context, url: str, worker: Child, snapshot: Snapshot) -> dict[str, Any]:
    duration = ctx.sizes.horizon_seconds
    producer = Producer(total=int(duration * RATE))
    watcher = Watcher(ctx, url, duration, producer)
    with ctx.connect(url) as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('autovacuum', 'synchronous_commit', 'fsync', 'server_version')"
            ).fetchall()
        )
        pinned_at_start = xmin_of(conn, snapshot.pid)
        if pinned_at_start["xmin"] is None:
            raise BenchError("the REPEATABLE READ session holds no xmin")
        ctx.step(f"{producer.total:,} stamp jobs at {RATE:,.0f}/s, xmin pinned")
        watcher.start()
        try:
            producer.run(conn, worker)
        finally:
            watcher.stop()
        stopped = time.time()
        at_end = dead_tuples(conn)
        pinned_at_end = xmin_of(conn, snapshot.pid)
        ctx.done()
        ctx.step("waiting for the last jobs, reading the stamps")
        _wait_for_the_last(ctx, conn, worker)
        read_at = time.time()
        stamps = array("d", [math.nan]) * producer.total
        for n, t in conn.execute(STAMPS, [STAMP]):
            if t is not None:
                stamps[n] = t
        statuses = dict(
            conn.execute("SELECT status, count(*) FROM notifyq.jobs GROUP BY status").fetchall()
        )
    ctx.done()
    return {
        "settings": settings,
        "jobs": producer.total,
        "transactions": producer.transactions,
        "jobs_per_insert": producer.total / producer.transactions,
        "xmin_at_start": pinned_at_start,
        "xmin_at_end": pinned_at_end,
        "at_end": at_end,
        "statuses": statuses,
        "watch": watcher.samples,
        **_analyse(producer.commits, stamps, stopped, read_at),
    }


def _wait_for_the_last(ctx: Context, conn: psycopg.Connection[Any], worker: Child) -> None:
    deadline = time.monotonic() + DRAIN_S
    while (row := conn.execute(UNFINISHED).fetchone()) and row[0]:
        worker.check_alive()
        if time.monotonic() > deadline:
            ctx.note(f"horizon: jobs were still unfinished {DRAIN_S:.0f} s after the stream")
            return
        time.sleep(0.2)


def _analyse(
    commits: array[float], stamps: array[float], stopped: float, read_at: float
) -> dict[str, Any]:
    """Pickup percentiles at both ends of the stream, pickups 10 s by 10 s, and the backlog
    at every second, from each job's commit time and handler stamp."""
    first, last = commits[0], commits[-1]
    span = last - first
    window = span * WINDOW_SHARE
    never = sum(1 for t in stamps if math.isnan(t))
    # A job never started counts with the time it had waited when the stamps were read: a
    # lower bound, which still shows in the percentiles at the end.
    latencies = [
        ((read_at if math.isnan(t) else t) - c) * 1000 for c, t in zip(commits, stamps, strict=True)
    ]

    # Jobs are inserted one after the other: their commit times are in order.
    def window_of(low: float, high: float) -> dict[str, float]:
        picked = latencies[bisect.bisect_left(commits, low) : bisect.bisect_right(commits, high)]
        p50, p95, p99 = percentiles(picked)
        return {"jobs": len(picked), "p50_ms": p50, "p95_ms": p95, "p99_ms": p99}

    buckets = []
    edge = first
    while edge < last:
        part = window_of(edge, min(edge + WATCH_S, last))
        buckets.append({"s": round(edge - first, 1), **part})
        edge += WATCH_S
    started = sorted(t for t in stamps if not math.isnan(t))

    def backlog(at: float) -> int:
        return max(0, bisect.bisect_right(commits, at) - bisect.bisect_right(started, at))

    seconds = [first + s for s in range(int(span) + 1)]
    # The backlog only grows at a commit, so its most is at one of them (or when the stream
    # stops): sampled at whole seconds alone, it could read lower than its value at the end.
    most = max(backlog(at) for at in (*commits, stopped))
    return {
        "span_s": span,
        "jobs_per_s": (len(commits) - 1) / span if span else math.nan,
        "never_started": never,
        "first": window_of(first, first + window),
        "last": window_of(last - window, last),
        "every_10s": buckets,
        "backlog_per_s": [backlog(at) for at in seconds],
        "backlog_max": most,
        "backlog_at_end": backlog(stopped),
    }


def _add_figures(ctx: Context, runs: list[dict[str, Any]]) -> None:
    seconds = ctx.sizes.horizon_seconds
    window = seconds * WINDOW_SHARE

    def add(key: str, label: str, unit: str, values: list[float], **extra: Any) -> None:
        ctx.results.add(Figure(f"{NAME}.{key}", NAME, label, unit, values, **extra))

    first = [run["first"]["p99_ms"] for run in runs]
    last = [run["last"]["p99_ms"] for run in runs]
    add(
        "first.p99",
        f"pickup p99, first {window:g} s of {seconds:g} s at {RATE:,.0f} jobs/s, xmin pinned",
        "ms",
        first,
    )
    add("last.p99", f"pickup p99, last {window:g} s, xmin pinned", "ms", last)
    add(
        "p99_growth",
        "  pickup p99, end / start",
        RATIO,
        [b / a if a else math.nan for a, b in zip(first, last, strict=True)],
        target=Target("<=", 3.0),
    )
    add(
        "backlog.max",
        "backlog (committed, not yet started), most at any moment, xmin pinned",
        "jobs",
        [float(run["backlog_max"]) for run in runs],
    )
    add(
        "backlog.end",
        "backlog when the stream stops, xmin pinned",
        "jobs",
        [float(run["backlog_at_end"]) for run in runs],
        target=Target("<=", RATE),
        note="one second of jobs",
    )
    add(
        "dead_tuples",
        "dead tuples of notifyq.jobs when the stream stops, xmin pinned",
        "rows",
        [float(run["at_end"]["dead_tuples"]) for run in runs],
        note="pg_stat_user_tables.n_dead_tup; autovacuum on",
    )
    add(
        "rate",
        "jobs inserted a second, xmin pinned",
        "jobs/s",
        [run["jobs_per_s"] for run in runs],
        note=f"asked: {RATE:,.0f}",
    )


SCENARIO = Scenario(NAME, run, lambda repeat, s: 3 * repeat)
