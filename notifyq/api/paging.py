"""Keyset paging: the ``next_cursor`` of a page, and its reading back by the next request.

A page is sorted by a time and the job id (``GET /jobs`` by ``created_at``, ``GET /scheduled``
by ``run_at``); its cursor names the last job of the page by both, and the next page starts
after it. A cursor is opaque to clients: URL-safe base64 of ``time|id``, without padding.
"""

from __future__ import annotations

import base64
from datetime import datetime
from uuid import UUID

from notifyq.errors import InvalidJob

__all__ = ["decode_cursor", "encode_cursor"]


def encode_cursor(at: datetime, job_id: UUID) -> str:
    """The cursor of a page whose last job is ``job_id``, sorted at ``at``."""
    raw = f"{at.isoformat()}|{job_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, *, route: str) -> tuple[datetime, UUID]:
    """The time and id the next page of ``route`` (say ``GET /jobs``) starts after. Raises
    :class:`~notifyq.errors.InvalidJob` (a 422) for a cursor that is not one ``route`` gave
    out."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, job_id = raw.split("|")
        return datetime.fromisoformat(at), UUID(job_id)
    except (ValueError, UnicodeDecodeError):
        raise InvalidJob(f"cursor is not one that {route} gave out") from None
