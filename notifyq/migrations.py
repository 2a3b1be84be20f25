"""``notifyq migrate``: brings the database schema up to date.

Each numbered file of ``sql/`` runs once, in its own transaction, and is recorded with its
checksum in ``notifyq.migrations``. Each of those transactions takes a transaction-level
advisory lock and looks again at what is applied, so two processes starting at once apply each
file exactly once; no lock outlives its transaction, so it works the same through a
transaction-mode pooler (PgBouncer), where a session's lock would stay behind on a server
connection that the next client gets. Migrations connect as every
connection does (:func:`notifyq.db.connect`), with a search_path of ``pg_catalog`` only, so a
migration names the schema of everything it creates or calls.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import psycopg

from notifyq.db import connect, first_line
from notifyq.errors import MigrationError
from notifyq.queries import Migration, load_migrations
from notifyq.settings import Settings

logger = logging.getLogger(__name__)

#: Advisory lock key held while migrating ("nq" + 1).
MIGRATION_LOCK = 0x6E71_0001
MIN_SERVER_VERSION = 130000

_BOOTSTRAP = """
CREATE SCHEMA IF NOT EXISTS notifyq;
CREATE TABLE IF NOT EXISTS notifyq.migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""

#: Settings that SQL-only clients depend on, copied into notifyq.settings when set explicitly.
_DATABASE_SETTINGS = ("default_task", "max_attempts")


async def migrate(
    settings: Settings, *, progress: Callable[[str], None] | None = None
) -> list[Migration]:
    """Applies the migrations that are missing and answers the ones it applied."""
    say = progress or (lambda message: logger.info("%s", message))
    # No statement timeout: a migration may rewrite a large table.
    conn = await connect(settings, "notifyq-migrate", statement_timeout=0)
    async with conn:
        if conn.info.server_version < MIN_SERVER_VERSION:
            raise MigrationError(
                f"notifyq needs PostgreSQL 13 or newer; this server is {conn.info.server_version}"
            )
        applied = await _apply_missing(conn, load_migrations(), say)
        async with _locked(conn):
            await _store_settings(conn, settings)
    return applied


async def _apply_missing(
    conn: psycopg.AsyncConnection, migrations: list[Migration], say: Callable[[str], None]
) -> list[Migration]:
    async with _locked(conn):
        await conn.execute(_BOOTSTRAP)
        _check_applied(await _applied(conn), migrations)
    applied = []
    for migration in migrations:
        async with _locked(conn):
            if migration.version in await _applied(conn):
                continue  # there before, or applied by another process meanwhile
            say(f"applying migration {migration.version:03d}_{migration.name}")
            try:
                await conn.execute(migration.sql.encode())
                await conn.execute(
                    "INSERT INTO notifyq.migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    [migration.version, migration.name, migration.checksum],
                )
            except psycopg.Error as exc:
                raise MigrationError(
                    f"migration {migration.version:03d}_{migration.name}.sql failed: "
                    f"{first_line(exc)}"
                ) from exc
        applied.append(migration)
    return applied


@contextlib.asynccontextmanager
async def _locked(conn: psycopg.AsyncConnection) -> AsyncIterator[None]:
    """A transaction that holds the migration lock. No statement timeout in it (a migration
    may rewrite a large table): SET LOCAL, which a pooler that drops startup options keeps."""
    async with conn.transaction():
        await conn.execute("SET LOCAL statement_timeout = 0")
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", [MIGRATION_LOCK])
        yield


async def _applied(conn: psycopg.AsyncConnection) -> dict[int, str]:
    cursor = await conn.execute("SELECT version, checksum FROM notifyq.migrations")
    return {version: checksum for version, checksum in await cursor.fetchall()}


def _check_applied(done: dict[int, str], migrations: list[Migration]) -> None:
    known = {migration.version for migration in migrations}
    unknown = sorted(set(done) - known)
    if unknown:
        raise MigrationError(
            f"the database has migrations {unknown} that this notifyq does not know: "
            "it was migrated by a newer version; upgrade notifyq"
        )
    for migration in migrations:
        if migration.version in done and done[migration.version] != migration.checksum:
            raise MigrationError(
                f"migration {migration.version:03d}_{migration.name}.sql changed after it "
                "was applied to this database (a development version of notifyq?); "
                "start afresh with `notifyq dev --reset` (embedded) or a new database"
            )


async def _store_settings(conn: psycopg.AsyncConnection, settings: Settings) -> None:
    for key in _DATABASE_SETTINGS:
        if key in settings.model_fields_set:
            await conn.execute(
                "INSERT INTO notifyq.settings (key, value) VALUES (%s, %s) "
                "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                [key, str(getattr(settings, key))],
            )


def latest_version() -> int:
    """The newest migration this notifyq ships."""
    return max(migration.version for migration in load_migrations())


async def check_schema(settings: Settings) -> None:
    """Raises MigrationError, saying what to run, unless the database's schema is the one this
    notifyq needs: for processes that do not migrate (NOTIFYQ_AUTO_MIGRATE=false), such as a
    role allowed only to read and write rows."""
    conn = await connect(settings, "notifyq-check")
    async with conn:
        try:
            cursor = await conn.execute("SELECT max(version) FROM notifyq.migrations")
            row = await cursor.fetchone()
        except psycopg.Error:
            row = None
    version = row[0] if row else None
    latest = latest_version()
    if version != latest:
        found = "no notifyq schema" if version is None else f"schema version {version}"
        raise MigrationError(
            f"the database has {found}, this notifyq needs version {latest}, and "
            "NOTIFYQ_AUTO_MIGRATE is off: run `notifyq migrate` as the schema's owner first"
        )
