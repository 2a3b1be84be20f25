"""Failover as the failover guide (docs/how-to/failover.md) sets it up: a ``DATABASE_URL`` that
names every host, with ``target_session_attrs=read-write``.

Every way notifyq connects (the pool, the LISTEN connections of a worker and of ``Queue.wait``,
``SyncQueue``, ``notifyq migrate``) takes the guide's URL, its first host refusing. The slow
test makes two clusters of its own (a primary and a synchronous streaming standby, initdb on
free ports in a temp folder, removed after), kills the primary under load, promotes the standby
as the README says, and checks that no acknowledged job was lost, that the API answered 503
in the gap, and how soon workers claim again."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from notifyq import Queue, SyncQueue
from notifyq.db import connect, open_pool
from notifyq.embedded._account import is_root, service_account
from notifyq.settings import Settings
from tests.docs import blocks
from tests.helpers import notifyq_env, processes, running_worker
from tests.sample_tasks import read_runs

README_URL = re.compile(r"export DATABASE_URL='(postgresql://[^']*)'")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def readme_failover_url(user: str, hosts: list[tuple[str, int]], dbname: str) -> str:
    """The guide's failover URL with this test's user, hosts and database put in."""
    shown = "".join(block.code for block in blocks("sh"))
    found = [u for u in README_URL.findall(shown) if "target_session_attrs" in u]
    assert found, "no page shows a multi-host DATABASE_URL"
    url = found[0]
    shown = "postgresql://user@host1:5432,host2:5432/db?target_session_attrs=read-write"
    assert url == shown, url
    url = url.replace("//user@", f"//{user}@")
    # A unix socket's folder goes percent-encoded in a URL's host list (libpq decodes it).
    listed = ",".join(f"{quote(h, safe='') if h.startswith('/') else h}:{p}" for h, p in hosts)
    url = url.replace("host1:5432,host2:5432", listed)
    return url.replace("/db?", f"/{dbname}?")


# -- every connect path ------------------------------------------------------------------------


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


# -- a real failover ---------------------------------------------------------------------------


def postgres_bin() -> Path | None:
    """A PostgreSQL bin folder with the tools a standby needs, that the server's account can
    run (as root, not the embedded wheel's, which lives in root's home)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_basebackup"))
    if found:
        return found[-1].parent
    on_path = shutil.which("pg_basebackup")
    return Path(on_path).parent if on_path else None


class Cluster:
    """A PostgreSQL cluster of this test's own, run as the embedded server's account when the
    test runs as root (PostgreSQL refuses root)."""

    def __init__(self, bindir: Path, base: Path, name: str, password: str) -> None:
        self.bindir = bindir
        self.data = base / name
        self.log = base / f"{name}.log"
        self.port = free_port()
        self.password = password

    def run(self, program: str, *args: str) -> None:
        account: dict[str, Any] = {}
        if is_root():
            owner = service_account()
            account = {"user": owner.uid, "group": owner.gid, "extra_groups": []}
        env = {"PATH": os.environ.get("PATH", ""), "PGPASSWORD": self.password, "LC_ALL": "C"}
        done = subprocess.run(
            [str(self.bindir / program), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.data.parent,
            **account,
        )
        log = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        assert done.returncode == 0, f"{program} {args}: {done.stdout}{done.stderr}\n{log}"

    def configure(self, **settings: object) -> None:
        with (self.data / "postgresql.auto.conf").open("a") as conf:
            for name, value in settings.items():
                conf.write(f"{name} = '{value}'\n")

    def start(self) -> None:
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self.run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def sql(self, statement: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user="postgres",
            password=self.password,
            dbname="postgres",
            autocommit=True,
            connect_timeout=5,
        ) as conn:
            cursor = conn.execute(statement)
            return cursor.fetchall() if cursor.description else []


@pytest.fixture
def cluster_base() -> Iterator[Path]:
    """A folder for the clusters (as root outside tmp_path, which the server's account cannot
    reach), owned by that account."""
    base = Path(tempfile.mkdtemp(prefix="notifyq-failover-"))
    base.chmod(0o755)
    if is_root():
        owner = service_account()
        os.chown(base, owner.uid, owner.gid)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def primary_and_synchronous_standby(base: Path) -> Iterator[tuple[Cluster, Cluster]]:
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("no PostgreSQL tools (initdb, pg_basebackup) to make a standby with")
    password = secrets.token_hex(16)
    primary = Cluster(bindir, base, "primary", password)
    standby = Cluster(bindir, base, "standby", password)
    pwfile = base / "pwfile"
    pwfile.write_text(password + "\n")
    if is_root():
        owner = service_account()
        os.chown(pwfile, owner.uid, owner.gid)
    try:
        primary.run(
            "initdb", "-D", str(primary.data), "-U", "postgres", f"--pwfile={pwfile}",
            "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C",
        )  # fmt: skip
        primary.configure(
            port=primary.port, listen_addresses="127.0.0.1", unix_socket_directories=primary.data
        )
        primary.start()
        standby.run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
            "-D", str(standby.data), "-R", "-X", "stream",
        )  # fmt: skip
        standby.configure(
            port=standby.port,
            unix_socket_directories=standby.data,
            primary_conninfo=f"host=127.0.0.1 port={primary.port} user=postgres "
            f"password={password} application_name=standby1",
            # What a standby copied from a primary already set up so carries: the README's
            # trap, which the promotion below must clear.
            synchronous_standby_names="standby1",
        )
        standby.start()
        # As the README says: the primary commits only once the standby has the WAL.
        primary.sql("ALTER SYSTEM SET synchronous_standby_names = 'standby1'")
        primary.sql("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 30
        query = "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'"
        while primary.sql(query) != [("sync",)]:
            assert time.monotonic() < deadline, primary.sql(query)
            time.sleep(0.05)
        yield primary, standby
    finally:
        standby.stop("immediate")
        primary.stop("immediate")


@pytest.mark.slow
def test_a_promoted_synchronous_standby_keeps_every_acknowledged_job(
    cluster_base: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs.txt"
    api_port = free_port()
    accepted: list[int] = []
    answers = Counter[int]()
    in_gap: list[tuple[int, float]] = []
    gap = threading.Event()
    with primary_and_synchronous_standby(cluster_base) as (primary, standby):
        url = readme_failover_url(
            f"postgres:{primary.password}",
            [("127.0.0.1", primary.port), ("127.0.0.1", standby.port)],
            "postgres",
        )
        env = notifyq_env(
            url,
            NOTIFYQ_IMPORT="tests.sample_tasks",
            NQ_RUNS_FILE=str(runs),
            NOTIFYQ_CONNECT_TIMEOUT="2",
        )
        with processes(tmp_path) as start:
            api = start("serve", "--no-worker", "--port", str(api_port), env=env, name="api")
            api.wait_for_output("Uvicorn running on", timeout=60)
            worker = start("worker", env=env, name="worker")
            worker.wait_for_output("ready")

            def load() -> None:
                with httpx.Client(base_url=f"http://127.0.0.1:{api_port}", timeout=15) as client:
                    for n in range(1, 601):
                        began = time.monotonic()
                        answer = client.post("/jobs", json={"task": "record", "payload": {"n": n}})
                        answers[answer.status_code] += 1
                        if answer.status_code == 201:
                            accepted.append(n)
                        elif gap.is_set():
                            in_gap.append((answer.status_code, time.monotonic() - began))
                        time.sleep(0.005)

            loader = threading.Thread(target=load)
            loader.start()
            deadline = time.monotonic() + 60
            while len(accepted) < 150:
                assert loader.is_alive() and time.monotonic() < deadline, answers
                time.sleep(0.01)
            gap.set()
            primary.stop("immediate")  # a crash: no shutdown checkpoint, sessions cut
            deadline = time.monotonic() + 20
            while not in_gap:
                assert time.monotonic() < deadline, f"no request met the gap: {answers}"
                time.sleep(0.02)
            standby.run("pg_ctl", "-D", str(standby.data), "-w", "promote")
            # The README's step: the promoted node must not wait for a standby it lacks.
            standby.sql("ALTER SYSTEM SET synchronous_standby_names = ''")
            standby.sql("SELECT pg_reload_conf()")
            writable = time.monotonic()
            gap.clear()
            before = len(read_runs(runs))
            while len(read_runs(runs)) == before:
                assert time.monotonic() - writable < 30, worker.output()[-3000:]
                time.sleep(0.01)
            claimed_after = time.monotonic() - writable
            loader.join(180)
            assert not loader.is_alive()
            deadline = time.monotonic() + 60
            while not set(accepted) <= {n for n, _ in read_runs(runs)}:
                assert time.monotonic() < deadline, worker.output()[-3000:]
                time.sleep(0.05)
            completed = standby.sql(
                "SELECT (payload->>'n')::int FROM notifyq.jobs WHERE status = 'completed'"
            )
            api.signal(signal.SIGTERM)
            worker.signal(signal.SIGTERM)
            assert api.wait() == 0, api.output()[-3000:]
            assert worker.wait() == 0, worker.output()[-3000:]
    assert set(accepted) <= {n for (n,) in completed}, "an acknowledged job was lost"
    assert set(answers) <= {201, 503}, answers
    # In the gap a refusal comes once the hosts have been tried: at once here, where the dead
    # primary refuses and the standby is read-only; within the connect timeout (2 s) at worst.
    assert all(code == 503 and seconds < 3 for code, seconds in in_gap), in_gap
    assert claimed_after < 5, claimed_after
    print(f"accepted {len(accepted)}, answers {dict(answers)}, claims again {claimed_after:.2f} s")
