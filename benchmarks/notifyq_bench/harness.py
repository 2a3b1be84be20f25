"""The bench's plumbing: scratch databases, child processes, the progress line, statistics."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import anyio
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import notifyq
from notifyq._scratch import ScratchDatabases, drop_orphans
from notifyq.db import redact
from notifyq_bench import bare

SCRATCH_PREFIX = "notifyq_bench_"
#: The folder that holds the notifyq package being measured (a source checkout, or
#: site-packages): first on the children's PYTHONPATH, and where its git revision is read.
NOTIFYQ_ROOT = str(Path(notifyq.__file__).resolve().parent.parent)
#: The folder that holds this package: the children import its tasks, floors and load
#: generators, also when the bench runs from a checkout without being installed.
BENCH_ROOT = str(Path(__file__).resolve().parent.parent)


class BenchError(Exception):
    """The bench could not measure something; the message says what and why."""


# -- scratch databases --------------------------------------------------------------------------


def with_dbname(conninfo: str, dbname: str) -> str:
    """``conninfo`` (URL or key=value) pointing at database ``dbname``."""
    return make_conninfo(conninfo, dbname=dbname)


def describe_server(conninfo: str) -> str:
    """Where the server is, without secrets: ``unix socket /dir`` or ``tcp host:port``."""
    params = conninfo_to_dict(conninfo)
    host = str(params.get("host") or "")
    port = str(params.get("port") or "5432")
    if not host or host.startswith("/"):
        return f"unix socket {host or '(default)'}, port {port}"
    return f"tcp {host}:{port}"


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another account's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Scratch:
    """Scratch databases named ``notifyq_bench_<pid>_<random>...`` on one server, each leased
    on the server by this process until it drops it (:mod:`notifyq._scratch`): a bench on
    another host sharing the server never drops them, and a killed bench's are dropped by the
    next one. :meth:`drop_all` drops every one this process created."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.names: list[str] = []
        self._databases = ScratchDatabases(server, SCRATCH_PREFIX)

    def drop_stale(self) -> list[str]:
        """Drops scratch databases of earlier runs that are gone (marked as scratch databases,
        their lease held by no session on the server, whatever host it came from)."""
        try:
            return drop_orphans(self.server, SCRATCH_PREFIX)
        except psycopg.OperationalError as exc:
            raise _unreachable(self.server, exc) from exc

    def create(self, suffix: str = "") -> str:
        """Creates, migrates and answers the conninfo of a new scratch database, with notifyq's
        schema and the bare loop's ``bench.jobs``."""
        from notifyq.migrations import migrate
        from notifyq.settings import Settings

        try:
            name = self._databases.create(suffix)
        except psycopg.OperationalError as exc:
            raise _unreachable(self.server, exc) from exc
        self.names.append(name)
        url = with_dbname(self.server, name)
        settings = Settings.load(database_url=url)
        anyio.run(lambda: migrate(settings, progress=lambda _: None))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(bare.SCHEMA.encode())
        return url

    def drop_all(self) -> list[str]:
        """Drops the databases this process created; answers the ones it could not drop (a
        later run drops them once this one is gone)."""
        try:
            return self._databases.close()
        except psycopg.Error:
            return sorted(self._databases.owned)


def _unreachable(server: str, exc: psycopg.Error) -> BenchError:
    return BenchError(f"cannot connect to {redact(server)}: {str(exc).strip().splitlines()[0]}")


# -- child processes ----------------------------------------------------------------------------


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGKILL it when the bench dies, so that even a
    killed bench leaves no process behind."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    roots = dict.fromkeys((NOTIFYQ_ROOT, BENCH_ROOT, env.get("PYTHONPATH", "")))
    env["PYTHONPATH"] = os.pathsep.join(p for p in roots if p)
    for key in ("NOTIFYQ_IMPORT", "NOTIFYQ_QUEUES", "NOTIFYQ_CONCURRENCY", "NOTIFYQ_API_TOKEN"):
        env.pop(key, None)
    env.update(extra)
    return env


class Child:
    """A process the bench started, its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], logdir: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = logdir / f"{name}-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        # Started in the log folder: ``python -m`` puts its working folder first on sys.path,
        # and the children must import the same notifyq and bench as this process
        # (NOTIFYQ_ROOT, BENCH_ROOT).
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=logdir,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self.pid = self.proc.pid

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_for(self, pattern: str, timeout: float = 60.0, count: int = 1) -> None:
        """Waits until the log matches ``pattern`` (``count`` times); fails if the process
        exits or the time runs out."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            text = self.log_path.read_text(errors="replace")
            if len(regex.findall(text)) >= count:
                return
            if self.proc.poll() is not None:
                raise BenchError(
                    f"{self.name} exited with code {self.proc.returncode} before it was ready:\n"
                    + self.log_tail()
                )
            if time.monotonic() > deadline:
                raise BenchError(
                    f"{self.name} was not ready after {timeout:.0f}s:\n" + self.log_tail()
                )
            time.sleep(0.02)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise BenchError(
                f"{self.name} died with code {self.proc.returncode}:\n" + self.log_tail()
            )

    def cpu(self) -> float | None:
        """CPU seconds this process has used so far."""
        return process_cpu(self.pid)

    def rss_kb(self, field: str = "VmRSS") -> int | None:
        """A memory figure of the process from /proc (Linux), in kB."""
        try:
            with open(f"/proc/{self.pid}/status") as status:
                for line in status:
                    if line.startswith(field + ":"):
                        return int(line.split()[1])
        except OSError:
            return None
        return None

    def stop(self, timeout: float = 10.0, *, signalled: bool = False) -> None:
        """SIGTERM (unless ``signalled`` already), then SIGKILL after ``timeout`` seconds; by
        pid, only this process."""
        if self.proc.poll() is None:
            if not signalled:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait(5)
        self._log.close()


class Children:
    """Every process the bench started; :meth:`stop_all` ends those still running."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self._children: list[Child] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> Child:
        child = Child(name, argv, env, self.logdir)
        self._children.append(child)
        return child

    def stop(self, *children: Child, timeout: float = 10.0) -> None:
        for child in children:
            if child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)
        for child in children:
            # One SIGTERM only: a second one makes a notifyq process exit at once, skipping its
            # clean-up (a worker would leave its idle mark behind for a lease).
            child.stop(timeout, signalled=True)
            if child in self._children:
                self._children.remove(child)

    def stop_all(self) -> None:
        self.stop(*list(self._children), timeout=5.0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_http(port: int, path: str, child: Child, timeout: float = 30.0) -> None:
    """Waits until GET ``path`` answers 200 on localhost:``port``."""
    import http.client

    deadline = time.monotonic() + timeout
    while True:
        child.check_alive()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                conn.close()
                return
            conn.close()
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise BenchError(f"{child.name} did not answer GET {path} in {timeout:.0f}s")
        time.sleep(0.05)


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) a process has used, from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_cpu() -> float | None:
    """CPU seconds used so far by every process named ``postgres`` on this host (the server's
    backends, when it runs here), for attributing a run's CPU to the database."""
    total = 0.0
    found = False
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if (proc / "comm").read_text().strip() != "postgres":
                continue
        except OSError:
            continue
        cpu = process_cpu(int(proc.name))
        if cpu is not None:
            total += cpu
            found = True
    return total if found else None


def source_revision() -> str | None:
    """The git commit of the notifyq being measured, with ``+dirty`` when its files differ."""
    try:
        head = subprocess.run(
            ["git", "-C", NOTIFYQ_ROOT, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", NOTIFYQ_ROOT, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def cpu_busy(seconds: float = 1.0) -> float | None:
    """The share of all CPUs in use (by anything) over ``seconds``, from /proc/stat; None
    where there is no /proc."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields), idle

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    total = total1 - total0
    return 1.0 - (idle1 - idle0) / total if total > 0 else None


# -- progress -----------------------------------------------------------------------------------


class Progress:
    """One line on stderr: a bar over the planned runs, the elapsed time and what runs now.
    On a terminal the line updates in place; elsewhere each step is its own line."""

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self.scenario = ""
        self._width = 0

    def elapsed(self) -> str:
        seconds = int(time.monotonic() - self.started)
        return f"{seconds // 60}m{seconds % 60:02d}s"

    def show(self, what: str) -> None:
        if not self.enabled:
            return
        filled = int(20 * min(self.done, self.total) / self.total)
        bar = "#" * filled + "." * (20 - filled)
        line = f"[{bar}] {self.done}/{self.total} {self.elapsed()} {self.scenario}: {what}"
        if self.tty:
            pad = max(0, self._width - len(line))
            self.stream.write("\r" + line + " " * pad)
            self._width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def advance(self, n: int = 1) -> None:
        self.done += n

    def say(self, message: str) -> None:
        """A message of its own line, above the progress line."""
        if not self.enabled:
            return
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0
        self.stream.write(message + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.enabled and self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0


def poll_until(
    check: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Turns SIGTERM into KeyboardInterrupt while the bench runs, so that cleanup runs."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
