"""A crash of the server that undoes a worker's claim while its job runs (a cluster of its own).

A worker's claims commit without waiting for the disk (sql/queries.sql, ``claim_jobs``). With
the WAL writer slowed to once in 10 s, nothing flushes the claim before the server is stopped
at once (``-m immediate``: a crash); started again, it has the job queued under the claim
before. The worker, which lived through it, claims the job again under the same number, and the
run in progress goes on as that claim's (notifyq.worker._ledger.Ledger.redone): the job runs
once, and completes with that run's result.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import psycopg
import pytest

from notifyq.settings import Settings
from tests.faults.cluster import own_cluster
from tests.helpers import registry, running_worker, wait_until

pytestmark = pytest.mark.slow


async def test_a_claim_a_crash_undid_goes_on_as_the_run_in_progress(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs: list[dict[str, Any]] = []
    started = anyio.Event()
    go = anyio.Event()

    async def held(payload: dict[str, Any]) -> dict[str, Any]:
        runs.append(payload)
        started.set()
        await go.wait()
        return {"runs": len(runs)}

    with own_cluster(wal_writer_delay="10s") as cluster:
        url = await anyio.to_thread.run_sync(cluster.database, "crash")
        settings = Settings.load(
            database_url=url,
            auto_migrate=False,
            poll_interval=1,
            lease_seconds=300,
            heartbeat_interval=100,
            connect_timeout=2,
        )
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            cursor = await conn.execute(
                "INSERT INTO notifyq.jobs (task) VALUES ('held') RETURNING id"
            )
            row = await cursor.fetchone()
            assert row is not None
            job_id = row[0]
        caplog.set_level(logging.WARNING, logger="notifyq.worker._producer")
        async with running_worker(settings, registry(held=held)):
            with anyio.fail_after(20):
                await started.wait()
            await anyio.to_thread.run_sync(cluster.stop, "immediate")
            await anyio.to_thread.run_sync(cluster.start)

            async def state() -> tuple[Any, ...] | None:
                try:
                    async with await psycopg.AsyncConnection.connect(url) as check:
                        cursor = await check.execute(
                            "SELECT status, claims FROM notifyq.jobs WHERE id = %s", [job_id]
                        )
                        return await cursor.fetchone()
                except psycopg.OperationalError:
                    return None

            # The crash undid the claim; the worker claims the job again, under the same number.
            await wait_until(
                lambda: any("came back under claim 1" in r.getMessage() for r in caplog.records),
                timeout=30,
            )
            assert await state() == ("processing", 1)
            go.set()
            await wait_until(lambda: _completed(state), timeout=30, interval=0.1)
        async with await psycopg.AsyncConnection.connect(url) as check:
            cursor = await check.execute(
                "SELECT status, result, claims, attempt_count FROM notifyq.jobs WHERE id = %s",
                [job_id],
            )
            final = await cursor.fetchone()
    assert runs == [{}]
    assert final == ("completed", {"runs": 1}, 1, 1)
    assert any("the run in progress goes on" in r.getMessage() for r in caplog.records)


async def _completed(state: Any) -> bool:
    found = await state()
    return found is not None and found[0] == "completed"
