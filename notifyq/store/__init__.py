"""The store: the one place that runs notifyq's SQL, one method per named query of
``sql/queries.sql``.

It works on a connection pool, or on a connection the caller passes (to enqueue inside the
caller's own transaction). Rows come typed from psycopg row factories; every driver error
leaves as one of notifyq's (:mod:`notifyq.errors`): a lost connection as
:class:`~notifyq.errors.DatabaseUnavailable`, the rest as a
:class:`~notifyq.errors.DatabaseError`. :class:`SyncStore` runs a producer's statements (enqueue,
read, watch) for blocking code.
"""

from __future__ import annotations

from notifyq.store._managing import BulkDone, JobFilter, Managing, Searched
from notifyq.store._runner import WRITE_CHUNK
from notifyq.store._scheduling import Scheduling
from notifyq.store._submit import ENQUEUE_CHUNK, Submitting
from notifyq.store._sync import SyncStore
from notifyq.store._upkeep import Upkeep
from notifyq.store._working import Working

__all__ = [
    "ENQUEUE_CHUNK",
    "WRITE_CHUNK",
    "BulkDone",
    "JobFilter",
    "Searched",
    "Store",
    "SyncStore",
]


class Store(Submitting, Managing, Scheduling, Working, Upkeep):
    """Runs notifyq's queries against a pool: submitting jobs, reading and managing them, and
    the statements a worker runs. Each concern is its own base class."""
