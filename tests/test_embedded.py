"""The embedded PostgreSQL launcher, with real servers and real processes (as root or not).

Every test runs on its own base folder, never the real per-user one, and ends by checking that
no server it started is still running. As root the base folder cannot be under ``tmp_path``:
pytest makes ``/tmp/pytest-of-root`` private (0700), and the account that runs the server could
not reach it; those tests use a folder of their own under the system temp instead.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from notifyq.embedded import (
    DATABASE,
    SERVICE_ACCOUNT,
    EmbeddedPostgres,
    EmbeddedPostgresError,
    reset,
)
from notifyq.errors import ConfigurationError, NotifyQError
from tests.helpers import ROOT

T = TypeVar("T")

IS_ROOT = os.geteuid() == 0

# A process that uses the server until it reads a line, then releases it.
USER_SCRIPT = """
import sys
from notifyq.embedded import EmbeddedPostgres

pg = EmbeddedPostgres(sys.argv[1])
url = pg.acquire()
print(url, pg.server_pid, flush=True)
sys.stdin.readline()
pg.release()
print("released", flush=True)
"""


def wait_until(condition: Callable[[], T], *, timeout: float = 10.0, what: str = "") -> T:
    """Polls ``condition`` until it answers something truthy; fails after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(0.01)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return True


def postmaster_pid(data_dir: Path) -> int | None:
    try:
        return int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (FileNotFoundError, ValueError):
        return None


def wait_gone(pid: int, timeout: float = 10.0) -> None:
    wait_until(lambda: not alive(pid), timeout=timeout, what=f"process {pid} to exit")


def assert_stopped(pid: int | None, data_dir: Path) -> None:
    assert pid is not None
    wait_gone(pid)
    assert not (data_dir / "postmaster.pid").exists()


def select_1(url: str) -> int:
    with psycopg.connect(url, connect_timeout=5) as conn:
        row = conn.execute("SELECT 1").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def base_dir(tmp_path: Path) -> Iterator[Path]:
    """An empty base folder; at teardown, fails the test if a server still runs in it (after
    stopping that server: it was started by this test)."""
    if IS_ROOT:
        base = Path(tempfile.mkdtemp(prefix="notifyq-test-"))
        base.chmod(0o755)  # our own folder: the server's account must traverse it
    else:
        base = tmp_path / "notifyq"
    try:
        yield base
    finally:
        leftovers = []
        for pid_file in base.rglob("postmaster.pid"):
            pid = postmaster_pid(pid_file.parent)
            if pid is not None and alive(pid):
                leftovers.append(pid)
                os.kill(pid, signal.SIGINT)
                wait_gone(pid, timeout=30)
        if IS_ROOT:
            shutil.rmtree(base, ignore_errors=True)
        assert not leftovers, f"the test left PostgreSQL server(s) running: {leftovers}"


class User:
    """Another process using the embedded server of a base folder."""

    def __init__(self, base_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", USER_SCRIPT, str(base_dir)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.url = ""
        self.server_pid = 0

    def wait_acquired(self, timeout: float = 30.0) -> User:
        url, pid = self._read_line(timeout).split()
        self.url, self.server_pid = url, int(pid)
        return self

    def release(self, timeout: float = 30.0) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self._read_line(timeout) == "released"
        assert self.proc.wait(timeout) == 0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()

    def _read_line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            if not selector.select(timeout):
                pytest.fail(f"process {self.proc.pid} said nothing for {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            pytest.fail(f"process {self.proc.pid} exited with {self.proc.wait(10)}")
        return line.strip()


@pytest.fixture
def users(base_dir: Path) -> Iterator[Callable[[], User]]:
    """Starts user processes on ``base_dir``; kills any still running at teardown (before the
    ``base_dir`` teardown checks for leftover servers)."""
    started: list[User] = []

    def start() -> User:
        user = User(base_dir)
        started.append(user)
        return user

    yield start
    for user in started:
        user.close()


def test_cold_start_gives_a_usable_url(base_dir: Path) -> None:
    messages: list[str] = []
    pg = EmbeddedPostgres(base_dir, on_progress=messages.append)
    assert pg.data_dir == base_dir / f"pg{pg.version.split('.')[0]}"

    url = pg.acquire()

    assert url.startswith("postgresql://postgres@127.0.0.1:")
    assert url.endswith(f"/{DATABASE}")
    assert pg.acquire() == url == pg.url  # idempotent
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.execute("SELECT current_database()").fetchone() == (DATABASE,)
    assert any("creating a new" in message for message in messages)
    assert any(f"starting embedded PostgreSQL {pg.version}" in message for message in messages)
    # The unix socket sits in the data folder too.
    assert any(path.name.startswith(".s.PGSQL.") for path in pg.data_dir.iterdir())
    pid = pg.server_pid

    pg.release()
    pg.release()  # idempotent

    assert_stopped(pid, pg.data_dir)
    with pytest.raises(EmbeddedPostgresError):
        _ = pg.url


def test_listen_receives_a_notify_from_another_connection(base_dir: Path) -> None:
    with EmbeddedPostgres(base_dir) as pg:
        pid = pg.server_pid
        with (
            psycopg.connect(pg.url, autocommit=True) as listener,
            psycopg.connect(pg.url, autocommit=True) as sender,
        ):
            listener.execute("LISTEN jobs")
            sender.execute("SELECT pg_notify('jobs', 'hello')")
            received = list(listener.notifies(timeout=10, stop_after=1))
    assert [(n.channel, n.payload) for n in received] == [("jobs", "hello")]
    assert_stopped(pid, pg.data_dir)


def test_processes_share_one_server_until_the_last_release(
    base_dir: Path, users: Callable[[], User]
) -> None:
    # Both race for the cold start of a new folder.
    first, second = users(), users()
    first.wait_acquired()
    second.wait_acquired()
    assert first.url == second.url
    assert first.server_pid == second.server_pid
    data_dir = EmbeddedPostgres(base_dir).data_dir
    assert postmaster_pid(data_dir) == first.server_pid

    first.release()

    assert alive(first.server_pid)
    assert select_1(second.url) == 1

    second.release()

    assert_stopped(second.server_pid, data_dir)


def test_a_killed_user_is_pruned_by_the_last_release(
    base_dir: Path, users: Callable[[], User]
) -> None:
    killed, survivor = users().wait_acquired(), users().wait_acquired()
    killed.kill()
    assert alive(survivor.server_pid)

    survivor.release()

    assert_stopped(survivor.server_pid, EmbeddedPostgres(base_dir).data_dir)


def test_a_server_left_by_a_killed_process_is_reused_then_stopped(
    base_dir: Path, users: Callable[[], User]
) -> None:
    killed = users().wait_acquired()
    killed.kill()
    assert alive(killed.server_pid)  # nobody released it

    messages: list[str] = []
    pg = EmbeddedPostgres(base_dir, on_progress=messages.append)
    url = pg.acquire()

    assert pg.server_pid == killed.server_pid
    assert postmaster_pid(pg.data_dir) == killed.server_pid
    assert url == killed.url
    assert any("reusing" in message for message in messages)
    assert select_1(url) == 1

    pg.release()

    assert_stopped(killed.server_pid, pg.data_dir)


def test_reset_wipes_the_data_folder(base_dir: Path) -> None:
    with EmbeddedPostgres(base_dir) as pg, psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (id int)")
        first_pid = pg.server_pid

    deleted = reset(base_dir)

    assert deleted == pg.data_dir
    assert not pg.data_dir.exists()
    assert_stopped(first_pid, pg.data_dir)
    with EmbeddedPostgres(base_dir) as pg, psycopg.connect(pg.url) as conn:
        assert conn.execute("SELECT to_regclass('kept')").fetchone() == (None,)
        second_pid = pg.server_pid
    assert_stopped(second_pid, pg.data_dir)


def test_reset_refuses_while_another_process_uses_the_server(
    base_dir: Path, users: Callable[[], User]
) -> None:
    user = users().wait_acquired()
    pg = EmbeddedPostgres(base_dir)

    with pytest.raises(EmbeddedPostgresError, match="in use"):
        pg.reset()

    assert (pg.data_dir / "PG_VERSION").exists()
    assert select_1(user.url) == 1
    user.release()
    assert_stopped(user.server_pid, pg.data_dir)


# Like a `notifyq dev` stopped by Ctrl-C: SIGINT to its whole process group, pg_ctl included.
INTERRUPTED_SCRIPT = """
import sys
from notifyq.embedded import EmbeddedPostgres

pg = EmbeddedPostgres(sys.argv[1], on_progress=lambda line: print(line, flush=True))
with pg:
    print("acquired", flush=True)
    sys.stdin.readline()
"""


@pytest.mark.parametrize("moment", ["starting", "acquired"])
def test_ctrl_c_leaves_no_server_behind(base_dir: Path, moment: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED_SCRIPT, str(base_dir)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(moment):
                break
        else:
            pytest.fail(f"the process exited with {proc.wait(10)} before {moment!r}")
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()

    data_dir = EmbeddedPostgres(base_dir).data_dir
    pid = postmaster_pid(data_dir)
    assert pid is None or not alive(pid)


def _dead_pid() -> int:
    proc = subprocess.Popen(["/bin/sh", "-c", "exit 0"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("owner", ["dead process", "live process that is not postgres"])
def test_a_stale_postmaster_pid_does_not_block_the_start(base_dir: Path, owner: str) -> None:
    with EmbeddedPostgres(base_dir) as pg:
        port = pg.url.rsplit(":", 1)[1].split("/")[0]
    stale_pid = _dead_pid() if owner == "dead process" else os.getpid()
    pid_file = pg.data_dir / "postmaster.pid"
    pid_file.write_text(
        f"{stale_pid}\n{pg.data_dir}\n{int(time.time())}\n{port}\n{pg.data_dir}\n127.0.0.1\n"
        "  1234567    98765\nready   \n"
    )

    url = pg.acquire()

    assert select_1(url) == 1
    server_pid = pg.server_pid
    assert server_pid is not None and server_pid != stale_pid
    pg.release()
    assert_stopped(server_pid, pg.data_dir)


def test_a_server_killed_hard_is_restarted(base_dir: Path) -> None:
    pg = EmbeddedPostgres(base_dir)
    pg.acquire()
    killed_pid = pg.server_pid
    assert killed_pid is not None
    os.kill(killed_pid, signal.SIGKILL)  # the postmaster this test started
    wait_until(lambda: not alive(killed_pid), what="the killed postmaster to go")
    pg.release()  # finds no server to stop

    url = pg.acquire()

    assert select_1(url) == 1
    assert pg.server_pid != killed_pid
    server_pid = pg.server_pid
    pg.release()
    assert_stopped(server_pid, pg.data_dir)


def test_missing_binaries_raise_a_clear_error(base_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken-bin"
    broken.mkdir()
    for name in ("postgres", "initdb", "pg_ctl"):
        script = broken / name
        script.write_text("#!/bin/sh\necho 'error while loading shared libraries' >&2\nexit 127\n")
        script.chmod(0o755)

    for bin_dir in (tmp_path / "nowhere", broken):
        pg = EmbeddedPostgres(base_dir, bin_dir=bin_dir)
        with pytest.raises(ConfigurationError, match="DATABASE_URL") as caught:
            pg.acquire()
        assert isinstance(caught.value, NotifyQError)
        assert str(bin_dir) in str(caught.value)
    assert not base_dir.exists() or not any(base_dir.iterdir())


def test_a_long_data_path_listens_on_tcp_only(base_dir: Path) -> None:
    deep = base_dir / ("d" * 60) / ("e" * 60)
    with EmbeddedPostgres(deep) as pg:
        assert select_1(pg.url) == 1
        assert not any(path.name.startswith(".s.PGSQL.") for path in pg.data_dir.iterdir())
        pid = pg.server_pid
    assert_stopped(pid, pg.data_dir)


def _system_bin_dir() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: p.parent.name)
    return next((path for path in reversed(found) if (path / "postgres").exists()), None)


@pytest.mark.skipif(_system_bin_dir() is None, reason="no PostgreSQL in /usr/lib/postgresql")
def test_system_binaries_work_too(base_dir: Path) -> None:
    bin_dir = _system_bin_dir()
    assert bin_dir is not None
    with EmbeddedPostgres(base_dir, bin_dir=bin_dir) as pg:
        assert pg.data_dir.name == f"pg{bin_dir.parent.name.split('.')[0]}"
        with psycopg.connect(pg.url) as conn:
            row: Any = conn.execute("SHOW server_version").fetchone()
        assert row[0].startswith(pg.version)
        pid = pg.server_pid
    assert_stopped(pid, pg.data_dir)


@pytest.mark.skipif(not IS_ROOT, reason="only root runs the server as another account")
def test_root_refuses_a_data_folder_the_server_account_cannot_reach() -> None:
    private = Path(tempfile.mkdtemp(prefix="notifyq-private-"))  # 0700, like a home folder
    try:
        pg = EmbeddedPostgres(private / "notifyq")
        with pytest.raises(ConfigurationError, match="cannot reach"):
            pg.acquire()
        assert stat.S_IMODE(private.stat().st_mode) == 0o700  # not loosened
        assert not (pg.data_dir / "PG_VERSION").exists()
    finally:
        shutil.rmtree(private)


@pytest.mark.skipif(not IS_ROOT, reason="only root runs the server as another account")
def test_root_runs_the_server_as_the_service_account(base_dir: Path) -> None:
    import pwd

    home_mode = Path("/root").stat().st_mode
    with EmbeddedPostgres(base_dir) as pg:
        pid = pg.server_pid
        assert pid is not None
        server_uid = Path(f"/proc/{pid}").stat().st_uid
        assert pwd.getpwuid(server_uid).pw_name in (SERVICE_ACCOUNT, "nobody")
        assert pg.data_dir.stat().st_uid == server_uid
        assert Path("/root").stat().st_mode == home_mode  # root's home not loosened
    assert_stopped(pid, pg.data_dir)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_registry_and_the_lock_are_private(base_dir: Path) -> None:
    # As older versions left them: readable by everyone.
    base_dir.mkdir(parents=True, exist_ok=True)
    pg = EmbeddedPostgres(base_dir)
    lock, registry = (base_dir / f"{pg.data_dir.name}.{end}" for end in ("lock", "users.json"))
    for path in (lock, registry):
        path.write_text('{"users": [], "port": null}')
        path.chmod(0o644)

    with pg:
        assert (mode_of(lock), mode_of(registry)) == (0o600, 0o600)
        pid = pg.server_pid
    assert (mode_of(lock), mode_of(registry)) == (0o600, 0o600)
    assert_stopped(pid, pg.data_dir)
