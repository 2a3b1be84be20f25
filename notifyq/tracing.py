"""Tracing of enqueues and attempts: a seam with nothing behind it unless OpenTelemetry is on.

:func:`tracing` answers, for a process's settings, :data:`NO_TRACING`, which does nothing and
never imports opentelemetry (the default), or, with ``NOTIFYQ_OTEL=true``, the OpenTelemetry
implementation of :mod:`notifyq._otel`, imported only then. The entry points (``Queue``,
``SyncQueue``, ``create_app``, ``Worker``) build it from their settings and pass it down: the
store opens a PRODUCER span around each enqueue and stores its W3C trace context on the jobs
(``notifyq.jobs.trace_context``); the executor runs each attempt in a CONSUMER span continued
from the stored context.

What is stored is what a W3C trace-context propagator writes into a carrier, as a JSON object:
``{"traceparent": "00-<32 hex>-<16 hex>-<2 hex>", "tracestate": "..."}`` (``tracestate``
optional). SQL callers may write it too; a stored context that is not an object of such strings
is treated as none (that job runs untraced, nothing else changes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from notifyq.errors import ConfigurationError

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from notifyq.jobspec import JobSpec
    from notifyq.models import ClaimedJob, EnqueueResult
    from notifyq.settings import Settings

__all__ = [
    "MAX_TRACESTATE",
    "NO_TRACING",
    "Processing",
    "Sending",
    "Tracing",
    "stored_carrier",
    "tracing",
]

#: The longest ``traceparent`` read back (version 00 has 55 characters; later versions may add).
MAX_TRACEPARENT = 128
#: The longest ``tracestate`` stored or read back: a longer one is left out (W3C lets a hop
#: drop tracestate entries), and the trace goes on without it.
MAX_TRACESTATE = 512


class Sending:
    """The span of one enqueue or one batch. ``context`` is the JSON text to store on its jobs
    (None: store nothing); :meth:`sent` tells it what was stored."""

    __slots__ = ()

    #: The trace context to store on the jobs, as JSON text; None to store none.
    context: str | None = None

    def sent(self, results: Sequence[EnqueueResult], specs: Sequence[Sequence[JobSpec]]) -> None:
        """The jobs are stored: ``results`` one per job, ``specs`` the jobs in chunks."""


class Processing:
    """The span of one attempt: told how it ended."""

    __slots__ = ()

    def failed(
        self, error: str, exc: BaseException | None, *, error_type: str, will_retry: bool
    ) -> None:
        """The attempt failed with ``error`` (raised as ``exc``, when it was raised)."""

    def ended(self, outcome: str) -> None:
        """The attempt ended: ``completed``, ``failed`` or ``snoozed``."""


_SENDING = Sending()
_PROCESSING = Processing()


class Tracing:
    """No tracing: every span is one shared object that does nothing, and nothing is stored."""

    #: Whether spans are made at all: callers on a hot path may skip the seam when not.
    enabled = False

    def send(self, specs: Sequence[JobSpec], *, batch: bool) -> AbstractContextManager[Sending]:
        """The span of an enqueue of ``specs`` (for a batch: the first of them, as known when
        it starts); current while the jobs are stored."""
        return contextlib.nullcontext(_SENDING)

    def process(self, job: ClaimedJob) -> AbstractContextManager[Processing]:
        """The span of an attempt of ``job``; current while its handler runs."""
        return contextlib.nullcontext(_PROCESSING)

    def incoming(self, headers: Mapping[str, str]) -> AbstractContextManager[None]:
        """Within it, the trace context of an incoming request's ``headers`` (``traceparent``,
        ``tracestate``) is current, unless a span already is (an instrumented server's)."""
        return contextlib.nullcontext()


#: The tracing of a process that has none.
NO_TRACING = Tracing()


def tracing(settings: Settings) -> Tracing:
    """The tracing these settings ask for: OpenTelemetry's with ``otel`` set (spans go to the
    process's global tracer provider, which the application configures), else none.

    Raises :class:`~notifyq.errors.ConfigurationError` when ``otel`` is set and opentelemetry is
    not installed."""
    if not settings.otel:
        return NO_TRACING
    try:
        from notifyq._otel import OtelTracing
    except ImportError as exc:
        raise ConfigurationError(
            "NOTIFYQ_OTEL is set but opentelemetry-api is not installed: "
            "pip install 'notifyq[otel]' (and an SDK and exporter of your choice)"
        ) from exc
    return OtelTracing()


def stored_carrier(stored: Any) -> dict[str, str] | None:
    """The carrier in a stored trace context, or None when there is none to read: only an
    object whose ``traceparent`` (and ``tracestate``, when present) are bounded strings."""
    if not isinstance(stored, dict):
        return None
    parent = stored.get("traceparent")
    if not isinstance(parent, str) or len(parent) > MAX_TRACEPARENT:
        return None
    carrier = {"traceparent": parent}
    state = stored.get("tracestate")
    if isinstance(state, str) and len(state) <= MAX_TRACESTATE:
        carrier["tracestate"] = state
    return carrier
