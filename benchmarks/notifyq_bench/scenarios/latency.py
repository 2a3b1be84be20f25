"""``latency``: pickup latency, commit to handler start, of an idle worker and of a burst,
with the strict floor in the same conditions as the floor; with ``--peers``, each installed
peer's idle pickup too."""

from __future__ import annotations

import asyncio
from typing import Any

from notifyq_bench.report import Figure, Target
from notifyq_bench.scenarios.context import (
    BARE_JOBS,
    NOTIFYQ_JOBS,
    WORKER_CONCURRENCY,
    Context,
    Scenario,
)
from notifyq_bench.scenarios.measure import pickup

IDLE_RATE = 20.0


def run(ctx: Context) -> None:
    """Pickup latency, commit to handler start: an idle worker receiving 20 jobs/s, and 100 jobs
    submitted back to back; the strict floor (1 process x 50 slots) in the same conditions is
    the floor. With ``--peers``, each installed peer (1 worker process at concurrency 50, on
    its own scratch database) receives the idle workload too, right after notifyq."""
    s = ctx.sizes
    idle_count = max(1, int(s.idle_seconds * IDLE_RATE))
    raw: dict[str, Any] = {
        "idle": {"notifyq": [], "bare": []},
        "burst": {"notifyq": [], "bare": []},
    }
    for who, table in (("bare", BARE_JOBS), ("notifyq", NOTIFYQ_JOBS)):
        ctx.step(f"starting the {who} worker")
        if who == "bare":
            procs = ctx.start_bare_loop(WORKER_CONCURRENCY)
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
    for peer in ctx.peers:
        ctx.step(f"{peer.label()}: creating its scratch database")
        url = ctx.scratch_url(f"_{peer.name}_latency")
        asyncio.run(peer.install(url))
        procs = peer.start_workers(ctx.children, url, 1, WORKER_CONCURRENCY)
        runs = raw.setdefault("peers", {}).setdefault(peer.name, {"label": peer.label()})
        try:
            for r in range(ctx.repeat):
                ctx.step(f"{peer.label()}: {idle_count} jobs at {IDLE_RATE:g}/s, repeat {r + 1}")
                runs.setdefault("idle", []).append(peer.pickup(url, idle_count, IDLE_RATE, procs))
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
                floor_label="strict floor",
            )
        )

    add("idle", "p50", "pickup latency, idle worker, 20 jobs/s: p50", 2.0)
    add("idle", "p95", "pickup latency, idle worker, 20 jobs/s: p95", None)
    add("idle", "p99", "pickup latency, idle worker, 20 jobs/s: p99", 5.0)
    add("burst", "p50", f"pickup latency, {s.burst} jobs back to back: p50", None)
    add("burst", "p99", f"pickup latency, {s.burst} jobs back to back: p99", 15.0)
    for name, peer in raw.get("peers", {}).items():
        for point in ("p50", "p99"):
            ctx.results.add(
                Figure(
                    key=f"latency.peer.{name}.idle.{point}",
                    scenario="latency",
                    label=f"pickup latency, {peer['label']}, idle, 20 jobs/s: {point}",
                    unit="ms",
                    values=[run[f"{point}_ms"] for run in peer["idle"]],
                    floor=[run[f"{point}_ms"] for run in raw["idle"]["bare"]],
                    floor_label="strict floor",
                )
            )


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


SCENARIO = Scenario("latency", run, lambda repeat, s: 4 * repeat)
