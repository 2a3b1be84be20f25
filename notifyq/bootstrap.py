"""The database of this process, chosen once, at its entry point.

The rule: a process uses the database of ``DATABASE_URL`` (or ``--database-url``). Only
``notifyq dev`` starts, or joins, an embedded PostgreSQL (:mod:`notifyq.embedded`) when it is
unset (:func:`dev_database`); every other entry point (the other commands,
:func:`notifyq.api.create_app`, :class:`notifyq.Queue`) refuses in one line
(:func:`require_database`), so that a forgotten variable in production never gives a worker or a
producer a second, empty job store of its own. The refusal itself is
:func:`notifyq.db.database_url`, which every connection checks too: this module decides, per
entry point, whether it applies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from notifyq.db import database_url
from notifyq.errors import ConfigurationError
from notifyq.settings import Settings

__all__ = ["DevDatabase", "dev_database", "require_database", "reset_embedded"]


def require_database(settings: Settings) -> Settings:
    """``settings``, once they are known to name a database: for every entry point but
    ``notifyq dev``. Raises :class:`~notifyq.errors.ConfigurationError`, saying how to give
    one, when they do not."""
    database_url(settings)
    return settings


@dataclass(frozen=True)
class DevDatabase:
    """The database of ``notifyq dev``: ``DATABASE_URL``'s, or an embedded server's."""

    #: The settings of the process, naming the database.
    settings: Settings
    #: Lets go of the embedded server (its last user stops it), for a process about to exit
    #: without leaving its ``with`` block; does nothing for ``DATABASE_URL``'s database.
    release: Callable[[], None]


@contextlib.contextmanager
def dev_database(settings: Settings, *, say: Callable[[str], None]) -> Iterator[DevDatabase]:
    """The database of ``notifyq dev`` for as long as the ``with`` block runs: ``settings``
    as they are when they name one; else an embedded PostgreSQL, started (or joined, when
    another notifyq process of this user runs one) and released on exit. ``say`` gets its
    progress, one line at a time.

    An embedded database belongs to this process: its settings always migrate (zero setup,
    even with ``NOTIFYQ_AUTO_MIGRATE`` off)."""
    if settings.database_url:
        yield DevDatabase(settings, release=_nothing)
        return
    from notifyq.embedded import EmbeddedPostgres

    # The server says which one runs, once, when it is started or joined: nothing is said
    # before (the binaries may not be there, another process may already run it).
    server = EmbeddedPostgres(settings.data_dir, on_progress=say)
    with server:
        ready = settings.model_copy(update={"database_url": server.url, "auto_migrate": True})
        yield DevDatabase(ready, release=server.release)


def reset_embedded(settings: Settings, *, say: Callable[[str], None]) -> Path:
    """Deletes the embedded PostgreSQL's data (``notifyq dev --reset``) and answers the folder
    that is gone. Refuses, with ``DATABASE_URL`` set, to touch a database that is not ours."""
    if settings.database_url:
        raise ConfigurationError(
            "--reset deletes the embedded PostgreSQL's data; it does nothing with DATABASE_URL "
            "set (unset it, or drop your database yourself)"
        )
    from notifyq.embedded import EmbeddedPostgres

    return EmbeddedPostgres(settings.data_dir, on_progress=say).reset()


def _nothing() -> None:
    pass
