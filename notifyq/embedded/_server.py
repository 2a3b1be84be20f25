""":class:`EmbeddedPostgres`, the handle a process holds on the embedded server: acquire (start it
or join it, then register as a user), release (unregister; the last user stops it) and reset
(delete the cluster while nobody uses it). Each step runs under the lock of ``_users``; the
other modules of the package do the work. The package docstring describes the whole."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import uuid
from pathlib import Path
from types import TracebackType

import psycopg
from psycopg import sql

from notifyq.db import redact
from notifyq.embedded._auth import read_password, unsafe_reason
from notifyq.embedded._binaries import Binaries, find_binaries, source_of
from notifyq.embedded._errors import (
    SET_DATABASE_URL,
    USE_YOUR_OWN,
    EmbeddedPostgresError,
    ProgressCallback,
)
from notifyq.embedded._layout import Paths, default_base_dir, make_dirs
from notifyq.embedded._postmaster import Postmaster, running_postmaster, stop
from notifyq.embedded._starter import Starter
from notifyq.embedded._users import Registry, User, locked
from notifyq.errors import ConfigurationError

# The package's one logger, named as before it was split: logs.py quiets it, users filter on it.
logger = logging.getLogger("notifyq.embedded")

#: The database the returned URL names; created at the first start of a cluster.
DATABASE = "notifyq"


class EmbeddedPostgres:
    """A handle on the embedded PostgreSQL server of one base folder.

    ``base_dir`` defaults to :func:`default_base_dir`; the cluster lives in its ``pg<major>``
    subfolder. ``bin_dir`` names a folder holding ``postgres``, ``initdb`` and ``pg_ctl`` and
    disables the search (wheel, then ``PATH``, then ``/usr/lib/postgresql/*/bin``).
    ``on_progress`` receives a line for each step worth showing a user.

    Nothing runs until first needed: :attr:`version` and :attr:`data_dir` run ``postgres
    --version`` once; :meth:`acquire` starts or joins the server.
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str] | None = None,
        *,
        bin_dir: str | os.PathLike[str] | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        base = Path(base_dir) if base_dir is not None else default_base_dir()
        self._base_dir = Path(os.path.realpath(base.expanduser()))
        self._bin_dir = Path(bin_dir) if bin_dir is not None else None
        self._on_progress = on_progress
        self._binaries: Binaries | None = None
        self._token: str | None = None
        self._owner_pid = 0
        self._url: str | None = None
        self._server_pid: int | None = None

    # -- what it is -------------------------------------------------------------------------

    @property
    def base_dir(self) -> Path:
        """The folder holding the cluster, its registry and its lock."""
        return self._base_dir

    @property
    def data_dir(self) -> Path:
        """The cluster folder (PGDATA): ``<base_dir>/pg<major>``."""
        return self._base_dir / f"pg{self._resolve().major}"

    @property
    def version(self) -> str:
        """The PostgreSQL version of the binaries, such as ``"18.6"``."""
        return self._resolve().version

    @property
    def bin_dir(self) -> Path:
        """The folder of the PostgreSQL binaries found (before any copy made for root)."""
        return self._resolve().bin_dir

    @property
    def url(self) -> str:
        """The libpq URL of database :data:`DATABASE`, while acquired: on the unix socket (no
        password needed), or on 127.0.0.1 with the superuser's password in it (log it only
        through :func:`notifyq.db.redact`)."""
        if self._url is None:
            raise EmbeddedPostgresError("the embedded PostgreSQL is not acquired")
        return self._url

    @property
    def server_pid(self) -> int | None:
        """The postmaster's pid while acquired, else None."""
        return self._server_pid

    # -- using it ---------------------------------------------------------------------------

    def acquire(self) -> str:
        """Starts the server, or joins the one already running, and registers this process as a
        user; answers the URL of database :data:`DATABASE`. Idempotent per handle."""
        if self._url is not None and self._owner_pid == os.getpid():
            return self._url
        if sys.platform == "win32":
            raise ConfigurationError(
                "the embedded PostgreSQL is not supported on Windows; " + SET_DATABASE_URL
            )
        binaries = self._resolve()
        data_dir = self.data_dir
        paths = Paths(self._base_dir, data_dir)
        make_dirs(self._base_dir)
        token = uuid.uuid4().hex
        with locked(paths.lock):
            registry = Registry.load(paths.registry)
            had_users = bool(registry.users)
            postmaster = self._joinable_postmaster(paths, registry)
            created = postmaster is None
            if postmaster is None:
                postmaster = Starter(binaries, paths, self._progress, port=registry.port).start()
            else:
                verb = "joining" if had_users else "reusing the leftover"
                self._progress(f"{verb} {_describe(postmaster, binaries)}; {USE_YOUR_OWN}")
            password = read_password(paths) if postmaster.tcp else None
            try:
                if created or not had_users:
                    # A new cluster, or a server left by a killed process, may lack it.
                    _ensure_database(postmaster, password)
                registry.users.append(User.of_this_process(token))
                if postmaster.tcp:
                    registry.port = postmaster.port
                registry.save()
            except BaseException:
                # Interrupted before this process was recorded: nobody would stop the server.
                if not had_users:
                    stop(postmaster)
                raise
        if created:
            logger.info("embedded PostgreSQL %s started in %s", binaries.version, data_dir)
        self._token, self._owner_pid = token, os.getpid()
        self._url, self._server_pid = postmaster.url(DATABASE, password), postmaster.pid
        atexit.register(self.release)
        return self._url

    def release(self) -> None:
        """Unregisters this process; stops the server if no other live process uses it.
        Idempotent; also runs at interpreter exit if forgotten."""
        token, self._token = self._token, None
        self._url = self._server_pid = None
        atexit.unregister(self.release)
        if token is None or self._owner_pid != os.getpid():
            return  # never acquired, already released, or a forked child of the acquirer
        paths = Paths(self._base_dir, self.data_dir)
        with locked(paths.lock):
            registry = Registry.load(paths.registry)
            registry.users = [user for user in registry.users if user.token != token]
            registry.save()
            if registry.users:
                logger.debug(
                    "embedded PostgreSQL left running for %d other user(s)", len(registry.users)
                )
                return
            postmaster = running_postmaster(paths.data_dir)
            if postmaster is not None:
                self._progress(f"stopping embedded PostgreSQL (data in {paths.data_dir})")
                stop(postmaster)

    def reset(self) -> Path:
        """Stops the server and deletes the cluster folder, so the next acquire starts afresh;
        answers the folder deleted. Refuses while any live process uses the server."""
        data_dir = self.data_dir
        paths = Paths(self._base_dir, data_dir)
        if not self._base_dir.exists():
            return data_dir
        with locked(paths.lock):
            registry = Registry.load(paths.registry)
            if registry.users:
                pids = ", ".join(str(user.pid) for user in registry.users)
                raise EmbeddedPostgresError(
                    f"cannot reset {data_dir}: the embedded PostgreSQL is in use by process(es) "
                    f"{pids}; stop them first"
                )
            postmaster = running_postmaster(data_dir)
            if postmaster is not None:
                self._progress(f"stopping embedded PostgreSQL (data in {data_dir})")
                stop(postmaster)
            if data_dir.exists():
                self._progress(f"deleting {data_dir}")
            shutil.rmtree(data_dir, ignore_errors=True)
            for leftover in self._base_dir.glob(f"{data_dir.name}.init-*"):
                shutil.rmtree(leftover, ignore_errors=True)
            for owned in (paths.registry, paths.password, paths.hba):
                owned.unlink(missing_ok=True)
            if data_dir.exists():
                raise EmbeddedPostgresError(f"could not delete {data_dir}")
        return data_dir

    def __enter__(self) -> EmbeddedPostgres:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = f"acquired, {redact(self._url)}" if self._url else "not acquired"
        return f"<EmbeddedPostgres {self._base_dir} ({state})>"

    # -- internals --------------------------------------------------------------------------

    def _resolve(self) -> Binaries:
        if self._binaries is None:
            self._binaries = find_binaries(self._bin_dir)
        return self._binaries

    def _progress(self, message: str) -> None:
        logger.info("%s", message)
        if self._on_progress is not None:
            self._on_progress(message)

    def _joinable_postmaster(self, paths: Paths, registry: Registry) -> Postmaster | None:
        """The running server to join, or None when one must be started. A server that was not
        started with our authentication rules (by an older notifyq: trust on 127.0.0.1) is
        stopped first when nobody uses it, and refused while someone does. Called with the lock
        held."""
        postmaster = running_postmaster(paths.data_dir)
        if postmaster is None:
            return None
        problem = unsafe_reason(postmaster, paths)
        if problem is None:
            return postmaster
        if registry.users:
            pids = ", ".join(str(user.pid) for user in registry.users)
            raise EmbeddedPostgresError(
                f"the embedded PostgreSQL in {paths.data_dir} (pid {postmaster.pid}) {problem}; "
                f"stop the processes using it ({pids}) and start again"
            )
        self._progress(f"stopping the embedded PostgreSQL left in {paths.data_dir}: {problem}")
        stop(postmaster)
        return None


def reset(
    base_dir: str | os.PathLike[str] | None = None,
    *,
    bin_dir: str | os.PathLike[str] | None = None,
    on_progress: ProgressCallback | None = None,
) -> Path:
    """Deletes the embedded cluster of ``base_dir`` (see :meth:`EmbeddedPostgres.reset`)."""
    return EmbeddedPostgres(base_dir, bin_dir=bin_dir, on_progress=on_progress).reset()


def _describe(postmaster: Postmaster, binaries: Binaries) -> str:
    """A running server, for the line that says which one this process uses: its version and
    where its binaries come from (as its ``postmaster.opts`` says: maybe another process's),
    its data, and its pid."""
    data_dir = postmaster.file.parent
    version, source = binaries.version, binaries.source
    program_dir = postmaster.program_dir()
    if program_dir is not None:
        source = source_of(program_dir, binaries)
        if source != binaries.source:
            # Started from other binaries of the same major version (the folder is pg<major>).
            version = _read_major(data_dir) or version
    where = f", on {postmaster.where}" if postmaster.tcp else ""
    return f"embedded PostgreSQL {version} ({source}) in {data_dir} (pid {postmaster.pid}{where})"


def _read_major(data_dir: Path) -> str | None:
    try:
        return (data_dir / "PG_VERSION").read_text().strip() or None
    except OSError:
        return None


def _ensure_database(postmaster: Postmaster, password: str | None) -> None:
    """Creates database :data:`DATABASE` if missing (at a cluster's first start, or on a server
    left by an older run)."""
    try:
        with psycopg.connect(
            postmaster.url("postgres", password), autocommit=True, connect_timeout=10
        ) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE]
            ).fetchone()
            if exists is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    except psycopg.Error as exc:
        raise EmbeddedPostgresError(
            f"cannot create database {DATABASE!r} in the embedded PostgreSQL: {exc}"
        ) from exc
