"""The floor: a bare psycopg queue loop with no notifyq code in it, as strict as one can be.

Two connections, both autocommit. The first only LISTENs, in a thread of its own, and sets a
flag when a notification comes. The second does all the work, one statement a round trip:
:data:`STEP` marks the previous batch done (a data-modifying CTE, fenced like notifyq's
completion on the worker and the attempt) and, in the same statement, claims up to
``min(free slots, batch)`` queued jobs with ``FOR UPDATE SKIP LOCKED``. The handlers are no-ops
that record the wall-clock time, like the bench's stamp handler, and run before the next
statement; so with ``--batch 50`` there are 50 slots, all free again when the next statement
goes out, and a full queue drains at one statement per 50 jobs. When a statement claims nothing
the loop waits for the flag (or ``poll`` seconds). The flag is cleared before each statement, so
a notification that arrives while one runs is not missed. Jobs are enqueued by the bench with
one multi-row INSERT.

It works on ``bench.jobs`` and ``bench.jobs_done``, which :data:`SCHEMA` creates: tables that
cost what ``notifyq.jobs`` and ``notifyq.jobs_done`` cost to write, with the same columns, CHECK
constraints, indexes and storage options (tests/test_bench.py compares them, so a schema change
in ``sql/`` must be followed here), and a bare statement-level notify trigger. A completion moves
its job from the first to the second, as notifyq's does. Unlike notifyq's, its queue, priority and
max_attempts have column defaults: there is no defaults trigger to fill them in.

Run as ``python -m notifyq_bench.bare CONNINFO --batch N``; it prints ``ready`` on stderr once
it listens, and runs until it is terminated. The bench starts one process per "process" of a
figure (1x50, 2x50, 1x1: processes x slots).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import psycopg

CHANNEL = "bench"

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS bench;
CREATE TABLE bench.jobs (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    task             text NOT NULL,
    queue            text NOT NULL DEFAULT 'default',
    payload          jsonb NOT NULL DEFAULT '{}'::jsonb,
    status           text NOT NULL DEFAULT 'queued',
    priority         integer NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    attempt_count    integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL DEFAULT 1,
    dedup_key        text,
    result           jsonb,
    last_error       text,
    errors           jsonb NOT NULL DEFAULT '[]'::jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    worker_id        text,
    lease_expires_at timestamptz,
    cancel_requested_at timestamptz,
    claims           integer NOT NULL DEFAULT 0,
    heartbeat_at     timestamptz,
    lost_count       integer NOT NULL DEFAULT 0,
    depends_on       uuid[] NOT NULL DEFAULT '{}',
    workflow_id      uuid,
    group_key        text,
    group_seq        bigint,
    group_blocked    boolean NOT NULL DEFAULT false,
    progress         jsonb,
    trace_context    jsonb
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 1);
-- As sql/018 adds it to notifyq.jobs.
ALTER TABLE bench.jobs ADD COLUMN ref text;
-- As sql/023 adds them (durable jobs: a suspended job's time and signal).
ALTER TABLE bench.jobs ADD COLUMN suspended_until timestamptz, ADD COLUMN waiting_for_signal text;
-- As sql/024 adds it (fair claims), with the indexes of keyed jobs queued and running.
ALTER TABLE bench.jobs ADD COLUMN fair_key text;
CREATE INDEX ON bench.jobs (queue, priority, fair_key, run_at, id)
    WHERE status = 'queued' AND NOT group_blocked AND fair_key IS NOT NULL;
CREATE INDEX ON bench.jobs (task, fair_key) WHERE status = 'processing' AND fair_key IS NOT NULL;
-- The rules of a job's columns are notifyq's insert trigger since sql/020, not CHECKs: the loop
-- inserts nothing but plain jobs, so it has neither. The statuses each table holds stay CHECKs,
-- and so does what only a suspended job says (sql/023).
ALTER TABLE ONLY bench.jobs ADD CONSTRAINT jobs_live_statuses
    CHECK (status IN ('waiting', 'queued', 'processing', 'suspended')) NO INHERIT;
ALTER TABLE ONLY bench.jobs ADD CONSTRAINT jobs_suspension
    CHECK ((status = 'suspended' OR (suspended_until IS NULL AND waiting_for_signal IS NULL))
           AND (waiting_for_signal IS NULL OR char_length(waiting_for_signal) BETWEEN 1 AND 200)
           AND (suspended_until IS NULL
                OR suspended_until BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00'))
    NO INHERIT;
CREATE INDEX ON bench.jobs (suspended_until) WHERE status = 'suspended';
CREATE INDEX ON bench.jobs (run_at)
    WHERE status = 'queued' AND NOT group_blocked AND run_at > created_at;
CREATE INDEX ON bench.jobs (queue, priority DESC, run_at, id)
    WHERE status = 'queued' AND NOT group_blocked;
CREATE UNIQUE INDEX ON bench.jobs (queue, dedup_key)
    WHERE status IN ('waiting', 'queued') AND dedup_key IS NOT NULL;
CREATE INDEX ON bench.jobs USING gin (depends_on) WITH (fastupdate = off)
    WHERE status IN ('waiting', 'queued') AND depends_on <> '{}';
CREATE INDEX ON bench.jobs (queue, group_key, group_seq)
    WHERE group_key IS NOT NULL AND status IN ('waiting', 'queued', 'processing', 'suspended');
CREATE INDEX ON bench.jobs (workflow_id) WHERE workflow_id IS NOT NULL;
-- As sql/020 makes notifyq.jobs_done, where a completion moves its job.
CREATE TABLE bench.jobs_done (
    CONSTRAINT jobs_done_statuses CHECK (status IN ('completed', 'failed', 'cancelled'))
) INHERITS (bench.jobs)
WITH (autovacuum_vacuum_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.05);
ALTER TABLE bench.jobs_done ADD PRIMARY KEY (id);
CREATE INDEX ON bench.jobs_done (finished_at);
CREATE INDEX ON bench.jobs_done (status, task, created_at DESC)
    WHERE status IN ('failed', 'cancelled');
CREATE INDEX ON bench.jobs_done (workflow_id) WHERE workflow_id IS NOT NULL;
CREATE FUNCTION bench.notify_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('bench', q) FROM (SELECT DISTINCT queue AS q FROM inserted) AS s;
    RETURN NULL;
END;
$$;
CREATE TRIGGER jobs_notify_inserted AFTER INSERT ON bench.jobs
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION bench.notify_inserted();
"""

STEP = """
WITH done AS (
    DELETE FROM ONLY bench.jobs AS j
    USING unnest(%(ids)s::uuid[], %(attempts)s::integer[], %(results)s::jsonb[])
          AS d(id, attempt, result)
    WHERE j.id = d.id AND j.status = 'processing' AND j.worker_id = %(worker)s
      AND j.attempt_count = d.attempt
    RETURNING j.*, d.result AS outcome
), moved AS (
    INSERT INTO bench.jobs_done
        (id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts,
         dedup_key, result, errors, created_at, started_at, finished_at, worker_id, claims,
         lost_count, depends_on, workflow_id, group_key, group_seq, trace_context, ref,
         fair_key)
    SELECT id, task, queue, payload, 'completed', priority, run_at, attempt_count, max_attempts,
           dedup_key, outcome, errors, created_at, started_at, now(), worker_id, claims,
           lost_count, depends_on, workflow_id, group_key, group_seq, trace_context, ref,
           fair_key
    FROM done
), picked AS (
    SELECT id FROM ONLY bench.jobs
    WHERE queue = 'default' AND status = 'queued' AND NOT group_blocked AND run_at <= now()
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE ONLY bench.jobs AS j
SET status = 'processing', attempt_count = j.attempt_count + 1, started_at = now(),
    worker_id = %(worker)s, lease_expires_at = now() + interval '30 seconds'
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.attempt_count, j.payload
"""


def _listen(conninfo: str, wake: threading.Event, ready: threading.Event) -> None:
    """The LISTEN connection: sets ``wake`` on every notification, and does nothing else."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        ready.set()
        for _ in conn.notifies():
            wake.set()


def run(conninfo: str, batch: int, poll: float = 1.0) -> None:
    """Claims and completes jobs of ``bench.jobs`` until the process is terminated."""
    worker = f"bare:{os.getpid()}"
    wake, ready = threading.Event(), threading.Event()
    listener = threading.Thread(target=_listen, args=(conninfo, wake, ready), daemon=True)
    listener.start()
    if not ready.wait(30):
        raise RuntimeError("the LISTEN connection was not ready after 30s")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        print("bare loop ready", file=sys.stderr, flush=True)
        ids: list[Any] = []
        attempts: list[int] = []
        results: list[str] = []
        while True:
            wake.clear()
            rows: list[Any] = conn.execute(
                STEP,
                {
                    "ids": ids,
                    "attempts": attempts,
                    "results": results,
                    "worker": worker,
                    # Every slot is free again: the batch just claimed ran before this statement.
                    "limit": batch,
                },
                prepare=True,
            ).fetchall()
            # "Run" the batch: each job's handler records when it started.
            started = json.dumps({"t": time.time()})
            ids = [row[0] for row in rows]
            attempts = [row[1] for row in rows]
            results = [started] * len(rows)
            if not rows:
                wake.wait(poll)
            if not listener.is_alive():
                raise RuntimeError("the LISTEN connection is gone")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m notifyq_bench.bare")
    parser.add_argument("conninfo")
    parser.add_argument("--batch", type=int, default=50)
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error("--batch must be at least 1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        run(args.conninfo, args.batch)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
