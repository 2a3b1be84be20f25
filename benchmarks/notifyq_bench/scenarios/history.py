"""``history``: notifyq's claim statement on an empty table against one with a large history
of finished jobs."""

from __future__ import annotations

import re
import time
from typing import Any

import psycopg

from notifyq_bench.harness import BenchError
from notifyq_bench.report import RATIO, Figure, Target
from notifyq_bench.scenarios.context import NOTIFYQ_JOBS, WORKER_CONCURRENCY, Context, Scenario
from notifyq_bench.scenarios.measure import truncate
from notifyq_bench.stats import median, percentiles
from notifyq_bench.tasks import NOOP

CLAIM_LIMIT = WORKER_CONCURRENCY


def claim_statement() -> tuple[bytes, dict[str, Any]]:
    """notifyq's own claim statement and parameters for it."""
    from notifyq.queries import load_queries

    query = load_queries()["claim_jobs"]
    known: dict[str, Any] = {
        "worker_id": "bench-history",
        "tasks": [NOOP],
        "queues": None,
        "limit": CLAIM_LIMIT,
        "lease": 30.0,
        "probe": False,
    }
    names = set(re.findall(rb"%\((\w+)\)[sbt]", query))
    unknown = {name.decode() for name in names} - set(known)
    if unknown:
        raise BenchError(
            "claim_jobs takes parameters the bench does not know: " + ", ".join(sorted(unknown))
        )
    return query, {name.decode(): known[name.decode()] for name in names}


def claim_times(url: str, reps: int) -> list[float]:
    """Runs the claim ``reps`` times (after a warm-up), each in a transaction that is rolled
    back so that every run sees the same queue; answers each statement's time in ms."""
    query, params = claim_statement()
    times = []
    with psycopg.connect(url) as conn:
        for index in range(reps + 20):
            started = time.perf_counter()
            conn.execute(query, params).fetchall()
            elapsed = time.perf_counter() - started
            conn.rollback()
            if index >= 20:
                times.append(elapsed * 1000)
    return times


def run(ctx: Context) -> None:
    """The claim statement's time on a table with no finished jobs against one with a large
    history of completed jobs (bulk-inserted, then VACUUM ANALYZE); the same queued jobs wait
    in both."""
    s = ctx.sizes
    ctx.step(f"creating a second scratch database with {s.history_rows:,} completed jobs")
    hist_url = ctx.scratch_url("_history")
    with ctx.connect(hist_url) as conn:
        started = time.perf_counter()
        # History as workers leave it: finished jobs in notifyq.jobs_done, which has no insert
        # triggers (only notifyq's functions write it).
        conn.execute(
            "INSERT INTO notifyq.jobs_done (task, payload, queue, priority, status, max_attempts, "
            "attempt_count, claims, result, created_at, run_at, started_at, finished_at, "
            "worker_id) "
            "SELECT %s, '{}'::jsonb, 'default', 0, 'completed', 1, 1, 1, 'null'::jsonb, t, t, t, "
            "t + interval '1 millisecond', 'bench-history' "
            "FROM (SELECT now() - make_interval(secs => g / 100.0) AS t "
            "      FROM generate_series(1, %s) AS g) AS s",
            [NOOP, s.history_rows],
        )
        load_seconds = time.perf_counter() - started
    raw: dict[str, Any] = {
        "history_rows": s.history_rows,
        "queued": s.history_queued,
        "claim_limit": CLAIM_LIMIT,
        "reps": s.claim_reps,
        "load_seconds": load_seconds,
        "empty": [],
        "history": [],
        "empty_idle": [],
        "history_idle": [],
    }
    with ctx.connect() as conn:
        truncate(conn, NOTIFYQ_JOBS)
    urls = (("empty", ctx.url), ("history", hist_url))
    for _, url in urls:
        with ctx.connect(url) as conn:
            conn.execute("VACUUM ANALYZE notifyq.jobs, notifyq.jobs_done")
    # Nothing queued: the claim an idle worker runs on every wake-up.
    for who, url in urls:
        raw[f"{who}_idle"] = claim_times(url, s.claim_reps)
    for _, url in urls:
        with ctx.connect(url) as conn:
            conn.execute(
                "INSERT INTO notifyq.jobs (task, payload, max_attempts) "
                "SELECT %s, '{}'::jsonb, 1 FROM generate_series(1, %s)",
                [NOOP, s.history_queued],
            )
            conn.execute("VACUUM ANALYZE notifyq.jobs, notifyq.jobs_done")
    for r in range(ctx.repeat):
        for who, url in urls:
            ctx.step(f"{who} table: {s.claim_reps} claims of {CLAIM_LIMIT}, repeat {r + 1}")
            times = claim_times(url, s.claim_reps)
            p50, p95 = percentiles(times, (50, 95))
            raw[who].append({"p50_ms": p50, "p95_ms": p95, "mean_ms": sum(times) / len(times)})
            ctx.done()
    ctx.results.raw["history"] = raw
    _add_figures(ctx, raw)


def _add_figures(ctx: Context, raw: dict[str, Any]) -> None:
    """The figures of the claim runs in ``raw``."""
    s = ctx.sizes
    empty = [run["p50_ms"] for run in raw["empty"]]
    full = [run["p50_ms"] for run in raw["history"]]
    rows = f"{s.history_rows:,}"
    add = ctx.results.add
    add(
        Figure(
            "history.empty",
            "history",
            f"claim of {CLAIM_LIMIT} (of {s.history_queued:,} queued), no finished jobs: p50",
            "ms",
            empty,
        )
    )
    add(
        Figure(
            "history.full",
            "history",
            f"claim of {CLAIM_LIMIT}, {rows} completed jobs in the table: p50",
            "ms",
            full,
            None,
            empty,
            "no finished jobs",
        )
    )
    add(
        Figure(
            "history.ratio",
            "history",
            f"claim time, {rows} finished jobs / none",
            RATIO,
            [a / b for a, b in zip(full, empty, strict=True)],
            Target("<=", 1.2),
        )
    )
    add(
        Figure(
            "history.idle_ratio",
            "history",
            f"empty claim (nothing queued), {rows} finished jobs / none",
            RATIO,
            [median(raw["history_idle"]) / median(raw["empty_idle"])],
        )
    )


SCENARIO = Scenario("history", run, lambda repeat, s: 2 * repeat)
