"""``memory``: resident memory of one worker process, idle and at its peak under load."""

from __future__ import annotations

from typing import Any

from notifyq_bench.report import Figure, Target
from notifyq_bench.scenarios.context import NOTIFYQ_JOBS, WORKER_CONCURRENCY, Context, Scenario
from notifyq_bench.scenarios.measure import RssSampler, drain, kb_to_mb


def run(ctx: Context) -> None:
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


SCENARIO = Scenario("memory", run, lambda repeat, s: repeat)
