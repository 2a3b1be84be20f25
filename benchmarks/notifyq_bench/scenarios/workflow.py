"""``workflow``: how fast work moves along dependencies, groups and waits. A dependent job's
start after its parent completed (idle worker, busy worker), a chain of 100 jobs end to end,
claim throughput with many group keys queued against the same jobs ungrouped, and
``Queue.wait``'s return after the job finished.

Times that span the database and the bench compare a wall-clock stamp taken here (or in the
handler) with a timestamp the database wrote (``finished_at``, the completing transaction's
``now()``): both clocks must be this host's, which the scenario checks first."""

from __future__ import annotations

import math
import time
from typing import Any
from uuid import UUID

import psycopg

from notifyq_bench.harness import BenchError, Child, describe_server, poll_until
from notifyq_bench.report import RATIO, Figure, Target
from notifyq_bench.scenarios.context import NOTIFYQ_JOBS, WORKER_CONCURRENCY, Context, Scenario
from notifyq_bench.scenarios.measure import drain, settle, truncate
from notifyq_bench.stats import percentiles
from notifyq_bench.tasks import NOOP, STAMP

#: Parent and child pairs submitted per second: each pair is done in a few ms, so the worker is
#: idle again when the next one comes.
PAIR_RATE = 40.0
#: The busy worker's slots run ``sleep`` jobs from a backlog that outlasts the run, each of a
#: length drawn between these (seconds): with one length for all, the slots would free in waves,
#: and a child would wait for the next wave rather than for the next free slot.
BUSY_SLEEP = (0.01, 0.09)
#: The pairs of the busy run jump the backlog: the figure is "claimed at the next free slot",
#: not "claimed after everything submitted before it".
BUSY_PRIORITY = 1
CHAIN_LENGTH = 100
JOBS_PER_KEY = 2
#: Most pairs of grouped and ungrouped drains, whatever the repeat count: each pair drains
#: twice 20,000 jobs at the default size, and three ratios already give a median.
MAX_DRAIN_PAIRS = 3
#: The job Queue.wait waits on runs this long, so that the wait is in place before it ends.
WAIT_SLEEP = 0.05
#: How far apart this host's clock and the database's may be before the figures that compare
#: them are called unreliable.
CLOCK_TOLERANCE_MS = 1.0

PARENT_INSERT = (
    "INSERT INTO notifyq.jobs (task, payload, max_attempts, priority) "
    "VALUES (%s, '{}'::jsonb, 1, %s) RETURNING id"
)
CHILD_INSERT = (
    "INSERT INTO notifyq.jobs (task, payload, max_attempts, priority, depends_on) "
    "VALUES (%s, '{}'::jsonb, 1, %s, ARRAY[%s]::uuid[]) RETURNING id"
)


def run(ctx: Context) -> None:
    """One worker process at concurrency 50, started and ready before anything is measured,
    runs every part: per repeat, parent/child pairs on an idle worker, the same on a busy
    one, a chain of 100 no-op jobs, Queue.wait on short jobs; then grouped and ungrouped
    drains, taking turns pair by pair (at most MAX_DRAIN_PAIRS pairs)."""
    s = ctx.sizes
    jobs = s.group_keys * JOBS_PER_KEY
    raw: dict[str, Any] = {
        "pair_rate": PAIR_RATE,
        "pairs": s.dependent_pairs,
        "busy_pairs": max(1, s.dependent_pairs // 2),
        "busy_sleep": list(BUSY_SLEEP),
        "chain_length": CHAIN_LENGTH,
        "waits": s.waits,
        "wait_sleep": WAIT_SLEEP,
        "group_keys": s.group_keys,
        "group_jobs": jobs,
        "idle": [],
        "busy": [],
        "chain": [],
        "wait": [],
        "grouped": [],
        "ungrouped": [],
    }
    ctx.step("starting a worker")
    (worker,) = ctx.start_workers(1, WORKER_CONCURRENCY)
    try:
        raw["clock"] = _check_clock(ctx)
        for r in range(ctx.repeat):
            of = f"repeat {r + 1} of {ctx.repeat}"
            ctx.step(
                f"{s.dependent_pairs} parent/child pairs at {PAIR_RATE:g}/s, idle worker, {of}"
            )
            raw["idle"].append(_dependent_starts(ctx, worker, s.dependent_pairs, priority=0))
            ctx.done()
            busy = raw["busy_pairs"]
            ctx.step(f"{busy} parent/child pairs at {PAIR_RATE:g}/s, busy worker, {of}")
            raw["busy"].append(_busy_dependent_starts(ctx, worker, busy))
            ctx.done()
            ctx.step(f"a chain of {CHAIN_LENGTH} jobs, {of}")
            raw["chain"].append(_chain(ctx, worker))
            ctx.step(f"Queue.wait on {s.waits} jobs, {of}")
            raw["wait"].append(_waits(ctx, s.waits))
            ctx.done()
        pairs = min(ctx.repeat, MAX_DRAIN_PAIRS)
        for r in range(pairs):
            # Each pair's two drains run seconds apart, in turns: the machine's drift over the
            # scenario lands on both sides of the ratio.
            order = ("grouped", "ungrouped") if r % 2 == 0 else ("ungrouped", "grouped")
            for who in order:
                ctx.step(f"{who} drain of {jobs:,} jobs, pair {r + 1} of {pairs}")
                keys = s.group_keys if who == "grouped" else None
                raw[who].append(drain(ctx, NOTIFYQ_JOBS, jobs, [worker], group_keys=keys))
            ctx.done()
    finally:
        ctx.children.stop(worker)
    ctx.results.raw["workflow"] = raw
    _add_figures(ctx, raw)


# -- the clocks ---------------------------------------------------------------------------------


def _check_clock(ctx: Context) -> dict[str, Any]:
    """How far the database's clock is from this host's: the database's ``clock_timestamp()``
    against the midpoint of this host's clock around the query, from the quickest of 20
    round trips. Notes it when the two disagree (another host's clock, or a container's)."""
    best: tuple[float, float] | None = None
    with ctx.connect() as conn:
        for _ in range(20):
            before = time.time()
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
            after = time.time()
            assert row is not None
            if best is None or after - before < best[0]:
                best = (after - before, row[0] - (before + after) / 2)
    assert best is not None
    round_trip, offset = best
    clock = {
        "server": describe_server(ctx.url),
        "round_trip_ms": round_trip * 1000,
        "offset_ms": offset * 1000,
    }
    if abs(offset) * 1000 > CLOCK_TOLERANCE_MS + round_trip * 500:
        ctx.note(
            f"the database's clock is {offset * 1000:+.1f} ms from this host's: the workflow "
            "figures that compare a stamp taken here with finished_at are off by about that much"
        )
    return clock


# -- parent completed -> dependent job's handler start ------------------------------------------


def _dependent_starts(ctx: Context, worker: Child, count: int, *, priority: int) -> dict[str, Any]:
    """Submits ``count`` pairs at PAIR_RATE, each a no-op parent and a stamp job that depends on
    it, inserted in one transaction; answers, in ms, each child's handler start (its stamp)
    minus its parent's ``finished_at``."""
    children: dict[UUID, UUID] = {}
    with ctx.connect() as conn:
        start = time.perf_counter() + 0.05
        for index in range(count):
            delay = start + index / PAIR_RATE - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            with conn.transaction():
                parent = _one(conn.execute(PARENT_INSERT, [NOOP, priority], prepare=True))
                child = _one(conn.execute(CHILD_INSERT, [STAMP, priority, parent], prepare=True))
            children[child] = parent
        ids = list(children)
        _wait_done(conn, worker, ids, f"{count} dependent stamp jobs")
        rows = conn.execute(
            "SELECT (c.result->>'t')::float8, extract(epoch FROM p.finished_at)::float8, "
            "extract(epoch FROM c.started_at - p.finished_at)::float8 "
            "FROM notifyq.jobs AS c JOIN notifyq.jobs AS p ON p.id = c.depends_on[1] "
            "WHERE c.id = ANY(%s)",
            [ids],
        ).fetchall()
    latencies = [(started - finished) * 1000 for started, finished, _ in rows]
    p50, p95, p99 = percentiles(latencies)
    return {
        "pairs": count,
        # Where the time goes: up to the claim of the child (the claiming transaction's now()),
        # the rest is the worker's, from the claim to the handler's first line.
        "claimed_p50_ms": percentiles([claimed * 1000 for _, _, claimed in rows], (50,))[0],
        "p50_ms": p50,
        "p95_ms": p95,
        "p99_ms": p99,
        "max_ms": max(latencies),
        "latencies_ms": sorted(round(x, 3) for x in latencies),
    }


def _busy_dependent_starts(ctx: Context, worker: Child, count: int) -> dict[str, Any]:
    """The pairs of :func:`_dependent_starts` while every slot of the worker runs a
    ``sleep`` job from a backlog that outlasts the pairs; the pairs have a higher priority
    than the backlog. Checks that the backlog did not run dry, then deletes what is left of
    it."""
    seconds = count / PAIR_RATE + 2.0
    low, high = BUSY_SLEEP
    backlog = math.ceil(seconds * WORKER_CONCURRENCY / ((low + high) / 2) * 1.5)
    with ctx.connect() as conn:
        truncate(conn, NOTIFYQ_JOBS)
        conn.execute(
            "INSERT INTO notifyq.jobs (task, payload, max_attempts) "
            "SELECT 'sleep', jsonb_build_object('seconds', %s + random() * (%s - %s)), 1 "
            "FROM generate_series(1, %s)",
            [low, high, low, backlog],
        )

        def saturated() -> bool:
            worker.check_alive()
            row = conn.execute(
                "SELECT count(*) FROM notifyq.jobs WHERE status = 'processing'"
            ).fetchone()
            return bool(row and row[0] >= WORKER_CONCURRENCY)

        poll_until(saturated, 30.0, "the worker's slots to fill with sleep jobs", 0.01)
        result = _dependent_starts(ctx, worker, count, priority=BUSY_PRIORITY)
        row = conn.execute(
            "SELECT count(*) FROM notifyq.jobs WHERE task = 'sleep' AND status = 'queued'"
        ).fetchone()
        left = row[0] if row else 0
        if not left:
            raise BenchError(f"the backlog of {backlog:,} sleep jobs ran dry: the worker was idle")
        result["backlog"] = backlog
        result["backlog_left"] = left
        conn.execute("DELETE FROM notifyq.jobs WHERE task = 'sleep' AND status = 'queued'")
        poll_until(lambda: not _processing(conn, worker), 30.0, "the last sleep jobs to end", 0.01)
    return result


# -- a chain ------------------------------------------------------------------------------------


def _chain(ctx: Context, worker: Child) -> dict[str, Any]:
    """A chain of CHAIN_LENGTH no-op jobs through ``Queue.enqueue_workflow``: seconds from
    the call (after a warm-up chain on the same Queue) to the last job's ``finished_at``."""
    import anyio

    from notifyq import Queue, chain, step

    def flow(length: int) -> Any:
        return chain(*(step(NOOP, max_attempts=1) for _ in range(length)))

    async def submit() -> tuple[float, float, UUID, UUID]:
        async with Queue(ctx.url, pool_size=1) as q:
            warm = await q.enqueue_workflow(flow(2))  # connection open, statements known
            await q.wait(list(warm.jobs.values())[-1], timeout=30)
            submitted = time.time()
            result = await q.enqueue_workflow(flow(CHAIN_LENGTH))
            returned = time.time()
            return submitted, returned, result.workflow_id, warm.workflow_id

    with ctx.connect() as conn:
        truncate(conn, NOTIFYQ_JOBS)
        settle(conn)
        submitted, returned, workflow_id, warm_id = anyio.run(submit)
        query = (
            "SELECT count(*) FILTER (WHERE status = 'completed'), "
            "count(*) FILTER (WHERE status IN ('failed', 'cancelled')), count(*), "
            "extract(epoch FROM max(finished_at))::float8 "
            "FROM notifyq.jobs WHERE workflow_id = %s"
        )

        def finished() -> bool:
            worker.check_alive()
            row = conn.execute(query, [workflow_id]).fetchone()
            assert row is not None
            if row[1]:
                raise BenchError(f"{row[1]} job(s) of the chain failed or were cancelled")
            return bool(row[0] == CHAIN_LENGTH)

        poll_until(finished, 60.0, f"a chain of {CHAIN_LENGTH} jobs to complete", 0.01)
        row = conn.execute(query, [workflow_id]).fetchone()
        assert row is not None
        conn.execute(
            "DELETE FROM notifyq.jobs WHERE workflow_id IN (%s, %s)", [workflow_id, warm_id]
        )
    return {
        "jobs": CHAIN_LENGTH,
        "seconds": row[3] - submitted,
        "enqueue_seconds": returned - submitted,
    }


# -- Queue.wait ---------------------------------------------------------------------------------


def _waits(ctx: Context, count: int) -> dict[str, Any]:
    """``count`` short ``sleep`` jobs, one at a time, each enqueued and then waited for with
    ``Queue.wait``; answers, in ms, when each wait returned minus the job's ``finished_at``.
    Every wait starts before its job ends (checked), so each is woken by a notification."""
    import anyio

    from notifyq import JobStatus, Queue

    async def wait_all() -> list[tuple[float, float]]:
        samples = []
        async with Queue(ctx.url, pool_size=2) as q:
            warm = await q.enqueue("sleep", {"seconds": WAIT_SLEEP}, max_attempts=1)
            await q.wait(warm.job_id, timeout=30)  # its LISTEN connection is open from here on
            for _ in range(count):
                job = await q.enqueue("sleep", {"seconds": WAIT_SLEEP}, max_attempts=1)
                called = time.time()
                done = await q.wait(job.job_id, timeout=30)
                returned = time.time()
                if done.finished_at is None or done.status is not JobStatus.COMPLETED:
                    raise BenchError(f"job {job.job_id} ended {done.status.value}")
                finished = done.finished_at.timestamp()
                if finished <= called:
                    raise BenchError(
                        "a job ended before Queue.wait was called: WAIT_SLEEP is short"
                    )
                samples.append((finished, returned))
        return samples

    with ctx.connect() as conn:
        truncate(conn, NOTIFYQ_JOBS)
    samples = anyio.run(wait_all)
    latencies = [(returned - finished) * 1000 for finished, returned in samples]
    p50, p95, p99 = percentiles(latencies)
    return {
        "waits": count,
        "p50_ms": p50,
        "p95_ms": p95,
        "p99_ms": p99,
        "max_ms": max(latencies),
        "latencies_ms": sorted(round(x, 3) for x in latencies),
    }


# -- helpers ------------------------------------------------------------------------------------


def _one(cursor: psycopg.Cursor[Any]) -> Any:
    row = cursor.fetchone()
    assert row is not None
    return row[0]


def _processing(conn: psycopg.Connection[Any], worker: Child) -> bool:
    worker.check_alive()
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM notifyq.jobs WHERE status = 'processing')")
    return bool(_one(row))


def _wait_done(conn: psycopg.Connection[Any], worker: Child, ids: list[UUID], what: str) -> None:
    query = (
        "SELECT count(*) FILTER (WHERE status = 'completed'), "
        "count(*) FILTER (WHERE status IN ('failed', 'cancelled')) "
        "FROM notifyq.jobs WHERE id = ANY(%s)"
    )

    def finished() -> bool:
        worker.check_alive()
        row = conn.execute(query, [ids]).fetchone()
        assert row is not None
        if row[1]:
            raise BenchError(f"{row[1]} of {what} failed or were cancelled")
        return bool(row[0] == len(ids))

    poll_until(finished, 60.0, f"{what} to complete")


# -- figures ------------------------------------------------------------------------------------


def _add_figures(ctx: Context, raw: dict[str, Any]) -> None:
    """The figures of the runs in ``raw``."""

    def latency(key: str, kind: str, label: str, target: float | None = None) -> None:
        point = key.rsplit(".", 1)[1]
        ctx.results.add(
            Figure(
                key,
                "workflow",
                f"{label}: {point}",
                "ms",
                [run[f"{point}_ms"] for run in raw[kind]],
                Target("<=", target) if target is not None else None,
            )
        )

    idle = f"parent completed → dependent job's handler start, idle worker, {PAIR_RATE:g} pairs/s"
    latency("workflow.idle.p50", "idle", idle, 3.0)
    latency("workflow.idle.p99", "idle", idle, 10.0)
    low, high = (round(x * 1000) for x in BUSY_SLEEP)
    busy = f"  the same, busy worker (all slots on {low}-{high} ms jobs, a backlog queued)"
    latency("workflow.busy.p50", "busy", busy)
    latency("workflow.busy.p99", "busy", busy)
    ctx.results.add(
        Figure(
            "workflow.chain",
            "workflow",
            f"a chain of {CHAIN_LENGTH} no-op jobs, enqueue_workflow → last finished_at",
            "s",
            [run["seconds"] for run in raw["chain"]],
            Target("<=", 0.5),
        )
    )
    grouped = [run["jobs_per_s"] for run in raw["grouped"]]
    ungrouped = [run["jobs_per_s"] for run in raw["ungrouped"]]
    keys = f"{raw['group_keys']:,} group keys x {JOBS_PER_KEY} jobs"
    ctx.results.add(
        Figure(
            "workflow.grouped",
            "workflow",
            f"throughput, 1 worker x {WORKER_CONCURRENCY}, {keys} queued",
            "jobs/s",
            grouped,
            None,
            ungrouped,
            "the same jobs without a group key",
        )
    )
    ctx.results.add(
        Figure(
            "workflow.grouped_vs_ungrouped",
            "workflow",
            f"throughput, {keys} / the same ungrouped",
            RATIO,
            [a / b for a, b in zip(grouped, ungrouped, strict=True)],
            Target(">=", 0.7),
            note="each ratio pairs two drains run in turn, seconds apart",
        )
    )
    waits = f"Queue.wait return after the job's finished_at ({WAIT_SLEEP * 1000:g} ms jobs)"
    latency("workflow.wait.p50", "wait", waits, 5.0)
    latency("workflow.wait.p99", "wait", waits)


SCENARIO = Scenario("workflow", run, lambda repeat, s: 3 * repeat + min(repeat, MAX_DRAIN_PAIRS))
