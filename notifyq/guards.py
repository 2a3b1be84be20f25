"""The HTTP guards: who may call the API, and what a request may cost before it is refused.

With ``NOTIFYQ_API_TOKEN`` set, :class:`TokenGuard` answers 401/403 to every request without the
right bearer token (but the open paths and, when CORS is on, preflights). Without a token the
API is still reachable from any browser on the machine, so :class:`LocalGuard` refuses what a
web page could make a browser send: a ``Host`` that is not a loopback name or an allowed host
(DNS rebinding, 400), and a state-changing request from another origin (CSRF, 403). With a
token neither applies: a page cannot make a browser attach the bearer header, and the token is
not something a rebound page can read.

Both are raw ASGI middleware that scan the headers once, as POST /jobs is the hottest route.
:func:`uvicorn_http_options` caps the bytes of a request's head at the connection, before any
of this runs (uvicorn's httptools parser buffers a header of any size).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Collection, Iterable, MutableMapping
from typing import Any

from notifyq.errors import ConfigurationError
from notifyq.settings import Settings

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Host names that always reach only this machine.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
#: Methods a cross-site page may not use without a token: every one that changes state.
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: Where TokenGuard records, for the open paths, whether the request carried the right token.
AUTHENTICATED = "notifyq.authenticated"


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


def install(app: Any, settings: Settings, open_paths: Collection[str]) -> None:
    """Adds the guard that ``settings`` call for to ``app`` (a Starlette app). Call it after
    every other middleware is added, so that it runs first."""
    token = usable_token(settings)
    if token is None:
        app.add_middleware(
            LocalGuard, allowed_hosts=settings.allowed_hosts, trusted=settings.cors_origins
        )
    else:
        app.add_middleware(
            TokenGuard,
            token=token,
            open_paths=frozenset(open_paths),
            preflights=bool(settings.cors_origins),
        )


def authenticated(scope: Scope) -> bool:
    """Whether TokenGuard saw the right token on this request to an open path."""
    return bool(scope.get(AUTHENTICATED, False))


class TokenGuard:
    """With NOTIFYQ_API_TOKEN set, answers 401 (no token) or 403 (wrong token) to every request
    but those of ``open_paths`` and, with ``preflights``, CORS preflights (which CORSMiddleware
    answers itself; the actual request still needs the token). It runs before the app reads the
    body. The comparison takes constant time."""

    def __init__(
        self, app: ASGIApp, token: str, open_paths: frozenset[str], preflights: bool = False
    ) -> None:
        self.app = app
        self.expected = token.encode()
        self.open_paths = open_paths
        self.preflights = preflights

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        if scope["path"] in self.open_paths:
            scope[AUTHENTICATED] = self._verdict(headers) == 200
            await self.app(scope, receive, send)
        elif self.preflights and scope["method"] == "OPTIONS" and _is_preflight(headers):
            await self.app(scope, receive, send)
        else:
            verdict = self._verdict(headers)
            if verdict == 200:
                await self.app(scope, receive, send)
            elif verdict == 401:
                await reject(send, 401, "missing Authorization: Bearer <token> header", bearer=True)
            else:
                await reject(send, 403, "wrong API token", bearer=True)

    def _verdict(self, headers: Iterable[tuple[bytes, bytes]]) -> int:
        """200 for the right token, 401 for none, 403 for a wrong one."""
        header = next((v for k, v in headers if k == b"authorization"), None)
        scheme, _, token = (header or b"").partition(b" ")
        if header is None or scheme.lower() != b"bearer":
            return 401
        return 200 if secrets.compare_digest(token.strip(), self.expected) else 403


def _is_preflight(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    names = {name for name, _ in headers}
    return b"origin" in names and b"access-control-request-method" in names


class LocalGuard:
    """Without a token: answers 400 to a request whose Host is not a loopback name or one of
    ``allowed_hosts``, and 403 to a POST, PUT, PATCH or DELETE that a browser sent from another
    origin (by its Origin or Sec-Fetch-Site header), unless that origin is ``trusted`` (the
    CORS origins, which the operator named). Requests without those headers (curl, scripts)
    are not from a page, and pass."""

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str], trusted: Iterable[str]) -> None:
        self.app = app
        self.hosts = frozenset(
            _host_name(name.encode()) for name in (*LOOPBACK_HOSTS, *allowed_hosts)
        )
        self.trusted = frozenset(origin.rstrip("/").encode() for origin in trusted)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = origin = site = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"sec-fetch-site":
                site = value
        if host is None or _host_name(host) not in self.hosts:
            await reject(send, 400, _host_refusal(host))
        elif scope["method"] in UNSAFE_METHODS and not self._same_origin(host, origin, site):
            await reject(
                send,
                403,
                "cross-site request refused: without NOTIFYQ_API_TOKEN, POST, PUT, PATCH and "
                "DELETE are accepted only from this API's own origin or NOTIFYQ_CORS_ORIGINS",
            )
        else:
            await self.app(scope, receive, send)

    def _same_origin(self, host: bytes, origin: bytes | None, site: bytes | None) -> bool:
        # Sec-Fetch-Site is set by the browser and cannot be forged by a page. same-site is
        # refused too: it covers every other port of localhost and sibling subdomains, where
        # other (less careful) local servers and sites live.
        if site is not None:
            if site in (b"same-origin", b"none"):
                return True
            return origin is not None and origin in self.trusted
        if origin is None or origin in self.trusted:
            return True
        # Older browsers send only Origin. The scheme is not compared: behind a proxy that
        # ends TLS the app sees http while the page was https.
        _, separator, authority = origin.partition(b"://")
        return bool(separator) and authority.lower() == host.lower()


def _host_name(host: bytes) -> bytes:
    """A Host header's name, lower-cased, without its port or a final dot; a bare IPv6
    address gets its brackets."""
    host = host.strip().lower()
    if host.startswith(b"["):
        return host.partition(b"]")[0] + b"]"
    if host.count(b":") > 1:
        return b"[" + host + b"]"
    return host.partition(b":")[0].rstrip(b".")


def _host_refusal(host: bytes | None) -> str:
    shown = "no Host header" if host is None else f"Host {host[:100].decode('latin-1')!r}"
    return (
        f"{shown} is not allowed: without NOTIFYQ_API_TOKEN the API answers only to "
        f"{', '.join(LOOPBACK_HOSTS)} and the names in NOTIFYQ_ALLOWED_HOSTS"
    )


async def reject(send: Send, status_code: int, detail: str, *, bearer: bool = False) -> None:
    """Answers ``{"detail": detail}`` with ``status_code``, without calling the app."""
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if bearer:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


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
