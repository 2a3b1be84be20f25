"""Scratch databases of the test suite and the bench: made, leased and dropped only by their run.

Many runs may share one PostgreSQL server, from different hosts or containers whose process ids
mean nothing to each other, so a scratch database's owner is proved on the server:

- Its run holds a session-level advisory lock keyed from the database's name (:func:`lease_key`)
  on one connection kept open for the whole run, taken *before* the database is made and let go
  only after it is dropped. The session ending, even by ``kill -9`` of the run, lets it go.
- Each scratch database carries a comment naming that lock (:func:`marker`), set by the run
  that made it. A database with the name of a scratch database and any other comment (or none)
  was not made by a run: :func:`drop_orphans` never drops it.
- :func:`drop_orphans` drops a marked database only while no session anywhere holds its key
  (``pg_locks`` covers the whole cluster, whatever database each session is connected to).

A database is made before it is marked, though both statements go to the server together: only
a run killed in the instant between sending them leaves an unmarked database, which stays until
someone drops it by hand (a leak, never a loss).

The lease needs a direct connection (or a pooler in session mode): through a transaction-mode
pooler a session lock lands on whichever server connection runs the statement. Private: the
tests and the bench (``notifyq_bench.harness``) use it; nothing happens at import.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import socket
import threading
from types import TracebackType
from typing import Any

import psycopg
from psycopg import sql

logger = logging.getLogger(__name__)


def lease_key(name: str) -> int:
    """The advisory lock key (a signed 64-bit integer) of scratch database ``name``: the same
    on every host, so that any run can tell whether the database's owner is still there."""
    digest = hashlib.blake2b(name.encode(), digest_size=8, person=b"nq-scratch").digest()
    return int.from_bytes(digest, "big", signed=True)


def marker(name: str) -> str:
    """The comment a run puts on scratch database ``name``: what marks it as one, and says to
    whoever reads it what keeps it alive."""
    return f"notifyq scratch database; its run holds advisory lock {lease_key(name)} while it runs"


# pg_locks shows a bigint advisory key as its high and low 32 bits (classid, objid) with
# objsubid 1, in whichever database the holder is connected to: the database is not compared.
_HELD_ELSEWHERE = """
SELECT EXISTS (
    SELECT FROM pg_locks
    WHERE locktype = 'advisory' AND classid = %(high)s::oid AND objid = %(low)s::oid
      AND objsubid = 1 AND pid <> pg_backend_pid()
)"""


def _key_parts(name: str) -> dict[str, int]:
    key = lease_key(name)
    return {"key": key, "high": (key >> 32) & 0xFFFFFFFF, "low": key & 0xFFFFFFFF}


def held(conn: psycopg.Connection[Any], name: str) -> bool:
    """Whether a session other than ``conn``'s holds the lease of scratch database ``name``."""
    row = conn.execute(_HELD_ELSEWHERE, _key_parts(name)).fetchone()
    return bool(row and row[0])


def application_name(purpose: str, pid: int | None = None) -> str:
    """The ``application_name`` of this process's connections for ``purpose`` (lease, create,
    drop, cleanup): whoever reads ``pg_stat_activity`` sees whose they are."""
    pid = os.getpid() if pid is None else pid
    return f"notifyq scratch {purpose}, pid {pid} on {socket.gethostname()}"[:63]


def _connect(conninfo: str, purpose: str) -> psycopg.Connection[Any]:
    return psycopg.connect(
        conninfo, autocommit=True, connect_timeout=5, application_name=application_name(purpose)
    )


def _like(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%") + "%"


def drop_orphans(conninfo: str, prefix: str) -> list[str]:
    """Drops the scratch databases named ``prefix...`` whose run is gone (marked, and their key
    held by no session); answers their names. Safe to run from any host at any time."""
    dropped: list[str] = []
    with _connect(conninfo, "cleanup") as conn:
        rows = conn.execute(
            "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database"
            " WHERE datname LIKE %s",
            [_like(prefix)],
        ).fetchall()
        for name, comment in rows:
            if comment != marker(name):
                continue
            key = _key_parts(name)
            # The key is taken before the look, so that two cleanups on one admin database do
            # not both drop; the look covers holders connected to other databases.
            locked = conn.execute("SELECT pg_try_advisory_lock(%(key)s)", key).fetchone()
            if not (locked and locked[0]):
                continue
            try:
                if held(conn, name):
                    continue
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
                dropped.append(name)
            except psycopg.Error as exc:
                # Another role's database, or one in use by a session without FORCE's rights:
                # left for its owner.
                logger.warning("could not drop scratch database %s: %s", name, exc)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%(key)s)", key)
    return dropped


class ScratchDatabases:
    """This run's scratch databases on the server ``conninfo`` names, ``prefix<pid>_<random>``:
    each made under a lease this object holds until it drops the database (:meth:`drop`) or
    closes (:meth:`close`, which drops what is left). Usable from several threads."""

    def __init__(self, conninfo: str, prefix: str) -> None:
        self.conninfo = conninfo
        self.prefix = prefix
        self._lock = threading.Lock()
        self._lease: psycopg.Connection[Any] | None = None
        self._owned: set[str] = set()

    def __enter__(self) -> ScratchDatabases:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def owned(self) -> frozenset[str]:
        """The scratch databases this object made and has not dropped."""
        with self._lock:
            return frozenset(self._owned)

    def create(self, suffix: str = "", template: str | None = None) -> str:
        """Makes, marks and answers the name of a new scratch database (a copy of ``template``
        when given). A name already taken, by anyone, is never reused: another is drawn."""
        while True:
            name = f"{self.prefix}{os.getpid()}_{secrets.token_hex(4)}{suffix}"
            if not self._take(name):
                continue
            try:
                made = self._make(name, template)
            except BaseException:
                with contextlib.suppress(psycopg.Error):
                    self._give_up(name)
                raise
            if made:
                return name
            self._give_up(name)

    def drop(self, name: str) -> None:
        """Drops scratch database ``name``, made by this object, then lets its lease go."""
        with self._lock:
            if name not in self._owned:
                raise ValueError(f"{name} is not a scratch database of this run")
        with _connect(self.conninfo, "drop") as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        # Dropped: a lease that cannot be given back went with its connection.
        with contextlib.suppress(psycopg.OperationalError):
            self._give_up(name)

    def close(self) -> list[str]:
        """Drops every scratch database this object still has, closes the lease; answers the
        ones it could not drop (they stay marked, for a later run's :func:`drop_orphans`)."""
        left = []
        for name in sorted(self.owned):
            try:
                self.drop(name)
            except psycopg.Error as exc:
                logger.warning("could not drop scratch database %s: %s", name, exc)
                left.append(name)
        with self._lock:
            if self._lease is not None:
                self._lease.close()
                self._lease = None
        return left

    def _make(self, name: str, template: str | None) -> bool:
        """Creates and marks ``name``; False when the name is taken (nothing was made)."""
        create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            create += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        mark = sql.SQL("COMMENT ON DATABASE {} IS {}").format(
            sql.Identifier(name), sql.Literal(marker(name))
        )
        made: psycopg.Cursor[Any] | None = None
        with _connect(self.conninfo, "create") as conn:
            try:
                # Both statements reach the server before the (slow) CREATE ends: a run killed
                # meanwhile still leaves its database marked, for the next run to drop. With
                # no Sync between them, the mark runs only if the CREATE succeeded (it commits
                # at once), so a database someone else made is never marked.
                with conn.pipeline():
                    made = conn.execute(create)
                    conn.execute(mark)
            except psycopg.errors.DuplicateDatabase:
                return False
            except BaseException:
                if made is not None and made.pgresult is not None:
                    # Made by this run, so this run drops it: unmarked, no later run would.
                    with contextlib.suppress(psycopg.Error):
                        conn.execute(
                            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                                sql.Identifier(name)
                            )
                        )
                raise
        return True

    def _take(self, name: str) -> bool:
        """Takes the lease of ``name``; False if another session has it (another run drew the
        same name, or a cleanup is looking at that name)."""
        with self._lock:
            if self._lease_call("SELECT pg_try_advisory_lock(%s)", name):
                self._owned.add(name)
                return True
            return False

    def _give_up(self, name: str) -> None:
        with self._lock:
            self._owned.discard(name)
            self._lease_call("SELECT pg_advisory_unlock(%s)", name)

    def _lease_call(self, query: str, name: str) -> bool:
        """Runs ``query`` on the lease connection with ``name``'s key; once more on a new one
        if the server lost it (a terminated backend, a restart): every lease held then has
        gone, and is taken again first, or this run's databases would go to the next
        cleanup. Called under ``_lock``."""
        if self._lease is not None:
            try:
                return _first(self._lease, query, name)
            except psycopg.OperationalError:
                logger.warning("the scratch databases' lease connection was lost; renewing")
                with contextlib.suppress(psycopg.Error):
                    self._lease.close()
                self._lease = None
                renew = True
        else:
            renew = False
        lease = _connect(self.conninfo, "lease")
        try:
            # An idle_session_timeout on the server would end the lease in the middle of a run.
            if lease.info.server_version >= 140000:
                lease.execute("SET idle_session_timeout = 0")
            if renew:
                for owned in sorted(self._owned - {name}):
                    if not _first(lease, "SELECT pg_try_advisory_lock(%s)", owned):
                        logger.warning("scratch database %s lost its lease meanwhile", owned)
            answer = _first(lease, query, name)
        except BaseException:
            lease.close()
            raise
        self._lease = lease
        return answer


def _first(conn: psycopg.Connection[Any], query: str, name: str) -> bool:
    row = conn.execute(query, [lease_key(name)]).fetchone()
    return bool(row and row[0])
