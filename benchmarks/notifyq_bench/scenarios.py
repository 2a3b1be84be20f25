"""The scenarios. Each takes the :class:`Context`, measures, and adds figures and raw data.

Timing rules they share: workers, servers and the bare loop are started first and waited for
("ready" in their log, or a health check), and only then does the clock start; throughput is
taken from the table itself (first ``started_at`` to last ``finished_at``), so neither process
start nor the bench's own polling counts; pickup latency is the handler's wall-clock stamp minus
the time the submitter's COMMIT returned, both on this host.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql

from notifyq_bench.harness import (
    BenchError,
    Child,
    Children,
    Progress,
    child_env,
    free_port,
    poll_until,
    postgres_cpu,
    wait_http,
)
from notifyq_bench.report import RATIO, Figure, Results, Target
from notifyq_bench.stats import median, percentiles
from notifyq_bench.tasks import NOOP, STAMP

TASKS_MODULE = "notifyq_bench.tasks"
NOTIFYQ_JOBS = sql.SQL("notifyq.jobs")
BARE_JOBS = sql.SQL("bench.jobs")
WORKER_CONCURRENCY = 50
IDLE_RATE = 20.0
API_RATE = 300.0
API_BODY = json.dumps({"task": NOOP, "payload": {"n": 1}})


@dataclass(frozen=True)
class Sizes:
    """How much each scenario does; ``--quick`` shrinks everything."""

    idle_seconds: float
    burst: int
    drain_jobs: int
    memory_jobs: int
    api_seconds: float
    api_connections: int
    batch_calls: int
    batch_size: int
    insert_seconds: float
    history_rows: int
    history_queued: int
    claim_reps: int
    levels: tuple[int, ...]
    level_jobs_per_slot: int
    bare_batch: int

    @classmethod
    def of(cls, quick: bool) -> Sizes:
        if quick:
            return cls(
                idle_seconds=2.0,
                burst=100,
                drain_jobs=5_000,
                memory_jobs=3_000,
                api_seconds=2.0,
                api_connections=32,
                batch_calls=5,
                batch_size=1_000,
                insert_seconds=2.0,
                history_rows=100_000,
                history_queued=1_000,
                claim_reps=100,
                levels=(1, 50),
                level_jobs_per_slot=40,
                bare_batch=500,
            )
        return cls(
            idle_seconds=10.0,
            burst=100,
            drain_jobs=50_000,
            memory_jobs=20_000,
            api_seconds=6.0,
            api_connections=32,
            batch_calls=50,
            batch_size=1_000,
            insert_seconds=6.0,
            history_rows=1_000_000,
            history_queued=1_000,
            claim_reps=500,
            levels=(1, 10, 50, 100),
            level_jobs_per_slot=200,
            bare_batch=500,
        )


@dataclass
class Context:
    """What every scenario needs: the scratch database, the processes, the results."""

    url: str
    scratch_url: Callable[[str], str]
    repeat: int
    sizes: Sizes
    children: Children
    progress: Progress
    results: Results
    workdir: Path
    _servers: dict[str, int] = field(default_factory=dict)
    servers: dict[str, Child] = field(default_factory=dict)

    def connect(self, url: str | None = None, **kwargs: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(url or self.url, autocommit=True, **kwargs)

    def step(self, what: str) -> None:
        self.progress.show(what)

    def done(self, what: str = "") -> None:
        self.progress.advance()
        if what:
            self.progress.show(what)

    def note(self, text: str) -> None:
        self.results.notes.append(text)
        self.progress.say("note: " + text)

    # -- processes -------------------------------------------------------------------------

    def start_workers(
        self, count: int, concurrency: int, url: str | None = None, **env: str
    ) -> list[Child]:
        """``count`` worker processes, returned once every one logged that it is ready."""
        workers = []
        for index in range(count):
            workers.append(
                self.children.start(
                    f"worker{index}-c{concurrency}",
                    [
                        sys.executable,
                        "-m",
                        "notifyq",
                        "worker",
                        "--import",
                        TASKS_MODULE,
                        "--concurrency",
                        str(concurrency),
                    ],
                    child_env(
                        DATABASE_URL=url or self.url,
                        NOTIFYQ_LOG_LEVEL="INFO",
                        NOTIFYQ_SHUTDOWN_GRACE="1",
                        **env,
                    ),
                )
            )
        for worker in workers:
            worker.wait_for(r"\bready\b")
        return workers

    def start_bare_loop(self, batch: int | None = None) -> Child:
        child = self.children.start(
            "bare-loop",
            [
                sys.executable,
                "-m",
                "notifyq_bench.bare",
                self.url,
                "--batch",
                str(batch or self.sizes.bare_batch),
            ],
            child_env(),
        )
        child.wait_for(r"\bready\b")
        return child

    def notifyq_api(self) -> int:
        """The port of ``notifyq serve --no-worker`` on the scratch database (one uvicorn
        process), started on first use."""
        if "notifyq" not in self._servers:
            port = free_port()
            child = self.children.start(
                "notifyq-api",
                [
                    sys.executable,
                    "-m",
                    "notifyq",
                    "serve",
                    "--no-worker",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                ],
                child_env(DATABASE_URL=self.url, NOTIFYQ_LOG_LEVEL="WARNING"),
            )
            wait_http(port, "/health", child)
            self._servers["notifyq"] = port
            self.servers["notifyq"] = child
        return self._servers["notifyq"]

    def bare_api(self) -> int:
        """The port of the bare FastAPI endpoint (one uvicorn process), started on first use."""
        if "bare" not in self._servers:
            port = free_port()
            child = self.children.start(
                "bare-api",
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "notifyq_bench.bare_api:create_app",
                    "--factory",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                ],
                child_env(NOTIFYQ_BENCH_CONNINFO=self.url),
            )
            wait_http(port, "/health", child)
            self._servers["bare"] = port
            self.servers["bare"] = child
        return self._servers["bare"]

    def stop_everything(self) -> None:
        self.children.stop_all()
        self._servers.clear()
        self.servers.clear()


# -- shared measurements ------------------------------------------------------------------------


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


def drain(ctx: Context, table: sql.Composable, jobs: int, processes: list[Child]) -> dict[str, Any]:
    """Inserts ``jobs`` no-op jobs in one transaction (so every worker wakes at its commit),
    waits until they are all done, and answers jobs/s from the first claim to the last
    completion as the table records them."""
    with ctx.connect() as conn:
        truncate(conn, table)
        settle(conn)
        cpu_before = [child.cpu() or 0.0 for child in processes]
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (task, payload, max_attempts) "
                "SELECT %s, '{{}}'::jsonb, 1 FROM generate_series(1, %s)"
            ).format(table),
            [NOOP, jobs],
        )
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


# -- latency --------------------------------------------------------------------------------------


def latency(ctx: Context) -> None:
    """Pickup latency, commit to handler start: an idle worker receiving 20 jobs/s, and 100 jobs
    submitted back to back; the bare loop in the same conditions is the floor."""
    s = ctx.sizes
    idle_count = max(1, int(s.idle_seconds * IDLE_RATE))
    raw: dict[str, Any] = {
        "idle": {"notifyq": [], "bare": []},
        "burst": {"notifyq": [], "bare": []},
    }
    for who, table in (("bare", BARE_JOBS), ("notifyq", NOTIFYQ_JOBS)):
        ctx.step(f"starting the {who} worker")
        if who == "bare":
            procs = [ctx.start_bare_loop()]
        else:
            procs = ctx.start_workers(1, WORKER_CONCURRENCY)
        try:
            for r in range(ctx.repeat):
                ctx.step(f"{who}: {idle_count} jobs at {IDLE_RATE:g}/s, repeat {r + 1}")
                raw["idle"][who].append(pickup(ctx, table, idle_count, IDLE_RATE))
                ctx.done()
                ctx.step(f"{who}: {s.burst} jobs back to back, repeat {r + 1}")
                raw["burst"][who].append(pickup(ctx, table, s.burst, None))
                ctx.done()
        finally:
            ctx.children.stop(*procs)
    ctx.results.raw["latency"] = _without_samples(raw)

    def add(kind: str, point: str, label: str, target: float | None) -> None:
        ctx.results.add(
            Figure(
                key=f"latency.{kind}.{point}",
                scenario="latency",
                label=label,
                unit="ms",
                values=[run[f"{point}_ms"] for run in raw[kind]["notifyq"]],
                target=Target("<=", target) if target is not None else None,
                floor=[run[f"{point}_ms"] for run in raw[kind]["bare"]],
                floor_label="bare psycopg loop",
            )
        )

    add("idle", "p50", "pickup latency, idle worker, 20 jobs/s: p50", 2.0)
    add("idle", "p95", "pickup latency, idle worker, 20 jobs/s: p95", None)
    add("idle", "p99", "pickup latency, idle worker, 20 jobs/s: p99", 10.0)
    add("burst", "p50", f"pickup latency, {s.burst} jobs back to back: p50", None)
    add("burst", "p99", f"pickup latency, {s.burst} jobs back to back: p99", 15.0)


def _without_samples(raw: Any) -> Any:
    """Raw results with each run's latency samples replaced by a compact histogram-free
    summary (the percentiles stay), so the JSON stays small."""
    if isinstance(raw, dict):
        return {
            k: (sorted(round(x, 3) for x in v) if k == "latencies_ms" else _without_samples(v))
            for k, v in raw.items()
        }
    if isinstance(raw, list):
        return [_without_samples(v) for v in raw]
    return raw


# -- throughput ----------------------------------------------------------------------------------


def throughput(ctx: Context) -> None:
    """A queue of N no-op jobs drained by the bare loop (claiming 500 at a time: the floor; and
    50 at a time: as many jobs in flight as the worker), then by one worker process at
    concurrency 50, then by two. The four take turns, round after round, each with processes
    of its own: a ratio pairs runs of one round, seconds apart, so the machine's drift over the
    scenario (other tenants, autovacuum, the page cache) does not land on one side of it."""
    jobs = ctx.sizes.drain_jobs
    raw: dict[str, Any] = {
        "jobs": jobs,
        "bare_batch": ctx.sizes.bare_batch,
        "bare": [],
        "bare_c": [],
        "one": [],
        "two": [],
    }
    runs = (
        ("bare", f"bare loop, batch {ctx.sizes.bare_batch}"),
        ("bare_c", f"bare loop, batch {WORKER_CONCURRENCY}"),
        ("one", "1 worker"),
        ("two", "2 workers"),
    )
    for r in range(ctx.repeat):
        for who, label in runs:
            ctx.step(f"{label}: starting, round {r + 1} of {ctx.repeat}")
            if who == "bare":
                procs = [ctx.start_bare_loop()]
            elif who == "bare_c":
                procs = [ctx.start_bare_loop(WORKER_CONCURRENCY)]
            else:
                procs = ctx.start_workers(1 if who == "one" else 2, WORKER_CONCURRENCY)
            table = NOTIFYQ_JOBS if who in ("one", "two") else BARE_JOBS
            try:
                ctx.step(f"{label}: draining {jobs:,} jobs, round {r + 1} of {ctx.repeat}")
                raw[who].append(drain(ctx, table, jobs, procs))
            finally:
                ctx.children.stop(*procs)
            ctx.done()
    bare = [run["jobs_per_s"] for run in raw["bare"]]
    one = [run["jobs_per_s"] for run in raw["one"]]
    two = [run["jobs_per_s"] for run in raw["two"]]
    raw["bare_jobs_per_s"] = bare
    ctx.results.raw["throughput"] = raw
    add = ctx.results.add
    add(
        Figure(
            "throughput.bare",
            "throughput",
            f"throughput, bare psycopg loop, batch {ctx.sizes.bare_batch} (floor)",
            "jobs/s",
            bare,
        )
    )
    add(
        Figure(
            "throughput.bare_c",
            "throughput",
            f"throughput, bare psycopg loop, batch {WORKER_CONCURRENCY}",
            "jobs/s",
            [run["jobs_per_s"] for run in raw["bare_c"]],
            note="as many jobs in flight as a worker at concurrency 50",
        )
    )
    add(
        Figure(
            "throughput.one",
            "throughput",
            f"throughput, 1 worker process, concurrency {WORKER_CONCURRENCY}",
            "jobs/s",
            one,
            Target(">=", 10_000),
            bare,
            "bare psycopg loop",
        )
    )
    add(
        Figure(
            "throughput.one_cpu",
            "throughput",
            "  worker CPU per job (1 worker)",
            "us",
            [run["consumer_cpu_us_per_job"] for run in raw["one"]],
            None,
            [run["consumer_cpu_us_per_job"] for run in raw["bare_c"]],
            "bare loop, batch 50",
            note="user+system CPU of the worker process over the drain, per job",
        )
    )
    add(
        Figure(
            "throughput.one_vs_bare",
            "throughput",
            "throughput, 1 worker / bare loop",
            RATIO,
            [a / b for a, b in zip(one, bare, strict=True)],
            Target(">=", 0.40),
        )
    )
    add(
        Figure(
            "throughput.two",
            "throughput",
            "throughput, 2 worker processes",
            "jobs/s",
            two,
            None,
            bare,
            "bare psycopg loop",
        )
    )
    add(
        Figure(
            "throughput.two_vs_one",
            "throughput",
            "throughput, 2 workers / 1 worker",
            RATIO,
            [a / b for a, b in zip(two, one, strict=True)],
            Target(">=", 1.3),
        )
    )


# -- memory -------------------------------------------------------------------------------------


def memory(ctx: Context) -> None:
    """Peak resident memory (VmRSS, sampled every 50 ms) of one worker process at concurrency
    50 while it drains a queue of no-op jobs."""
    jobs = ctx.sizes.memory_jobs
    raw: list[dict[str, Any]] = []
    for r in range(ctx.repeat):
        ctx.step(
            f"worker at concurrency {WORKER_CONCURRENCY}: draining {jobs:,} jobs, repeat {r + 1}"
        )
        (worker,) = ctx.start_workers(1, WORKER_CONCURRENCY)
        try:
            idle_kb = worker.rss_kb() or 0
            with RssSampler([worker]).running() as sampler:
                run = drain(ctx, NOTIFYQ_JOBS, jobs, [worker])
            run["idle_rss_mb"] = kb_to_mb(idle_kb)
            run["peak_rss_mb"] = kb_to_mb(sampler.peak_kb[worker.pid])
            run["hwm_mb"] = kb_to_mb(worker.rss_kb("VmHWM") or 0)
            raw.append(run)
        finally:
            ctx.children.stop(worker)
        ctx.done()
    ctx.results.raw["memory"] = raw
    ctx.results.add(
        Figure(
            "memory.idle",
            "memory",
            "worker RSS, idle after start",
            "MB",
            [run["idle_rss_mb"] for run in raw],
        )
    )
    ctx.results.add(
        Figure(
            "memory.peak",
            "memory",
            f"worker RSS, peak under load at concurrency {WORKER_CONCURRENCY}",
            "MB",
            [run["peak_rss_mb"] for run in raw],
            Target("<=", 100),
        )
    )


# -- api ------------------------------------------------------------------------------------------


def _wrk(port: int, seconds: float, connections: int, workdir: Path) -> dict[str, Any]:
    script = workdir / "post.lua"
    body = API_BODY.replace("\\", "\\\\").replace('"', '\\"')
    script.write_text(
        'wrk.method = "POST"\n'
        f'wrk.body = "{body}"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    url = f"http://127.0.0.1:{port}/jobs"
    wrk = shutil.which("wrk") or "wrk"
    # A short unmeasured run first, so pools are full and code paths warm.
    warm = subprocess.run(
        [wrk, "-t1", f"-c{connections}", "-d1s", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    warm_total = re.search(r"(\d+) requests in", warm)
    out = subprocess.run(
        [
            wrk,
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 30,
    ).stdout
    total = re.search(r"(\d+) requests in ([\d.]+)(\w+)", out)
    if total is None:
        raise BenchError("could not read wrk's output:\n" + out)
    scale = {"s": 1.0, "ms": 0.001, "m": 60.0}.get(total.group(3), 1.0)
    elapsed = float(total.group(2)) * scale
    requests = int(total.group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    not_ok = int(bad.group(1)) if bad else 0
    socket_errors = sum(int(g) for g in errors.groups()) if errors else 0
    return {
        "tool": "wrk",
        "requests": requests,
        "ok": requests - not_ok,
        "not_ok": not_ok,
        "socket_errors": socket_errors,
        "seconds": elapsed,
        "rate": (requests - not_ok) / elapsed,
        "all_requests": requests + (int(warm_total.group(1)) if warm_total else 0),
    }


def _loadgen(workdir: Path, port: int, seconds: float, mode: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "notifyq_bench.loadgen",
            "http",
            "--port",
            str(port),
            "--body",
            API_BODY,
            "--seconds",
            str(seconds),
            *mode,
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=workdir,
        timeout=seconds + 60,
    )
    if out.returncode != 0:
        raise BenchError("the load generator failed:\n" + out.stderr[-2000:])
    result: dict[str, Any] = json.loads(out.stdout)
    result["tool"] = "notifyq_bench.loadgen"
    return result


def max_rate(ctx: Context, port: int) -> dict[str, Any]:
    s = ctx.sizes
    if shutil.which("wrk"):
        return _wrk(port, s.api_seconds, s.api_connections, ctx.workdir)
    return _loadgen(
        ctx.workdir, port, s.api_seconds, ["--connections", str(s.api_connections), "--warmup", "1"]
    )


def _server_cpu(run: dict[str, Any], cpu: float, pg_before: float | None) -> None:
    """Adds the CPU per request of the server process and of the database's processes
    (warm-up requests counted in both)."""
    pg_after = postgres_cpu()
    everything = run.get("all_requests") or run.get("requests") or 0
    run["server_cpu_us_per_request"] = cpu / everything * 1e6 if everything else None
    run["postgres_cpu_us_per_request"] = (
        (pg_after - pg_before) / everything * 1e6
        if everything and pg_after is not None and pg_before is not None
        else None
    )


def api(ctx: Context) -> None:
    """Requests/s of POST /jobs on one uvicorn process, against the bare endpoint; p99 latency
    of both at a paced 300 requests/s."""
    ctx.step("starting notifyq serve --no-worker and the bare FastAPI app")
    notifyq_port = ctx.notifyq_api()
    bare_port = ctx.bare_api()
    raw: dict[str, Any] = {
        "tool": "wrk" if shutil.which("wrk") else "notifyq_bench.loadgen",
        "connections": ctx.sizes.api_connections,
        "max": {"notifyq": [], "bare": []},
        "paced": {"notifyq": [], "bare": []},
    }
    targets = (("bare", bare_port, BARE_JOBS), ("notifyq", notifyq_port, NOTIFYQ_JOBS))
    for r in range(ctx.repeat):
        for who, port, table in targets:
            ctx.step(f"{who}: POST /jobs at the maximum rate, repeat {r + 1}")
            with ctx.connect() as conn:
                truncate(conn, table)
                settle(conn)
            before, pg_before = ctx.servers[who].cpu() or 0.0, postgres_cpu()
            run = max_rate(ctx, port)
            _server_cpu(run, (ctx.servers[who].cpu() or 0.0) - before, pg_before)
            if run["ok"] == 0 or run["ok"] < 0.99 * run["requests"]:
                raise BenchError(f"{who}: only {run['ok']} of {run['requests']} requests succeeded")
            raw["max"][who].append(run)
            ctx.done()
        for who, port, table in targets:
            ctx.step(f"{who}: POST /jobs paced at {API_RATE:g}/s, repeat {r + 1}")
            with ctx.connect() as conn:
                truncate(conn, table)
            before, pg_before = ctx.servers[who].cpu() or 0.0, postgres_cpu()
            run = _loadgen(ctx.workdir, port, ctx.sizes.api_seconds, ["--rate", str(API_RATE)])
            _server_cpu(run, (ctx.servers[who].cpu() or 0.0) - before, pg_before)
            if run["ok"] < run["requests"]:
                raise BenchError(f"{who}: {run['requests'] - run['ok']} paced requests failed")
            raw["paced"][who].append(run)
            ctx.done()
    ctx.results.raw["api"] = raw
    bare = [run["rate"] for run in raw["max"]["bare"]]
    ours = [run["rate"] for run in raw["max"]["notifyq"]]
    add = ctx.results.add
    add(Figure("api.bare", "api", "POST /jobs, bare FastAPI + one INSERT (floor)", "req/s", bare))
    add(
        Figure(
            "api.notifyq",
            "api",
            "POST /jobs, one uvicorn process",
            "req/s",
            ours,
            None,
            bare,
            "bare FastAPI endpoint",
        )
    )
    add(
        Figure(
            "api.notifyq_cpu",
            "api",
            "  server CPU per POST /jobs",
            "us",
            [run["server_cpu_us_per_request"] for run in raw["max"]["notifyq"]],
            None,
            [run["server_cpu_us_per_request"] for run in raw["max"]["bare"]],
            "bare FastAPI endpoint",
        )
    )
    add(
        Figure(
            "api.notifyq_vs_bare",
            "api",
            "POST /jobs / bare endpoint",
            RATIO,
            [a / b for a, b in zip(ours, bare, strict=True)],
            Target(">=", 0.75),
        )
    )
    add(
        Figure(
            "api.paced_p99",
            "api",
            f"POST /jobs p99 latency at {API_RATE:g} req/s",
            "ms",
            [run["p99_ms"] for run in raw["paced"]["notifyq"]],
            Target("<=", 10.0),
            [run["p99_ms"] for run in raw["paced"]["bare"]],
            "bare FastAPI endpoint",
        )
    )


# -- batch ----------------------------------------------------------------------------------------


def batch(ctx: Context) -> None:
    """Jobs/s through ``Queue.enqueue_many`` and ``POST /jobs/batch``, 1,000 jobs a call."""
    import anyio

    from notifyq.client import Queue

    s = ctx.sizes
    raw: dict[str, Any] = {
        "calls": s.batch_calls,
        "batch_size": s.batch_size,
        "enqueue_many": [],
        "http": [],
    }
    jobs = [{"task": NOOP, "payload": {"n": i}} for i in range(s.batch_size)]

    async def enqueue_many() -> float:
        async with Queue(ctx.url, pool_size=1) as q:
            await q.enqueue_many(jobs[:10])  # warm: connection open, statement known
            started = time.perf_counter()
            for _ in range(s.batch_calls):
                results = await q.enqueue_many(jobs)
                if len(results) != len(jobs):
                    raise BenchError(f"enqueue_many answered {len(results)} of {len(jobs)}")
            return time.perf_counter() - started

    for r in range(ctx.repeat):
        ctx.step(f"enqueue_many: {s.batch_calls} calls of {s.batch_size:,} jobs, repeat {r + 1}")
        with ctx.connect() as conn:
            truncate(conn, NOTIFYQ_JOBS)
            settle(conn)
        seconds = anyio.run(enqueue_many)
        raw["enqueue_many"].append(
            {"seconds": seconds, "jobs_per_s": s.batch_calls * s.batch_size / seconds}
        )
        ctx.done()
    ctx.results.add(
        Figure(
            "batch.enqueue_many",
            "batch",
            f"enqueue_many, {s.batch_size:,} jobs a call",
            "jobs/s",
            [run["jobs_per_s"] for run in raw["enqueue_many"]],
            Target(">=", 50_000),
        )
    )

    ctx.step("starting notifyq serve --no-worker")
    port = ctx.notifyq_api()
    body = json.dumps({"jobs": jobs}).encode()
    skipped: str | None = None
    for r in range(ctx.repeat):
        ctx.step(
            f"POST /jobs/batch: {s.batch_calls} requests of {s.batch_size:,} jobs, repeat {r + 1}"
        )
        with ctx.connect() as conn:
            truncate(conn, NOTIFYQ_JOBS)
            settle(conn)
        conn_http = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            status, answer = _post(conn_http, "/jobs/batch", body)  # warm-up, and the probe
            if status in (404, 405):
                skipped = f"POST /jobs/batch answered {status}: the route does not exist yet"
            elif not 200 <= status < 300:
                skipped = f"POST /jobs/batch answered {status}: {answer[:300]!r}"
            if skipped:
                ctx.progress.advance(ctx.repeat - r)
                break
            started = time.perf_counter()
            for _ in range(s.batch_calls):
                status, answer = _post(conn_http, "/jobs/batch", body)
                if not 200 <= status < 300:
                    raise BenchError(f"POST /jobs/batch answered {status}: {answer[:300]!r}")
            seconds = time.perf_counter() - started
            answered = len(json.loads(answer).get("results", []))
            if answered != s.batch_size:
                ctx.note(f"POST /jobs/batch answered {answered} results for {s.batch_size} jobs")
        finally:
            conn_http.close()
        raw["http"].append(
            {"seconds": seconds, "jobs_per_s": s.batch_calls * s.batch_size / seconds}
        )
        ctx.done()
    raw["http_skipped"] = skipped
    ctx.results.raw["batch"] = raw
    if skipped:
        ctx.note(skipped + "; that figure is skipped")
    ctx.results.add(
        Figure(
            "batch.http",
            "batch",
            f"POST /jobs/batch, {s.batch_size:,} jobs a request",
            "jobs/s",
            [run["jobs_per_s"] for run in raw["http"]],
            Target(">=", 50_000),
            note=skipped or "",
        )
    )


def _post(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, bytes]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.read()


# -- insert-trigger --------------------------------------------------------------------------------

INSERT_ONE = f"INSERT INTO notifyq.jobs (task, payload, max_attempts) VALUES ('{NOOP}', '{{}}', 1);"
INSERT_CLIENTS = 8


def notify_triggers(conn: psycopg.Connection[Any]) -> list[str]:
    """The trigger(s) on notifyq.jobs that send the notification: ``jobs_notify_inserted`` while
    it exists, else those whose function calls pg_notify or a wake function."""
    rows = conn.execute(
        "SELECT t.tgname, t.tgname = 'jobs_notify_inserted' "
        "FROM pg_trigger AS t JOIN pg_proc AS p ON p.oid = t.tgfoid "
        "WHERE t.tgrelid = 'notifyq.jobs'::regclass AND NOT t.tgisinternal "
        "AND (t.tgname = 'jobs_notify_inserted' "
        "     OR p.prosrc ~* 'pg_notify\\s*\\(|\\.wake_v[0-9]+\\s*\\(') ORDER BY 1"
    ).fetchall()
    known = [name for name, is_known in rows if is_known]
    return known or [name for name, _ in rows]


def set_triggers(conn: psycopg.Connection[Any], names: list[str], enabled: bool) -> None:
    verb = sql.SQL("ENABLE" if enabled else "DISABLE")
    for name in names:
        conn.execute(
            sql.SQL("ALTER TABLE notifyq.jobs {} TRIGGER {}").format(verb, sql.Identifier(name))
        )


def insert_rate(ctx: Context, seconds: float) -> dict[str, Any]:
    """Single-row durable INSERTs into notifyq.jobs from 8 concurrent clients, one transaction
    each, for ``seconds``: pgbench when it is installed, else Python threads."""
    pgbench = shutil.which("pgbench")
    if pgbench:
        script = ctx.workdir / "insert.sql"
        script.write_text(INSERT_ONE + "\n")
        out = subprocess.run(
            [
                pgbench,
                "-n",
                "-c",
                str(INSERT_CLIENTS),
                "-j",
                "2",
                "-M",
                "prepared",
                "-T",
                str(max(1, round(seconds))),
                "-f",
                str(script),
                ctx.url,
            ],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        )
        if out.returncode != 0:
            raise BenchError("pgbench failed:\n" + (out.stderr or out.stdout)[-2000:])
        match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out.stdout)
        if match is None:
            raise BenchError("could not read pgbench's output:\n" + out.stdout[-2000:])
        done = re.search(r"number of transactions actually processed: (\d+)", out.stdout)
        return {
            "tool": "pgbench",
            "rate": float(match.group(1)),
            "inserts": int(done.group(1)) if done else None,
        }
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "notifyq_bench.loadgen",
            "inserts",
            ctx.url,
            "--statement",
            INSERT_ONE,
            "--clients",
            str(INSERT_CLIENTS),
            "--seconds",
            str(seconds),
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ctx.workdir,
        timeout=seconds + 60,
    )
    if out.returncode != 0:
        raise BenchError("the insert clients failed:\n" + out.stderr[-2000:])
    result: dict[str, Any] = json.loads(out.stdout)
    result["tool"] = "python threads"
    return result


def insert_trigger(ctx: Context) -> None:
    """The NOTIFY trigger's cost on 8 concurrent single-row INSERT clients: trigger off, then
    on while the only worker is busy (every slot running a long sleep job), then on with no
    worker at all."""
    seconds = ctx.sizes.insert_seconds
    raw: dict[str, Any] = {
        "clients": INSERT_CLIENTS,
        "seconds": seconds,
        "off": [],
        "on_busy": [],
        "on_no_worker": [],
    }
    with ctx.connect() as conn:
        triggers = notify_triggers(conn)
        truncate(conn, NOTIFYQ_JOBS)
    if not triggers:
        raise BenchError("found no notify trigger on notifyq.jobs to switch off")
    raw["triggers"] = triggers

    def measure(kind: str, enabled: bool) -> None:
        with ctx.connect() as conn:
            conn.execute(sql.SQL("DELETE FROM notifyq.jobs WHERE task = %s"), [NOOP])
            conn.execute("VACUUM notifyq.jobs")
            settle(conn)
            set_triggers(conn, triggers, enabled)
        try:
            raw[kind].append(insert_rate(ctx, seconds))
        finally:
            with ctx.connect() as conn:
                set_triggers(conn, triggers, True)

    busy_slots = 2
    ctx.step("starting a worker and filling its slots with long sleep jobs")
    (worker,) = ctx.start_workers(1, busy_slots)
    try:
        with ctx.connect() as conn:
            conn.execute(
                "INSERT INTO notifyq.jobs (task, payload, max_attempts) "
                "SELECT 'sleep', '{\"seconds\": 3600}', 1 FROM generate_series(1, %s)",
                [busy_slots],
            )

            def all_busy() -> bool:
                row = conn.execute(
                    "SELECT count(*) FROM notifyq.jobs WHERE status = 'processing'"
                ).fetchone()
                return bool(row and row[0] == busy_slots)

            poll_until(all_busy, 30, "the worker to take its sleep jobs")
        for r in range(ctx.repeat):
            ctx.step(f"trigger off, repeat {r + 1}")
            measure("off", False)
            ctx.done()
            ctx.step(f"trigger on, worker busy, repeat {r + 1}")
            measure("on_busy", True)
            worker.check_alive()
            ctx.done()
    finally:
        ctx.children.stop(worker, timeout=5)
    for r in range(ctx.repeat):
        ctx.step(f"trigger on, no worker, repeat {r + 1}")
        measure("on_no_worker", True)
        ctx.done()
    with ctx.connect() as conn:
        truncate(conn, NOTIFYQ_JOBS)
    ctx.results.raw["insert_trigger"] = raw
    off = [run["rate"] for run in raw["off"]]
    busy = [run["rate"] for run in raw["on_busy"]]
    none = [run["rate"] for run in raw["on_no_worker"]]
    add = ctx.results.add
    add(
        Figure(
            "insert.off",
            "insert-trigger",
            "inserts/s, 8 clients, notify trigger off",
            "inserts/s",
            off,
        )
    )
    add(
        Figure(
            "insert.on_busy",
            "insert-trigger",
            "inserts/s, 8 clients, trigger on, workers busy",
            "inserts/s",
            busy,
            None,
            off,
            "trigger off",
        )
    )
    add(
        Figure(
            "insert.on_busy_vs_off",
            "insert-trigger",
            "insert rate, trigger on (workers busy) / off",
            RATIO,
            [a / b for a, b in zip(busy, off, strict=True)],
            Target(">=", 0.85),
        )
    )
    add(
        Figure(
            "insert.on_no_worker",
            "insert-trigger",
            "inserts/s, 8 clients, trigger on, no worker",
            "inserts/s",
            none,
            None,
            off,
            "trigger off",
        )
    )


# -- history -------------------------------------------------------------------------------------

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


def history(ctx: Context) -> None:
    """The claim statement's time on a table with no finished jobs against one with a large
    history of completed jobs (bulk-inserted, then VACUUM ANALYZE); the same queued jobs wait
    in both."""
    s = ctx.sizes
    ctx.step(f"creating a second scratch database with {s.history_rows:,} completed jobs")
    hist_url = ctx.scratch_url("_history")
    with ctx.connect(hist_url) as conn:
        started = time.perf_counter()
        # History as workers would have left it: an INSERT may not name those columns, so the
        # trigger that enforces it is off while this scratch database is filled.
        conn.execute("ALTER TABLE notifyq.jobs DISABLE TRIGGER jobs_accept")
        conn.execute(
            "INSERT INTO notifyq.jobs (task, payload, status, max_attempts, attempt_count, "
            "result, created_at, run_at, started_at, finished_at, worker_id) "
            "SELECT %s, '{}'::jsonb, 'completed', 1, 1, 'null'::jsonb, t, t, t, "
            "t + interval '1 millisecond', 'bench-history' "
            "FROM (SELECT now() - make_interval(secs => g / 100.0) AS t "
            "      FROM generate_series(1, %s) AS g) AS s",
            [NOOP, s.history_rows],
        )
        conn.execute("ALTER TABLE notifyq.jobs ENABLE TRIGGER jobs_accept")
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
            conn.execute("VACUUM ANALYZE notifyq.jobs")
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
            conn.execute("VACUUM ANALYZE notifyq.jobs")
    for r in range(ctx.repeat):
        for who, url in urls:
            ctx.step(f"{who} table: {s.claim_reps} claims of {CLAIM_LIMIT}, repeat {r + 1}")
            times = claim_times(url, s.claim_reps)
            p50, p95 = percentiles(times, (50, 95))
            raw[who].append({"p50_ms": p50, "p95_ms": p95, "mean_ms": sum(times) / len(times)})
            ctx.done()
    ctx.results.raw["history"] = raw
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


# -- concurrency sweep ----------------------------------------------------------------------------


def concurrency(ctx: Context) -> None:
    """Throughput and back-to-back pickup latency of one worker process at several
    concurrencies: the data of the plot."""
    s = ctx.sizes
    levels: list[dict[str, Any]] = []
    for level in s.levels:
        jobs = min(s.drain_jobs, max(1_000, level * s.level_jobs_per_slot))
        ctx.step(f"starting a worker at concurrency {level}")
        (worker,) = ctx.start_workers(1, level)
        data: dict[str, Any] = {
            "concurrency": level,
            "jobs": jobs,
            "jobs_per_s": [],
            "p50_ms": [],
            "p95_ms": [],
            "p99_ms": [],
        }
        try:
            for r in range(ctx.repeat):
                ctx.step(
                    f"concurrency {level}: draining {jobs:,} jobs and {s.burst} back to "
                    f"back, repeat {r + 1}"
                )
                data["jobs_per_s"].append(drain(ctx, NOTIFYQ_JOBS, jobs, [worker])["jobs_per_s"])
                run = pickup(ctx, NOTIFYQ_JOBS, s.burst, None)
                for key in ("p50_ms", "p95_ms", "p99_ms"):
                    data[key].append(run[key])
                ctx.done()
        finally:
            ctx.children.stop(worker)
        levels.append(data)
        ctx.results.add(
            Figure(
                f"concurrency.c{level}",
                "concurrency",
                f"throughput, 1 worker, concurrency {level}",
                "jobs/s",
                data["jobs_per_s"],
            )
        )
    ctx.results.raw["concurrency"] = {"levels": levels}


#: Scenarios by name, in the order they run, with the number of progress steps each takes.
SCENARIOS: dict[str, tuple[Callable[[Context], None], Callable[[int, Sizes], int]]] = {
    "latency": (latency, lambda repeat, s: 4 * repeat),
    "throughput": (throughput, lambda repeat, s: 4 * repeat),
    "memory": (memory, lambda repeat, s: repeat),
    "api": (api, lambda repeat, s: 4 * repeat),
    "batch": (batch, lambda repeat, s: 2 * repeat),
    "insert-trigger": (insert_trigger, lambda repeat, s: 3 * repeat),
    "history": (history, lambda repeat, s: 2 * repeat),
    "concurrency": (concurrency, lambda repeat, s: len(s.levels) * repeat),
}
