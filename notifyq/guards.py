"""The checks that come before an API server starts, importable without a web framework.

:func:`usable_token` refuses a blank ``NOTIFYQ_API_TOKEN``; :func:`bind_refusal` says why
``serve``/``dev`` must not bind an address others can reach without a token, and
:func:`cors_refusal` why they must not answer every origin without one; and
:func:`uvicorn_http_options` bounds what a client may hold at the connection, before any
middleware runs (so before any token is checked): the bytes of a request's head (uvicorn's
httptools parser buffers a header of any size), the time it may take to send its head and its
body (a client that trickles a byte now and then holds a connection for ever otherwise), and the
number of connections. The guards that check
each request (the token, the Host, the origin) are ASGI middleware in
:mod:`notifyq.api.middleware`.
"""

from __future__ import annotations

import asyncio
import ipaddress
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


# -- what a client may hold: a request's head, its time, connections --------------------------


def cors_refusal(settings: Settings) -> str | None:
    """Why the API must not start with these settings, or None: without a token, a wildcard
    CORS origin lets any web page its visitor opens read the whole API by GET."""
    if "*" in settings.cors_origins and usable_token(settings) is None:
        return (
            "refusing NOTIFYQ_CORS_ORIGINS=* without NOTIFYQ_API_TOKEN: any web site its "
            "visitors open could read every job through their browser; list the origins that "
            "may call the API, or set a token"
        )
    return None


def uvicorn_http_options(settings: Settings) -> dict[str, Any]:
    """``uvicorn.Config`` options that bound what one client may hold: a request's line and
    headers capped at NOTIFYQ_MAX_HEADER_BYTES, sent within NOTIFYQ_HEAD_TIMEOUT, its body
    within NOTIFYQ_BODY_TIMEOUT (httptools, which buffers a header of any size, behind a
    protocol that counts and times; h11's own cap when httptools is not installed, without the
    timeouts), and at most NOTIFYQ_MAX_CONNECTIONS connections (uvicorn answers 503 past
    them)."""
    bounded: dict[str, Any] = {"limit_concurrency": settings.max_connections}
    try:
        import httptools  # noqa: F401
    except ImportError:
        logger.warning(
            "httptools is not installed: requests are served by h11, without the head and "
            "body timeouts (a slow client holds its connection until NOTIFYQ_MAX_CONNECTIONS)"
        )
        return bounded | {"http": "h11", "h11_max_incomplete_event_size": settings.max_header_bytes}
    protocol = guarded_protocol(
        settings.max_header_bytes,
        head_timeout=settings.head_timeout,
        body_timeout=settings.body_timeout,
    )
    return bounded | {"http": protocol}


def guarded_protocol(
    max_header_bytes: int, *, head_timeout: float, body_timeout: float
) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, answering 431 and closing the connection once a request's
    head (request line and headers) passes ``max_header_bytes``, so that a huge header costs
    at most the limit and one read, not its size; answering 408 and closing it when a head
    is not all in ``head_timeout`` seconds after the connection opened (or the request's
    first byte, on a kept-alive connection); and closing it when a body is not all in
    ``body_timeout`` seconds after its head."""
    from notifyq._guarded_http import GuardedProtocol

    settings = {
        "limit": max_header_bytes,
        "head_timeout": head_timeout,
        "body_timeout": body_timeout,
    }
    return type("GuardedProtocol", (GuardedProtocol,), settings)
