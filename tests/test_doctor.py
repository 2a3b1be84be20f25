"""``notifyq doctor`` (issue 29, part 3): it names what holds the xmin horizon within a second
of it crossing NOTIFYQ_HORIZON_WARN_AFTER, and exits 1 then; it finds leases nobody rescues, a
missing leader and grants that overstep; /metrics shows the same figures, and the maintenance
leader warns in its log."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import psycopg

from notifyq.api import create_app
from notifyq.db import open_pool
from notifyq.doctor import Health, examine
from notifyq.settings import Settings
from notifyq.store import Store
from tests.helpers import ROOT, notifyq_env, running_worker


@asynccontextmanager
async def a_store(settings: Settings) -> AsyncIterator[Store]:
    async with open_pool(settings, name="doctor-test", max_size=2) as pool:
        yield Store(pool)


@asynccontextmanager
async def pinned(db_url: str) -> AsyncIterator[int]:
    """A REPEATABLE READ transaction that has taken its snapshot and stays open: its pid."""
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        cursor = await conn.execute("SELECT pg_backend_pid(), count(*) FROM notifyq.jobs")
        row = await cursor.fetchone()
        assert row is not None
        yield int(row[0])
        await conn.rollback()


def check(health: Health, name: str) -> Any:
    return next(c for c in health.checks if c.name == name)


async def test_doctor_names_a_pinned_horizon_within_a_second_of_crossing_the_setting(
    settings: Settings, db_url: str
) -> None:
    after = 1.5
    async with a_store(settings) as store:
        began = time.monotonic()
        async with pinned(db_url) as pid:
            with anyio.fail_after(after + 5):
                while True:
                    health = await examine(store, horizon_warn_after=after)
                    seen = time.monotonic() - began
                    horizon = check(health, "xmin horizon")
                    if horizon.status == "fail":
                        break
                    assert horizon.status == "ok", horizon
                    await anyio.sleep(0.05)
            assert after <= seen < after + 1.0, seen
            assert f"pid {pid} " in horizon.summary and "count(*)" in horizon.summary
            assert f"pg_terminate_backend({pid})" in (horizon.advice or "")
            assert health.failed
            # The command says the same, and exits 1.
            with anyio.fail_after(60):
                done = await anyio.run_process(
                    [sys.executable, "-m", "notifyq", "doctor", "--horizon-warn-after", str(after)],
                    env=notifyq_env(db_url),
                    cwd=ROOT,
                    check=False,
                )
            assert done.returncode == 1, done.stdout + done.stderr
            assert f"FAIL  xmin horizon: pid {pid} " in done.stdout.decode()
        health = await examine(store, horizon_warn_after=after)
    assert check(health, "xmin horizon").status == "ok"


async def test_metrics_show_the_horizon_and_the_checks(settings: Settings, db_url: str) -> None:
    app = create_app(settings.model_copy(update={"run_worker": False, "horizon_warn_after": 0.2}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
        ) as client,
        pinned(db_url),
    ):
        await anyio.sleep(0.3)  # the snapshot gets older than the setting
        text = (await client.get("/metrics")).text
    values = {
        line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("notifyq_") and " " in line
    }
    assert values["notifyq_horizon_age_seconds"] >= 0.3
    assert values["notifyq_horizon_xid_age"] >= 0
    assert values['notifyq_health_check{check="xmin horizon"}'] == 2
    assert values['notifyq_health_check{check="schema"}'] == 0
    assert (
        values['notifyq_schema_version{of="database"}']
        == values['notifyq_schema_version{of="code"}']
    )
    assert 'notifyq_table_rows{state="dead",table="jobs"}' in values
    assert values["notifyq_maintenance_leader"] == 0


class _Caught(logging.Handler):
    """Sets ``event`` at the first record whose message holds ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.WARNING)
        self.text = text
        self.event = anyio.Event()
        self.message = ""

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage() and not self.event.is_set():
            self.message = record.getMessage()
            self.event.set()


async def test_the_leader_warns_when_the_horizon_is_older_than_the_setting(
    settings: Settings, db_url: str
) -> None:
    caught = _Caught("the xmin horizon is held back")
    logger = logging.getLogger("notifyq.worker._maintenance")
    logger.addHandler(caught)
    try:
        fast = settings.model_copy(update={"horizon_warn_after": 0.5, "lease_seconds": 4})
        async with running_worker(fast), pinned(db_url) as pid:
            with anyio.fail_after(10):
                await caught.event.wait()
    finally:
        logger.removeHandler(caught)
    assert f"pid {pid} " in caught.message and "NOTIFYQ_HORIZON_WARN_AFTER=0.5s" in caught.message


async def test_doctor_finds_stuck_leases_a_missing_leader_and_overstepping_grants(
    settings: Settings, conn: Any
) -> None:
    await conn.execute("INSERT INTO notifyq.jobs (task) VALUES ('echo')")
    # A worker that died two minutes ago, in the middle of a job, and nobody else runs.
    await conn.execute(
        "UPDATE notifyq.jobs SET status = 'processing', worker_id = 'gone', attempt_count = 1, "
        "started_at = now() - interval '3 minutes', "
        "lease_expires_at = now() - interval '2 minutes'"
    )
    await conn.execute("GRANT EXECUTE ON FUNCTION notifyq.resign_v1(text, text) TO PUBLIC")
    async with a_store(settings) as store:
        health = await examine(store, horizon_warn_after=300)
    assert health.failed
    leases, leadership = check(health, "leases"), check(health, "leadership")
    assert leases.status == "fail" and "nobody rescues" in leases.summary, leases
    assert leadership.status == "fail" and "none leads" in leadership.summary, leadership
    grants = check(health, "grants")
    assert grants.status == "fail" and "notifyq.resign_v1(text,text)" in grants.summary
    assert check(health, "schema").status == "ok"


async def test_doctor_names_a_queue_whose_first_job_no_worker_serves(
    settings: Settings, conn: Any
) -> None:
    """A job of a task no worker has registered (a typo in a psql INSERT, say) waits for ever
    and holds its queue's claim floor: the doctor names the queue and the task, and says what to
    do; once a worker registers the task, the check passes."""
    await conn.execute("INSERT INTO notifyq.tasks (name) VALUES ('echo')")
    await conn.execute(
        "INSERT INTO notifyq.jobs (task, queue, run_at) "
        "VALUES ('echoo', 'mail', now() - interval '1 hour'), ('echo', 'mail', now()), "
        "('echo', 'default', now() - interval '2 hours'), "
        "('later', 'default', now() + interval '1 day')"
    )
    async with a_store(settings) as store:
        health = await examine(store, horizon_warn_after=300)
        unserved = check(health, "unserved tasks")
        assert unserved.status == "warn", unserved
        assert "queue 'mail' (priority 0): task 'echoo', due 3600 s ago" in unserved.summary
        assert "'default'" not in unserved.summary  # its first job is served; the other not due
        assert "notifyq jobs --status queued --task echoo" in unserved.advice
        await conn.execute("INSERT INTO notifyq.tasks (name) VALUES ('echoo')")
        health = await examine(store, horizon_warn_after=300)
    assert check(health, "unserved tasks").status == "ok"


async def test_doctor_passes_a_database_just_migrated(settings: Settings) -> None:
    """Nothing is wrong with a new database: no check fails (notifyq.signal, which PUBLIC may
    run since version 23 as it may run notifyq.enqueue, used to fail the grants check)."""
    async with a_store(settings) as store:
        health = await examine(store, horizon_warn_after=300)
    assert not health.failed, [c for c in health.checks if c.status == "fail"]
    assert check(health, "grants").status == "ok"


async def test_doctor_finds_a_listener_that_stopped_receiving(
    settings: Settings, db_url: str, monkeypatch: Any
) -> None:
    # A LISTEN connection inside a transaction gets no notification until it ends (and holds
    # every other listener's back in the queue).
    monkeypatch.setattr("notifyq.doctor.DEAF_AFTER", 0.1)
    async with (
        a_store(settings) as store,
        await psycopg.AsyncConnection.connect(db_url, application_name="notifyq-listener") as deaf,
    ):
        await deaf.execute("LISTEN notifyq")
        await deaf.commit()
        health = await examine(store, horizon_warn_after=300)
        assert check(health, "listeners").status == "ok"
        await deaf.execute("SELECT 1")  # a transaction begins, and stays open
        with anyio.fail_after(10):
            while (listeners := check(health, "listeners")).status == "ok":
                await anyio.sleep(0.05)
                health = await examine(store, horizon_warn_after=300)
        assert listeners.status == "fail" and f"pid {deaf.info.backend_pid}" in listeners.summary
        assert health.deaf_listeners == 1
        await deaf.rollback()
