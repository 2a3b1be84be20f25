"""Prometheus metrics: what a process's workers and API did, and the queues' depth.

One :class:`Metrics` per process, built at the entry point on a registry of its own (never the
global default one). ``GET /metrics`` serves it; a worker without the API serves it on
``--metrics-port``. Queue depth is read from the database when scraped (the API) or every few
seconds (a worker's own port), with the same cheap counts as ``GET /queues``.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

_LATENCY_BUCKETS = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)
_RUN_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800)


class Metrics:
    """The metrics of one process, on their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = ("queue", "task")
        r = self.registry
        self.enqueued = Counter(
            "notifyq_jobs_enqueued",
            "Jobs enqueued through this process's API.",
            labels,
            registry=r,
        )
        self.started = Counter(
            "notifyq_jobs_started",
            "Attempts started by this process's workers.",
            labels,
            registry=r,
        )
        self.completed = Counter("notifyq_jobs_completed", "Jobs completed.", labels, registry=r)
        self.failed = Counter(
            "notifyq_jobs_failed",
            "Jobs failed for good (no attempts left, or permanent).",
            labels,
            registry=r,
        )
        self.retried = Counter(
            "notifyq_jobs_retried",
            "Failed attempts that went back to the queue.",
            labels,
            registry=r,
        )
        self.cancelled = Counter(
            "notifyq_jobs_cancelled",
            "Running jobs stopped by a cancel request.",
            labels,
            registry=r,
        )
        self.rescued = Counter(
            "notifyq_jobs_rescued",
            "Jobs of other workers whose lease ran out, requeued (or failed) by this process.",
            registry=r,
        )
        self.lost = Counter(
            "notifyq_outcomes_discarded",
            "Outcomes discarded because the worker had lost the job's lease.",
            registry=r,
        )
        self.pickup = Histogram(
            "notifyq_pickup_latency_seconds",
            "From the moment a job became due (committed, or its run_at) to its handler start.",
            ("queue",),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.runtime = Histogram(
            "notifyq_run_seconds",
            "How long handlers ran.",
            labels,
            buckets=_RUN_BUCKETS,
            registry=r,
        )
        self.reconnects = Counter(
            "notifyq_listener_reconnects",
            "Times the LISTEN connection was re-established.",
            registry=r,
        )
        self.notifications = Counter(
            "notifyq_notifications_received",
            "NOTIFY messages received by the listener.",
            registry=r,
        )
        self.claims = Counter(
            "notifyq_claims",
            "Claim statements run, by whether they found work and what woke the worker.",
            ("found", "woken_by"),
            registry=r,
        )
        self.depth = Gauge(
            "notifyq_queue_jobs",
            "Jobs by queue and status (completed may be estimated).",
            ("queue", "status"),
            registry=r,
        )
        self.oldest = Gauge(
            "notifyq_queue_oldest_due_seconds",
            "How long the oldest due job of a queue waits.",
            ("queue",),
            registry=r,
        )
        self.depth_read_at = 0.0

    def set_depth(self, rows: list[dict[str, Any]]) -> None:
        """Queue depth gauges from ``Store.queue_stats`` rows."""
        self.depth.clear()
        self.oldest.clear()
        for row in rows:
            for status in ("queued", "due", "processing", "completed", "failed", "cancelled"):
                self.depth.labels(row["queue"], status).set(row[status])
            self.oldest.labels(row["queue"]).set(row["oldest_due_seconds"] or 0.0)
        self.depth_read_at = time.monotonic()

    def render(self) -> bytes:
        """The Prometheus text format."""
        return generate_latest(self.registry)
