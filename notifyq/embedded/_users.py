"""Who uses a server: the registry of live processes (``pg<major>.users.json``, pruned of the dead
at every load) and the lock file (``pg<major>.lock``) held around every start, stop, reset and
registry change."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from notifyq.embedded._errors import EmbeddedPostgresError
from notifyq.embedded._layout import write_file
from notifyq.embedded._procs import pid_alive, start_marker

# The package's one logger, named as before it was split: logs.py quiets it, users filter on it.
logger = logging.getLogger("notifyq.embedded")

_LOCK_TIMEOUT = 120.0


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Holds an exclusive ``flock`` on ``path``; the kernel drops it if the process dies."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        with contextlib.suppress(PermissionError):  # not ours: then not ours to change
            os.fchmod(fd, 0o600)  # older versions made it 0644
        deadline = time.monotonic() + _LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise EmbeddedPostgresError(
                        f"timed out after {_LOCK_TIMEOUT:.0f} s waiting for {path}, held by "
                        "another process starting or stopping the embedded PostgreSQL"
                    ) from None
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)


@dataclass
class User:
    """One process using the server, and the token of the handle it acquired with."""

    pid: int
    #: The process's start time as the kernel reports it, to tell a reused pid apart.
    started: str | None
    token: str

    @classmethod
    def of_this_process(cls, token: str) -> User:
        """This process, as a user holding ``token``."""
        return cls(os.getpid(), start_marker(os.getpid()), token)

    def alive(self) -> bool:
        """Whether the process still runs and is not another that reused its pid."""
        if not pid_alive(self.pid):
            return False
        return self.started is None or start_marker(self.pid) in (None, self.started)


@dataclass
class Registry:
    """The registry file's content: the live users, and the TCP port last listened on."""

    path: Path
    users: list[User]
    #: The port the server last listened on, tried first at the next start.
    port: int | None

    @classmethod
    def load(cls, path: Path) -> Registry:
        """The registry, with users whose process died pruned."""
        try:
            raw = json.loads(path.read_text())
            users = [User(int(u["pid"]), u.get("started"), str(u["token"])) for u in raw["users"]]
            port = int(raw["port"]) if raw.get("port") else None
        except FileNotFoundError:
            return cls(path, [], None)
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring the unreadable registry %s: %s", path, exc)
            return cls(path, [], None)
        live = [user for user in users if user.alive()]
        if len(live) != len(users):
            dead = sorted({user.pid for user in users} - {user.pid for user in live})
            logger.info("pruned dead users of the embedded PostgreSQL: %s", dead)
        return cls(path, live, port)

    def save(self) -> None:
        """Writes the registry back (0600). Called with the lock held."""
        data = {
            "users": [{"pid": u.pid, "started": u.started, "token": u.token} for u in self.users],
            "port": self.port,
        }
        write_file(self.path, json.dumps(data, indent=1), 0o600)
