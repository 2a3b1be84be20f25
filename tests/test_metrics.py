"""Prometheus metrics against a real PostgreSQL: label sets stay bounded whatever names clients
send (the contract's "Safe by default"), and rendering does not hold up the event loop."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import anyio
import anyio.to_thread
import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from notifyq import JobContext, Snooze
from notifyq.api import create_app
from notifyq.metrics import MAX_QUEUES, OTHER, Metrics
from notifyq.settings import Settings
from notifyq.worker import Worker
from tests.helpers import registry


@contextlib.asynccontextmanager
async def api(settings: Settings) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    app = create_app(settings.model_copy(update={"run_worker": False}))
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://localhost") as client,
    ):
        yield app, client


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The (labels, value) samples named ``name`` in the Prometheus text ``text``."""
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def by_label(found: list[tuple[dict[str, str], float]], label: str) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for labels, value in found:
        totals[labels[label]] += value
    return dict(totals)


async def test_enqueue_labels_are_bounded_and_nothing_is_lost(settings: Settings) -> None:
    made_up = [
        {"task": f"made_up_{n % 40}", "queue": f"q{n}", "payload": {}}
        for n in range(MAX_QUEUES + 40)
    ]
    late = [{"task": "late", "queue": "q0", "payload": {}}] * 3
    async with api(settings) as (_, client):
        answer = await client.post("/jobs/batch", json={"jobs": made_up + late})
        assert answer.status_code == 200, answer.text
        # `late` is registered by a worker that starts after its jobs were enqueued: they
        # count under its name, not under "other".
        await Worker(settings, registry(late=lambda payload: None), burst=True).run()
        text = (await client.get("/metrics")).text
    enqueued = samples(text, "notifyq_jobs_enqueued_total")
    queues = by_label(enqueued, "queue")
    tasks = by_label(enqueued, "task")
    assert len(queues) == MAX_QUEUES + 1 and OTHER in queues
    assert tasks == {OTHER: MAX_QUEUES + 40, "late": 3}
    assert queues[OTHER] == 40  # the queues past the first 500 seen
    depth = samples(text, "notifyq_queue_jobs")
    assert len(by_label(depth, "queue")) == MAX_QUEUES + 1
    queued = by_label([s for s in depth if s[0]["status"] == "queued"], "queue")
    assert sum(queued.values()) == MAX_QUEUES + 40 and queued[OTHER] == 40
    oldest = by_label(samples(text, "notifyq_queue_oldest_due_seconds"), "queue")
    assert len(oldest) == MAX_QUEUES + 1


async def test_worker_labels_are_bounded_by_queue(settings: Settings, conn: Any) -> None:
    await conn.execute(
        "INSERT INTO notifyq.jobs (task, queue) "
        "SELECT 'echo', 'w' || n FROM generate_series(1, %s) n",
        [MAX_QUEUES + 20],
    )
    metrics = Metrics()
    await Worker(settings, burst=True, metrics=metrics).run()
    text = metrics.render().decode()
    for name in ("notifyq_jobs_started_total", "notifyq_jobs_completed_total"):
        queues = by_label(samples(text, name), "queue")
        assert len(queues) == MAX_QUEUES + 1, name
        assert sum(queues.values()) == MAX_QUEUES + 20 and queues[OTHER] == 20
    pickup = samples(text, "notifyq_pickup_latency_seconds_count")
    assert len(by_label(pickup, "queue")) == MAX_QUEUES + 1


class Blocking:
    """A collector that holds the render until the test says the event loop answered
    meanwhile (or five seconds passed)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.loop_answered = threading.Event()
        self.loop_was_free: bool | None = None

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> list[Any]:
        self.entered.set()
        self.loop_was_free = self.loop_answered.wait(5)
        return []


async def test_rendering_does_not_block_the_event_loop(settings: Settings) -> None:
    async with api(settings) as (app, client):
        blocking = Blocking()
        app.state.metrics.registry.register(blocking)
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.get, "/metrics")
            assert await anyio.to_thread.run_sync(blocking.entered.wait, 5)
            with anyio.fail_after(4):
                health = await client.get("/health")
            blocking.loop_answered.set()
    assert health.status_code == 200
    assert blocking.loop_was_free is True


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="no promtool (apt-get install prometheus) to check")
async def test_the_metrics_pass_promtool(settings: Settings, conn: Any) -> None:
    """What a worker and the API expose, after real traffic (jobs completed, retried, failed,
    snoozed; submissions accepted and refused), passes Prometheus's own checker, lint
    included."""
    snoozed: set[UUID] = set()

    async def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
        if payload["n"] % 3 == 0:
            raise RuntimeError("boom")
        if payload["n"] % 3 == 1 and ctx.job_id not in snoozed:
            snoozed.add(ctx.job_id)
            raise Snooze(0)

    async with api(settings) as (_, client):
        for n in range(12):
            answer = await client.post(
                "/jobs", json={"task": "flaky", "payload": {"n": n}, "max_attempts": 2}
            )
            assert answer.status_code == 201
        assert (await client.post("/jobs", json={"task": 1})).status_code == 422
        metrics = Metrics()
        await Worker(settings, registry(flaky=flaky), burst=True, metrics=metrics).run()
        exposed = {"api": (await client.get("/metrics")).content, "worker": metrics.render()}
    for name in ("notifyq_jobs_retried_total", "notifyq_jobs_snoozed_total"):
        assert samples(exposed["worker"].decode(), name), name
    for who, text in exposed.items():
        assert PROMTOOL is not None
        checked = await anyio.to_thread.run_sync(
            lambda text=text: subprocess.run(
                [PROMTOOL, "check", "metrics"], input=text, capture_output=True, timeout=30
            )
        )
        assert checked.returncode == 0 and not checked.stdout.strip(), (
            who,
            checked.stdout.decode(),
            checked.stderr.decode(),
        )
