"""``insert-trigger``: what the NOTIFY trigger costs concurrent single-row INSERTs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from typing import Any

import psycopg
from psycopg import sql

from notifyq_bench.harness import BenchError, child_env, poll_until
from notifyq_bench.report import RATIO, Figure, Target
from notifyq_bench.scenarios.context import NOTIFYQ_JOBS, Context, Scenario
from notifyq_bench.scenarios.measure import settle, truncate
from notifyq_bench.tasks import NOOP

INSERT_ONE = f"INSERT INTO notifyq.jobs (task, payload, max_attempts) VALUES ('{NOOP}', '{{}}', 1);"
INSERT_CLIENTS = 8


def notify_triggers(conn: psycopg.Connection[Any]) -> list[str]:
    """The trigger(s) on notifyq.jobs that send the notification: ``jobs_notify_inserted`` while
    it exists, else those whose function calls pg_notify or a wake function."""
    rows = conn.execute(
        "SELECT t.tgname, t.tgname = 'jobs_notify_inserted' "
        "FROM pg_trigger AS t JOIN pg_proc AS p ON p.oid = t.tgfoid "
        "WHERE t.tgrelid = 'notifyq.jobs'::regclass AND NOT t.tgisinternal "
        "AND (t.tgname = 'jobs_notify_inserted' "
        "     OR p.prosrc ~* 'pg_notify\\s*\\(|\\.wake_v[0-9]+\\s*\\(') ORDER BY 1"
    ).fetchall()
    known = [name for name, is_known in rows if is_known]
    return known or [name for name, _ in rows]


def set_triggers(conn: psycopg.Connection[Any], names: list[str], enabled: bool) -> None:
    verb = sql.SQL("ENABLE" if enabled else "DISABLE")
    for name in names:
        conn.execute(
            sql.SQL("ALTER TABLE notifyq.jobs {} TRIGGER {}").format(verb, sql.Identifier(name))
        )


def insert_rate(ctx: Context, seconds: float) -> dict[str, Any]:
    """Single-row durable INSERTs into notifyq.jobs from 8 concurrent clients, one transaction
    each, for ``seconds``: pgbench when it is installed, else Python threads."""
    pgbench = shutil.which("pgbench")
    if pgbench:
        script = ctx.workdir / "insert.sql"
        script.write_text(INSERT_ONE + "\n")
        out = subprocess.run(
            [
                pgbench,
                "-n",
                "-c",
                str(INSERT_CLIENTS),
                "-j",
                "2",
                "-M",
                "prepared",
                "-T",
                str(max(1, round(seconds))),
                "-f",
                str(script),
                ctx.url,
            ],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        )
        if out.returncode != 0:
            raise BenchError("pgbench failed:\n" + (out.stderr or out.stdout)[-2000:])
        match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out.stdout)
        if match is None:
            raise BenchError("could not read pgbench's output:\n" + out.stdout[-2000:])
        done = re.search(r"number of transactions actually processed: (\d+)", out.stdout)
        return {
            "tool": "pgbench",
            "rate": float(match.group(1)),
            "inserts": int(done.group(1)) if done else None,
        }
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "notifyq_bench.loadgen",
            "inserts",
            ctx.url,
            "--statement",
            INSERT_ONE,
            "--clients",
            str(INSERT_CLIENTS),
            "--seconds",
            str(seconds),
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ctx.workdir,
        timeout=seconds + 60,
    )
    if out.returncode != 0:
        raise BenchError("the insert clients failed:\n" + out.stderr[-2000:])
    result: dict[str, Any] = json.loads(out.stdout)
    result["tool"] = "python threads"
    return result


def run(ctx: Context) -> None:
    """The NOTIFY trigger's cost on 8 concurrent single-row INSERT clients: trigger off, then
    on while the only worker is busy (every slot running a long sleep job), then on with no
    worker at all."""
    seconds = ctx.sizes.insert_seconds
    raw: dict[str, Any] = {
        "clients": INSERT_CLIENTS,
        "seconds": seconds,
        "off": [],
        "on_busy": [],
        "on_no_worker": [],
    }
    with ctx.connect() as conn:
        triggers = notify_triggers(conn)
        truncate(conn, NOTIFYQ_JOBS)
    if not triggers:
        raise BenchError("found no notify trigger on notifyq.jobs to switch off")
    raw["triggers"] = triggers

    def measure(kind: str, enabled: bool) -> None:
        with ctx.connect() as conn:
            conn.execute(sql.SQL("DELETE FROM notifyq.jobs WHERE task = %s"), [NOOP])
            conn.execute("VACUUM notifyq.jobs, notifyq.jobs_done")
            settle(conn)
            set_triggers(conn, triggers, enabled)
        try:
            raw[kind].append(insert_rate(ctx, seconds))
        finally:
            with ctx.connect() as conn:
                set_triggers(conn, triggers, True)

    busy_slots = 2
    ctx.step("starting a worker and filling its slots with long sleep jobs")
    (worker,) = ctx.start_workers(1, busy_slots)
    try:
        with ctx.connect() as conn:
            conn.execute(
                "INSERT INTO notifyq.jobs (task, payload, max_attempts) "
                "SELECT 'sleep', '{\"seconds\": 3600}', 1 FROM generate_series(1, %s)",
                [busy_slots],
            )

            def all_busy() -> bool:
                row = conn.execute(
                    "SELECT count(*) FROM notifyq.jobs WHERE status = 'processing'"
                ).fetchone()
                return bool(row and row[0] == busy_slots)

            poll_until(all_busy, 30, "the worker to take its sleep jobs")
        for r in range(ctx.repeat):
            ctx.step(f"trigger off, repeat {r + 1}")
            measure("off", False)
            ctx.done()
            ctx.step(f"trigger on, worker busy, repeat {r + 1}")
            measure("on_busy", True)
            worker.check_alive()
            ctx.done()
    finally:
        ctx.children.stop(worker, timeout=5)
    for r in range(ctx.repeat):
        ctx.step(f"trigger on, no worker, repeat {r + 1}")
        measure("on_no_worker", True)
        ctx.done()
    with ctx.connect() as conn:
        truncate(conn, NOTIFYQ_JOBS)
    ctx.results.raw["insert_trigger"] = raw
    _add_figures(ctx, raw)


def _add_figures(ctx: Context, raw: dict[str, Any]) -> None:
    """The figures of the insert runs in ``raw``."""
    off = [run["rate"] for run in raw["off"]]
    busy = [run["rate"] for run in raw["on_busy"]]
    none = [run["rate"] for run in raw["on_no_worker"]]
    add = ctx.results.add
    add(
        Figure(
            "insert.off",
            "insert-trigger",
            "inserts/s, 8 clients, notify trigger off",
            "inserts/s",
            off,
        )
    )
    add(
        Figure(
            "insert.on_busy",
            "insert-trigger",
            "inserts/s, 8 clients, trigger on, workers busy",
            "inserts/s",
            busy,
            None,
            off,
            "trigger off",
        )
    )
    add(
        Figure(
            "insert.on_busy_vs_off",
            "insert-trigger",
            "insert rate, trigger on (workers busy) / off",
            RATIO,
            [a / b for a, b in zip(busy, off, strict=True)],
            Target(">=", 0.85),
        )
    )
    add(
        Figure(
            "insert.on_no_worker",
            "insert-trigger",
            "inserts/s, 8 clients, trigger on, no worker",
            "inserts/s",
            none,
            None,
            off,
            "trigger off",
        )
    )


SCENARIO = Scenario("insert-trigger", run, lambda repeat, s: 3 * repeat)
