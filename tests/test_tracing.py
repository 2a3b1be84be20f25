"""OpenTelemetry tracing (NOTIFYQ_OTEL=true): the trace context of the enqueuing code is kept on
the job and continued by the span of each attempt, with the SDK's in-memory exporter.

The tests of this that need no database are in tests/unit/test_tracing.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx
import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from notifyq import Queue, SyncQueue
from notifyq.api import create_app
from notifyq.settings import Settings
from tests.helpers import job_row, registry, running_worker, wait_for_status, wait_until
from tests.unit.test_tracing import (
    PARENT_ID,
    TRACE_ID,
    captured_spans,
)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans this test ends (see captured_spans)."""
    with captured_spans() as value:
        yield value


@pytest.fixture
def traced(settings: Settings) -> Settings:
    return settings.model_copy(update={"otel": True})


@contextlib.asynccontextmanager
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"run_worker": False}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as client,
    ):
        yield client


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


async def processed(exporter: InMemorySpanExporter, count: int = 1) -> list[ReadableSpan]:
    """The ``process`` spans, once ``count`` of them have ended."""

    def found() -> list[ReadableSpan] | None:
        done = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CONSUMER]
        return done if len(done) >= count else None

    spans: list[ReadableSpan] = await wait_until(found)
    return spans


def ids(span: ReadableSpan) -> tuple[str, str]:
    assert span.context is not None
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


def parent_id(span: ReadableSpan) -> str | None:
    return None if span.parent is None else f"{span.parent.span_id:016x}"


def ancestors(exporter: InMemorySpanExporter, span: ReadableSpan) -> list[str]:
    """The ids of the span's parent, its parent's, and so on (the last one not exported here);
    every exported one between is an instrumented server's."""
    by_id = {ids(s)[1]: s for s in exporter.get_finished_spans()}
    found = []
    while (parent := parent_id(span)) is not None:
        found.append(parent)
        if parent not in by_id:
            break
        span = by_id[parent]
        assert span.kind is SpanKind.SERVER, span.name
    return found


async def test_post_jobs_continues_the_callers_trace_through_the_handlers_span(
    traced: Settings, conn: Any, spans: InMemorySpanExporter
) -> None:
    seen: list[tuple[str, str]] = []

    def handler(payload: dict[str, Any]) -> None:
        # The handler runs inside the attempt's span: its own spans are children of it.
        seen.append(ids(trace.get_current_span()))  # type: ignore[arg-type]

    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": "vendor=x"}
    async with api(traced) as client:
        answer = await client.post(
            "/jobs", json={"task": "traced", "queue": "work", "payload": {}}, headers=headers
        )
        assert answer.status_code == 201, answer.text
        job_id = answer.json()["job_id"]
        async with running_worker(traced, registry(traced=handler)):
            await wait_for_status(conn, job_id, "completed")
            (process,) = await processed(spans)

    (send,) = named(spans, "send work")
    assert send.kind is SpanKind.PRODUCER
    assert ids(send)[0] == TRACE_ID
    # The caller's span, then (with a FastAPI that makes spans of its own) the request's.
    assert ancestors(spans, send)[-1] == PARENT_ID
    assert dict(send.attributes or {}) == {
        "messaging.system": "notifyq",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "work",
        "notifyq.task": "traced",
        "messaging.message.id": job_id,
        "notifyq.duplicate": False,
    }
    # One trace: the caller's, then the enqueue, then the attempt.
    assert ids(process)[0] == TRACE_ID
    assert parent_id(process) == ids(send)[1]
    assert process.name == "process work"
    assert process.status.status_code is StatusCode.UNSET
    assert dict(process.attributes or {}) == {
        "messaging.system": "notifyq",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "work",
        "messaging.message.id": job_id,
        "notifyq.task": "traced",
        "notifyq.attempt": 1,
        "notifyq.max_attempts": 3,
        "notifyq.outcome": "completed",
    }
    assert seen == [ids(process)]
    row = await job_row(conn, job_id)
    assert row is not None
    assert row["trace_context"] == {
        "traceparent": f"00-{TRACE_ID}-{ids(send)[1]}-01",
        "tracestate": "vendor=x",
    }


async def test_queue_enqueue_inside_a_span_is_continued_by_the_worker(
    traced: Settings, conn: Any, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("test")
    async with Queue(settings=traced) as q:
        with tracer.start_as_current_span("request") as request:
            job = await q.enqueue("echo", {"n": 1}, queue="mail")
    async with running_worker(traced, registry()):
        await wait_for_status(conn, job.job_id, "completed")
        (process,) = await processed(spans)
    (send,) = named(spans, "send mail")
    request_trace = f"{request.get_span_context().trace_id:032x}"
    assert ids(send)[0] == request_trace == ids(process)[0]
    assert parent_id(send) == f"{request.get_span_context().span_id:016x}"
    assert parent_id(process) == ids(send)[1]
    assert process.attributes is not None
    assert process.attributes["messaging.destination.name"] == "mail"


async def test_a_failed_attempt_has_error_status_and_the_exception(
    traced: Settings, conn: Any, spans: InMemorySpanExporter
) -> None:
    def broken(payload: dict[str, Any]) -> None:
        raise ValueError("no such thing")

    async with Queue(settings=traced) as q:
        job = await q.enqueue("broken", {}, max_attempts=2)
    async with running_worker(traced, registry(broken=broken)):
        await wait_for_status(conn, job.job_id, "failed")
        first, second = sorted(
            await processed(spans, 2),
            key=lambda s: (s.attributes or {}).get("notifyq.attempt", 0),  # type: ignore[arg-type,return-value]
        )
    for span, will_retry in ((first, True), (second, False)):
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "ValueError: no such thing"
        attributes = dict(span.attributes or {})
        assert attributes["error.type"] == "ValueError"
        assert attributes["notifyq.outcome"] == "failed"
        assert attributes["notifyq.will_retry"] is will_retry
        (event,) = span.events
        assert event.name == "exception"
        assert (event.attributes or {})["exception.type"] == "ValueError"
    # The queue was the task's to choose: the enqueue's span does not know it.
    (send,) = named(spans, "send")
    assert "messaging.destination.name" not in (send.attributes or {})
    assert parent_id(first) == parent_id(second) == ids(send)[1]


async def test_a_batch_is_one_send_span_that_each_attempt_continues(
    traced: Settings, conn: Any, spans: InMemorySpanExporter
) -> None:
    async with Queue(settings=traced) as q:
        jobs = await q.enqueue_many([{"task": "echo", "payload": {"i": i}} for i in range(3)])
    async with running_worker(traced, registry()):
        for job in jobs:
            await wait_for_status(conn, job.job_id, "completed")
        attempts = await processed(spans, 3)
    (send,) = named(spans, "send")
    assert send.kind is SpanKind.PRODUCER and send.parent is None
    assert (send.attributes or {})["messaging.batch.message_count"] == 3
    assert {parent_id(a) for a in attempts} == {ids(send)[1]}
    assert {ids(a)[0] for a in attempts} == {ids(send)[0]}
    assert {(a.attributes or {})["messaging.message.id"] for a in attempts} == {
        str(job.job_id) for job in jobs
    }


async def test_a_job_that_waited_for_others_links_to_its_enqueue(
    traced: Settings, conn: Any, spans: InMemorySpanExporter
) -> None:
    async with Queue(settings=traced) as q:
        created = await q.enqueue_workflow(
            [
                {"ref": "a", "task": "echo", "payload": {}},
                {"ref": "b", "task": "echo", "payload": {}, "depends_on": ["a"]},
            ]
        )
    async with running_worker(traced, registry()):
        await wait_for_status(conn, created.jobs["b"], "completed")
        attempts = await processed(spans, 2)
    (send,) = named(spans, "send")
    by_job = {(a.attributes or {})["messaging.message.id"]: a for a in attempts}
    first, then = by_job[str(created.jobs["a"])], by_job[str(created.jobs["b"])]
    assert parent_id(first) == ids(send)[1]
    # It ran because its parent finished, not when it was enqueued: a trace of its own, linked.
    assert then.parent is None and ids(then)[0] != ids(send)[0]
    (link,) = then.links
    assert f"{link.context.span_id:016x}" == ids(send)[1]


@pytest.mark.parametrize(
    "stored",
    [
        {"traceparent": 5},
        {"traceparent": "not a traceparent"},
        {"traceparent": f"00-{'0' * 32}-{PARENT_ID}-01"},
        {"tracestate": "a=b"},
        {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": ["x"]},
        {"traceparent": "x" * 600},
    ],
)
async def test_a_stored_context_that_cannot_be_read_leaves_the_job_untraced(
    traced: Settings, conn: Any, spans: InMemorySpanExporter, stored: dict[str, Any]
) -> None:
    cursor = await conn.execute(
        "INSERT INTO notifyq.jobs (task, payload, trace_context) VALUES ('echo', '{}', %s) "
        "RETURNING id",
        [json.dumps(stored)],
    )
    (job_id,) = await cursor.fetchone()
    async with running_worker(traced, registry()):
        row = await wait_for_status(conn, job_id, "completed")
        (process,) = await processed(spans)
    assert row["result"] == {}
    readable = "tracestate" in stored and "traceparent" in stored
    if readable:  # only its tracestate was unusable: the trace goes on without it
        assert ids(process)[0] == TRACE_ID and parent_id(process) == PARENT_ID
    else:
        assert process.parent is None


@pytest.mark.parametrize(
    "stored", ['["00-x"]', '"text"', json.dumps({"traceparent": "x", "pad": "y" * 1100})]
)
async def test_sql_cannot_store_a_context_that_is_not_a_small_object(
    conn: Any, stored: str
) -> None:
    with pytest.raises(psycopg.errors.CheckViolation):
        await conn.execute(
            "INSERT INTO notifyq.jobs (task, payload, trace_context) VALUES ('echo', '{}', %s)",
            [stored],
        )


async def test_a_duplicate_takes_the_trace_of_its_newer_submission(
    traced: Settings, conn: Any, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("test")
    async with Queue(settings=traced) as q:
        with tracer.start_as_current_span("first"):
            first = await q.enqueue("echo", {"v": 1}, dedup_key="k")
        with tracer.start_as_current_span("second") as second:
            again = await q.enqueue("echo", {"v": 2}, dedup_key="k")
    assert again.duplicate and again.job_id == first.job_id
    row = await job_row(conn, first.job_id)
    assert row is not None
    assert f"{second.get_span_context().trace_id:032x}" in row["trace_context"]["traceparent"]


async def test_sync_queue_keeps_the_trace_context(
    traced: Settings, conn: Any, spans: InMemorySpanExporter
) -> None:
    def enqueue() -> Any:
        with (
            SyncQueue(settings=traced) as q,
            trace.get_tracer("test").start_as_current_span("sync"),
        ):
            return q.enqueue("echo", {}), q.enqueue_many([{"task": "echo", "payload": {}}])

    one, many = await anyio.to_thread.run_sync(enqueue)
    for job_id in (one.job_id, many[0].job_id):
        row = await job_row(conn, job_id)
        assert row is not None and row["trace_context"]["traceparent"].startswith("00-")
    assert len(named(spans, "send")) == 2


async def test_with_tracing_off_nothing_is_stored_and_no_span_made(
    settings: Settings, conn: Any, spans: InMemorySpanExporter
) -> None:
    async with Queue(settings=settings) as q:
        with trace.get_tracer("test").start_as_current_span("request"):
            one = await q.enqueue("echo", {})
            many = await q.enqueue_many([{"task": "echo", "payload": {}, "dedup_key": "d"}])
    async with running_worker(settings, registry()):
        for job_id in (one.job_id, many[0].job_id):
            row = await wait_for_status(conn, job_id, "completed")
            assert row["trace_context"] is None
    assert [s.name for s in spans.get_finished_spans()] == ["request"]


async def test_the_functions_of_version_7_answer_as_before(conn: Any) -> None:
    # Clients of version 7 (and notifyq.enqueue) call enqueue_v3, without a trace context; it
    # runs the later versions' rule and leaves the context empty.
    cursor = await conn.execute(
        "SELECT job_id, duplicate FROM notifyq.enqueue_v3('echo', '{}', 'old', NULL, NULL, "
        "NULL, 'k', NULL, NULL, NULL, NULL, NULL, NULL)"
    )
    (job_id, duplicate) = await cursor.fetchone()
    assert not duplicate
    cursor = await conn.execute(
        "SELECT * FROM notifyq.claim_v4('w', ARRAY['echo'], ARRAY['old'], 10, 30, false)"
    )
    claimed = await cursor.fetchall()
    assert len(claimed) == 1 and len(cursor.description) == 12
    assert job_id in {row[0] for row in claimed}
    row = await job_row(conn, job_id)
    assert row is not None and row["status"] == "processing" and row["trace_context"] is None
