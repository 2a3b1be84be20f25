"""PostgreSQL clusters of a scenario's own: initdb into a temporary folder, on a free port,
started and stopped with pg_ctl, removed afterwards; and a synchronous streaming standby of one
(pg_basebackup -R). The shared server is never touched: a fault scenario stops and kills its
clusters at will.

As root the clusters run as the embedded server's account (PostgreSQL refuses root), in a
folder outside tmp_path (private to root) that the account owns."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from notifyq.embedded._account import is_root, service_account
from tests.docs import blocks
from tests.helpers import notifyq_env

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


def postgres_bin() -> Path | None:
    """A PostgreSQL bin folder with the tools a standby needs, that the server's account can
    run (as root, not the embedded wheel's, which lives in root's home)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_basebackup"))
    if found:
        return found[-1].parent
    on_path = shutil.which("pg_basebackup")
    return Path(on_path).parent if on_path else None


class Cluster:
    """A PostgreSQL cluster of a scenario's own, on a port of its own."""

    def __init__(self, bindir: Path, base: Path, name: str, password: str) -> None:
        self.bindir = bindir
        self.data = base / name
        self.log = base / f"{name}.log"
        self.port = free_port()
        self.password = password

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres:{self.password}@127.0.0.1:{self.port}/{dbname}"

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

    def initdb(self, pwfile: Path) -> None:
        self.run(
            "initdb", "-D", str(self.data), "-U", "postgres", f"--pwfile={pwfile}",
            "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C",
        )  # fmt: skip
        self.configure(
            port=self.port, listen_addresses="127.0.0.1", unix_socket_directories=self.data
        )

    def configure(self, **settings: object) -> None:
        with (self.data / "postgresql.auto.conf").open("a") as conf:
            for name, value in settings.items():
                conf.write(f"{name} = '{value}'\n")

    def start(self) -> None:
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self.run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def sql(self, statement: str, dbname: str = "postgres") -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(statement)
            return cursor.fetchall() if cursor.description else []

    def database(self, name: str) -> str:
        """A new database ``name`` with notifyq's schema; answers its URL."""
        self.sql(f'CREATE DATABASE "{name}"')
        url = self.url(name)
        done = subprocess.run(
            [sys.executable, "-m", "notifyq", "migrate"],
            env=notifyq_env(url),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return url


@contextlib.contextmanager
def cluster_base() -> Iterator[Path]:
    """A folder for a scenario's clusters, removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="notifyq-faults-"))
    base.chmod(0o755)
    if is_root():
        owner = service_account()
        os.chown(base, owner.uid, owner.gid)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _setup(base: Path) -> tuple[Path, str, Path]:
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("no PostgreSQL tools (initdb, pg_ctl, pg_basebackup) to make clusters with")
    password = secrets.token_hex(16)
    pwfile = base / "pwfile"
    pwfile.write_text(password + "\n")
    if is_root():
        owner = service_account()
        os.chown(pwfile, owner.uid, owner.gid)
    return bindir, password, pwfile


@contextlib.contextmanager
def own_cluster(**settings: object) -> Iterator[Cluster]:
    """A running cluster of its own (autovacuum on, durable commits: initdb's defaults, plus
    ``settings``), stopped and removed afterwards."""
    with cluster_base() as base:
        bindir, password, pwfile = _setup(base)
        cluster = Cluster(bindir, base, "main", password)
        try:
            cluster.initdb(pwfile)
            if settings:
                cluster.configure(**settings)
            cluster.start()
            yield cluster
        finally:
            cluster.stop("immediate")


@contextlib.contextmanager
def primary_and_synchronous_standby() -> Iterator[tuple[Cluster, Cluster]]:
    """A primary and its synchronous streaming standby, set up as the failover guide says."""
    with cluster_base() as base:
        bindir, password, pwfile = _setup(base)
        primary = Cluster(bindir, base, "primary", password)
        standby = Cluster(bindir, base, "standby", password)
        try:
            primary.initdb(pwfile)
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
                # trap, which the promotion must clear.
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
