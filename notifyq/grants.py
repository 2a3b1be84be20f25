"""``notifyq grant ROLE --as KIND``: the least privileges each kind of client needs.

The schema's owner runs the migrations; nothing else needs DDL. Roles of the other kinds:

- ``producer``: enqueues jobs (a plain ``INSERT`` of the columns a producer may set,
  ``notifyq.enqueue``, ``Queue.enqueue``, workflows) and reads the jobs whose ids it holds
  (``Queue.get``, ``Queue.wait``: through ``notifyq.job_v1`` and the watch functions). It reads
  no table, so it sees neither the jobs of other clients (their payloads, results and errors)
  nor their ids; it can neither change a job nor claim one. The insert triggers and the
  enqueue functions run as the schema's owner (they read the tasks' registrations and the
  waiting workers), so the producer needs no privilege on those tables.
- ``worker``: runs workers and the API (``serve --no-worker`` too, with
  ``NOTIFYQ_AUTO_MIGRATE=false``): reads and writes the rows of notifyq's tables, never their
  shape, and executes every function of the schema (those of later migrations too, by the
  default privileges of the role that runs ``grant``, the schema's owner). The archive's
  partitions (NOTIFYQ_ARCHIVE_AFTER) are created and dropped through two of them, which run as
  the schema's owner.

PUBLIC executes only ``notifyq.enqueue`` (sql/022): every other function, among them those that
run as the schema's owner (the maintenance lead, the watches, the wake-ups), is refused to a
role that is not granted one of these kinds.
"""

from __future__ import annotations

from typing import Literal

import psycopg
from psycopg import sql

from notifyq.db import connect_sync, first_line
from notifyq.errors import DatabaseError
from notifyq.settings import Settings

Kind = Literal["producer", "worker"]
KINDS: tuple[Kind, ...] = ("producer", "worker")

#: The columns of notifyq.jobs a producer may name in an INSERT (the rest are the engine's).
PRODUCER_COLUMNS = ("id", "task", "payload", "queue", "priority", "run_at", "dedup_key",
                    "max_attempts", "created_at", "depends_on", "group_key",
                    "workflow_id", "trace_context", "fair_key")  # fmt: skip
#: Tables whose rows a worker (or the API) reads and writes.
WORKER_TABLES = (
    "jobs", "jobs_done", "claim_floors", "tasks", "queues", "periodic_ticks", "waiting_workers",
    "watched_jobs", "minute_stats", "job_steps", "job_signals", "fair_lanes", "fair_weights",
    "lane_floors",
)  # fmt: skip
#: Tables a worker only reads.
WORKER_READS = ("settings", "migrations")
#: The archive (sql/015): a worker's maintenance leader moves finished jobs into it; reads of a
#: job (any client's) look there when the job is not in notifyq.jobs.
ARCHIVE = "jobs_archive"
#: The functions a producer's enqueues and reads call (sql/022 grants the same to producers
#: granted before it). Every other function is the worker's.
PRODUCER_FUNCTIONS = (
    "uuid_v7()",
    "keep_task_defaults_v2(text)",
    "job_defaults_v1(text[], jsonb[], text[], integer[], integer[], integer)",
    "enqueue_v4(text, jsonb, text, integer, timestamptz, float8, text, integer, integer, uuid[], "
    "text, uuid, uuid, jsonb)",
    "job_v1(uuid)",
    # sql/024: the enqueues that take a fair_key, on_conflict and debounce, and the read of a
    # job that shows its fair_key.
    "enqueue_v5(text, jsonb, text, integer, timestamptz, float8, text, integer, integer, uuid[], "
    "text, uuid, uuid, jsonb, text, text, float8)",
    "enqueue_many_v6(text[], jsonb[], text[], integer[], timestamptz[], float8[], text[], "
    "integer[], integer, text[], text[], uuid[], uuid[], jsonb, text[], text[], text[], float8[])",
    "job_v3(uuid)",
    # sql/023: a job's read with its steps, and sending a signal (a producer's act).
    "job_v2(uuid)",
    "signal(uuid, text, jsonb)",
    "signal_v1(uuid, text, jsonb)",
    "watch_v1(uuid, text, float8)",
    "refresh_watches_v1(text, uuid[], float8)",
    "unwatch_v1(uuid, text)",
)


def statements(role: str, kind: Kind) -> list[sql.Composed]:
    """The GRANT statements that give ``role`` the privileges of ``kind``."""
    who = sql.Identifier(role)
    schema = sql.Identifier("notifyq")
    found: list[sql.Composed] = [
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, who),
    ]
    if kind == "producer":
        columns = sql.SQL(", ").join(map(sql.Identifier, PRODUCER_COLUMNS))
        found += [
            sql.SQL("GRANT INSERT ({}) ON notifyq.jobs TO {}").format(columns, who),
            # Versions before 22 let a producer read every job: taken back.
            sql.SQL("REVOKE SELECT ON notifyq.jobs, notifyq.jobs_done, {} FROM {}").format(
                sql.Identifier("notifyq", ARCHIVE), who
            ),
        ]
        # A function's signature is not an identifier: these are constants of this module.
        found += [
            sql.SQL("GRANT EXECUTE ON FUNCTION notifyq.{} TO {}").format(sql.SQL(function), who)
            for function in PRODUCER_FUNCTIONS
        ]
        return found
    tables = sql.SQL(", ").join(sql.Identifier("notifyq", name) for name in WORKER_TABLES)
    reads = sql.SQL(", ").join(sql.Identifier("notifyq", name) for name in WORKER_READS)
    found += [
        sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(tables, who),
        sql.SQL("GRANT SELECT ON {} TO {}").format(reads, who),
        sql.SQL("GRANT SELECT, INSERT, DELETE ON {} TO {}").format(
            sql.Identifier("notifyq", ARCHIVE), who
        ),
    ]
    found += [
        sql.SQL("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {} TO {}").format(schema, who),
        sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA {} GRANT EXECUTE ON FUNCTIONS TO {}").format(
            schema, who
        ),
    ]
    return found


def login_statement(role: str, password: str, *, exists: bool) -> sql.Composed:
    """``CREATE ROLE`` (or, when it ``exists``, ``ALTER ROLE``) ``role`` able to log in with
    ``password``. DDL takes no parameters: the password goes as a quoted literal."""
    verb = sql.SQL("ALTER ROLE" if exists else "CREATE ROLE")
    return sql.SQL("{} {} LOGIN PASSWORD {}").format(
        verb, sql.Identifier(role), sql.Literal(password)
    )


def grant(settings: Settings, role: str, kind: Kind, *, password: str | None = None) -> None:
    """Runs the :func:`statements` of ``kind`` for ``role``, all or none; with ``password``,
    first makes ``role`` a role that logs in with it (created when missing), as a deployment
    that keeps its secrets in the environment needs (docker-compose.yml does).

    Raises :class:`~notifyq.errors.DatabaseUnavailable` when the database cannot be reached and
    :class:`~notifyq.errors.DatabaseError` when it refuses (the caller is not the owner of the
    schema, or the schema is not there yet)."""
    # No statement timeout, as for migrations: this is the schema owner's statement.
    with connect_sync(settings, "notifyq-grant", statement_timeout=0) as conn:
        try:
            with conn.transaction():
                if password is not None:
                    found = conn.execute(
                        "SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", [role]
                    ).fetchone()
                    conn.execute(login_statement(role, password, exists=found is not None))
                for statement in statements(role, kind):
                    conn.execute(statement)
        except psycopg.Error as exc:
            raise DatabaseError(
                f"could not grant {kind} privileges to {role!r}: {first_line(exc)} (run it as "
                "the owner of the notifyq schema, after `notifyq migrate`)",
                sqlstate=exc.sqlstate,
            ) from exc
