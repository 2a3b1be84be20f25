"""What the contrib modules share: :class:`TransientFailure`, payload validation with one
readable message, the rule that turns a failure no retry can cure into a permanent one, and the
email address check (used by the settings for NOTIFYQ_SMTP_FROM as well as by ``send_email``)."""

from __future__ import annotations

import contextlib
import email.utils
import logging
from collections.abc import Iterator
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from notifyq.errors import NotifyQError, PermanentFailure

logger = logging.getLogger(__name__)

__all__ = [
    "LINE_BREAKS",
    "TransientFailure",
    "check_address",
    "fails_for_good",
    "has_line_break",
    "validate_payload",
]


P = TypeVar("P", bound=BaseModel)


class TransientFailure(NotifyQError):
    """Raised by a contrib task for a failure that may pass by itself: an SMTP 4xx answer, an
    HTTP 5xx or 429, a timeout, a refused or dropped connection. Like any exception other than
    :class:`~notifyq.errors.PermanentFailure`, the job is retried with backoff."""


def validate_payload(model: type[P], payload: dict[str, Any], task: str) -> P:
    """``payload`` as a ``model``, or a PermanentFailure naming each bad field: the same
    payload would fail the same way at every attempt."""
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            where = ".".join(str(part) for part in error["loc"]) or "payload"
            problems.append(f"{where}: {error['msg'].removeprefix('Value error, ')}")
        raise PermanentFailure(f"{task}: invalid payload: {'; '.join(problems)}") from None


#: Exceptions that the same job would raise again on every attempt: a text that cannot be
#: encoded, an unknown codec, a value of the wrong kind, data nested too deep.
_NEVER_PASSES = (ValueError, LookupError, TypeError, RecursionError)


@contextlib.contextmanager
def fails_for_good(task: str) -> Iterator[None]:
    """Turns an exception that no retry can cure into a PermanentFailure naming it, so such a
    job fails once instead of being retried with backoff until its attempts run out."""
    try:
        yield
    except _NEVER_PASSES as exc:
        # Not expected (each known case has its own message): keep the traceback in the log.
        logger.warning("%s failed for good on an unexpected error", task, exc_info=True)
        raise PermanentFailure(f"{task}: {type(exc).__name__}: {exc}") from exc


#: What str.splitlines() breaks on, and the email package refuses in a header: CR and LF, but
#: also VT, FF, the file/group/record separators, NEL, U+2028 and U+2029.
LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def has_line_break(value: str) -> bool:
    """Whether ``value`` holds a line break (any of :data:`LINE_BREAKS`) or NUL, which would
    let it end an email header and start another."""
    return "\x00" in value or not LINE_BREAKS.isdisjoint(value)


def check_address(value: str) -> str:
    """``value`` if it is one email address (``a@example.com`` or ``Name <a@example.com>``), on
    one line; else ValueError saying what is wrong (a pydantic validator)."""
    if has_line_break(value):
        raise ValueError(
            "an address must not contain a line break (CR, LF, U+2028 and the like) or NUL"
        )
    parsed = email.utils.getaddresses([value])
    if len(parsed) != 1:
        raise ValueError(f"{value!r} is not one email address")
    address = parsed[0][1]
    local, at, domain = address.rpartition("@")
    if not (at and local and domain) or any(c.isspace() for c in address):
        raise ValueError(f"{value!r} is not an email address")
    return value
