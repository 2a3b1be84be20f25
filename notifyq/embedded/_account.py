"""The unprivileged account that runs PostgreSQL when notifyq runs as root (PostgreSQL refuses
root), and running a command: as that account if given, in the C locale, with SIGINT and SIGTERM
held while the child is forked."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from notifyq.embedded._errors import SET_DATABASE_URL
from notifyq.errors import ConfigurationError

# The package's one logger, named as before it was split: logs.py quiets it, users filter on it.
logger = logging.getLogger("notifyq.embedded")

#: The system account the server runs as when notifyq runs as root.
SERVICE_ACCOUNT = "notifyq-pg"


@dataclass(frozen=True)
class Account:
    """A system account to run the server's programs as: its name (for messages) and ids, and
    whether this process has just created it (and so must say so)."""

    name: str
    uid: int
    gid: int
    created: bool = False

    def removal(self) -> str:
        """The command that removes the account, for the line that says it was made."""
        return f"userdel {self.name}"


def is_root() -> bool:
    """Whether this process runs as root, and so must run PostgreSQL as another account."""
    return sys.platform != "win32" and os.geteuid() == 0


def service_account() -> Account:
    """:data:`SERVICE_ACCOUNT`, created when missing (``nobody`` when it cannot be)."""
    import pwd

    try:
        entry = pwd.getpwnam(SERVICE_ACCOUNT)
    except KeyError:
        entry = _create_service_account()
        return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_name == SERVICE_ACCOUNT)
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _create_service_account() -> Any:
    import pwd

    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    nologin = next(
        (shell for shell in ("/usr/sbin/nologin", "/sbin/nologin") if os.path.exists(shell)),
        "/bin/false",
    )
    command = [
        useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
        "--shell", nologin, "--comment", "notifyq embedded PostgreSQL", SERVICE_ACCOUNT,
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
        detail = result.stderr.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        detail = str(exc)
    try:
        # Also covers a concurrent process having created it first.
        return pwd.getpwnam(SERVICE_ACCOUNT)
    except KeyError:
        logger.warning(
            "could not create the system account %s (%s); running PostgreSQL as nobody",
            SERVICE_ACCOUNT,
            detail,
        )
        return pwd.getpwnam("nobody")


def run(
    command: Sequence[str],
    *,
    account: Account | None = None,
    timeout: float,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Runs ``command`` (as ``account`` if given) in the C locale, with ``input`` on its stdin;
    raises CalledProcessError with its output on failure."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LC_ALL": "C",
        "LANG": "C",
    }
    if "TZ" in os.environ:
        env["TZ"] = os.environ["TZ"]
    privileges: dict[str, Any] = {}
    if account is not None:
        privileges = {"user": account.uid, "group": account.gid, "extra_groups": []}
    proc: subprocess.Popen[str] | None = None
    try:
        with _signals_held():
            proc = subprocess.Popen(
                command,
                env=env,
                cwd="/",
                stdin=subprocess.DEVNULL if input is None else subprocess.PIPE,
                # Pipes are safe: pg_ctl points the server's output at its log file.
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                **privileges,
            )
        stdout, stderr = proc.communicate(input, timeout=timeout)
    except BaseException:
        if proc is not None and proc.poll() is None:
            # SIGINT rather than subprocess's SIGKILL: pg_ctl passes it on to the server it
            # launched (in a session of its own, which a Ctrl-C does not reach), and initdb
            # removes its half-made folder.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise
    finally:
        if proc is not None:
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, list(command), stdout, stderr)
    return subprocess.CompletedProcess(list(command), proc.returncode, stdout, stderr)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Holds back SIGINT and SIGTERM (where Python handles them) until the block ends.

    A KeyboardInterrupt raised inside ``subprocess.Popen()`` after the fork loses the child's
    pid: a pg_ctl started then would go on to launch a server nobody stops. Blocking the signals
    instead would leave them blocked in the child too.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # Python runs signal handlers in the main thread only
        return
    held: list[int] = []
    previous: dict[int, Any] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if callable(handler):
            previous[signum] = handler
            signal.signal(signum, lambda received, _frame: held.append(received))
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in held:
            signal.raise_signal(number)


def check_reachable(folder: Path, account: Account) -> None:
    """Raises ConfigurationError, with the way out, when ``account`` cannot enter ``folder``."""
    try:
        run(["/bin/sh", "-c", 'cd -- "$1"', "sh", str(folder)], account=account, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigurationError(
            f"the account {account.name!r} that runs the embedded PostgreSQL as root cannot "
            f"reach {folder} (a parent folder is private, such as a home folder). Choose a data "
            f"folder outside private homes (NOTIFYQ_DATA_DIR), or {SET_DATABASE_URL}"
        ) from exc
