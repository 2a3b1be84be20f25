"""``batch``: jobs/s through ``Queue.enqueue_many`` and ``POST /jobs/batch``."""

from __future__ import annotations

import http.client
import json
import time
from typing import Any

from notifyq_bench.harness import BenchError
from notifyq_bench.report import Figure, Target
from notifyq_bench.scenarios.context import NOTIFYQ_JOBS, Context, Scenario
from notifyq_bench.scenarios.measure import settle, truncate
from notifyq_bench.tasks import NOOP


def run(ctx: Context) -> None:
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


SCENARIO = Scenario("batch", run, lambda repeat, s: 2 * repeat)
