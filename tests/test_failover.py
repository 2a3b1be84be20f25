"""Failover as the failover guide (docs/how-to/failover.md) sets it up: a ``DATABASE_URL`` that
names every host, with ``target_session_attrs=read-write``.

Every way notifyq connects (the pool, the LISTEN connections of a worker and of ``Queue.wait``,
``SyncQueue``, ``notifyq migrate``) takes the guide's URL, its first host refusing. A real
failover (a primary killed under load, its synchronous standby promoted) is a scenario of the
fault suite: tests/faults/test_failover.py."""

from __future__ import annotations

import sys

import anyio
from psycopg.conninfo import conninfo_to_dict

from notifyq import Queue, SyncQueue
from notifyq.db import connect, open_pool
from notifyq.settings import Settings
from tests.faults.cluster import free_port, readme_failover_url
from tests.helpers import notifyq_env, running_worker


async def test_every_way_notifyq_connects_takes_the_readmes_multi_host_url(db_url: str) -> None:
    server = conninfo_to_dict(db_url)
    refusing = free_port()  # nothing listens there: libpq goes on to the next host
    url = readme_failover_url(
        str(server["user"]),
        [("127.0.0.1", refusing), (str(server["host"]), int(server["port"]))],
        str(server["dbname"]),
    )
    with anyio.fail_after(60):
        migrate = await anyio.run_process(
            [sys.executable, "-m", "notifyq", "migrate"], env=notifyq_env(url), check=False
        )
    assert migrate.returncode == 0, migrate.stderr.decode()
    # A poll far off: the job below completes within its wait only if the worker's LISTEN
    # connection (and Queue.wait's) heard it.
    settings = Settings.load(database_url=url, poll_interval=60, auto_migrate=False)
    async with await connect(settings, "test") as conn:
        cursor = await conn.execute("SELECT current_database(), current_setting('port')::integer")
        assert await cursor.fetchone() == (server["dbname"], int(server["port"]))
    async with open_pool(settings, name="test") as pool, pool.connection() as pooled:
        cursor = await pooled.execute("SELECT NOT pg_is_in_recovery()")
        assert await cursor.fetchone() == (True,)
    async with Queue(url) as q, running_worker(settings) as worker:
        assert worker.ready
        created = await q.enqueue("echo", {"n": 1})
        job = await q.wait(created.job_id, timeout=20)
        assert (job.status, job.result) == ("completed", {"n": 1})
    with SyncQueue(url) as sync_queue:
        found = sync_queue.get(created.job_id)
        assert found is not None and found.status == "completed"
