"""The worker's own metrics endpoint (``notifyq worker --metrics-port``): Prometheus's text format
over a small threaded HTTP server, behind the API's token when one is set.

The API serves its metrics at ``GET /metrics`` behind its middleware; a standalone worker has no
API, so this is its endpoint. It obeys the same rule as the API: an address others can reach
needs NOTIFYQ_API_TOKEN (sent as ``Authorization: Bearer ...``, which Prometheus's scrape
config sets with ``authorization: {credentials: ...}``), unless
NOTIFYQ_ALLOW_UNAUTHENTICATED=true.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from notifyq.errors import ConfigurationError
from notifyq.guards import is_loopback, usable_token
from notifyq.metrics import Metrics
from notifyq.settings import Settings

__all__ = ["MetricsServer", "serve_metrics"]

StartResponse = Callable[..., Any]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape would drown the worker's log


class MetricsServer:
    """A running metrics endpoint; :meth:`close` stops it."""

    def __init__(self, server: _Server) -> None:
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="notifyq-metrics", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve_metrics(metrics: Metrics, settings: Settings, host: str, port: int) -> MetricsServer:
    """Serves ``metrics`` on ``host:port`` from now on. Raises ConfigurationError, saying what
    to do, for an address others can reach without a token; OSError when the port is taken."""
    token = usable_token(settings)
    if token is None and not is_loopback(host) and not settings.allow_unauthenticated:
        raise ConfigurationError(
            f"refusing to serve metrics on {host} without a token: anyone who reaches it would "
            "read the queues' and tasks' names and counts; set NOTIFYQ_API_TOKEN (Prometheus "
            "sends it with `authorization: {credentials: ...}`), bind 127.0.0.1, or set "
            "NOTIFYQ_ALLOW_UNAUTHENTICATED=true"
        )
    app = make_wsgi_app(metrics.registry)
    expected = f"Bearer {token}".encode() if token is not None else None

    def guarded(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if expected is not None:
            given = str(environ.get("HTTP_AUTHORIZATION", "")).encode()
            if not hmac.compare_digest(given, expected):
                start_response(
                    "401 Unauthorized",
                    [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")],
                )
                return [b"a bearer token is required (NOTIFYQ_API_TOKEN)\n"]
        answer: Iterable[bytes] = app(environ, start_response)
        return answer

    server = make_server(host, port, guarded, server_class=_Server, handler_class=_QuietHandler)
    return MetricsServer(server)
