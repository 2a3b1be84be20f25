"""Prometheus metrics: what a process's workers and API did, and the queues' depth.

One :class:`Metrics` per process, built at the entry point on a registry of its own (never the
global default one). ``GET /metrics`` serves it; a worker without the API serves it on
``--metrics-port``. Queue depth is read from the database when scraped (the API) or every few
seconds (a worker's own port), with the same cheap counts as ``GET /queues``.

Queue and task names come from clients, so the label sets are bounded (:class:`LabelBounds`):
the first :data:`MAX_QUEUES` queues seen keep their names, later ones are counted under
``other``; and a task no worker registered is counted under ``other`` too. Fair keys are
clients' names as well: only the :data:`MAX_FAIR_KEYS` busiest, read with the queues' depth,
have series, and a key that leaves them loses its series at the next reading.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from typing import Any, Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "MAX_FAIR_KEYS", "MAX_QUEUES", "OTHER", "LabelBounds", "Metrics"]

#: The label of every queue past the first MAX_QUEUES, and of every task no worker registered.
OTHER = "other"
#: Queues that keep their own label.
MAX_QUEUES = 500
#: Fair keys (a queue's key each) with series of their own in ``notifyq_fair_key_jobs``: the
#: busiest ones, whichever they are at each reading.
MAX_FAIR_KEYS = 20
#: Distinct (queue, task) pairs of unregistered tasks held until the next scrape decides
#: whether a worker registered them meanwhile; past it they are counted under OTHER at once.
MAX_PENDING = 1000

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
        self.bounds = LabelBounds()
        self._job_families()
        self._process_families()
        self._health_families()
        self.depth_read_at = 0.0

    def _job_families(self) -> None:
        """What happened to jobs, by queue and task."""
        labels = ("queue", "task")
        r = self.registry

        def by_queue(name: str, documentation: str) -> _ByQueue[Counter]:
            return _ByQueue(Counter(name, documentation, labels, registry=r), self.bounds)

        self.enqueued = _Enqueued(
            Counter(
                "notifyq_jobs_enqueued",
                "Jobs enqueued through this process's API.",
                labels,
                registry=r,
            ),
            self.bounds,
        )
        # A worker claims only tasks it registered: the task label of what it ran is bounded
        # by its code, the queue label (clients choose queues) is not.
        self.started = by_queue(
            "notifyq_jobs_started", "Attempts started by this process's workers."
        )
        self.completed = by_queue("notifyq_jobs_completed", "Jobs completed.")
        self.failed = by_queue(
            "notifyq_jobs_failed", "Jobs failed for good (no attempts left, or permanent)."
        )
        self.retried = by_queue(
            "notifyq_jobs_retried", "Failed attempts that went back to the queue."
        )
        self.cancelled = by_queue(
            "notifyq_jobs_cancelled", "Running jobs stopped by a cancel request."
        )
        self.snoozed = by_queue(
            "notifyq_jobs_snoozed",
            "Attempts whose handler raised Snooze: back to the queue for later, not counted.",
        )
        self.signals = Counter(
            "notifyq_signals",
            "Signals sent to jobs through this process's API, by whether they were the first "
            "of their name (sent) or a duplicate.",
            ("outcome",),
            registry=r,
        )
        self.suspended = by_queue(
            "notifyq_jobs_suspended",
            "Attempts that suspended their job (ctx.sleep, ctx.wait_for_signal): slot given back.",
        )
        self.pickup = self._by_queue(
            Histogram(
                "notifyq_pickup_latency_seconds",
                "From the moment a job became due (committed, or its run_at) to its handler start.",
                ("queue",),
                buckets=_LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.runtime = self._by_queue(
            Histogram(
                "notifyq_run_seconds",
                "How long handlers ran.",
                labels,
                buckets=_RUN_BUCKETS,
                registry=r,
            )
        )

    def _process_families(self) -> None:
        """What this process's workers and listener did, and the queues' depth."""
        r = self.registry
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
        self.fair_keys = Gauge(
            "notifyq_fair_key_jobs",
            f"Jobs queued and running of the {MAX_FAIR_KEYS} fair keys with the most of them "
            "(by queue); the other keys have no series.",
            ("queue", "fair_key", "state"),
            registry=r,
        )

    def _health_families(self) -> None:
        """What ``notifyq doctor`` reads, as gauges (set when /metrics is scraped)."""
        r = self.registry
        self.horizon_age = Gauge(
            "notifyq_horizon_age_seconds",
            "Age of the oldest snapshot (session or prepared transaction) holding the xmin "
            "horizon of this database; 0 when none.",
            registry=r,
        )
        self.horizon_xid_age = Gauge(
            "notifyq_horizon_xid_age",
            "Transactions since the oldest snapshot anything (replication slots too) holds.",
            registry=r,
        )
        self.table_rows = Gauge(
            "notifyq_table_rows",
            "Live and dead row versions of notifyq's tables (PostgreSQL's statistics).",
            ("table", "state"),
            registry=r,
        )
        self.listeners = Gauge(
            "notifyq_listeners",
            "LISTEN connections of notifyq's processes on this database, by whether they "
            "still receive.",
            ("state",),
            registry=r,
        )
        self.notify_queue_usage = Gauge(
            "notifyq_notification_queue_usage",
            "Share of PostgreSQL's notification queue in use (pg_notification_queue_usage).",
            registry=r,
        )
        self.expired_leases = Gauge(
            "notifyq_leases_expired",
            "Running jobs whose lease ran out and that are not rescued yet.",
            registry=r,
        )
        self.leader = Gauge(
            "notifyq_maintenance_leader",
            "1 when a worker leads the maintenance (rescue, retention), else 0.",
            registry=r,
        )
        self.schema_version = Gauge(
            "notifyq_schema_version",
            "Schema version of the database (current) and of this code (expected).",
            ("of",),
            registry=r,
        )
        self.health_checks = Gauge(
            "notifyq_health_check",
            "Each check of `notifyq doctor`: 0 ok, 1 warn, 2 fail.",
            ("check",),
            registry=r,
        )

    def set_health(
        self,
        *,
        horizon_seconds: float,
        horizon_xid_age: int,
        tables: Iterable[dict[str, Any]],
        listeners: int,
        stopped_listeners: int,
        overview: dict[str, Any],
        expected_version: int,
        checks: Iterable[tuple[str, str]],
    ) -> None:
        """The gauges of :meth:`_health_families`, from the figures of one
        :func:`notifyq.doctor.examine` (``Health.figures()``): ``checks`` are (name, status)
        pairs, a status ok, warn or fail."""
        self.horizon_age.set(horizon_seconds)
        self.horizon_xid_age.set(horizon_xid_age)
        self.table_rows.clear()
        for row in tables:
            self.table_rows.labels(row["table"], "live").set(row["live"])
            self.table_rows.labels(row["table"], "dead").set(row["dead"])
        self.listeners.labels("receiving").set(listeners - stopped_listeners)
        self.listeners.labels("stopped").set(stopped_listeners)
        self.notify_queue_usage.set(float(overview["notification_queue_usage"] or 0.0))
        self.expired_leases.set(int(overview["expired_leases"]))
        self.leader.set(1 if overview["leader"] else 0)
        self.schema_version.labels("database").set(overview["schema_version"] or 0)
        self.schema_version.labels("code").set(expected_version)
        levels = {"ok": 0, "warn": 1, "fail": 2}
        for name, status in checks:
            self.health_checks.labels(name).set(levels[status])

    def _by_queue(self, family: _Family) -> _ByQueue[_Family]:
        return _ByQueue(family, self.bounds)

    def set_depth(self, rows: list[dict[str, Any]]) -> None:
        """Queue depth gauges from ``Store.queue_stats`` rows; the queues past the bound are
        summed under ``other`` (and their oldest wait is the longest of theirs)."""
        depth: dict[tuple[str, str], float] = {}
        oldest: dict[str, float] = {}
        for row in rows:
            queue = self.bounds.queue(row["queue"])
            for status in _DEPTH_STATUSES:
                depth[queue, status] = depth.get((queue, status), 0) + row[status]
            oldest[queue] = max(oldest.get(queue, 0.0), row["oldest_due_seconds"] or 0.0)
        self.depth.clear()
        self.oldest.clear()
        for (queue, status), value in depth.items():
            self.depth.labels(queue, status).set(value)
        for queue, seconds in oldest.items():
            self.oldest.labels(queue).set(seconds)
        self.depth_read_at = time.monotonic()

    def set_fair_keys(self, rows: Iterable[dict[str, Any]]) -> None:
        """The fair keys' gauges from ``Store.fair_keys`` rows, the first MAX_FAIR_KEYS of
        them: every series of the reading before goes, so a key that is no longer among the
        busiest (or has no job left) is not shown with its last counts."""
        self.fair_keys.clear()
        for row in itertools.islice(rows, MAX_FAIR_KEYS):
            for state in ("queued", "running"):
                self.fair_keys.labels(row["queue"], row["fair_key"], state).set(row[state])

    def know_tasks(self, names: Iterable[str]) -> None:
        """The tasks registered by workers (``Store.list_tasks``): these keep their own label
        in ``notifyq_jobs_enqueued``. Counts held for a task until now are settled: under its
        name if it is among these, else under ``other``."""
        self.bounds.tasks = frozenset(names)
        self.enqueued.settle()

    def render(self) -> bytes:
        """The Prometheus text format. Seconds of CPU with many series: call it off the
        event loop."""
        return generate_latest(self.registry)


_DEPTH_STATUSES = (
    "waiting",
    "queued",
    "due",
    "processing",
    "suspended",
    "waiting_for_signal",
    "completed",
    "failed",
    "cancelled",
)


class LabelBounds:
    """Which queue and task names may be label values. The first ``max_queues`` queues seen
    keep their names, for the life of the process (so a series never changes its label);
    ``tasks`` are the names workers registered."""

    def __init__(self, max_queues: int = MAX_QUEUES) -> None:
        self.max_queues = max_queues
        self.tasks: frozenset[str] = frozenset()
        self._queues: set[str] = set()

    def queue(self, name: str) -> str:
        """The label of queue ``name``."""
        if name in self._queues:
            return name
        if len(self._queues) < self.max_queues:
            self._queues.add(name)
            return name
        return OTHER


class _Child(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class _Family(Protocol):
    def labels(self, *values: str) -> Any: ...


F = TypeVar("F", bound=_Family)


class _ByQueue(Generic[F]):
    """A metric family whose first label is a queue, bounded by ``bounds``."""

    def __init__(self, family: F, bounds: LabelBounds) -> None:
        self.family = family
        self._bounds = bounds

    def labels(self, queue: str, *rest: str) -> Any:
        """The child of these label values, the queue's bounded."""
        return self.family.labels(self._bounds.queue(queue), *rest)


class _Enqueued:
    """``notifyq_jobs_enqueued``, whose task label is a name the client chose: a task workers
    registered counts under its name, another waits (as a plain count) for the next scrape,
    which counts it under its name if a worker registered it meanwhile, else under ``other``.
    So a job enqueued just before its worker first started is not lost to ``other``, and a
    count, once under ``other``, never moves (counters only grow)."""

    def __init__(self, family: Counter, bounds: LabelBounds) -> None:
        self.family = family
        self._bounds = bounds
        self._pending: dict[tuple[str, str], float] = {}

    def labels(self, queue: str, task: str) -> _Child:
        """What to ``inc()`` for a job of ``task`` enqueued on ``queue``."""
        label = self._bounds.queue(queue)
        if task in self._bounds.tasks:
            child: _Child = self.family.labels(label, task)
            return child
        key = (label, task)
        if key not in self._pending and len(self._pending) >= MAX_PENDING:
            other: _Child = self.family.labels(label, OTHER)
            return other
        return _Pending(self, key)

    def hold(self, key: tuple[str, str], amount: float) -> None:
        """Adds to the count held for ``key`` (a queue label and a task name)."""
        self._pending[key] = self._pending.get(key, 0) + amount

    def settle(self) -> None:
        """Counts the held jobs under their task's label, or ``other``."""
        pending, self._pending = self._pending, {}
        for (queue, task), count in pending.items():
            label = task if task in self._bounds.tasks else OTHER
            self.family.labels(queue, label).inc(count)


class _Pending:
    """A count held by :class:`_Enqueued` until the next scrape."""

    __slots__ = ("_key", "_owner")

    def __init__(self, owner: _Enqueued, key: tuple[str, str]) -> None:
        self._owner = owner
        self._key = key

    def inc(self, amount: float = 1) -> None:
        self._owner.hold(self._key, amount)
