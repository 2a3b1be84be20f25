"""The seam of :mod:`notifyq.tracing`: the no-op spans every caller holds, and the rule for
reading a stored trace context. Nothing here imports opentelemetry; ``_otel`` builds on it
(one way: this module never imports that one)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from notifyq.jobspec import JobSpec
    from notifyq.models import ClaimedJob, EnqueueResult

__all__ = [
    "MAX_TRACESTATE",
    "NO_TRACING",
    "Processing",
    "Sending",
    "Tracing",
    "stored_carrier",
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
