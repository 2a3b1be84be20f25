"""Tracing of enqueues and attempts: a seam with nothing behind it unless OpenTelemetry is on.

:func:`tracing` answers, for a process's settings, :data:`NO_TRACING`, which does nothing and
never imports opentelemetry (the default), or, with ``NOTIFYQ_OTEL=true``, the OpenTelemetry
implementation of :mod:`notifyq.tracing._otel`, imported only then. The entry points (``Queue``,
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

from typing import TYPE_CHECKING

from notifyq.errors import ConfigurationError
from notifyq.tracing._seam import (
    MAX_TRACESTATE,
    NO_TRACING,
    Processing,
    Sending,
    Tracing,
    stored_carrier,
)

if TYPE_CHECKING:
    from notifyq.settings import Settings

# A leaf package: it imports only notifyq's value types (errors, models, settings, _version),
# and _seam never imports _otel, which builds on it (so there is no circle between them).
__all__ = [
    "MAX_TRACESTATE",
    "NO_TRACING",
    "Processing",
    "Sending",
    "Tracing",
    "stored_carrier",
    "tracing",
]


def tracing(settings: Settings) -> Tracing:
    """The tracing these settings ask for: OpenTelemetry's with ``otel`` set (spans go to the
    process's global tracer provider, which the application configures), else none.

    Raises :class:`~notifyq.errors.ConfigurationError` when ``otel`` is set and opentelemetry is
    not installed."""
    if not settings.otel:
        return NO_TRACING
    try:
        from notifyq.tracing._otel import OtelTracing
    except ImportError as exc:
        raise ConfigurationError(
            "NOTIFYQ_OTEL is set but opentelemetry-api is not installed: "
            "pip install 'notifyq[otel]' (and an SDK and exporter of your choice)"
        ) from exc
    return OtelTracing()
