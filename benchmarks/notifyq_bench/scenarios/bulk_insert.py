"""``bulk-insert``: one ``INSERT ... SELECT`` of many jobs from plain SQL, against the same
statement into a plain table.

The plain table is a copy of the floor's ``bench.jobs`` (:mod:`notifyq_bench.bare`) with no
trigger at all: the columns, checks, indexes and storage options of ``notifyq.jobs``, and column
defaults where notifyq fills a job's queue, priority and max_attempts from its task. The
statement names only the task and the payload, as a psql user would, so notifyq's defaults
trigger runs for every row, and its notify trigger once. No worker runs: the figure is what the
insert costs its producer. The two tables take turns, each going first every other repeat, from
empty and after a checkpoint.
"""

from __future__ import annotations

import time
from typing import Any

from psycopg import sql

from notifyq_bench.report import RATIO, Figure, Target
from notifyq_bench.scenarios.context import NOTIFYQ_JOBS, Context, Scenario
from notifyq_bench.scenarios.measure import settle, truncate
from notifyq_bench.tasks import NOOP

PLAIN_JOBS = sql.SQL("bench.plain_jobs")
INSERT = (
    "INSERT INTO {} (task, payload) "
    "SELECT %s, jsonb_build_object('n', n) FROM generate_series(1, %s) AS n"
)


def run(ctx: Context) -> None:
    """Jobs/s of one INSERT ... SELECT of ``bulk_rows`` jobs into each table, and their ratio."""
    rows = ctx.sizes.bulk_rows
    raw: dict[str, Any] = {"rows": rows, "notifyq": [], "plain": []}
    tables = {"notifyq": NOTIFYQ_JOBS, "plain": PLAIN_JOBS}
    with ctx.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench.plain_jobs (LIKE bench.jobs INCLUDING ALL)")
        for r in range(ctx.repeat):
            order = ["notifyq", "plain"] if r % 2 == 0 else ["plain", "notifyq"]
            for who in order:
                ctx.step(f"INSERT ... SELECT of {rows:,} jobs into the {who} table, repeat {r + 1}")
                truncate(conn, tables[who])
                settle(conn)
                statement = sql.SQL(INSERT).format(tables[who])
                started = time.perf_counter()
                with conn.transaction():
                    conn.execute(statement, [NOOP, rows])
                seconds = time.perf_counter() - started
                raw[who].append({"seconds": seconds, "jobs_per_s": rows / seconds})
                ctx.done()
        truncate(conn, NOTIFYQ_JOBS)
        conn.execute("DROP TABLE bench.plain_jobs")
    ctx.results.raw["bulk_insert"] = raw
    notifyq = [run["jobs_per_s"] for run in raw["notifyq"]]
    plain = [run["jobs_per_s"] for run in raw["plain"]]
    ctx.results.add(
        Figure(
            "bulk_insert.notifyq",
            "bulk-insert",
            f"bulk SQL INSERT ... SELECT of {rows:,} jobs",
            "jobs/s",
            notifyq,
            None,
            plain,
            "plain table",
        )
    )
    ctx.results.add(
        Figure(
            "bulk_insert.vs_plain",
            "bulk-insert",
            "bulk SQL INSERT, notifyq.jobs / a plain table with its indexes",
            RATIO,
            [a / b for a, b in zip(notifyq, plain, strict=True)],
            Target(">=", 0.5),
        )
    )


SCENARIO = Scenario("bulk-insert", run, lambda repeat, s: 2 * repeat)
