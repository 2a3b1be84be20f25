"""The SQL function psql users call takes every job option (notifyq/jobspec.py); the checks that
need no database are in tests/unit/test_jobspec.py."""

from __future__ import annotations

from typing import Any

import psycopg

from notifyq.jobspec import options


async def test_the_psql_enqueue_takes_every_option_but_delay(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    """notifyq.enqueue, the function psql users call, takes each option as a named argument
    (delay is run_at there: `now() + interval`)."""
    rows = await (
        await conn.execute(
            "SELECT unnest(proargnames) FROM pg_proc AS p JOIN pg_namespace AS n"
            " ON n.oid = p.pronamespace WHERE n.nspname = 'notifyq' AND p.proname = 'enqueue'"
        )
    ).fetchall()
    arguments = {row[0] for row in rows}
    missing = {name for name in options() if name != "delay"} - arguments
    assert not missing, f"notifyq.enqueue lacks {missing}: add them in a migration"
