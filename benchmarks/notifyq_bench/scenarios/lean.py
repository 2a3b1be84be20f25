"""``lean``: notifyq against the lean floor (:mod:`notifyq_bench.lean`), the reference of the
storage issue, taking turns with it round by round in the same run.

Each round, for the lean floor and notifyq in turn (each going first every other round):
a full queue drained in the shapes 1 process x 50 slots, 2 x 50 and 1 x 1, the queue filled by
``INSERT ... SELECT`` statements of 10,000 rows in one transaction (so every consumer wakes at
its commit); one ``INSERT ... SELECT`` of ``bulk_rows`` rows with no consumer running; and, on
the 1 x 50 drain, the WAL bytes and commits that each job cost from its enqueue to its end.
Then pickup latency, commit to handler start, of an idle 1 x 50 consumer at 20 jobs/s and of
100 jobs back to back. notifyq's jobs are inserted as a psql user would, naming only the task
and the payload. Every figure of notifyq is shown with the lean floor's of the same rounds
and as a ratio to it, against the storage issue's targets.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from notifyq_bench import lean
from notifyq_bench.harness import BenchError, Child, child_env, poll_until
from notifyq_bench.peers.base import STAMP_LINE
from notifyq_bench.report import RATIO, Figure, Target
from notifyq_bench.scenarios.context import WORKER_CONCURRENCY, Context, Scenario
from notifyq_bench.scenarios.measure import pickup, settle
from notifyq_bench.stats import percentiles
from notifyq_bench.tasks import NOOP

IDLE_RATE = 20.0
#: (key suffix, processes, slots a process), as the ``throughput`` scenario's shapes.
SHAPES = (("one", 1, WORKER_CONCURRENCY), ("two", 2, WORKER_CONCURRENCY), ("single", 1, 1))
LEAN = "lean floor"


@dataclass(frozen=True)
class Side:
    """One of the two queues measured: how to fill, count and time its table."""

    name: str
    table: str
    #: One chunk of the fill: ``%s`` rows.
    fill: str
    #: The bulk insert of the ``bulk`` figure: ``%s`` rows.
    bulk: str
    queued: str
    running: str
    done: str


LEAN_SIDE = Side(
    "lean",
    "lean_jobs",
    "INSERT INTO lean_jobs (payload) SELECT '{}'::jsonb FROM generate_series(1, %s)",
    "INSERT INTO lean_jobs (payload) "
    "SELECT jsonb_build_object('n', n) FROM generate_series(1, %s) AS n",
    "queued",
    "running",
    "done",
)
NOTIFYQ_SIDE = Side(
    "notifyq",
    "notifyq.jobs",
    f"INSERT INTO notifyq.jobs (task, payload) SELECT '{NOOP}', '{{}}'::jsonb "
    "FROM generate_series(1, %s)",
    f"INSERT INTO notifyq.jobs (task, payload) SELECT '{NOOP}', jsonb_build_object('n', n) "
    "FROM generate_series(1, %s) AS n",
    "queued",
    "processing",
    "completed",
)


def install(conn: psycopg.Connection[Any]) -> None:
    """The lean floor's table in the scratch database, as its reference text gives it."""
    row = conn.execute("SELECT to_regclass('public.lean_jobs') IS NOT NULL").fetchone()
    if not (row and row[0]):
        conn.execute(lean.SCHEMA.encode())


def start_lean(ctx: Context, slots: int, count: int = 1) -> list[Child]:
    """``count`` lean floor processes of ``slots`` slots, returned once every one listens."""
    loops = [
        ctx.children.start(
            f"lean{index}-s{slots}",
            [sys.executable, "-m", "notifyq_bench.lean", ctx.url, "--slots", str(slots)],
            child_env(),
        )
        for index in range(count)
    ]
    for loop in loops:
        loop.wait_for(r"\bready\b")
    return loops


def _start(ctx: Context, side: Side, processes: int, slots: int) -> list[Child]:
    if side is LEAN_SIDE:
        return start_lean(ctx, slots, processes)
    return ctx.start_workers(processes, slots)


def _wal_lsn(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def _commits(conn: psycopg.Connection[Any]) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


def drain(ctx: Context, side: Side, jobs: int, processes: list[Child]) -> dict[str, Any]:
    """Fills ``side``'s table with ``jobs`` jobs in one transaction, waits until every one is
    done, and answers jobs/s from the first claim to the last completion as the table records
    them, with the WAL written from the fill's start to the last completion, per job."""
    table = sql.SQL(side.table)
    with ctx.connect() as conn:
        conn.execute(sql.SQL("TRUNCATE {}").format(table))
        settle(conn)
        lsn_before = _wal_lsn(conn)
        with conn.transaction():
            for start in range(0, jobs, lean.CHUNK):
                conn.execute(side.fill.encode(), [min(lean.CHUNK, jobs - start)])
        left = sql.SQL(
            "SELECT EXISTS (SELECT 1 FROM {t} WHERE status = {q}) "
            "OR EXISTS (SELECT 1 FROM {t} WHERE status = {r})"
        ).format(t=table, q=sql.Literal(side.queued), r=sql.Literal(side.running))
        deadline = time.monotonic() + max(120.0, jobs / 100)
        while (row := conn.execute(left).fetchone()) and row[0]:
            for child in processes:
                child.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"{side.name}: {jobs} jobs were not done in time")
            time.sleep(0.05)
        row = conn.execute(
            sql.SQL(
                "SELECT count(*) FILTER (WHERE status = {d}), count(*), "
                "extract(epoch FROM max(finished_at) - min(started_at))::float8, "
                "pg_wal_lsn_diff(pg_current_wal_insert_lsn(), {lsn}::pg_lsn)::float8 FROM {t}"
            ).format(d=sql.Literal(side.done), lsn=sql.Literal(lsn_before), t=table)
        ).fetchone()
    assert row is not None
    completed, total, span, wal = row
    if completed != jobs or total != jobs:
        raise BenchError(f"{side.name}: {completed} of {jobs} jobs done ({total} rows)")
    return {
        "jobs": jobs,
        "seconds": span,
        "jobs_per_s": jobs / span if span else float("nan"),
        "wal_bytes_per_job": wal / jobs,
    }


def bulk(ctx: Context, side: Side, rows: int) -> dict[str, Any]:
    """One ``INSERT ... SELECT`` of ``rows`` jobs into an empty table, no consumer running."""
    with ctx.connect() as conn:
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(side.table)))
        settle(conn)
        started = time.perf_counter()
        with conn.transaction():
            conn.execute(side.bulk.encode(), [rows])
        seconds = time.perf_counter() - started
    return {"rows": rows, "seconds": seconds, "jobs_per_s": rows / seconds}


def lean_pickup(ctx: Context, loop: Child, count: int, rate: float | None) -> dict[str, Any]:
    """Inserts ``count`` stamp jobs into ``lean_jobs``, one per transaction, ``rate`` a second
    (None: back to back), and answers the commit-to-handler-start latencies in ms."""
    keys = [uuid.uuid4().hex for _ in range(count)]
    commits: dict[str, float] = {}
    with ctx.connect() as conn:
        conn.execute("TRUNCATE lean_jobs")
        time.sleep(0.2)  # as notifyq's worker is given after its TRUNCATE
        start = time.perf_counter() + 0.05
        for index, key in enumerate(keys):
            if rate is not None:
                delay = start + index / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            conn.execute(
                "INSERT INTO lean_jobs (payload) VALUES (jsonb_build_object('k', %s::text))",
                [key],
                prepare=True,
            )
            commits[key] = time.time()  # autocommit: execute returns once the COMMIT is done
    stamps: dict[str, float] = {}

    def all_stamped() -> bool:
        loop.check_alive()
        text = loop.log_path.read_text(errors="replace")
        stamps.update((key, float(t)) for key, t in STAMP_LINE.findall(text))
        return all(key in stamps for key in keys)

    poll_until(all_stamped, 60.0, f"{count} lean floor stamp jobs")
    latencies = [(stamps[key] - commits[key]) * 1000 for key in keys]
    p50, p95, p99 = percentiles(latencies)
    return {"jobs": count, "rate": rate, "p50_ms": p50, "p95_ms": p95, "p99_ms": p99}


def run(ctx: Context) -> None:
    """The lean floor and notifyq in turns: drains, bulk inserts, pickup latency."""
    s = ctx.sizes
    raw: dict[str, Any] = {
        side.name: {"bulk": [], "idle": [], "burst": [], **{key: [] for key, _, _ in SHAPES}}
        for side in (LEAN_SIDE, NOTIFYQ_SIDE)
    }
    raw["jobs"], raw["single_jobs"], raw["bulk_rows"] = s.drain_jobs, s.single_jobs, s.bulk_rows
    with ctx.connect() as conn:
        install(conn)
    for r in range(ctx.repeat):
        sides = (LEAN_SIDE, NOTIFYQ_SIDE) if r % 2 == 0 else (NOTIFYQ_SIDE, LEAN_SIDE)
        for key, processes, slots in SHAPES:
            jobs = s.single_jobs if slots == 1 else s.drain_jobs
            for side in sides:
                what = f"{side.name} {processes} x {slots}"
                ctx.step(f"{what}: draining {jobs:,} jobs, round {r + 1} of {ctx.repeat}")
                procs = _start(ctx, side, processes, slots)
                try:
                    with ctx.connect() as conn:
                        commits_before = _commits(conn)
                    result = drain(ctx, side, jobs, procs)
                finally:
                    ctx.children.stop(*procs)
                # The consumers' backends have exited, so their counts are in the statistics.
                with ctx.connect() as conn:
                    result["commits_per_job"] = (_commits(conn) - commits_before) / jobs
                raw[side.name][key].append(result)
                ctx.done()
        for side in sides:
            ctx.step(f"{side.name}: INSERT ... SELECT of {s.bulk_rows:,} jobs, round {r + 1}")
            raw[side.name]["bulk"].append(bulk(ctx, side, s.bulk_rows))
            ctx.done()
    idle_count = max(1, int(s.idle_seconds * IDLE_RATE))
    for side in (LEAN_SIDE, NOTIFYQ_SIDE):
        ctx.step(f"{side.name}: starting a 1 x {WORKER_CONCURRENCY} consumer for pickups")
        procs = _start(ctx, side, 1, WORKER_CONCURRENCY)
        try:
            for r in range(ctx.repeat):
                ctx.step(f"{side.name}: {idle_count} jobs at {IDLE_RATE:g}/s, repeat {r + 1}")
                raw[side.name]["idle"].append(_pickup(ctx, side, procs, idle_count, IDLE_RATE))
                ctx.done()
                ctx.step(f"{side.name}: {s.burst} jobs back to back, repeat {r + 1}")
                raw[side.name]["burst"].append(_pickup(ctx, side, procs, s.burst, None))
                ctx.done()
        finally:
            ctx.children.stop(*procs)
    with ctx.connect() as conn:
        conn.execute("TRUNCATE lean_jobs, notifyq.jobs")
    if ctx.peers:
        raw["peers"] = _peers(ctx, idle_count)
    ctx.results.raw["lean"] = raw
    _add_figures(ctx, raw)


def _peers(ctx: Context, idle_count: int) -> dict[str, Any]:
    """With ``--peers``: each installed peer's drains in the same shapes and its idle pickup,
    on a scratch database of its own, measured as the ``throughput`` scenario measures them
    (from the enqueue's commit until no job is left), to be divided by the lean floor."""
    s = ctx.sizes
    out: dict[str, Any] = {}
    for peer in ctx.peers:
        ctx.step(f"{peer.label()}: creating its scratch database")
        url = ctx.scratch_url(f"_{peer.name}_lean")
        asyncio.run(peer.install(url))
        runs: dict[str, Any] = {"label": peer.label(), "idle": []}
        for r in range(ctx.repeat):
            for key, processes, slots in SHAPES:
                jobs = s.single_jobs if slots == 1 else s.peer_jobs
                ctx.step(f"{peer.label()} {processes} x {slots}: {jobs:,} jobs, round {r + 1}")
                procs = peer.start_workers(ctx.children, url, processes, slots)
                try:
                    runs.setdefault(key, []).append(peer.drain(url, jobs, procs))
                finally:
                    ctx.children.stop(*procs)
        procs = peer.start_workers(ctx.children, url, 1, WORKER_CONCURRENCY)
        try:
            for r in range(ctx.repeat):
                ctx.step(f"{peer.label()}: {idle_count} jobs at {IDLE_RATE:g}/s, repeat {r + 1}")
                runs["idle"].append(peer.pickup(url, idle_count, IDLE_RATE, procs))
        finally:
            ctx.children.stop(*procs)
        out[peer.name] = runs
    return out


def _pickup(
    ctx: Context, side: Side, procs: list[Child], count: int, rate: float | None
) -> dict[str, Any]:
    if side is LEAN_SIDE:
        return lean_pickup(ctx, procs[0], count, rate)
    run = pickup(ctx, sql.SQL(side.table), count, rate)
    return {key: value for key, value in run.items() if key != "latencies_ms"}


def _values(runs: list[dict[str, Any]], field: str) -> list[float]:
    return [float(run[field]) for run in runs]


def _add_figures(ctx: Context, raw: dict[str, Any]) -> None:
    lean_runs, notifyq_runs = raw[LEAN_SIDE.name], raw[NOTIFYQ_SIDE.name]

    def pair(key: str, label: str, unit: str, runs: str, field: str, target: Target) -> None:
        """notifyq's figure beside the lean floor's, and their ratio, round by round."""
        ours, floor = _values(notifyq_runs[runs], field), _values(lean_runs[runs], field)
        ctx.results.add(Figure(f"lean.{key}", "lean", label, unit, ours, None, floor, LEAN))
        ctx.results.add(
            Figure(
                f"lean.{key}_vs_lean",
                "lean",
                f"  {label.split(',')[0].split(' of ')[0]} / lean floor",
                RATIO,
                [a / b for a, b in zip(ours, floor, strict=True)],
                target,
            )
        )

    single = raw["single_jobs"]
    pair("one", "throughput, 1 process x 50", "jobs/s", "one", "jobs_per_s", Target(">=", 0.8))
    pair("two", "throughput, 2 processes x 50", "jobs/s", "two", "jobs_per_s", Target(">=", 0.8))
    pair(
        "single",
        f"throughput, 1 process x 1 ({single:,} jobs)",
        "jobs/s",
        "single",
        "jobs_per_s",
        Target(">=", 0.8),
    )
    for who, runs in ((LEAN, lean_runs), ("notifyq", notifyq_runs)):
        one, two = _values(runs["one"], "jobs_per_s"), _values(runs["two"], "jobs_per_s")
        ctx.results.add(
            Figure(
                f"lean.scaling.{'lean' if who == LEAN else 'notifyq'}",
                "lean",
                f"throughput, 2 processes / 1 process at x 50, {who}",
                RATIO,
                [a / b for a, b in zip(two, one, strict=True)],
                Target(">=", 1.5) if who == "notifyq" else None,
            )
        )
    pair(
        "bulk",
        f"bulk INSERT ... SELECT of {raw['bulk_rows']:,} jobs",
        "jobs/s",
        "bulk",
        "jobs_per_s",
        Target(">=", 0.5),
    )
    pair("idle_p99", "pickup, idle, 20 jobs/s, p99", "ms", "idle", "p99_ms", Target("<=", 1.3))
    pair("burst_p99", "pickup, burst of 100, p99", "ms", "burst", "p99_ms", Target("<=", 1.3))
    for point in ("p50",):
        ctx.results.add(
            Figure(
                f"lean.idle_{point}",
                "lean",
                f"pickup, idle, 20 jobs/s, {point}",
                "ms",
                _values(notifyq_runs["idle"], f"{point}_ms"),
                None,
                _values(lean_runs["idle"], f"{point}_ms"),
                LEAN,
            )
        )
    pair(
        "wal",
        "WAL bytes a job, enqueue to end, 1 x 50",
        "B",
        "one",
        "wal_bytes_per_job",
        Target("<=", 2.0),
    )
    ctx.results.add(
        Figure(
            "lean.commits",
            "lean",
            "commits a job, enqueue to end, 1 x 50",
            "",
            _values(notifyq_runs["one"], "commits_per_job"),
            None,
            _values(lean_runs["one"], "commits_per_job"),
            LEAN,
        )
    )
    _add_peer_figures(ctx, raw)


def _add_peer_figures(ctx: Context, raw: dict[str, Any]) -> None:
    """Each peer's throughput and idle pickup beside the lean floor's."""
    lean_runs = raw[LEAN_SIDE.name]
    for name, peer in raw.get("peers", {}).items():
        for key, processes, slots in SHAPES:
            ctx.results.add(
                Figure(
                    f"lean.peer.{name}.{key}",
                    "lean",
                    f"throughput, {peer['label']}, {processes} x {slots}",
                    "jobs/s",
                    _values(peer[key], "jobs_per_s"),
                    None,
                    _values(lean_runs[key], "jobs_per_s"),
                    LEAN,
                    note="timed from the enqueue's commit until the bench saw no job left",
                )
            )
        ctx.results.add(
            Figure(
                f"lean.peer.{name}.idle_p99",
                "lean",
                f"pickup, {peer['label']}, idle, 20 jobs/s, p99",
                "ms",
                _values(peer["idle"], "p99_ms"),
                None,
                _values(lean_runs["idle"], "p99_ms"),
                LEAN,
            )
        )


SCENARIO = Scenario("lean", run, lambda repeat, s: repeat * (2 * len(SHAPES) + 2) + 4 * repeat)
