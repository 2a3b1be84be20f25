"""``notifyq doctor``: what is wrong with a database's queue, and what to do about it.

:func:`examine` reads the database's health through the store and judges each part of it (a
:class:`Check`: ok, warn or fail, a summary and the next step): the oldest snapshot that holds
the xmin horizon (dead rows pile up behind it, and every claim steps over them), the dead rows
of the queue's tables, the LISTEN connections that stopped receiving, leases that ran out and
nobody rescued, the maintenance lead, the schema's version against this code's, and grants
that overstep. The same readings become metrics (:meth:`notifyq.metrics.Metrics.set_health`),
and the maintenance leader logs a warning when the horizon is older than
NOTIFYQ_HORIZON_WARN_AFTER.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

from notifyq.migrations import latest_version
from notifyq.store import Store

Status = Literal["ok", "warn", "fail"]

#: Dead row versions of a table past which (and past its live ones) vacuum is behind.
DEAD_ROWS_WARN = 100_000
#: Seconds after its lease ran out that a running job counts as stuck: the leader rescues
#: expired leases every few seconds.
STUCK_AFTER = 60.0
#: Share of the notification queue in use past which a listener has stopped reading.
NOTIFY_QUEUE_WARN = 0.1
#: Seconds a listener may spend inside a transaction before it counts as deaf.
DEAF_AFTER = 10.0


@dataclass(frozen=True)
class Check:
    """One part of the health: its verdict, what was found, and what to do (None when ok)."""

    name: str
    status: Status
    summary: str
    advice: str | None = None


@dataclass(frozen=True)
class Health:
    """Every check, and the figures they were judged on (the metrics' too)."""

    checks: list[Check]
    horizon: list[dict[str, Any]]
    tables: list[dict[str, Any]]
    listeners: list[dict[str, Any]]
    overview: dict[str, Any]
    expected_version: int
    deaf_listeners: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """Whether a check failed (``notifyq doctor`` then exits 1)."""
        return any(check.status == "fail" for check in self.checks)

    @property
    def horizon_seconds(self) -> float:
        """Age of the oldest snapshot a session or prepared transaction holds (0: none)."""
        return max((row["age_seconds"] or 0.0 for row in self.horizon), default=0.0)

    @property
    def horizon_xid_age(self) -> int:
        """Transactions since the oldest snapshot anything holds (0: none)."""
        return max((row["xid_age"] or 0 for row in self.horizon), default=0)

    def figures(self) -> dict[str, Any]:
        """The keyword arguments of :meth:`notifyq.metrics.Metrics.set_health`."""
        return {
            "horizon_seconds": self.horizon_seconds,
            "horizon_xid_age": self.horizon_xid_age,
            "tables": self.tables,
            "listeners": len(self.listeners),
            "stopped_listeners": self.deaf_listeners,
            "overview": self.overview,
            "expected_version": self.expected_version,
            "checks": [(check.name, check.status) for check in self.checks],
        }

    def as_json(self) -> str:
        """The checks and their figures as one JSON document (``notifyq doctor --json``)."""
        return json.dumps(
            {
                "ok": not self.failed,
                "checks": [check.__dict__ for check in self.checks],
                "horizon": self.horizon,
                "tables": self.tables,
                "listeners": self.listeners,
                "overview": self.overview,
                "expected_version": self.expected_version,
            },
            default=str,
            indent=2,
        )


async def examine(store: Store, *, horizon_warn_after: float) -> Health:
    """Reads the database's health and judges it; a horizon older than ``horizon_warn_after``
    seconds fails."""
    horizon = await store.horizon_holders()
    tables = await store.table_tuples()
    listeners = await store.listener_connections()
    overview = await store.health_overview()
    expected = latest_version()
    deaf = [row for row in listeners if _deaf(row)]
    checks = [
        _horizon(horizon, horizon_warn_after),
        _tables(tables, overview),
        _listeners(listeners, deaf, overview),
        _leases(overview),
        _unserved(overview),
        _leadership(overview),
        _schema(overview, expected),
        _grants(overview),
    ]
    return Health(checks, horizon, tables, listeners, overview, expected, len(deaf))


def render(health: Health) -> list[str]:
    """The lines ``notifyq doctor`` prints: one per check, its advice indented below."""
    marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
    lines = []
    for check in health.checks:
        lines.append(f"{marks[check.status]}  {check.name}: {check.summary}")
        if check.advice:
            lines.append(f"      -> {check.advice}")
    verdict = "something is wrong" if health.failed else "nothing is wrong"
    lines.append(f"notifyq doctor: {verdict}")
    return lines


# -- the checks ------------------------------------------------------------------------------


def describe_holder(row: dict[str, Any]) -> str:
    """One holder of the horizon in words: what it is, how old, and what it runs."""
    detail = row["detail"]
    if row["kind"] == "session":
        query = " ".join(str(detail.get("query") or "").split())[:120]
        return (
            f"pid {detail['pid']} ({detail.get('user')}@{detail.get('database')}, "
            f"{detail.get('application') or 'no application name'}, {detail.get('state')}) "
            f"holds a snapshot {row['age_seconds']:.1f} s old ({row['xid_age']} transactions); "
            f"query: {query!r}"
        )
    if row["kind"] == "replication slot":
        active = "active" if detail.get("active") else "inactive"
        return (
            f"replication slot {row['holder']!r} ({active}) holds xmin "
            f"{row['xid_age']} transactions back"
        )
    return (
        f"prepared transaction {row['holder']!r} (owner {detail.get('owner')}) is "
        f"{row['age_seconds']:.1f} s old ({row['xid_age']} transactions)"
    )


def _horizon(rows: list[dict[str, Any]], warn_after: float) -> Check:
    name = "xmin horizon"
    if not rows:
        return Check(name, "ok", "no open snapshot holds dead rows back")
    oldest = rows[0]
    old = [row for row in rows if (row["age_seconds"] or 0.0) > warn_after]
    if old:
        worst = max(old, key=lambda row: row["age_seconds"])
        advice = {
            "session": f"end it (SELECT pg_terminate_backend({worst['holder']})) or its "
            "transaction; set idle_in_transaction_session_timeout so a forgotten BEGIN ends "
            "itself",
            "prepared transaction": f"COMMIT PREPARED or ROLLBACK PREPARED {worst['holder']!r}",
        }[worst["kind"]]
        return Check(
            name,
            "fail",
            f"{describe_holder(worst)}: older than NOTIFYQ_HORIZON_WARN_AFTER={warn_after:g} s; "
            "dead rows pile up behind it in every table and each claim steps over them",
            advice,
        )
    if oldest["kind"] == "replication slot" and not oldest["detail"].get("active"):
        return Check(
            name,
            "warn",
            describe_holder(oldest),
            f"drop it if nothing uses it: SELECT pg_drop_replication_slot({oldest['holder']!r})",
        )
    return Check(name, "ok", f"oldest: {describe_holder(oldest)}")


def _tables(rows: list[dict[str, Any]], overview: dict[str, Any]) -> Check:
    name = "dead rows"
    behind = [row for row in rows if row["dead"] > DEAD_ROWS_WARN and row["dead"] > row["live"]]
    figures = ", ".join(f"{row['table']} {row['dead']:,} dead/{row['live']:,} live" for row in rows)
    if behind:
        tables = ", ".join(f"notifyq.{row['table']}" for row in behind)
        why = "" if overview["autovacuum"] else " (autovacuum is off on this server)"
        return Check(
            name,
            "warn",
            f"vacuum is behind on {tables}{why}: {figures}",
            f"VACUUM {tables}; if the count does not fall, an old snapshot holds them (see the "
            "xmin horizon)" + ("" if overview["autovacuum"] else "; turn autovacuum on"),
        )
    if not overview["autovacuum"]:
        return Check(
            name,
            "warn",
            f"autovacuum is off on this server: nothing removes dead rows but a VACUUM by hand "
            f"({figures or 'no statistics yet'})",
            "turn it on (autovacuum = on), or VACUUM notifyq's tables on a schedule",
        )
    return Check(name, "ok", figures or "no statistics yet")


def _deaf(row: dict[str, Any]) -> bool:
    inside = row["state"] in ("idle in transaction", "idle in transaction (aborted)")
    return (inside and (row["state_seconds"] or 0.0) > DEAF_AFTER) or row[
        "wait_event"
    ] == "ClientWrite"


def _listeners(
    rows: list[dict[str, Any]], deaf: list[dict[str, Any]], overview: dict[str, Any]
) -> Check:
    name = "listeners"
    usage = float(overview["notification_queue_usage"] or 0.0)
    if deaf:
        pids = ", ".join(str(row["pid"]) for row in deaf)
        return Check(
            name,
            "fail",
            f"{len(deaf)} of {len(rows)} LISTEN connection(s) stopped receiving (pid {pids}: "
            "inside a transaction, or their process stopped reading)",
            "restart the process that owns it; notifications to everyone queue up behind it "
            f"(the queue is {usage:.0%} full)",
        )
    if usage > NOTIFY_QUEUE_WARN:
        return Check(
            name,
            "fail",
            f"the notification queue is {usage:.0%} full: a listener stopped reading",
            "find the session that LISTENs and idles in a transaction (pg_stat_activity) and "
            "end it; at 100% every NOTIFY, so every insert, fails",
        )
    return Check(name, "ok", f"{len(rows)} LISTEN connection(s), all receiving")


def _leases(overview: dict[str, Any]) -> Check:
    name = "leases"
    expired = int(overview["expired_leases"])
    oldest = overview["oldest_expired_seconds"]
    if expired and oldest is not None and oldest > STUCK_AFTER:
        return Check(
            name,
            "fail",
            f"{expired} running job(s) whose lease ran out, the oldest {oldest:.0f} s ago: "
            "nobody rescues them",
            "start a worker (the maintenance leader rescues them within seconds), or see the "
            "leadership check",
        )
    if expired:
        return Check(name, "ok", f"{expired} lease(s) just ran out; the leader rescues them")
    return Check(name, "ok", "no running job has lost its lease")


def _unserved(overview: dict[str, Any]) -> Check:
    name = "unserved tasks"
    levels = overview["unserved"] or []
    if not levels:
        return Check(name, "ok", "every queue's first claimable job is of a task a worker knows")
    heads = "; ".join(
        f"queue {level['queue']!r} (priority {level['priority']}): task {level['task']!r}, "
        f"due {level['waited_seconds']:.0f} s ago"
        for level in levels[:5]
    )
    more = f" (and {len(levels) - 5} more)" if len(levels) > 5 else ""
    tasks = sorted({str(level["task"]) for level in levels})
    return Check(
        name,
        "warn",
        f"{len(levels)} queue level(s) begin with a job of a task no worker has registered: "
        f"{heads}{more}. Such a job waits for ever, and every claim of its queue steps over "
        "the jobs claimed since it",
        f"start a worker that serves {', '.join(map(repr, tasks))} (a typo in a task name?), "
        f"or cancel those jobs: `notifyq jobs --status queued --task {shlex.quote(tasks[0])}` "
        "lists them, "
        "`notifyq cancel ID...` cancels them",
    )


def _leadership(overview: dict[str, Any]) -> Check:
    name = "leadership"
    workers = int(overview["idle_workers"]) + int(overview["busy_workers"])
    if overview["leader"]:
        return Check(name, "ok", f"worker {overview['leader']} leads the maintenance")
    if workers:
        return Check(
            name,
            "fail",
            f"{workers} worker(s) run but none leads the maintenance: lost jobs are not "
            "rescued and retention stops",
            "check the workers' logs for 'could not renew the lead'; their role needs "
            "`notifyq grant ROLE --as worker`",
        )
    return Check(
        name, "warn", "no worker is running: nothing runs jobs or rescues them", "start a worker"
    )


def _schema(overview: dict[str, Any], expected: int) -> Check:
    name = "schema"
    version = overview["schema_version"]
    if version == expected:
        return Check(name, "ok", f"version {version}, as this notifyq expects")
    if version is None or version < expected:
        return Check(
            name,
            "fail",
            f"version {version}, this notifyq needs {expected}",
            "run `notifyq migrate` as the schema's owner",
        )
    return Check(
        name,
        "fail",
        f"version {version}, newer than this notifyq's {expected}",
        "upgrade notifyq where this runs",
    )


def _grants(overview: dict[str, Any]) -> Check:
    name = "grants"
    public = list(overview["public_functions"])
    readers = list(overview["job_readers"])
    if public:
        shown = ", ".join(public[:5]) + (" ..." if len(public) > 5 else "")
        return Check(
            name,
            "fail",
            f"{len(public)} function(s) of notifyq run for any role: {shown}",
            "REVOKE EXECUTE ON FUNCTION ... FROM PUBLIC (a migration run by another role than "
            "the schema's owner misses its default privileges)",
        )
    if readers:
        return Check(
            name,
            "warn",
            f"role(s) {', '.join(readers)} read every job's payload without being workers",
            "grant them again: `notifyq grant ROLE --as producer` (reads by id only since "
            "version 22)",
        )
    return Check(
        name,
        "ok",
        "PUBLIC runs only notifyq.enqueue and notifyq.signal; no producer reads every job",
    )
