"""``concurrency``: throughput and pickup latency of one worker at several concurrencies (the
data of ``--plot``)."""

from __future__ import annotations

from typing import Any

from notifyq_bench.report import Figure
from notifyq_bench.scenarios.context import NOTIFYQ_JOBS, Context, Scenario
from notifyq_bench.scenarios.measure import drain, pickup


def run(ctx: Context) -> None:
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


SCENARIO = Scenario("concurrency", run, lambda repeat, s: len(s.levels) * repeat)
