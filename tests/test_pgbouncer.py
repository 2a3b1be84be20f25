"""notifyq behind a real PgBouncer in transaction mode, set up as the PgBouncer guide
(docs/how-to/pgbouncer.md) says: DATABASE_URL through PgBouncer, NOTIFYQ_LISTEN_URL straight
to the server, ``options`` in ``ignore_startup_parameters``.

Each test starts its own PgBouncer (the ``pgbouncer`` binary: CI installs it; skipped, saying
so, where there is none) on a free port, in front of the test server, with a pool of several
server connections so that consecutive transactions of one client really land on different
ones. What used to go wrong there: psycopg's prepared statements answered "prepared statement
... does not exist" or "bind message supplies 8 parameters", `notifyq migrate` left its session
lock on a pooled server connection (the next start hung), and a LISTEN through the pooler passed
the worker's check and then never heard a thing.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from notifyq import Queue, SyncQueue
from notifyq.api import create_app
from notifyq.db import connect_kwargs
from notifyq.errors import ConfigurationError, DatabaseUnavailable
from notifyq.migrations import migrate
from notifyq.notifier import Listener
from notifyq.settings import Settings
from tests.helpers import count_by_status, running_worker, url_with_dbname, wait_until

PGBOUNCER = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None
)

pytestmark = pytest.mark.skipif(
    PGBOUNCER is None, reason="no pgbouncer binary (apt-get install pgbouncer) to test through"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def pgbouncer(server_url: str, *, ignore_options: bool = True) -> Iterator[str]:
    """A PgBouncer in transaction mode in front of ``server_url``'s server, every database
    reachable through it; answers the URL of the server's database through it."""
    assert PGBOUNCER is not None
    server = conninfo_to_dict(server_url)
    if str(server.get("host") or "").startswith("/"):
        pytest.skip(
            "the test server listens on a unix socket only (the embedded one): PgBouncer, "
            "running as another account, cannot reach it; set DATABASE_URL to a TCP server"
        )
    port = _free_port()
    # A folder of its own that its account can reach (pytest's are private to ours).
    folder = Path(tempfile.mkdtemp(prefix="notifyq-pgbouncer-"))
    folder.chmod(0o755)
    user = server.get("user") or "postgres"
    (folder / "users.txt").write_text(f'"{user}" ""\n')
    ignored = "extra_float_digits,options" if ignore_options else "extra_float_digits"
    (folder / "pgbouncer.ini").write_text(
        f"""[databases]
* = host={server.get("host") or "127.0.0.1"} port={server.get("port") or 5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder}/users.txt
pool_mode = transaction
default_pool_size = 4
max_client_conn = 200
ignore_startup_parameters = {ignored}
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
"""
    )
    command = [PGBOUNCER, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer will not run as root
        account = pwd.getpwnam("postgres") if _has_account("postgres") else pwd.getpwnam("nobody")
        os.chown(folder, account.pw_uid, account.pw_gid)
        for path in folder.iterdir():
            os.chown(path, account.pw_uid, account.pw_gid)
        command[1:1] = ["-u", account.pw_name]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"postgresql://{user}@127.0.0.1:{port}/{server.get('dbname') or 'postgres'}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with psycopg.connect(url, connect_timeout=2, prepare_threshold=None):
                    break
            except psycopg.OperationalError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log = folder / "pgbouncer.log"
                    output = process.stdout.read().decode() if process.stdout else ""
                    raise AssertionError(
                        f"PgBouncer did not start: {output}"
                        f"{log.read_text() if log.exists() else ''}"
                    ) from None
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if process.stdout:
            process.stdout.close()
        shutil.rmtree(folder, ignore_errors=True)


def _has_account(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _through(bouncer_url: str, db_url: str) -> str:
    return url_with_dbname(bouncer_url, conninfo_to_dict(db_url)["dbname"])


@pytest.fixture
def bouncer(server_url: str) -> Iterator[str]:
    with pgbouncer(server_url) as url:
        yield url


@pytest.fixture
def pooled(settings: Settings, db_url: str, bouncer: str) -> Settings:
    """The test's settings as the PgBouncer guide has them."""
    return settings.model_copy(
        update={"database_url": _through(bouncer, db_url), "listen_url": db_url}
    )


def test_listen_url_elsewhere_means_transaction_pooling(settings: Settings, db_url: str) -> None:
    assert not settings.transaction_pooled
    assert settings.model_copy(update={"listen_url": db_url + "?x"}).transaction_pooled
    assert settings.model_copy(update={"pooler": "transaction"}).transaction_pooled
    assert not settings.model_copy(update={"listen_url": "x", "pooler": "none"}).transaction_pooled
    assert (
        connect_kwargs(settings.model_copy(update={"pooler": "transaction"}), "t")[
            "prepare_threshold"
        ]
        is None
    )


async def test_the_api_and_a_worker_through_pgbouncer(pooled: Settings, conn: Any) -> None:
    # 200 submissions of a few shapes, so that each statement runs far more often than
    # psycopg's prepare threshold, over PgBouncer's four server connections; then a worker
    # through it runs them all, woken by the direct LISTEN (its poll is 30 s away).
    app = create_app(pooled.model_copy(update={"run_worker": False}))
    answers: list[int] = []
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:

            async def submit(n: int) -> None:
                body: dict[str, Any] = {"task": "echo", "payload": {"n": n}}
                if n % 3 == 1:
                    body["priority"] = n % 7
                if n % 3 == 2:
                    body["dedup_key"] = f"k{n}"
                response = await client.post("/jobs", json=body)
                answers.append(response.status_code)
                if response.status_code == 201:
                    read = await client.get(f"/jobs/{response.json()['job_id']}")
                    answers.append(read.status_code)

            limiter = anyio.CapacityLimiter(8)

            async def limited(n: int) -> None:
                async with limiter:
                    await submit(n)

            async with anyio.create_task_group() as tg:
                for n in range(200):
                    tg.start_soon(limited, n)
    assert sorted(set(answers)) == [200, 201], answers
    async with running_worker(pooled), Queue(settings=pooled) as q:

        async def all_done() -> bool:
            return await count_by_status(conn) == {"completed": 200}

        await wait_until(all_done, timeout=20)
        # Idle now: a new job is started by the notification, not by the poll 30 s away.
        late = await q.enqueue("echo", {"late": True})
        assert (await q.wait(late.job_id, timeout=5)).result == {"late": True}


async def test_queue_wait_through_pgbouncer(pooled: Settings) -> None:
    async with Queue(settings=pooled) as q, running_worker(pooled):
        for n in range(20):
            result = await q.enqueue("echo", {"n": n}, priority=n % 3)
            job = await q.wait(result.job_id, timeout=10)
            assert job.result == {"n": n}


async def test_migrations_through_pgbouncer_leave_no_lock_behind(
    empty_db_url: str, bouncer: str
) -> None:
    through = Settings.load(database_url=_through(bouncer, empty_db_url), pooler="transaction")
    # Three at once, each transaction on whichever server connection PgBouncer picks.
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(migrate, through)
    async with await psycopg.AsyncConnection.connect(empty_db_url, autocommit=True) as conn:
        applied = await (await conn.execute("SELECT version FROM notifyq.migrations")).fetchall()
        locks = await (
            # In this database: the test run's own scratch leases are advisory locks too.
            await conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        ).fetchone()
    assert [v for (v,) in applied] == sorted({v for (v,) in applied}) and len(applied) >= 6
    assert locks == (0,)
    # And the next start finds nothing to wait for.
    with anyio.fail_after(10):
        assert await migrate(through) == []


async def test_a_listen_through_pgbouncer_is_refused_naming_the_pooler(
    settings: Settings, db_url: str, bouncer: str
) -> None:
    url = _through(bouncer, db_url)
    listener = Listener(url, connect_kwargs=connect_kwargs(settings, "t"), probe_wait=1.0)
    with anyio.fail_after(15), pytest.raises(ConfigurationError, match="transaction-mode pooler"):
        await listener.run()
    # A worker given only DATABASE_URL through PgBouncer does not start (no silent 30 s polls).
    lone = settings.model_copy(update={"database_url": url, "pooler": "none"})
    with anyio.fail_after(20), pytest.raises(BaseException) as raised:
        async with running_worker(lone):
            pass
    assert any("NOTIFYQ_LISTEN_URL" in str(error) for error in _leaves(raised.value))


def _leaves(error: BaseException) -> Iterator[BaseException]:
    inner_errors = getattr(error, "exceptions", None)  # an exception group (3.11's or anyio's)
    if inner_errors is not None:
        for inner in inner_errors:
            yield from _leaves(inner)
    else:
        yield error
        if error.__cause__ is not None:
            yield from _leaves(error.__cause__)


async def test_a_pgbouncer_that_refuses_the_startup_options_is_named(
    server_url: str, db_url: str, settings: Settings
) -> None:
    with pgbouncer(server_url, ignore_options=False) as url:
        strict = settings.model_copy(update={"database_url": _through(url, db_url)})
        with pytest.raises(DatabaseUnavailable, match="ignore_startup_parameters"):
            async with Queue(settings=strict) as q:
                await q.enqueue("echo", {})


async def test_the_sync_queue_through_pgbouncer(pooled: Settings) -> None:
    def enqueue_and_wait(settings: Settings) -> list[Any]:
        with SyncQueue(settings=settings) as q:
            return [
                q.wait(q.enqueue("echo", {"n": n}, priority=n % 3).job_id, timeout=10).result
                for n in range(12)
            ]

    async with running_worker(pooled):
        results = await anyio.to_thread.run_sync(enqueue_and_wait, pooled)
    assert results == [{"n": n} for n in range(12)]
    # Its LISTEN through the pooler is refused too, naming the pooler.
    lone = pooled.model_copy(update={"listen_url": None, "pooler": "transaction"})
    with pytest.raises(ConfigurationError, match="transaction-mode pooler"):
        await anyio.to_thread.run_sync(enqueue_and_wait, lone)
