"""The lean floor: what PostgreSQL itself can do for a job queue on this machine.

Every throughput, insert and pickup figure of the ``lean`` scenario is divided by it. It is the
smallest honest queue, fixed by the project's reference text (``floor/LEAN.md``) to the letter:
one narrow table, one partial index, a statement-level NOTIFY trigger, one LISTEN connection
that sets a flag, and one work connection that, in a single statement a round trip, marks the
previous batch done and claims the next. :data:`SCHEMA` and :data:`STATEMENT` are that text's
SQL, unchanged (tests/test_bench.py compares them with it when it is at hand): a figure of
notifyq is worth what its reference is, so the reference is never tuned, and never replaced by
a loop over notifyq's own table (the ``throughput`` scenario's "strict floor" is that other,
weaker reference).

The loop's handlers are no-ops that note the time; a job whose payload has a ``k`` key prints
``stamp <k> <time.time()>`` on stdout, so the bench reads pickup times from its log as it does
a peer's. When a statement claims nothing the loop waits for the flag (cleared before each
statement) or a 5 s poll.

Run as ``python -m notifyq_bench.lean CONNINFO --slots N``; it prints ``ready`` on stderr once
it listens, and runs until it is terminated.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import psycopg

CHANNEL = "lean_jobs"
POLL_SECONDS = 5.0
#: Rows of one ``INSERT ... SELECT`` when the bench fills the queue.
CHUNK = 10_000

SCHEMA = """
CREATE TABLE lean_jobs (
    id          bigserial PRIMARY KEY,
    status      text        NOT NULL DEFAULT 'queued',
    payload     jsonb       NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    started_at  timestamptz,
    finished_at timestamptz
);
CREATE INDEX lean_jobs_queued_idx ON lean_jobs (id) WHERE status = 'queued';
CREATE FUNCTION lean_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_notify('lean_jobs', ''); RETURN NULL; END $$;
CREATE TRIGGER lean_jobs_notify AFTER INSERT ON lean_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION lean_jobs_notify();
"""

STATEMENT = """
WITH acked AS (
    UPDATE lean_jobs SET status = 'done', finished_at = now() WHERE id = ANY(%(done)s::bigint[])
)
UPDATE lean_jobs SET status = 'running', started_at = now()
WHERE id IN (SELECT id FROM lean_jobs WHERE status = 'queued' ORDER BY id
             FOR UPDATE SKIP LOCKED LIMIT %(k)s)
RETURNING id, payload;
"""


def _listen(conninfo: str, wake: threading.Event, ready: threading.Event) -> None:
    """The LISTEN connection: sets ``wake`` on every notification, and does nothing else."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        ready.set()
        for _ in conn.notifies():
            wake.set()


def run(conninfo: str, slots: int) -> None:
    """Claims and completes jobs of ``lean_jobs`` until the process is terminated."""
    wake, ready = threading.Event(), threading.Event()
    listener = threading.Thread(target=_listen, args=(conninfo, wake, ready), daemon=True)
    listener.start()
    if not ready.wait(30):
        raise RuntimeError("the LISTEN connection was not ready after 30s")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        print("lean floor ready", file=sys.stderr, flush=True)
        done: list[int] = []
        while True:
            wake.clear()
            # Every slot is free again: the batch just claimed ran before this statement.
            rows: list[Any] = conn.execute(
                STATEMENT, {"done": done, "k": slots}, prepare=True
            ).fetchall()
            started = time.time()
            stamps = [f"stamp {row[1]['k']} {started!r}" for row in rows if "k" in row[1]]
            if stamps:
                print("\n".join(stamps), flush=True)
            done = [row[0] for row in rows]
            if not rows:
                wake.wait(POLL_SECONDS)
            if not listener.is_alive():
                raise RuntimeError("the LISTEN connection is gone")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m notifyq_bench.lean")
    parser.add_argument("conninfo")
    parser.add_argument("--slots", type=int, default=50)
    args = parser.parse_args(argv)
    if args.slots < 1:
        parser.error("--slots must be at least 1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        run(args.conninfo, args.slots)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
