"""``throughput``: a full queue of no-op jobs drained by the bare loop, one worker process and
two, taking turns round after round."""

from __future__ import annotations

from typing import Any

from notifyq_bench.report import RATIO, Figure, Target
from notifyq_bench.scenarios.context import (
    BARE_JOBS,
    NOTIFYQ_JOBS,
    WORKER_CONCURRENCY,
    Context,
    Scenario,
)
from notifyq_bench.scenarios.measure import drain


def run(ctx: Context) -> None:
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
    raw["bare_jobs_per_s"] = [run["jobs_per_s"] for run in raw["bare"]]
    ctx.results.raw["throughput"] = raw
    _add_figures(ctx, raw)


def _add_figures(ctx: Context, raw: dict[str, Any]) -> None:
    """The figures of the throughput runs in ``raw``."""
    bare = [run["jobs_per_s"] for run in raw["bare"]]
    one = [run["jobs_per_s"] for run in raw["one"]]
    two = [run["jobs_per_s"] for run in raw["two"]]
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


SCENARIO = Scenario("throughput", run, lambda repeat, s: 4 * repeat)
