"""``fair``: the fair-claims issue's four targets (sql/024), with the same worker processes
(``WORKERS`` of ``SLOTS`` slots) for all four, and the lanes and weights of the part before
deleted before each part (as the maintenance would once they are idle).

- **Beside a flood.** ``fair_flood`` jobs of key ``A`` (100,000 in a full run), each holding
  its slot ``FLOOD_SECONDS``, so that the flood lasts while it is measured beside and every
  slot is busy with it; once the workers run it, one stamp job each of keys ``B`` to ``J`` a round,
  ``fair_rounds`` rounds, one INSERT per transaction, ``KEY_JOB_RATE`` a second. The figure is
  the p99 of the handler's stamp minus the time the job's COMMIT returned, both on this host;
  the flood must still have jobs queued when the last of them has run.
- **key_concurrency.** ``fair_capped_jobs`` jobs of ``bench_per_key`` (``key_concurrency=2``)
  over ``CAPPED_KEYS`` keys, ``CAPPED_SECONDS`` each, more slots than the keys' caps add up to.
  Each handler answers when it began and ended on the host's monotonic clock; the figure is
  the most jobs of one key whose handlers ran at once (a peak, target ≤ 2), and the raw
  results count the moments (handler starts) at which more than 2 of a key were running.
- **Weights 4:1.** ``A`` has weight 4 in ``notifyq.fair_weights``, ``B`` none (1); as many
  no-op jobs of each as ``fair_weighted_claims`` (20,000 in a full run), in one INSERT, so
  both are backlogged until that many have started (``A`` would take them all to run dry).
  The share is ``A``'s of the first ``fair_weighted_claims`` jobs in the order they started
  (``started_at``, the claim's time). A target of 80 % ± 4 is a band, which a figure's target
  cannot say: the figure is the distance of the share from 80 %, in percentage points (≤ 4),
  and the label says the share.
- **Throughput.** ``drain_jobs`` no-op jobs drained with a fair_key on every job (one of
  ``THROUGHPUT_KEYS``) and without keys, in turns, each drain on a vacuumed table; jobs/s from
  the first claim to the last completion, read from the table. The figure is keys / no keys.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any
from uuid import UUID

import psycopg

from notifyq_bench.harness import BenchError, Child
from notifyq_bench.report import RATIO, Figure, Target
from notifyq_bench.scenarios.context import NOTIFYQ_JOBS, Context, Scenario
from notifyq_bench.scenarios.measure import settle, truncate
from notifyq_bench.stats import median, percentiles
from notifyq_bench.tasks import NOOP, PER_KEY, PER_KEY_LIMIT, SLEEP, STAMP

NAME = "fair"
WORKERS = 4
#: Slots of each worker: more than the key_concurrency part's keys can run at once
#: (CAPPED_KEYS x PER_KEY_LIMIT), so that the caps, not the slots, bound it.
SLOTS = 16
FLOOD_KEY = "A"
KEYS = tuple("BCDEFGHIJ")
#: How long a job of the flood holds its slot: the flood lasts at least
#: fair_flood x FLOOD_SECONDS / (WORKERS x SLOTS) seconds (4.7 s with --quick).
FLOOD_SECONDS = 0.03
#: The jobs of keys B-J inserted a second beside the flood.
KEY_JOB_RATE = 50.0
CAPPED_KEYS = 20
CAPPED_SECONDS = 0.01
WEIGHTED = ("A", "B")
WEIGHT = 4.0
#: Key A's share of the claims under weights 4:1, and how far from it the target allows.
SHARE = 80.0
SHARE_SPREAD = 4.0
THROUGHPUT_KEYS = 20

COUNT_PROCESSING = "SELECT count(*) FROM ONLY notifyq.jobs WHERE status = 'processing'"


def run(ctx: Context) -> None:
    s = ctx.sizes
    raw: dict[str, Any] = {
        "workers": WORKERS,
        "slots": SLOTS,
        "flood_jobs": s.fair_flood,
        "flood_job_seconds": FLOOD_SECONDS,
        "key_job_rate": KEY_JOB_RATE,
        "rounds": s.fair_rounds,
        "capped_jobs": s.fair_capped_jobs,
        "capped_keys": CAPPED_KEYS,
        "key_concurrency": PER_KEY_LIMIT,
        "weighted_claims": s.fair_weighted_claims,
        "weight": WEIGHT,
        "drain_jobs": s.drain_jobs,
        "throughput_keys": THROUGHPUT_KEYS,
        "beside_flood": [],
        "capped": [],
        "weighted": [],
        "keyed": [],
        "plain": [],
    }
    ctx.step(f"starting {WORKERS} workers")
    workers = ctx.start_workers(WORKERS, SLOTS)
    try:
        for r in range(ctx.repeat):
            of = f"repeat {r + 1} of {ctx.repeat}"
            ctx.step(f"keys B-J beside {s.fair_flood:,} jobs of key A, {of}")
            raw["beside_flood"].append(_beside_flood(ctx, workers, s.fair_flood, s.fair_rounds))
            ctx.done()
            ctx.step(f"{s.fair_capped_jobs:,} jobs, key_concurrency={PER_KEY_LIMIT}, {of}")
            raw["capped"].append(_capped(ctx, workers, s.fair_capped_jobs))
            ctx.done()
            ctx.step(f"weights {WEIGHT:g}:1, {s.fair_weighted_claims:,} claims, {of}")
            raw["weighted"].append(_weighted(ctx, workers, s.fair_weighted_claims))
            ctx.done()
            # In turns, each drain on a vacuumed table without lanes: the keys are the only
            # difference between the two.
            order = ("plain", "keyed") if r % 2 == 0 else ("keyed", "plain")
            for who in order:
                keys = THROUGHPUT_KEYS if who == "keyed" else 0
                ctx.step(f"drain of {s.drain_jobs:,} jobs, {keys} keys, {of}")
                raw[who].append(_drain(ctx, workers, s.drain_jobs, keys))
            ctx.done()
    finally:
        ctx.children.stop(*workers)
    ctx.results.raw[NAME] = raw
    _add_figures(ctx, raw)


def _fresh(conn: psycopg.Connection[Any], *, vacuum: bool = False) -> None:
    """No job, no lane, no weight: each part starts where a new database would."""
    truncate(conn, NOTIFYQ_JOBS)
    conn.execute("DELETE FROM notifyq.fair_lanes")
    conn.execute("DELETE FROM notifyq.fair_weights")
    if vacuum:
        conn.execute(
            "VACUUM (ANALYZE) notifyq.jobs, notifyq.jobs_done, notifyq.claim_floors, "
            "notifyq.fair_lanes"
        )
    settle(conn)


# -- one job each of keys B-J beside a flood of key A ---------------------------------------------


def _beside_flood(ctx: Context, workers: list[Child], flood: int, rounds: int) -> dict[str, Any]:
    insert = (
        "INSERT INTO notifyq.jobs (task, payload, max_attempts, fair_key) "
        "VALUES (%s, '{}'::jsonb, 1, %s) RETURNING id"
    )
    committed: dict[UUID, float] = {}
    keys: dict[UUID, str] = {}
    with ctx.connect() as conn:
        _fresh(conn)
        conn.execute(
            "INSERT INTO notifyq.jobs (task, payload, max_attempts, fair_key) "
            "SELECT %s, jsonb_build_object('seconds', %s::float8), 1, %s "
            "FROM generate_series(1, %s)",
            [SLEEP, FLOOD_SECONDS, FLOOD_KEY, flood],
        )
        # The workers run the flood (at least half the slots busy with it) before the first
        # job of another key comes.
        _wait(conn, workers, COUNT_PROCESSING, WORKERS * SLOTS // 2, "flood jobs running")
        start = time.perf_counter() + 0.05
        for index in range(rounds * len(KEYS)):
            delay = start + index / KEY_JOB_RATE - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            key = KEYS[index % len(KEYS)]
            row = conn.execute(insert, [STAMP, key], prepare=True).fetchone()
            stamp = time.time()  # autocommit: execute returns once the COMMIT is done
            assert row is not None
            committed[row[0]] = stamp
            keys[row[0]] = key
        ids = list(committed)
        _wait(
            conn,
            workers,
            "SELECT count(*) FROM notifyq.jobs_done WHERE id = ANY(%s)",
            len(ids),
            "jobs of keys B-J done",
            [ids],
        )
        left = _count(
            conn,
            "SELECT count(*) FROM ONLY notifyq.jobs WHERE status = 'queued' AND fair_key = %s",
            [FLOOD_KEY],
        )
        rows = conn.execute(
            "SELECT id, status, (result->>'t')::float8 FROM notifyq.jobs_done WHERE id = ANY(%s)",
            [ids],
        ).fetchall()
        # What is left of the flood is not needed: deleted, and the jobs running let finish.
        conn.execute("DELETE FROM ONLY notifyq.jobs WHERE status = 'queued'")
        _wait_none(conn, workers, COUNT_PROCESSING, "flood jobs running")
    failed = [job_id for job_id, status, _ in rows if status != "completed"]
    if failed:
        raise BenchError(f"{len(failed)} of {len(ids)} jobs of keys B-J did not complete")
    if left == 0:
        raise BenchError(
            f"the flood of {flood:,} jobs of key {FLOOD_KEY} ran dry before the jobs of keys "
            "B-J had run: they were not measured beside it"
        )
    latencies = {job_id: (started - committed[job_id]) * 1000 for job_id, _, started in rows}
    by_key: dict[str, list[float]] = defaultdict(list)
    for job_id, latency in latencies.items():
        by_key[keys[job_id]].append(latency)
    p50, p95, p99 = percentiles(list(latencies.values()))
    return {
        "jobs": len(ids),
        "p50_ms": p50,
        "p95_ms": p95,
        "p99_ms": p99,
        "max_ms": max(latencies.values()),
        "max_ms_by_key": {key: max(values) for key, values in sorted(by_key.items())},
        "flood_left": left,
        "latencies_ms": list(latencies.values()),
    }


# -- key_concurrency across worker processes ----------------------------------------------------


def _capped(ctx: Context, workers: list[Child], jobs: int) -> dict[str, Any]:
    with ctx.connect() as conn:
        _fresh(conn)
        conn.execute(
            "INSERT INTO notifyq.jobs (task, payload, max_attempts, fair_key) "
            "SELECT %s, jsonb_build_object('seconds', %s::float8, 'key', k), 1, k "
            "FROM generate_series(1, %s) AS g, LATERAL (SELECT 'k' || (g %% %s)) AS l(k) "
            "ORDER BY g",
            [PER_KEY, CAPPED_SECONDS, jobs, CAPPED_KEYS],
        )
        _wait(
            conn,
            workers,
            "SELECT count(*) FROM notifyq.jobs_done WHERE task = %s",
            jobs,
            "key_concurrency jobs done",
            [PER_KEY],
        )
        # The key is read from the payload, which carries it too, so that the count does not
        # rest on the finished row keeping its fair_key (keyless says how many did not).
        keyless = _count(
            conn,
            "SELECT count(*) FROM notifyq.jobs_done WHERE task = %s "
            "AND fair_key IS DISTINCT FROM payload->>'key'",
            [PER_KEY],
        )
        rows = conn.execute(
            "SELECT payload->>'key', status, (result->>'b')::float8, (result->>'e')::float8 "
            "FROM notifyq.jobs_done WHERE task = %s",
            [PER_KEY],
        ).fetchall()
        span_row = conn.execute(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 "
            "FROM notifyq.jobs_done WHERE task = %s",
            [PER_KEY],
        ).fetchone()
    completed = [row for row in rows if row[1] == "completed"]
    if len(completed) != jobs:
        raise BenchError(f"{len(completed)} of {jobs} key_concurrency jobs completed")
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for key, _, began, ended in completed:
        spans[key].append((began, ended))
    peaks = {key: _peak(key_spans) for key, key_spans in sorted(spans.items())}
    over = sum(_moments_over(key_spans, PER_KEY_LIMIT) for key_spans in spans.values())
    seconds = span_row[0] if span_row else None
    return {
        "jobs": jobs,
        "keys": len(spans),
        "peak": max(peaks.values()),
        "peaks_by_key": peaks,
        "keys_at_limit": sum(1 for peak in peaks.values() if peak == PER_KEY_LIMIT),
        "moments_over_limit": over,
        "finished_without_their_key": keyless,
        "seconds": seconds,
        "jobs_per_s": jobs / seconds if seconds else float("nan"),
    }


def _events(spans: list[tuple[float, float]]) -> list[tuple[float, int]]:
    """Starts (+1) and ends (-1) in time order; an end sorts before a start at the same
    moment, so that one job handing its place to the next is not counted as an overlap."""
    return sorted([(began, 1) for began, _ in spans] + [(ended, -1) for _, ended in spans])


def _peak(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one moment."""
    running = peak = 0
    for _, step in _events(spans):
        running += step
        peak = max(peak, running)
    return peak


def _moments_over(spans: list[tuple[float, float]], limit: int) -> int:
    """The starts after which more than ``limit`` spans were open."""
    running = over = 0
    for _, step in _events(spans):
        running += step
        if step > 0 and running > limit:
            over += 1
    return over


# -- weights 4:1 ----------------------------------------------------------------------------------


def _weighted(ctx: Context, workers: list[Child], claims: int) -> dict[str, Any]:
    heavy, light = WEIGHTED
    with ctx.connect() as conn:
        _fresh(conn)
        conn.execute(
            "INSERT INTO notifyq.fair_weights (fair_key, weight) VALUES (%s, %s)",
            [heavy, WEIGHT],
        )
        # Both keys in one statement: their lanes open at the same commit.
        conn.execute(
            "INSERT INTO notifyq.jobs (task, payload, max_attempts, fair_key) "
            "SELECT %s, jsonb_build_object('key', k), 1, k "
            "FROM generate_series(1, %s) AS g, "
            "LATERAL (SELECT CASE WHEN g %% 2 = 0 THEN %s ELSE %s END) AS l(k) ORDER BY g",
            [NOOP, 2 * claims, heavy, light],
        )
        _wait(conn, workers, "SELECT count(*) FROM notifyq.jobs_done", claims, "weighted jobs done")
        row = conn.execute(
            "WITH gone AS (DELETE FROM ONLY notifyq.jobs WHERE status = 'queued' "
            "RETURNING fair_key) "
            "SELECT count(*) FILTER (WHERE fair_key = %s), count(*) FILTER (WHERE fair_key = %s) "
            "FROM gone",
            [heavy, light],
        ).fetchone()
        assert row is not None
        heavy_left, light_left = row
        _wait_none(conn, workers, COUNT_PROCESSING, "weighted jobs running")
        window = [
            key
            for (key,) in conn.execute(
                "SELECT payload->>'key' FROM notifyq.jobs WHERE started_at IS NOT NULL "
                "ORDER BY started_at, id LIMIT %s",
                [claims],
            )
        ]
    if len(window) != claims:
        raise BenchError(f"{len(window)} of {claims} weighted jobs started")
    taken = window.count(heavy)
    return {
        "claims": claims,
        "heavy": taken,
        "light": window.count(light),
        "share_pct": 100 * taken / claims,
        # Both keys still had jobs queued after the window (each had as many as it holds).
        "heavy_left": heavy_left,
        "light_left": light_left,
    }


# -- throughput with and without keys -----------------------------------------------------------


def _drain(ctx: Context, workers: list[Child], jobs: int, keys: int) -> dict[str, Any]:
    """``jobs`` no-op jobs inserted in one transaction (each with one of ``keys`` fair keys, or
    none), drained; jobs/s from the first claim to the last completion, read from the table."""
    with ctx.connect() as conn:
        _fresh(conn, vacuum=True)
        if keys:
            conn.execute(
                "INSERT INTO notifyq.jobs (task, payload, max_attempts, fair_key) "
                "SELECT %s, '{}'::jsonb, 1, 'k' || (g %% %s) "
                "FROM generate_series(1, %s) AS g ORDER BY g",
                [NOOP, keys, jobs],
            )
        else:
            conn.execute(
                "INSERT INTO notifyq.jobs (task, payload, max_attempts) "
                "SELECT %s, '{}'::jsonb, 1 FROM generate_series(1, %s)",
                [NOOP, jobs],
            )
        _wait(conn, workers, "SELECT count(*) FROM notifyq.jobs_done", jobs, "no-op jobs done")
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'completed'), "
            "extract(epoch FROM max(finished_at) - min(started_at))::float8, "
            "count(DISTINCT (worker_id, started_at)) "
            "FROM notifyq.jobs_done"
        ).fetchone()
    assert row is not None
    completed, span, claims = row
    if completed != jobs:
        raise BenchError(f"{completed} of {jobs} no-op jobs completed")
    return {
        "jobs": jobs,
        "keys": keys,
        "seconds": span,
        "jobs_per_s": jobs / span if span else float("nan"),
        "jobs_per_claim": jobs / claims if claims else float("nan"),
    }


# -- helpers ---------------------------------------------------------------------------------


def _count(conn: psycopg.Connection[Any], query: str, params: list[Any] | None = None) -> int:
    row = conn.execute(query, params).fetchone()
    return int(row[0]) if row else 0


def _check(workers: list[Child]) -> None:
    for worker in workers:
        worker.check_alive()


def _wait(
    conn: psycopg.Connection[Any],
    workers: list[Child],
    query: str,
    count: int,
    what: str,
    params: list[Any] | None = None,
    *,
    timeout: float = 300.0,
) -> None:
    deadline = time.monotonic() + timeout
    while (found := _count(conn, query, params)) < count:
        _check(workers)
        if time.monotonic() > deadline:
            raise BenchError(f"{found} of {count} {what} after {timeout:.0f}s")
        time.sleep(0.02)


def _wait_none(conn: psycopg.Connection[Any], workers: list[Child], query: str, what: str) -> None:
    deadline = time.monotonic() + 60.0
    while (found := _count(conn, query)) > 0:
        _check(workers)
        if time.monotonic() > deadline:
            raise BenchError(f"{found} {what} still after 60s")
        time.sleep(0.02)


def _add_figures(ctx: Context, raw: dict[str, Any]) -> None:
    ctx.results.add(
        Figure(
            "fair.pickup_beside_flood.p99",
            NAME,
            f"one job each of keys B-J beside {raw['flood_jobs']:,} of key A: commit → handler "
            f"start, p99 ({WORKERS} workers x {SLOTS}, all busy with A)",
            "ms",
            [run["p99_ms"] for run in raw["beside_flood"]],
            Target("<=", 50.0),
        )
    )
    capped = raw["capped"]
    ctx.results.add(
        Figure(
            "fair.key_concurrency.peak",
            NAME,
            f"key_concurrency={PER_KEY_LIMIT}, {WORKERS} workers x {SLOTS}, "
            f"{raw['capped_jobs']:,} jobs over {CAPPED_KEYS} keys: most of one key running "
            f"at once ({sum(run['moments_over_limit'] for run in capped)} moments above "
            f"{PER_KEY_LIMIT})",
            "jobs",
            [float(run["peak"]) for run in capped],
            Target("<=", float(PER_KEY_LIMIT)),
            note="the handlers' start and end on the host's monotonic clock, per key",
        )
    )
    shares = [run["share_pct"] for run in raw["weighted"]]
    ctx.results.add(
        Figure(
            "fair.weighted_share",
            NAME,
            f"weights {WEIGHT:g}:1, both keys backlogged, {raw['weighted_claims']:,} claims: "
            f"key A's share ({median(shares):.1f} %) off {SHARE:g} % by",
            "pp",
            [abs(share - SHARE) for share in shares],
            Target("<=", SHARE_SPREAD),
            note="key A's share of the first jobs to start, in started_at order; the shares: "
            + ", ".join(f"{share:.2f} %" for share in shares),
        )
    )
    keyed = [run["jobs_per_s"] for run in raw["keyed"]]
    plain = [run["jobs_per_s"] for run in raw["plain"]]
    ctx.results.add(
        Figure(
            "fair.throughput_ratio",
            NAME,
            f"claim throughput, a fair_key on every job ({THROUGHPUT_KEYS} keys) / no keys "
            f"({raw['drain_jobs']:,} no-op jobs, {WORKERS} workers x {SLOTS})",
            RATIO,
            [a / b for a, b in zip(keyed, plain, strict=True)],
            Target(">=", 0.8),
            note="each ratio pairs two drains run in turns, each on a vacuumed table",
        )
    )


SCENARIO = Scenario(NAME, run, lambda repeat, s: 4 * repeat)
