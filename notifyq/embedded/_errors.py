"""How the embedded server reports to its user: the error it raises, the callback that receives a
line per step, the hint that ends the line saying which server runs, and the advice its
configuration errors end with."""

from __future__ import annotations

from collections.abc import Callable

from notifyq.errors import NotifyQError

#: Called with one human-readable line per step (starting, joining, stopping, ...).
ProgressCallback = Callable[[str], None]


class EmbeddedPostgresError(NotifyQError):
    """Raised when the embedded PostgreSQL cannot be started or stopped, or cannot be reset
    because other processes still use it."""


#: Ends the one line that says which server was started or joined.
USE_YOUR_OWN = "export DATABASE_URL to use your own server"

SET_DATABASE_URL = (
    "set DATABASE_URL to a PostgreSQL server instead, for example "
    "DATABASE_URL=postgresql://user:password@localhost:5432/notifyq"
)
