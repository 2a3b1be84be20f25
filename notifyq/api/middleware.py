"""The raw ASGI middleware of the API: what a request may cost, and who may call, decided
before the app reads a byte of the body.

:class:`BodyLimit` answers 413 to a body over the size limit. With ``NOTIFYQ_API_TOKEN`` set,
:class:`TokenGuard` answers 401/403 to every request without the right bearer token (but the
open paths and, when CORS is on, preflights). Without a token the API is still reachable from
any browser on the machine, so :class:`LocalGuard` refuses what a web page could make a browser
send: a ``Host`` that is not a loopback name or an allowed host (DNS rebinding, 400), and a
state-changing request from another origin (CSRF, 403). With a token neither applies: a page
cannot make a browser attach the bearer header, and the token is not something a rebound page
can read.

They are raw ASGI middleware that scan the headers once, as POST /jobs is the hottest route.
What the command line checks before it starts a server (the bind, the size of a request's head)
lives in :mod:`notifyq.guards`, which imports no web framework.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable, Collection, Iterable, MutableMapping
from typing import Any

from starlette.responses import JSONResponse

from notifyq.guards import usable_token
from notifyq.settings import Settings
from notifyq.tracing import Tracing

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


# -- body size ----------------------------------------------------------------------------


class TraceContext:
    """Makes an incoming request's W3C trace context (``traceparent``, ``tracestate``) current
    while the app serves it, so that the jobs it enqueues continue the caller's trace. Installed
    only with tracing on; under an instrumented server (whose span is then current) it does
    nothing."""

    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        found = {}
        for name, value in scope["headers"]:
            if name in _TRACE_HEADERS:
                found[_TRACE_HEADERS[name]] = value.decode("latin-1")
        if not found:
            await self.app(scope, receive, send)
            return
        with self.tracing.incoming(found):
            await self.app(scope, receive, send)


#: The headers of a W3C trace context, as ASGI gives them, and their carrier keys.
_TRACE_HEADERS = {b"traceparent": "traceparent", b"tracestate": "tracestate"}


class BodyLimit:
    """Answers 413 to a request body over ``max_bytes``, before the app reads any of it when
    Content-Length says so, and by counting when the body is streamed without one."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is not None and length > self.max_bytes:
            await self._too_large(send)
            return
        if length is not None:
            await self.app(scope, receive, send)
            return
        # No Content-Length (chunked): read the body here, counting, then replay it.
        chunks: list[Message] = []
        size = 0
        while True:
            message = await receive()
            chunks.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._too_large(send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return chunks.pop(0) if chunks else await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        response = JSONResponse(
            {"detail": f"request body is larger than the limit of {self.max_bytes} bytes"},
            status_code=413,
        )
        await send({"type": "http.response.start", "status": 413, "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


# -- who may call ---------------------------------------------------------------------


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
