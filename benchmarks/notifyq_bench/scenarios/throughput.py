"""``throughput``: a full queue of no-op jobs drained by the strict floor and by notifyq's
workers, 1 process x 50 slots, 2 x 50 and 1 x 1, taking turns round after round; with
``--peers``, by each installed peer in the same shapes too."""

from __future__ import annotations

import asyncio
from typing import Any

from notifyq_bench.harness import Child
from notifyq_bench.peers.base import Peer
from notifyq_bench.report import RATIO, Figure, Target
from notifyq_bench.scenarios.context import (
    BARE_JOBS,
    NOTIFYQ_JOBS,
    WORKER_CONCURRENCY,
    Context,
    Scenario,
)
from notifyq_bench.scenarios.measure import drain

#: The shapes of a drain: (key suffix, processes, slots a process).
SHAPES = (("", 1, WORKER_CONCURRENCY), ("_two", 2, WORKER_CONCURRENCY), ("_single", 1, 1))
FLOOR_LABEL = "strict floor"


def _shape_text(processes: int, slots: int) -> str:
    return f"{processes} process{'es' if processes > 1 else ''} x {slots}"


def run(ctx: Context) -> None:
    """A queue of N no-op jobs drained by the strict floor (:mod:`notifyq_bench.bare`) and by
    notifyq's workers, each in three shapes: 1 process with 50 slots, 2 processes with 50, and
    1 process with 1 slot (fewer jobs: one job a round trip). They take turns, round after
    round, each with processes of its own: a ratio pairs runs of one round, seconds apart, so
    the machine's drift over the scenario (other tenants, autovacuum, the page cache) does not
    land on one side of it. With ``--peers``, each installed peer drains in the same shapes in
    the same rounds, on a scratch database of its own."""
    s = ctx.sizes
    raw: dict[str, Any] = {"jobs": s.drain_jobs, "single_jobs": s.single_jobs}
    runs: list[tuple[str, str, int, int, int]] = []
    for suffix, processes, slots in SHAPES:
        jobs = s.single_jobs if slots == 1 else s.drain_jobs
        runs.append(
            (f"bare{suffix}", f"floor {_shape_text(processes, slots)}", processes, slots, jobs)
        )
        who = {"": "one", "_two": "two", "_single": "single"}[suffix]
        runs.append((who, f"notifyq {_shape_text(processes, slots)}", processes, slots, jobs))
    peer_urls: dict[str, str] = {}
    for peer in ctx.peers:
        ctx.step(f"{peer.label()}: creating its scratch database")
        peer_urls[peer.name] = _peer_database(ctx, peer)
        raw.setdefault("peers", {})[peer.name] = {"label": peer.label(), "jobs": s.peer_jobs}
    for key, *_ in runs:
        raw[key] = []
    for r in range(ctx.repeat):
        for key, label, processes, slots, jobs in runs:
            ctx.step(f"{label}: starting, round {r + 1} of {ctx.repeat}")
            procs: list[Child]
            if key.startswith("bare"):
                procs = ctx.start_bare_loop(slots, processes)
                table = BARE_JOBS
            else:
                procs = ctx.start_workers(processes, slots)
                table = NOTIFYQ_JOBS
            try:
                ctx.step(f"{label}: draining {jobs:,} jobs, round {r + 1} of {ctx.repeat}")
                raw[key].append(drain(ctx, table, jobs, procs))
            finally:
                ctx.children.stop(*procs)
            ctx.done()
        for peer in ctx.peers:
            url = peer_urls[peer.name]
            for suffix, processes, slots in SHAPES:
                jobs = s.single_jobs if slots == 1 else s.peer_jobs
                label = f"{peer.label()} {_shape_text(processes, slots)}"
                ctx.step(f"{label}: draining {jobs:,} jobs, round {r + 1} of {ctx.repeat}")
                procs = peer.start_workers(ctx.children, url, processes, slots)
                try:
                    result = peer.drain(url, jobs, procs)
                finally:
                    ctx.children.stop(*procs)
                raw["peers"][peer.name].setdefault(f"runs{suffix}", []).append(result)
    raw["bare_jobs_per_s"] = [run["jobs_per_s"] for run in raw["bare"]]
    ctx.results.raw["throughput"] = raw
    _add_figures(ctx, raw)


def _peer_database(ctx: Context, peer: Peer) -> str:
    url = ctx.scratch_url(f"_{peer.name}")
    asyncio.run(peer.install(url))
    return url


def _rates(runs: list[dict[str, Any]]) -> list[float]:
    return [run["jobs_per_s"] for run in runs]


def _add_figures(ctx: Context, raw: dict[str, Any]) -> None:
    """The figures of the throughput runs in ``raw``; each shape's floor is the strict floor
    in the same shape, so "vs floor" is notifyq (or a peer) over the floor of its round."""
    add = ctx.results.add
    bare = _rates(raw["bare"])
    one = _rates(raw["one"])
    floors = {suffix: _rates(raw[f"bare{suffix}"]) for suffix, _, _ in SHAPES}
    add(
        Figure(
            "throughput.bare",
            "throughput",
            f"throughput, strict floor, {_shape_text(1, WORKER_CONCURRENCY)} (the floor)",
            "jobs/s",
            bare,
            note="claim and complete in one statement, a LISTEN connection of its own",
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
            FLOOR_LABEL,
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
            [run["consumer_cpu_us_per_job"] for run in raw["bare"]],
            FLOOR_LABEL,
            note="user+system CPU of the worker process over the drain, per job",
        )
    )
    add(
        Figure(
            "throughput.one_vs_bare",
            "throughput",
            "throughput, 1 worker / strict floor",
            RATIO,
            [a / b for a, b in zip(one, bare, strict=True)],
            Target(">=", 0.8),
        )
    )
    _add_two_worker_figures(ctx, raw, floors)
    add(
        Figure(
            "throughput.bare_single",
            "throughput",
            f"throughput, strict floor, {_shape_text(1, 1)}",
            "jobs/s",
            floors["_single"],
        )
    )
    add(
        Figure(
            "throughput.single",
            "throughput",
            "throughput, 1 worker process, concurrency 1",
            "jobs/s",
            _rates(raw["single"]),
            None,
            floors["_single"],
            FLOOR_LABEL + ", 1 x 1",
        )
    )
    _add_peer_figures(ctx, raw, floors)


def _add_two_worker_figures(
    ctx: Context, raw: dict[str, Any], floors: dict[str, list[float]]
) -> None:
    """Two worker processes: beside the strict floor in the same shape, and over one worker."""
    add = ctx.results.add
    one = _rates(raw["one"])
    two = _rates(raw["two"])
    add(
        Figure(
            "throughput.bare_two",
            "throughput",
            f"throughput, strict floor, {_shape_text(2, WORKER_CONCURRENCY)}",
            "jobs/s",
            floors["_two"],
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
            floors["_two"],
            FLOOR_LABEL + ", 2 x 50",
        )
    )
    add(
        Figure(
            "throughput.two_vs_bare_two",
            "throughput",
            "throughput, 2 workers / strict floor, 2 x 50",
            RATIO,
            [a / b for a, b in zip(two, floors["_two"], strict=True)],
            Target(">=", 0.8),
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


def _add_peer_figures(ctx: Context, raw: dict[str, Any], floors: dict[str, list[float]]) -> None:
    """Each peer's throughput in each shape, beside the strict floor in that shape."""
    add = ctx.results.add
    for name, peer in raw.get("peers", {}).items():
        for suffix, processes, slots in SHAPES:
            add(
                Figure(
                    f"throughput.peer.{name}{suffix}",
                    "throughput",
                    f"throughput, {peer['label']}, {_shape_text(processes, slots)}",
                    "jobs/s",
                    _rates(peer[f"runs{suffix}"]),
                    None,
                    floors[suffix],
                    f"{FLOOR_LABEL}, {_shape_text(processes, slots)}",
                    note="timed from the enqueue's commit until the bench saw no job left",
                )
            )


SCENARIO = Scenario("throughput", run, lambda repeat, s: 2 * len(SHAPES) * repeat)
