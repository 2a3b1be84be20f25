"""A PostgreSQL server of the bench's own, for the ``multihost`` scenario: a temporary cluster
that listens on the bridge address of :mod:`notifyq_bench.netns` (and a unix socket in its own
folder), where every login needs a generated password (scram-sha-256), over TCP and the socket
alike. The machine's own PostgreSQL is never touched.

PostgreSQL refuses to run as root: as root, ``initdb`` and ``postgres`` run as the ``postgres``
account, which owns the temporary folder. :meth:`BenchServer.close` stops the server (by its
pid) and removes the folder.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from notifyq_bench.harness import BenchError, _die_with_parent

ACCOUNT = "postgres"


def find_bin_dir() -> Path | None:
    """The newest system PostgreSQL's binaries (``/usr/lib/postgresql/<major>/bin``), else the
    folder of ``postgres`` on PATH."""

    def major(path: Path) -> float:
        try:
            return float(path.parent.name)
        except ValueError:
            return 0.0

    system = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=major, reverse=True)
    for path in system:
        if (path / "initdb").exists() and (path / "postgres").exists():
            return path
    on_path = shutil.which("postgres")
    return Path(os.path.realpath(on_path)).parent if on_path else None


class BenchServer:
    """A temporary cluster listening on ``address``:``port``; :attr:`url` logs in over TCP as
    the superuser (with the password in the conninfo: never print it, use ``redact``)."""

    def __init__(self, address: str, port: int = 5432, bin_dir: Path | None = None) -> None:
        self.address = address
        self.port = port
        found = bin_dir or find_bin_dir()
        if found is None:
            raise BenchError(
                "no PostgreSQL binaries (initdb, postgres) under /usr/lib/postgresql or on PATH"
            )
        self.bin_dir = found
        self.password = secrets.token_urlsafe(24)
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._account: dict[str, Any] = {}
        if os.geteuid() == 0:
            try:
                entry = pwd.getpwnam(ACCOUNT)
            except KeyError:
                raise BenchError(
                    f"as root, the bench's PostgreSQL runs as the {ACCOUNT!r} account, "
                    "which does not exist here"
                ) from None
            self._account = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
            self._uid, self._gid = entry.pw_uid, entry.pw_gid
        else:
            self._uid, self._gid = os.geteuid(), os.getegid()

    @property
    def url(self) -> str:
        return make_conninfo(
            host=self.address,
            port=str(self.port),
            user="postgres",
            password=self.password,
            dbname="postgres",
            connect_timeout="5",
        )

    def url_without_password(self, dbname: str) -> str:
        """A URL for children, which get the password as ``PGPASSWORD``."""
        return f"postgresql://postgres@{self.address}:{self.port}/{dbname}"

    def _run(self, argv: list[str]) -> None:
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=self.dir,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
            **self._account,
        )
        if result.returncode != 0:
            raise BenchError(f"{Path(argv[0]).name} failed: {result.stderr.strip()[-500:]}")

    def version(self) -> str:
        out = subprocess.run(
            [str(self.bin_dir / "postgres"), "--version"],
            capture_output=True,
            text=True,
            check=False,
            **self._account,
        ).stdout
        match = re.search(r"(\d+(?:\.\d+)?)", out)
        return match.group(1) if match else out.strip()

    def start(self, timeout: float = 60.0) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="notifyq-bench-pg-"))
        os.chown(self.dir, self._uid, self._gid)
        self.dir.chmod(0o700)
        data = self.dir / "data"
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n")
        os.chown(pwfile, self._uid, self._gid)
        pwfile.chmod(0o600)
        self._run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--pwfile",
                str(pwfile),
                "--auth",
                "scram-sha-256",
                "--encoding",
                "UTF8",
                "--no-instructions",
            ]
        )
        pwfile.unlink()
        # Only these rules, whatever initdb wrote: a password for every login, by any route.
        hba = self.dir / "hba.conf"
        hba.write_text(
            f"local all all scram-sha-256\nhost all all {self.address}/24 scram-sha-256\n"
        )
        os.chown(hba, self._uid, self._gid)
        log = (self.dir / "server.log").open("wb")
        os.chown(self.dir / "server.log", self._uid, self._gid)
        self.proc = subprocess.Popen(
            [
                str(self.bin_dir / "postgres"),
                "-D",
                str(data),
                "-c",
                f"listen_addresses={self.address}",
                "-c",
                f"port={self.port}",
                "-c",
                f"unix_socket_directories={self.dir}",
                "-c",
                f"hba_file={hba}",
                "-c",
                "max_connections=200",
                "-c",
                "password_encryption=scram-sha-256",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.dir,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
            start_new_session=True,
            # Run after the switch to the account (a change of user would clear it): a killed
            # bench takes its server along, whose backends then exit by themselves.
            preexec_fn=_die_with_parent,
            **self._account,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise BenchError(
                    f"the bench's PostgreSQL exited with code {self.proc.returncode}:\n"
                    + self.log_tail()
                )
            try:
                with psycopg.connect(self.url, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"the bench's PostgreSQL did not accept logins in {timeout:.0f}s:\n"
                        + self.log_tail()
                    ) from None
                time.sleep(0.1)

    def log_tail(self, lines: int = 10) -> str:
        if self.dir is None:
            return ""
        try:
            text = (self.dir / "server.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        """Fast shutdown (SIGINT to the postmaster's pid), SIGQUIT then SIGKILL if it lingers;
        then the folder goes."""
        if self.proc is not None and self.proc.poll() is None:
            for sig, wait in ((signal.SIGINT, 20.0), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(sig)
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> BenchServer:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
