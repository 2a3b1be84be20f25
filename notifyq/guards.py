"""The checks that come before an API server starts, importable without a web framework.

:func:`usable_token` refuses a blank ``NOTIFYQ_API_TOKEN``; :func:`bind_refusal` says why
``serve``/``dev`` must not bind an address others can reach without a token; and
:func:`uvicorn_http_options` caps the bytes of a request's head at the connection, before any
middleware runs (uvicorn's httptools parser buffers a header of any size). The guards that check
each request (the token, the Host, the origin) are ASGI middleware in
:mod:`notifyq.api.middleware`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from typing import Any

from notifyq.errors import ConfigurationError
from notifyq.settings import Settings

logger = logging.getLogger(__name__)


def usable_token(settings: Settings) -> str | None:
    """The API token, or None when none is set. A blank one is an error, also when the
    settings were copied past their validation (``model_copy``): it must never mean that an
    empty bearer is accepted."""
    if settings.api_token is None:
        return None
    token = settings.api_token.get_secret_value().strip()
    if not token:
        raise ConfigurationError(
            "NOTIFYQ_API_TOKEN is empty or whitespace: set it to a long random secret, or unset it"
        )
    return token


# -- binding ----------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` reaches only this machine (a name other than localhost may
    resolve to anything, so it does not count)."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def bind_refusal(settings: Settings) -> str | None:
    """Why ``serve``/``dev`` must not start with these settings, or None: a token is required
    to bind an address others can reach, unless NOTIFYQ_ALLOW_UNAUTHENTICATED says otherwise."""
    if is_loopback(settings.host) or usable_token(settings) is not None:
        return None
    if settings.allow_unauthenticated:
        logger.warning(
            "serving %s without NOTIFYQ_API_TOKEN (NOTIFYQ_ALLOW_UNAUTHENTICATED=true): anyone "
            "who reaches it can enqueue, cancel and retry jobs; requests must name a Host in "
            "NOTIFYQ_ALLOWED_HOSTS (or a loopback name)",
            settings.host,
        )
        return None
    return (
        f"refusing to serve on {settings.host} without a token: anyone who reaches it could "
        "enqueue, cancel and retry jobs; set NOTIFYQ_API_TOKEN (e.g. `openssl rand -hex 32`), "
        "bind 127.0.0.1, or set NOTIFYQ_ALLOW_UNAUTHENTICATED=true"
    )


# -- the size of a request's head -------------------------------------------------------


def uvicorn_http_options(max_header_bytes: int) -> dict[str, Any]:
    """``uvicorn.Config`` options that cap a request's line and headers at
    ``max_header_bytes``: httptools (which buffers a header of any size) behind a protocol that
    counts, or h11's own cap when httptools is not installed."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return {"http": "h11", "h11_max_incomplete_event_size": max_header_bytes}
    return {"http": header_capped_protocol(max_header_bytes)}


def header_capped_protocol(max_header_bytes: int) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, answering 431 and closing the connection once a request's
    head (request line and headers) passes ``max_header_bytes``, so that a huge header costs
    at most the limit and one read, not its size."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class HeaderCappedProtocol(HttpToolsProtocol):
        """HttpToolsProtocol that measures each request's head twice: as read (to cut a head
        that never ends, before the parser buffers it) and once parsed (to refuse a complete
        head over the limit that came in one read)."""

        limit = max_header_bytes
        _in_head = True
        _read = 0
        _refused = False

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            if self._in_head:
                # A read that also holds the start of the body is over-counted, so this
                # count decides only when the head is still unfinished after it.
                self._read += len(data)
            super().data_received(data)
            over = self._in_head and self._read > self.limit
            if over and not self._refused and not self.transport.is_closing():
                self._refuse()

        def on_headers_complete(self) -> None:
            self._in_head = False
            if self._refused:
                return  # a request pipelined behind the refused one
            # The head is at most what was read since it began: measured only past the limit.
            if self._read > self.limit and self._head_size() > self.limit:
                self._refuse()
                return
            super().on_headers_complete()

        def _head_size(self) -> int:
            return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)

        def on_body(self, body: bytes) -> None:
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self._refused:
                return
            self._in_head = True
            self._read = 0
            super().on_message_complete()

        def _refuse(self) -> None:
            self._refused = True
            client = f"{self.client[0]}:{self.client[1]} " if self.client else ""
            self.logger.warning("%srequest head over %d bytes: refused", client, self.limit)
            body = json.dumps(
                {"detail": f"request line and headers are larger than {self.limit} bytes"}
            ).encode()
            head = [b"HTTP/1.1 431 Request Header Fields Too Large\r\n"]
            for name, value in self.server_state.default_headers:
                head.append(name + b": " + value + b"\r\n")
            head.append(b"content-type: application/json\r\n")
            head.append(b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body))
            self.transport.write(b"".join(head) + body)
            self.transport.close()

    return HeaderCappedProtocol
