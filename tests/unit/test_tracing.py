"""Tracing without a database: opentelemetry imported only when asked for (and a line saying
what to install when it is missing), and the API continuing an incoming traceparent.

The tests here need no database; those that do are in tests/test_tracing.py.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.helpers import ROOT

#: One exporter for the process: the global tracer provider can be set only once.
_EXPORTER = InMemorySpanExporter()


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


PARENT_ID = "00f067aa0ba902b7"


@contextlib.contextmanager
def captured_spans() -> Iterator[InMemorySpanExporter]:
    """The spans this test ends, through the global tracer provider notifyq's tracing uses."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans this test ends (see captured_spans)."""
    with captured_spans() as value:
        yield value


def test_notifyq_does_not_import_opentelemetry_unless_asked() -> None:
    code = (
        "import sys, notifyq, notifyq.api, notifyq.worker, notifyq.cli, notifyq.tracing\n"
        "from notifyq.settings import Settings\n"
        "from notifyq.tracing import tracing\n"
        "assert tracing(Settings()).enabled is False\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


async def test_the_api_continues_an_incoming_traceparent_when_no_span_is_current(
    spans: InMemorySpanExporter,
) -> None:
    from notifyq.api.middleware import TraceContext
    from notifyq.tracing._otel import OtelTracing

    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(trace.get_current_span().get_span_context())

    guarded = TraceContext(app, OtelTracing())
    header = f"00-{TRACE_ID}-{PARENT_ID}-01".encode()
    for headers in ([(b"traceparent", header)], [(b"traceparent", b"junk")], []):
        await guarded({"type": "http", "headers": headers}, None, None)
    with trace.get_tracer("test").start_as_current_span("server") as server:
        await guarded({"type": "http", "headers": [(b"traceparent", header)]}, None, None)
    continued, junk, none, under_a_span = seen
    assert (f"{continued.trace_id:032x}", f"{continued.span_id:016x}") == (TRACE_ID, PARENT_ID)
    assert not junk.is_valid and not none.is_valid
    assert under_a_span == server.get_span_context()


def test_tracing_asked_for_without_opentelemetry_says_what_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"
        "from notifyq.errors import ConfigurationError\n"
        "from notifyq.settings import Settings\n"
        "from notifyq.tracing import tracing\n"
        "try:\n"
        "    tracing(Settings(otel=True))\n"
        "except ConfigurationError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "pip install 'notifyq[otel]'" in done.stdout
