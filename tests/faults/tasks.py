"""Tasks that the fault scenarios' worker processes import (``tests.faults.tasks``)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg

from notifyq import task

#: Every run of ``fault_step``, in the order they started: the scenario's own table, in the
#: database under test, written by the handler itself (not by notifyq).
RUNS_TABLE = """CREATE TABLE IF NOT EXISTS public.fault_runs (
    seq bigserial PRIMARY KEY, n integer NOT NULL, pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp())"""

_local = threading.local()


def _connection() -> psycopg.Connection[Any]:
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True, connect_timeout=5)
        _local.conn = conn
    return conn


@task("fault_step", max_attempts=25)
def fault_step(payload: dict[str, Any]) -> int:
    """Records this run of job ``payload["n"]`` in ``fault_runs``, then works for
    ``payload["seconds"]``. A payload without a whole ``n`` fails the job (KeyError,
    ValueError, TypeError): the bad rows of the kill scenario."""
    n = int(payload["n"])
    _connection().execute(
        "INSERT INTO public.fault_runs (n, pid) VALUES (%s, %s)", [n, os.getpid()]
    )
    time.sleep(float(payload.get("seconds", 0)))
    return n


@task("fault_stamp", max_attempts=1)
async def fault_stamp(payload: dict[str, Any]) -> dict[str, float]:
    """Answers when its handler started: the pickup latency is that minus the insert's commit."""
    return {"t": time.time()}
