"""Extra built-in tasks that talk to the outside world: ``send_email`` (SMTP), ``http_request``
(a webhook call), and ``file_digest`` / ``file_gzip`` (confined to one folder).

Nothing here runs at import. :func:`contrib_tasks` builds the tasks as closures over a
:class:`ContribSettings`, read from the environment once at the entry point::

    from notifyq.builtins import worker_registry
    from notifyq.contrib import ContribSettings

    registry = worker_registry(contrib=ContribSettings.load())

Every handler validates its payload with a pydantic model (the ``*Payload`` classes below); a bad
payload fails the job at once with :class:`~notifyq.errors.PermanentFailure` naming the field.
A failure that may pass (a server answering 4xx over SMTP or 5xx over HTTP, a timeout, a refused
connection) raises :class:`TransientFailure` and the job is retried with backoff; one that will
not (a refused recipient, an HTTP 404, a path outside the root, a text that cannot be encoded)
raises ``PermanentFailure``, and so does any ValueError, LookupError or TypeError that escapes a
handler, since the same payload would raise it again at every attempt.

Safe by default: ``http_request`` reaches only public addresses, on every hop, unless
NOTIFYQ_HTTP_ALLOW lists more (:mod:`notifyq.contrib.egress`), and sends the payload's secrets to no
other origin; ``send_email`` never logs in without TLS unless told; the file tasks refuse a
file with several hard links.

One module per concern: :mod:`~notifyq.contrib.settings` (:class:`ContribSettings`),
:mod:`~notifyq.contrib.email`, :mod:`~notifyq.contrib.http` with the address check of
:mod:`~notifyq.contrib.egress`, and :mod:`~notifyq.contrib.files`; this package's names are the
ones in ``__all__``.
"""

from __future__ import annotations

from notifyq.contrib._shared import TransientFailure
from notifyq.contrib.email import EmailPayload, email_handler
from notifyq.contrib.files import FileDigestPayload, FileGzipPayload, digest_handler, gzip_handler
from notifyq.contrib.http import HttpRequestPayload, http_handler
from notifyq.contrib.settings import ContribSettings
from notifyq.tasks import Task, make_task

__all__ = [
    "ContribSettings",
    "EmailPayload",
    "FileDigestPayload",
    "FileGzipPayload",
    "HttpRequestPayload",
    "TransientFailure",
    "contrib_tasks",
]

#: Seconds a task may run past its own network timeout before the worker cancels it: our own
#: deadline fires first, so the worker's cancellation (which abandons a thread) is a last resort.
TIMEOUT_MARGIN = 5.0


def contrib_tasks(settings: ContribSettings) -> list[Task]:
    """The contrib tasks (``send_email``, ``http_request``, ``file_digest``, ``file_gzip``),
    bound to ``settings``."""
    return [
        make_task(
            email_handler(settings),
            "send_email",
            max_attempts=5,
            timeout=settings.smtp_timeout + TIMEOUT_MARGIN,
        ),
        make_task(
            http_handler(settings),
            "http_request",
            max_attempts=5,
            timeout=settings.http_timeout + TIMEOUT_MARGIN,
        ),
        make_task(digest_handler(settings), "file_digest"),
        make_task(gzip_handler(settings), "file_gzip"),
    ]
