"""The OpenTelemetry implementation of :mod:`notifyq.tracing`, imported only when tracing is on.

Spans follow OpenTelemetry's messaging semantic conventions, with ``messaging.system`` =
``notifyq`` and the queue as the destination:

- ``send <queue>``, PRODUCER, around an enqueue (``Queue.enqueue``, ``POST /jobs``, ...): its
  context is what the jobs store. A batch (``enqueue_many``, ``POST /jobs/batch``, workflows)
  is one such span with ``messaging.batch.message_count``, whose context every job of the batch
  stores (no ``create`` span per job: the conventions let the send span's context stand in).
- ``process <queue>``, CONSUMER, around each attempt, current while the handler runs (so the
  handler's own spans are its children). Its parent is the stored context, except for a job
  with ``depends_on``: that one starts when its parents have finished, maybe hours after the
  enqueue, and not because of it, so it starts a trace of its own with a *link* to the stored
  context. A failed attempt has status ERROR, ``error.type`` and, when the handler raised, the
  exception recorded.

Spans go to the global tracer provider, which the application sets up (SDK, exporter,
sampling); with opentelemetry-api alone they are non-recording and nothing is stored.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from notifyq._version import __version__
from notifyq.jobspec import JobSpec
from notifyq.models import ClaimedJob, EnqueueResult
from notifyq.tracing._seam import MAX_TRACESTATE, Processing, Sending, Tracing, stored_carrier

__all__ = ["OtelTracing"]

logger = logging.getLogger("notifyq.tracing")

#: W3C trace context only: baggage may be large or private, and is not the job's to keep.
_PROPAGATOR = TraceContextTextMapPropagator()

SYSTEM = "notifyq"


class OtelTracing(Tracing):
    """Spans through the global tracer provider (or ``tracer_provider``)."""

    enabled = True

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("notifyq", __version__, tracer_provider)

    @contextlib.contextmanager
    def send(self, specs: Sequence[JobSpec], *, batch: bool) -> Iterator[Sending]:
        queue = _one_queue(specs)
        attributes: dict[str, str] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        if queue is not None:
            attributes["messaging.destination.name"] = queue
        if not batch and specs and specs[0].task is not None:
            attributes["notifyq.task"] = specs[0].task
        name = f"send {queue}" if queue is not None else "send"
        with self._tracer.start_as_current_span(
            name, kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            yield _Send(span, _injected(), batch=batch)

    @contextlib.contextmanager
    def process(self, job: ClaimedJob) -> Iterator[Processing]:
        # Never the worker's own context: an attempt is a child of its job's enqueue or of
        # nothing.
        parent = Context()
        links: Sequence[Link] = ()
        stored = _extracted(job)
        if stored is not None:
            span_context = trace.get_current_span(stored).get_span_context()
            if job.dependencies is None:
                parent = stored
            else:
                links = (Link(span_context, {"notifyq.link": "enqueued"}),)
        attributes: dict[str, AttributeValue] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": job.queue,
            "messaging.message.id": str(job.id),
            "notifyq.task": job.task,
            "notifyq.attempt": job.attempt,
            "notifyq.max_attempts": job.max_attempts,
        }
        with self._tracer.start_as_current_span(
            f"process {job.queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes=attributes,
        ) as span:
            yield _Process(span)

    @contextlib.contextmanager
    def incoming(self, headers: Mapping[str, str]) -> Iterator[None]:
        carrier = None
        if not trace.get_current_span().get_span_context().is_valid:
            carrier = stored_carrier(dict(headers))
        found = _extract(carrier) if carrier is not None else None
        if found is None:
            yield
            return
        token = otel_context.attach(found)
        try:
            yield
        finally:
            otel_context.detach(token)


class _Send(Sending):
    def __init__(self, span: Span, context: str | None, *, batch: bool) -> None:
        self._span = span
        self._batch = batch
        self.context = context

    def sent(self, results: Sequence[EnqueueResult], specs: Sequence[Sequence[JobSpec]]) -> None:
        span = self._span
        if not span.is_recording():
            return
        if self._batch:
            span.set_attribute("messaging.batch.message_count", len(results))
            queue = _one_queue([spec for chunk in specs for spec in chunk])
            if queue is not None:
                span.set_attribute("messaging.destination.name", queue)
                span.update_name(f"send {queue}")
        elif results:
            span.set_attribute("messaging.message.id", str(results[0].job_id))
            span.set_attribute("notifyq.duplicate", results[0].duplicate)


class _Process(Processing):
    def __init__(self, span: Span) -> None:
        self._span = span

    def failed(
        self, error: str, exc: BaseException | None, *, error_type: str, will_retry: bool
    ) -> None:
        span = self._span
        span.set_status(Status(StatusCode.ERROR, error.partition("\n")[0]))
        span.set_attribute("error.type", error_type)
        span.set_attribute("notifyq.will_retry", will_retry)
        if exc is not None:
            span.record_exception(exc)

    def ended(self, outcome: str) -> None:
        self._span.set_attribute("notifyq.outcome", outcome)


def _one_queue(specs: Sequence[JobSpec]) -> str | None:
    """The queue every one of ``specs`` names, or None (none named, or several)."""
    queues = {spec.queue for spec in specs}
    return queues.pop() if len(queues) == 1 else None


def _injected() -> str | None:
    """The current trace context as the JSON text a job stores, or None when there is no valid
    span (no SDK configured, say)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    if "traceparent" not in carrier:
        return None
    if len(carrier.get("tracestate", "")) > MAX_TRACESTATE:
        del carrier["tracestate"]
    return json.dumps(carrier, separators=(",", ":"))


def _extracted(job: ClaimedJob) -> Context | None:
    """The context stored on ``job``, or None when it has none that can be read."""
    carrier = stored_carrier(job.trace_context)
    if carrier is None:
        if job.trace_context is not None:
            logger.debug("job %s: its stored trace context cannot be read; untraced", job.id)
        return None
    found = _extract(carrier)
    if found is None:
        logger.debug("job %s: its stored trace context is not valid; untraced", job.id)
    return found


def _extract(carrier: Mapping[str, str]) -> Context | None:
    """The context of a carrier's valid ``traceparent``, or None."""
    try:
        found = _PROPAGATOR.extract(carrier)
    except Exception:  # a propagator must not fail a job, whatever the row held
        return None
    if not trace.get_current_span(found).get_span_context().is_valid:
        return None
    return found
