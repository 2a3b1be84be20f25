"""uvicorn's httptools protocol, guarded against what a client can make a server hold: a head
that never ends or is too large, and a head or a body that trickles in. Imported only by
:func:`notifyq.guards.guarded_protocol` when a server starts (it imports uvicorn)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class GuardedProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that measures each request's head twice: as read (to cut a head
    that never ends, before the parser buffers it) and once parsed (to refuse a complete
    head over the limit that came in one read); and that times each head and body."""

    #: The longest head, and the seconds a head and a body may take (set by
    #: :func:`notifyq.guards.guarded_protocol` on a subclass of its own).
    limit = 16_384
    head_timeout = 10.0
    body_timeout = 60.0
    _in_head = True
    _read = 0
    _refused = False
    _in_body = False
    _timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # A connection that never sends a byte holds a slot too.
        self._time(self.head_timeout, self._head_too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._untime()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            if self._timer is None:
                self._time(self.head_timeout, self._head_too_slow)  # a kept-alive request
            # A read that also holds the start of the body is over-counted, so this
            # count decides only when the head is still unfinished after it.
            self._read += len(data)
        super().data_received(data)
        over = self._in_head and self._read > self.limit
        if over and not self._refused and not self.transport.is_closing():
            self._refuse()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._in_body = True
        self._time(self.body_timeout, self._body_too_slow)
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
        self._untime()
        self._in_body = False
        if self._refused:
            return
        self._in_head = True
        self._read = 0
        super().on_message_complete()

    def handle_websocket_upgrade(self) -> None:
        # The connection becomes another protocol's: its timers must not close it later.
        self._untime()
        super().handle_websocket_upgrade()

    def _time(self, seconds: float, then: Callable[[], None]) -> None:
        self._untime()
        self._timer = self.loop.call_later(seconds, then)

    def _untime(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_too_slow(self) -> None:
        self._timer = None
        if self._in_head and not self.transport.is_closing():
            self._close_slow("request head", 408, "Request Timeout", self.head_timeout)

    def _body_too_slow(self) -> None:
        self._timer = None
        if self._in_body and not self.transport.is_closing():
            # The app may be reading the body already: it sees the client go away.
            self._close_slow("request body", None, "", self.body_timeout)

    def _close_slow(self, what: str, status: int | None, reason: str, limit: float) -> None:
        self._refused = True
        client = f"{self.client[0]}:{self.client[1]} " if self.client else ""
        self.logger.warning("%s%s not received within %gs: connection closed", client,
                            what, limit)  # fmt: skip
        if status is not None:
            body = json.dumps({"detail": f"{what} not received within {limit:g} s"}).encode()
            self.transport.write(
                b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n"
                % (status, reason.encode(), len(body))
                + body
            )
        self.transport.close()

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
