"""What a long-running command says when it cannot go on: one line, or a traceback for a bug."""

from __future__ import annotations

import psycopg

from notifyq.db import first_line
from notifyq.errors import NotifyQError


class ProcessError(NotifyQError):
    """Raised when a process cannot start what it was asked to (a metrics port already taken,
    say); the message says why, in one line."""


def one_line(exc: BaseException) -> str | None:
    """What to tell the user about ``exc`` (looking inside exception groups), or None for a
    bug, which keeps its traceback."""
    if isinstance(exc, NotifyQError):
        return str(exc)
    if isinstance(exc, psycopg.Error):  # from a statement outside the store
        return f"database error: {first_line(exc)}"
    for inner in getattr(exc, "exceptions", ()):
        found = one_line(inner)
        if found is not None:
            return found
    return None
