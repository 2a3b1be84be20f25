"""A server as its ``postmaster.pid`` describes it: reading that file, telling a live postmaster
from a stale file or a reused pid, waiting until it is ready, the URL to reach it, stopping it,
and a free TCP port for the next one."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from notifyq.embedded._errors import EmbeddedPostgresError
from notifyq.embedded._procs import pid_alive, reap_if_ours

# The package's one logger, named as before it was split: logs.py quiets it, users filter on it.
logger = logging.getLogger("notifyq.embedded")

#: The role every URL names (made by initdb).
SUPERUSER = "postgres"
#: The one TCP address a server listens on, when it cannot use its unix socket.
HOST = "127.0.0.1"
#: How long a server may take to become ready, whoever started it.
START_TIMEOUT = 60.0
_STOP_TIMEOUT = 60.0


def _is_postmaster_of(pid: int, data_dir: Path) -> bool:
    """Whether ``pid`` is a live postmaster serving ``data_dir``, and not a process that reused
    the pid of a dead one. When that cannot be told, answers True: deleting a live server's
    ``postmaster.pid`` would let a second server corrupt the cluster."""
    if not pid_alive(pid):
        return False
    proc = Path(f"/proc/{pid}")
    if proc.is_dir():
        try:
            # PostgreSQL runs as its data folder's owner, in its data folder.
            if proc.stat().st_uid != data_dir.stat().st_uid:
                return False
            return os.path.samefile(proc / "cwd", data_dir)
        except PermissionError:
            try:
                argv0 = (proc / "cmdline").read_bytes().split(b"\0", 1)[0]
            except OSError:
                return True
            return os.path.basename(argv0).startswith((b"postgres", b"postmaster"))
        except OSError:
            return False
    try:
        command = ["ps", "-o", "uid=,comm=", "-p", str(pid)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=10)
        uid, _, name = result.stdout.strip().partition(" ")
        if int(uid) != data_dir.stat().st_uid:
            return False
    except (OSError, ValueError, subprocess.SubprocessError):
        return True
    return "postgres" in name or "postmaster" in name


@dataclass(frozen=True)
class Postmaster:
    """What ``postmaster.pid`` says about the server of a data folder."""

    file: Path
    pid: int
    port: int
    socket_dir: str
    listen: str
    status: str

    @classmethod
    def read(cls, data_dir: Path) -> Postmaster | None:
        """The ``postmaster.pid`` of ``data_dir``; None if there is none, pid 0 if unreadable."""
        file = data_dir / "postmaster.pid"
        try:
            # Bounded, no symlinks: as root this reads a file another account owns.
            fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError:
            return cls(file, 0, 0, "", "", "")  # a symlink, say: stale, removed after a while
        with os.fdopen(fd, "rb") as stream:
            lines = stream.read(4096).decode(errors="replace").splitlines()
        # pid, data dir, start time, port, socket dir, listen address, shared memory, status;
        # the later lines appear while the server starts.
        lines += [""] * (8 - len(lines))
        try:
            pid = int(lines[0])
        except ValueError:
            # Being written right now, or garbage (removed as stale after a moment).
            return cls(file, 0, 0, "", "", "")
        port = int(lines[3]) if lines[3].strip().isdigit() else 0
        return cls(file, pid, port, lines[4].strip(), lines[5].strip(), lines[7].strip())

    @property
    def tcp(self) -> bool:
        """Whether it listens on TCP (the long-path fallback) rather than on its unix socket."""
        return bool(self.listen)

    @property
    def where(self) -> str:
        """Where it listens, for progress lines."""
        if self.tcp:
            return f"{self._tcp_host()}:{self.port}"
        return f"a unix socket in {self.socket_dir}"

    def url(self, dbname: str, password: str | None = None) -> str:
        """The libpq URL of database ``dbname`` on this server, as the superuser."""
        if self.tcp:
            user = SUPERUSER if password is None else f"{SUPERUSER}:{password}"
            return f"postgresql://{user}@{self._tcp_host()}:{self.port}/{dbname}"
        socket_dir = urllib.parse.quote(self.socket_dir, safe="/")
        return f"postgresql://{SUPERUSER}@/{dbname}?host={socket_dir}&port={self.port}"

    def program_dir(self) -> Path | None:
        """The folder of the ``postgres`` program this server runs, as its ``postmaster.opts``
        says (the full path, then the quoted arguments); None when that cannot be read."""
        try:
            opts = (self.file.parent / "postmaster.opts").read_text(errors="replace")
        except OSError:
            return None
        program = opts.split(' "', 1)[0].strip()
        return Path(program).parent if os.path.isabs(program) else None

    def _tcp_host(self) -> str:
        host = HOST if self.listen in ("*", "0.0.0.0", "::", "localhost") else self.listen
        return f"[{host}]" if ":" in host else host


def running_postmaster(data_dir: Path) -> Postmaster | None:
    """The live postmaster of ``data_dir``, once it is ready; None if there is none (a stale
    ``postmaster.pid`` is removed). Called with the lock held."""
    start = time.monotonic()
    deadline = start + START_TIMEOUT
    delay = 0.005
    while True:
        postmaster = Postmaster.read(data_dir)
        if postmaster is None:
            return None
        if postmaster.pid == 0 and time.monotonic() < start + 2:
            pass  # being written by a starting server (or garbage: removed below)
        elif not _is_postmaster_of(postmaster.pid, data_dir):
            logger.info("removing stale %s (pid %s is gone)", postmaster.file, postmaster.pid)
            postmaster.file.unlink(missing_ok=True)
            return None
        elif postmaster.status == "ready":
            return postmaster
        # Starting (its starter was killed mid-start) or stopping (a stop was interrupted):
        # wait for it to settle rather than start a second server on the same folder.
        if time.monotonic() > deadline:
            raise EmbeddedPostgresError(
                f"the PostgreSQL server in {data_dir} (pid {postmaster.pid}) stayed "
                f"{postmaster.status or 'starting'!r} for {START_TIMEOUT:.0f} s; "
                f"see {data_dir / 'server.log'}"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def stop(postmaster: Postmaster) -> None:
    """Fast shutdown (SIGINT): sessions are ended, a checkpoint is written, the server exits."""
    start = time.monotonic()
    for signum, timeout in ((signal.SIGINT, _STOP_TIMEOUT), (signal.SIGQUIT, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(postmaster.pid, signum)
        deadline = time.monotonic() + timeout
        delay = 0.002
        while pid_alive(postmaster.pid):
            if time.monotonic() > deadline:
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        else:
            reap_if_ours(postmaster.pid)
            logger.info(
                "embedded PostgreSQL (pid %s) stopped in %.3f s",
                postmaster.pid,
                time.monotonic() - start,
            )
            return
        logger.warning("embedded PostgreSQL (pid %s) ignored %s", postmaster.pid, signum.name)
    raise EmbeddedPostgresError(f"the embedded PostgreSQL (pid {postmaster.pid}) would not stop")


def stop_if_running(data_dir: Path) -> None:
    """Stops the server of ``data_dir`` if one runs, whatever its state (after a failed start)."""
    postmaster = Postmaster.read(data_dir)
    if postmaster is not None and _is_postmaster_of(postmaster.pid, data_dir):
        stop(postmaster)


def free_port(preferred: int | None) -> int:
    """``preferred`` if it is free on :data:`HOST`, else any free port there."""
    for port in (preferred, 0):
        if port is None:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            # As PostgreSQL does: a port in TIME_WAIT from our last run is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((HOST, port))
            except OSError:
                continue
            chosen: int = probe.getsockname()[1]
            return chosen
    raise EmbeddedPostgresError(f"no free TCP port on {HOST}")
