"""``durable``: the durable-jobs issue's three targets.

- **Wake-up.** Jobs that wait for a signal (``bench_wait_signal``) are suspended on an idle
  worker; then each gets its signal (``SELECT notifyq.signal(...)``, one transaction each, 20 a
  second), and the figure is the handler's stamp when it runs again minus the time the signal's
  COMMIT returned, both on this host: the signal's commit wakes the worker by NOTIFY, not a poll.
- **Suspended jobs cost nothing.** ``suspended_jobs`` such jobs (10,000 in a full run) are made
  by the worker itself (each claimed, run, suspended), and must hold no slot (no job
  ``processing`` once they are all suspended); then the claim throughput of no-op jobs with them
  suspended is compared with the same drain without them, taking turns.
- **kill -9.** Worker processes (concurrency 8, lease 2 s) run three-step jobs
  (``bench_three_steps``, 50 ms a step), each killed with SIGKILL once some steps have begun,
  ``kill_trials`` times (``--kill-trials``); then a last worker finishes the jobs. Each run of a
  step's function is a row stamped with the database's clock: a run that began after its step
  was recorded is a completed step run twice, and the target is none.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import psycopg

from notifyq_bench.harness import BenchError, Child
from notifyq_bench.report import RATIO, Figure, Target
from notifyq_bench.scenarios.context import NOTIFYQ_JOBS, WORKER_CONCURRENCY, Context, Scenario
from notifyq_bench.scenarios.measure import settle, truncate
from notifyq_bench.stats import percentiles
from notifyq_bench.tasks import NOOP, RUNS_TABLE, THREE_STEPS, WAIT_SIGNAL

NAME = "durable"
#: Signals a second in the wake-up part: the worker is idle again before the next one.
SIGNAL_RATE = 20.0
#: Slots and lease of the workers killed in the kill -9 part.
KILL_CONCURRENCY = 8
KILL_LEASE = "2"
#: Step runs that must have begun in a worker before it is killed.
RUNS_BEFORE_KILL = 4
STEP_SECONDS = 0.05

INSERT_WAITERS = (
    "INSERT INTO notifyq.jobs (task, payload, max_attempts) "
    "SELECT %s, '{}'::jsonb, 1 FROM generate_series(1, %s)"
)
COUNT_SUSPENDED = "SELECT count(*) FROM ONLY notifyq.jobs WHERE status = 'suspended'"
COUNT_PROCESSING = "SELECT count(*) FROM ONLY notifyq.jobs WHERE status = 'processing'"


def run(ctx: Context) -> None:
    s = ctx.sizes
    raw: dict[str, Any] = {
        "signal_rate": SIGNAL_RATE,
        "signal_wakes": s.signal_wakes,
        "suspended_jobs": s.suspended_jobs,
        "drain_jobs": s.drain_jobs,
        "kill_trials": s.kill_trials,
        "wakes": [],
        "slots_held": [],
        "plain": [],
        "with_suspended": [],
    }
    ctx.step("starting a worker")
    (worker,) = ctx.start_workers(1, WORKER_CONCURRENCY)
    try:
        for r in range(ctx.repeat):
            of = f"repeat {r + 1} of {ctx.repeat}"
            ctx.step(f"{s.signal_wakes} signals at {SIGNAL_RATE:g}/s, idle worker, {of}")
            raw["wakes"].append(_wakes(ctx, worker, s.signal_wakes))
            ctx.done()
            with ctx.connect() as conn:
                truncate(conn, NOTIFYQ_JOBS)
            # In turns, each drain on a vacuumed table: the suspended jobs are the only
            # difference between the two.
            order = ("plain", "with_suspended") if r % 2 == 0 else ("with_suspended", "plain")
            for who in order:
                if who == "plain":
                    with ctx.connect() as conn:
                        conn.execute("DELETE FROM ONLY notifyq.jobs WHERE status = 'suspended'")
                    ctx.step(f"drain of {s.drain_jobs:,} jobs, none suspended, {of}")
                else:
                    ctx.step(f"suspending {s.suspended_jobs:,} jobs, {of}")
                    raw["slots_held"].append(_suspend(ctx, worker, s.suspended_jobs))
                    ctx.step(
                        f"drain of {s.drain_jobs:,} jobs, {s.suspended_jobs:,} suspended, {of}"
                    )
                raw[who].append(_drain(ctx, worker, s.drain_jobs))
            ctx.done()
    finally:
        ctx.children.stop(worker)
    ctx.step(f"kill -9 during three-step jobs, {s.kill_trials:,} trials")
    raw["kills"] = _kill_trials(ctx, s.kill_trials)
    ctx.done()
    ctx.results.raw[NAME] = raw
    _add_figures(ctx, raw)


# -- signal committed -> handler running again ---------------------------------------------------


def _wakes(ctx: Context, worker: Child, count: int) -> dict[str, Any]:
    with ctx.connect() as conn:
        truncate(conn, NOTIFYQ_JOBS)
        ids = [
            row[0]
            for row in conn.execute(
                INSERT_WAITERS + " RETURNING id",
                [WAIT_SIGNAL, count],
            ).fetchall()
        ]
        _wait(conn, worker, COUNT_SUSPENDED, count, "jobs suspended waiting for a signal")
        settle(conn)
        committed: dict[Any, float] = {}
        start = time.perf_counter() + 0.05
        for index, job_id in enumerate(ids):
            delay = start + index / SIGNAL_RATE - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            conn.execute("SELECT notifyq.signal(%s, 'go')", [job_id], prepare=True)
            committed[job_id] = time.time()  # autocommit: the COMMIT has returned
        _wait(
            conn,
            worker,
            "SELECT count(*) FROM notifyq.jobs_done WHERE status = 'completed'",
            count,
            "signalled jobs completed",
        )
        rows = conn.execute(
            "SELECT id, (result->>'t')::float8 FROM notifyq.jobs WHERE id = ANY(%s)", [ids]
        ).fetchall()
    latencies = [(stamp - committed[job_id]) * 1000 for job_id, stamp in rows]
    p50, p95, p99 = percentiles(latencies)
    return {"p50_ms": p50, "p95_ms": p95, "p99_ms": p99, "max_ms": max(latencies)}


# -- suspended jobs and the claims of others ------------------------------------------------------


def _suspend(ctx: Context, worker: Child, count: int) -> int:
    """``count`` jobs run by the worker until each is suspended waiting for a signal; answers
    how many jobs are still processing then (the slots they hold)."""
    with ctx.connect() as conn:
        conn.execute(INSERT_WAITERS, [WAIT_SIGNAL, count])
        _wait(conn, worker, COUNT_SUSPENDED, count, "jobs suspended")
        row = conn.execute(COUNT_PROCESSING).fetchone()
    return int(row[0]) if row else -1


def _drain(ctx: Context, worker: Child, jobs: int) -> dict[str, Any]:
    """``jobs`` no-op jobs inserted in one transaction, drained; jobs/s from the first claim to
    the last completion, read from the table (the suspended jobs stay as they are)."""
    with ctx.connect() as conn:
        conn.execute("DELETE FROM notifyq.jobs_done")
        conn.execute("VACUUM (ANALYZE) notifyq.jobs, notifyq.jobs_done, notifyq.claim_floors")
        settle(conn)
        conn.execute(
            "INSERT INTO notifyq.jobs (task, payload, max_attempts) "
            "SELECT %s, '{}'::jsonb, 1 FROM generate_series(1, %s)",
            [NOOP, jobs],
        )
        _wait(
            conn,
            worker,
            "SELECT count(*) FROM notifyq.jobs_done WHERE task = %s",
            jobs,
            "no-op jobs done",
            [NOOP],
        )
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'completed'), "
            "extract(epoch FROM max(finished_at) - min(started_at))::float8 "
            "FROM notifyq.jobs_done WHERE task = %s",
            [NOOP],
        ).fetchone()
    assert row is not None
    completed, span = row
    if completed != jobs:
        raise BenchError(f"{completed} of {jobs} no-op jobs completed")
    return {"jobs": jobs, "seconds": span, "jobs_per_s": jobs / span if span else float("nan")}


# -- kill -9 during three-step jobs --------------------------------------------------------------


def _kill_trials(ctx: Context, trials: int) -> dict[str, Any]:
    jobs = max(1, trials) * KILL_CONCURRENCY + KILL_CONCURRENCY
    env = {"NOTIFYQ_LEASE_SECONDS": KILL_LEASE, "NOTIFYQ_POLL_INTERVAL": "1"}
    with ctx.connect() as conn:
        truncate(conn, NOTIFYQ_JOBS)
        conn.execute(f"DROP TABLE IF EXISTS {RUNS_TABLE}")
        conn.execute(f"CREATE TABLE {RUNS_TABLE} (job_id uuid, name text, at timestamptz)")
        conn.execute(
            "INSERT INTO notifyq.jobs (task, payload, max_attempts) "
            "SELECT %s, jsonb_build_object('seconds', %s::float8), 1000 "
            "FROM generate_series(1, %s)",
            [THREE_STEPS, STEP_SECONDS, jobs],
        )
        started = time.monotonic()
        for _ in range(trials):
            (doomed,) = ctx.start_workers(1, KILL_CONCURRENCY, **env)
            target = _count(conn, f"SELECT count(*) FROM {RUNS_TABLE}") + RUNS_BEFORE_KILL
            deadline = time.monotonic() + 60
            while _count(conn, f"SELECT count(*) FROM {RUNS_TABLE}") < target:
                doomed.check_alive()
                if time.monotonic() > deadline:
                    raise BenchError("a worker of the kill -9 trials started no step in 60 s")
                time.sleep(0.005)
            doomed.proc.send_signal(signal.SIGKILL)
            doomed.proc.wait(10)
            ctx.children.stop(doomed)
        (survivor,) = ctx.start_workers(1, WORKER_CONCURRENCY, **env)
        try:
            _wait(
                conn,
                survivor,
                "SELECT count(*) FROM notifyq.jobs_done WHERE task = %s AND status = 'completed'",
                jobs,
                "three-step jobs completed",
                [THREE_STEPS],
                timeout=max(300.0, jobs / 10),
            )
        finally:
            ctx.children.stop(survivor)
        row = conn.execute(
            f"""SELECT
                  (SELECT count(*) FROM {RUNS_TABLE} AS r
                   JOIN notifyq.job_steps AS s ON s.job_id = r.job_id AND s.name = r.name
                   WHERE s.kind = 'step' AND r.at > s.finished_at),
                  (SELECT count(*) FROM notifyq.job_steps WHERE kind = 'step'),
                  (SELECT count(*) FROM (SELECT 1 FROM {RUNS_TABLE} GROUP BY job_id, name
                                         HAVING count(*) > 1) AS cut)"""
        ).fetchone()
        conn.execute(f"DROP TABLE {RUNS_TABLE}")
    assert row is not None
    twice, recorded, cut = row
    return {
        "trials": trials,
        "jobs": jobs,
        "seconds": time.monotonic() - started,
        "completed_steps_run_twice": twice,
        "steps_recorded": recorded,
        "steps_cut_and_run_again": cut,
    }


# -- helpers ---------------------------------------------------------------------------------


def _count(conn: psycopg.Connection[Any], query: str, params: list[Any] | None = None) -> int:
    row = conn.execute(query, params).fetchone()
    return int(row[0]) if row else 0


def _wait(
    conn: psycopg.Connection[Any],
    worker: Child,
    query: str,
    count: int,
    what: str,
    params: list[Any] | None = None,
    *,
    timeout: float = 300.0,
) -> None:
    deadline = time.monotonic() + timeout
    while (found := _count(conn, query, params)) < count:
        worker.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"{found} of {count} {what} after {timeout:.0f}s")
        time.sleep(0.02)


def _add_figures(ctx: Context, raw: dict[str, Any]) -> None:
    ctx.results.add(
        Figure(
            "durable.signal_wake.p99",
            NAME,
            f"signal committed → job running again, p99, idle worker ({SIGNAL_RATE:g}/s)",
            "ms",
            [run["p99_ms"] for run in raw["wakes"]],
            Target("<=", 10.0),
        )
    )
    ctx.results.add(
        Figure(
            "durable.slots_held",
            NAME,
            f"{raw['suspended_jobs']:,} suspended jobs: slots they hold",
            "jobs",
            [float(held) for held in raw["slots_held"]],
            Target("<=", 0.0),
        )
    )
    plain = [run["jobs_per_s"] for run in raw["plain"]]
    suspended = [run["jobs_per_s"] for run in raw["with_suspended"]]
    ctx.results.add(
        Figure(
            "durable.throughput_ratio",
            NAME,
            f"claim throughput, {raw['suspended_jobs']:,} suspended / none suspended "
            f"({raw['drain_jobs']:,} no-op jobs, 1 worker x {WORKER_CONCURRENCY})",
            RATIO,
            [a / b for a, b in zip(suspended, plain, strict=True)],
            Target(">=", 0.95),
            note="each ratio pairs two drains run in turns, each on a vacuumed table",
        )
    )
    kills = raw["kills"]
    ctx.results.add(
        Figure(
            "durable.kill_repeats",
            NAME,
            f"kill -9 during three-step jobs, {kills['trials']:,} trials: completed steps run "
            f"twice ({kills['steps_cut_and_run_again']:,} steps cut by a kill ran again)",
            "steps",
            [float(kills["completed_steps_run_twice"])],
            Target("<=", 0.0),
        )
    )


SCENARIO = Scenario(NAME, run, lambda repeat, s: 2 * repeat + 1)
