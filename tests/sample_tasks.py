"""Tasks that worker processes started by the tests import with ``--import tests.sample_tasks``."""

from __future__ import annotations

import os
import time
from typing import Any

import anyio
import psycopg

from notifyq import JobContext, task


@task
def record(payload: dict[str, Any]) -> int:
    """Appends "n pid" to the file named by NQ_RUNS_FILE: one line per run, so that a test can
    count how often each job ran, and in which process, across processes."""
    _append_run(payload["n"])
    return int(payload["n"])


@task
async def record_slowly(payload: dict[str, Any]) -> int:
    """record, then wait payload["seconds"] (default 0.01) without blocking the loop."""
    _append_run(payload["n"])
    await anyio.sleep(float(payload.get("seconds", 0.01)))
    return int(payload["n"])


@task
async def three_steps(payload: dict[str, Any], ctx: JobContext) -> list[str]:
    """Three durable steps of payload["seconds"] each (default 0.02); each run of a step's
    function is a row of the table durable_runs (job_id, name, at: the database's clock when
    it started), which the test creates, so that a test can tell a run after its step was
    recorded."""
    seconds = float(payload.get("seconds", 0.02))
    return [
        await ctx.step(name, _durable_run, str(ctx.job_id), name, seconds)
        for name in ("one", "two", "three")
    ]


@task(key_concurrency=2)
async def per_key(payload: dict[str, Any]) -> None:
    """Holds its slot for payload["seconds"] (default 0.02) and appends "key start end pid" to
    NQ_RUNS_FILE, on the host's monotonic clock (one clock for every process), so that a test
    can tell how many jobs of one key ran at once."""
    began = time.monotonic()
    await anyio.sleep(float(payload.get("seconds", 0.02)))
    line = f"{payload['key']} {began:.6f} {time.monotonic():.6f} {os.getpid()}\n".encode()
    fd = os.open(os.environ["NQ_RUNS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _durable_run(job_id: str, name: str, seconds: float) -> str:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO durable_runs (job_id, name, at) VALUES (%s, %s, clock_timestamp())",
            (job_id, name),
        )
    time.sleep(seconds)
    return name


def _append_run(n: int) -> None:
    # One small write per run: O_APPEND makes it atomic across processes and threads.
    line = f"{n} {os.getpid()}\n".encode()
    fd = os.open(os.environ["NQ_RUNS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_runs(path: str | os.PathLike[str]) -> list[tuple[int, int]]:
    """The (n, pid) pairs that record and record_slowly appended."""
    with open(path, encoding="utf-8") as runs:
        return [(int(n), int(pid)) for n, pid in (line.split() for line in runs if line.strip())]


@task("nap", max_attempts=5)
def nap(payload: dict[str, Any]) -> str:
    """Blocks a worker thread for payload["seconds"]."""
    time.sleep(float(payload.get("seconds", 1)))
    return "rested"
