"""The handlers the bench's workers run (``notifyq worker --import notifyq_bench.tasks``).

Importing this module registers them with ``@notifyq.task`` and does nothing else.
"""

from __future__ import annotations

import os
import time
from typing import Any

import anyio
import psycopg

from notifyq.context import JobContext
from notifyq.tasks import task

#: Task names, also used by the scenarios that enqueue them.
NOOP = "bench_noop"
STAMP = "bench_stamp"
WAIT_SIGNAL = "bench_wait_signal"
THREE_STEPS = "bench_three_steps"
SLEEP = "bench_sleep"
PER_KEY = "bench_per_key"
#: The ``key_concurrency`` of PER_KEY: jobs of one fair_key running at once, across workers.
PER_KEY_LIMIT = 2
#: The table where each run of a three-step job's step function is recorded (the ``durable``
#: scenario creates it): job_id, name, at (the database's clock when the run began).
RUNS_TABLE = "bench_durable_runs"


@task(NOOP)
async def bench_noop(payload: dict[str, Any]) -> None:
    """Does nothing: the throughput scenarios measure the queue, not the handler."""


@task(STAMP)
async def bench_stamp(payload: dict[str, Any]) -> dict[str, float]:
    """Answers the wall-clock time at which it started. The result is written by the worker's
    batched completion anyway, so carrying the stamp there costs the measurement nothing."""
    return {"t": time.time()}


@task(SLEEP)
async def bench_sleep(payload: dict[str, Any]) -> None:
    """Holds its slot for payload["seconds"] (default 0.01): a job that takes some time."""
    await anyio.sleep(float(payload.get("seconds", 0.01)))


@task(PER_KEY, key_concurrency=PER_KEY_LIMIT)
async def bench_per_key(payload: dict[str, Any]) -> dict[str, float]:
    """Holds its slot for payload["seconds"] (default 0.01) and answers when it began and
    ended on the host's monotonic clock (one clock for every process on the host), so that
    the jobs of one fair_key running at once can be counted from the results."""
    began = time.monotonic()
    await anyio.sleep(float(payload.get("seconds", 0.01)))
    return {"b": began, "e": time.monotonic()}


@task(WAIT_SIGNAL)
async def bench_wait_signal(payload: dict[str, Any], ctx: JobContext) -> dict[str, float]:
    """Suspends until the signal ``go`` comes, then answers the wall-clock time at which it
    ran again."""
    await ctx.wait_for_signal("go")
    return {"t": time.time()}


@task(THREE_STEPS)
async def bench_three_steps(payload: dict[str, Any], ctx: JobContext) -> list[str]:
    """Three durable steps of payload["seconds"] each; each run of a step's function is a row
    of RUNS_TABLE, so that a run after its step was recorded shows."""
    seconds = float(payload.get("seconds", 0.05))
    return [
        await ctx.step(name, _recorded_run, str(ctx.job_id), name, seconds)
        for name in ("one", "two", "three")
    ]


def _recorded_run(job_id: str, name: str, seconds: float) -> str:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {RUNS_TABLE} (job_id, name, at) VALUES (%s, %s, clock_timestamp())",
            (job_id, name),
        )
    time.sleep(seconds)
    return name
