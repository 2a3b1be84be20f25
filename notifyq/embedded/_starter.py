"""Bringing a stopped cluster up, with the lock held: ``initdb`` on a new folder, the safety that
every start sees to (a private socket folder, the hba file, on TCP the superuser's password), and
``pg_ctl start`` on the unix socket or, when its path is too long, on 127.0.0.1."""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

from notifyq.embedded._account import check_reachable, is_root, run, service_account
from notifyq.embedded._auth import hba_rules, new_password, read_password
from notifyq.embedded._binaries import Binaries, runnable_binaries
from notifyq.embedded._errors import USE_YOUR_OWN, EmbeddedPostgresError, ProgressCallback
from notifyq.embedded._layout import SOCKET_PORT, Paths, write_file
from notifyq.embedded._postmaster import (
    HOST,
    START_TIMEOUT,
    SUPERUSER,
    Postmaster,
    free_port,
    stop_if_running,
)

# Given on the command line at each start, with the port, sockets and hba_file, rather than
# written to postgresql.conf: root never writes into the folder the unprivileged account owns,
# and a cluster made by an older notifyq gets them too.
_SERVER_SETTINGS = (
    "max_connections=100",
    "password_encryption=scram-sha-256",
    # Defence in depth: the folder (0700) already keeps other accounts away from the socket.
    "unix_socket_permissions=0700",
)


class Starter:
    """Brings a stopped cluster up (after ``initdb`` if new); runs with the lock held."""

    def __init__(
        self,
        binaries: Binaries,
        paths: Paths,
        progress: ProgressCallback,
        *,
        port: int | None = None,
    ) -> None:
        self.account = service_account() if is_root() else None
        self.binaries = binaries
        self.paths = paths
        self.progress = progress
        if self.account is not None and self.account.created:
            # A lasting change to the machine, made for the user: said, with its undoing.
            progress(
                f"created the system account {self.account.name} (no login, no home) to run "
                "PostgreSQL, which refuses to run as root; it stays when notifyq stops. To "
                f"remove it: `notifyq dev --reset` (or delete {paths.base_dir}), then "
                f"`{self.account.removal()}`"
            )
        #: The TCP port tried first when the server must listen on TCP (the one it last used).
        self.port = port

    def start(self) -> Postmaster:
        """Starts the server (made safe first, and made at all if new) and answers it, ready."""
        data_dir = self.paths.data_dir
        if self.account is not None:
            check_reachable(self.paths.base_dir, self.account)
            self.binaries = runnable_binaries(self.binaries, self.account, self.progress)
        if not (data_dir / "PG_VERSION").exists():
            self.initdb()
        self.make_safe()
        # The one line that says which server runs (the version, where its binaries come
        # from, its data): said before it starts, so that a slow or failed start is explained.
        starting = (
            f"starting embedded PostgreSQL {self.binaries.version} ({self.binaries.source}) "
            f"in {data_dir}"
        )
        if self.paths.socket_fits:
            self.progress(f"{starting}; {USE_YOUR_OWN}")
            return self.pg_ctl_start(SOCKET_PORT, tcp=False)
        self.progress(
            f"{starting}, on {HOST} with the password in {self.paths.password} (the path of "
            f"a unix socket there would be too long); {USE_YOUR_OWN}"
        )
        port = self.port
        for attempt in range(3):
            port = free_port(port)
            try:
                return self.pg_ctl_start(port, tcp=True)
            except EmbeddedPostgresError as exc:
                # Another program took the port between our probe and the server's bind.
                if attempt == 2 or "already in use" not in str(exc):
                    raise
                port = None
        raise AssertionError("unreachable")

    def make_safe(self) -> None:
        """Sees to it that the server about to start lets nobody in without a password over the
        network, whoever made the cluster: its socket folder private, the rules rewritten, and
        on TCP the superuser's password set."""
        data_dir = self.paths.data_dir
        # PostgreSQL also accepts 0750 (a cluster made with group access): the group would
        # reach the socket, where no password is asked.
        if stat.S_IMODE(data_dir.stat().st_mode) & 0o077:
            data_dir.chmod(0o700)
        tcp = not self.paths.socket_fits
        # Nothing secret in it, and the server's account (not root, as root) must read it.
        write_file(self.paths.hba, hba_rules(tcp=tcp), 0o644)
        if tcp:
            self.set_password(read_password(self.paths) or new_password(self.paths))

    def set_password(self, password: str) -> None:
        """Sets the superuser's password in single-user mode: no server runs (the lock is held),
        and a cluster made with trust has no other way in. The password goes on stdin, never on
        a command line or in a log. Done at every start on TCP, so the file is always right."""
        command = [
            self.binaries.program("postgres"), "--single", "-D", str(self.paths.data_dir),
            "-c", "exit_on_error=on", "-c", "log_min_error_statement=panic",
            "-c", "log_checkpoints=off", "-c", "password_encryption=scram-sha-256",
            SUPERUSER,
        ]  # fmt: skip
        statement = f"ALTER ROLE {SUPERUSER} PASSWORD '{password}'\n"  # safe: _auth.PASSWORD_RE
        try:
            run(command, account=self.account, timeout=START_TIMEOUT + 30, input=statement)
        except subprocess.CalledProcessError as exc:
            detail = (exc.stderr or exc.stdout or "").replace(password, "***").strip()
            raise EmbeddedPostgresError(
                f"could not set the superuser's password in {self.paths.data_dir}:\n{detail}"
            ) from None

    def initdb(self) -> None:
        """Makes the cluster with ``initdb``, as the server's account, in the C locale."""
        data_dir = self.paths.data_dir
        others = [
            folder
            for folder in sorted(data_dir.parent.glob("pg[0-9]*"))
            if folder.name[2:].isdigit()
            and folder != data_dir
            and (folder / "PG_VERSION").is_file()
        ]
        # A cluster of another major version (made with other binaries) is left as it is.
        kept = "".join(f"; {folder} stays as it is" for folder in others)
        self.progress(
            f"creating a new PostgreSQL {self.binaries.version} cluster in {data_dir} "
            f"(first run{kept})"
        )
        # initdb into a fresh folder then rename, so that an interrupted initdb never leaves a
        # half-made cluster behind under the real name.
        for leftover in data_dir.parent.glob(f"{data_dir.name}.init-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        if data_dir.exists():
            if any(data_dir.iterdir()):
                raise EmbeddedPostgresError(
                    f"{data_dir} exists but holds no PostgreSQL cluster (no PG_VERSION); "
                    "move it away or run the reset"
                )
            data_dir.rmdir()
        staging = data_dir.with_name(f"{data_dir.name}.init-{os.getpid()}")
        staging.mkdir(mode=0o700)
        if self.account is not None:
            os.chown(staging, self.account.uid, self.account.gid, follow_symlinks=False)
        command = [
            self.binaries.program("initdb"), "-D", str(staging), "-U", SUPERUSER,
            # Its own pg_hba.conf is not used (see make_safe), but it should be as safe.
            "--auth-local=trust", "--auth-host=reject", "--encoding=UTF8", "--locale=C",
        ]  # fmt: skip
        try:
            run(command, account=self.account, timeout=300)
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if not isinstance(exc, subprocess.CalledProcessError):
                raise
            raise EmbeddedPostgresError(
                f"initdb failed in {staging}:\n{(exc.stderr or exc.stdout or '').strip()}"
            ) from exc
        os.rename(staging, data_dir)

    def pg_ctl_start(self, port: int, *, tcp: bool) -> Postmaster:
        """Starts the server on its unix socket only, or (``tcp``) on 127.0.0.1 only."""
        data_dir, log = self.paths.data_dir, self.paths.log
        options = ["-p", str(port), "-c", f"hba_file={self.paths.hba}"]
        for setting in _SERVER_SETTINGS:
            options += ["-c", setting]
        if tcp:
            options += ["-c", f"listen_addresses={HOST}", "-c", "unix_socket_directories="]
        else:
            options += ["-c", "listen_addresses=", "-c", f'unix_socket_directories="{data_dir}"']
        # No server runs here (checked under the lock): socket lock files left by a killed one
        # would make PostgreSQL refuse the port while that pid lingers as a zombie.
        for leftover in data_dir.glob(".s.PGSQL.*"):
            leftover.unlink(missing_ok=True)
        if log.exists():
            os.replace(log, log.with_name(log.name + ".1"))
        command = [
            self.binaries.program("pg_ctl"), "start", "-w", "-t", str(int(START_TIMEOUT)),
            "-D", str(data_dir), "-l", str(log),
            # pg_ctl hands these to /bin/sh.
            "-o", " ".join(shlex.quote(option) for option in options),
        ]  # fmt: skip
        try:
            run(command, account=self.account, timeout=START_TIMEOUT + 30)
        except BaseException as exc:
            # pg_ctl puts the server in its own session, so neither pg_ctl's failure nor a
            # Ctrl-C reaching us and pg_ctl stops a server that came up late or half-way.
            stop_if_running(data_dir)
            if not isinstance(exc, subprocess.SubprocessError):
                raise
            raise EmbeddedPostgresError(
                f"PostgreSQL failed to start in {data_dir} (deleting that folder with a reset "
                f"starts afresh):\n{_tail(log)}"
            ) from exc
        postmaster = Postmaster.read(data_dir)
        if postmaster is None or postmaster.status != "ready":
            raise EmbeddedPostgresError(
                f"PostgreSQL started in {data_dir} but its postmaster.pid says otherwise:\n"
                f"{_tail(log)}"
            )
        return postmaster


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"
