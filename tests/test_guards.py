"""The HTTP guards against a real PostgreSQL: the contract's "Safe by default" lines on tokens,
Host names and cross-site requests, /health's details, CORS preflights, and the cap on a
request's head (a real `notifyq serve` on a loopback port, fed by a raw socket).

The tests of this that need no database are in tests/unit/test_guards.py.
"""

from __future__ import annotations

import contextlib
import select
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from pydantic import SecretStr

from notifyq.api import create_app
from notifyq.errors import ConfigurationError
from notifyq.settings import Settings
from tests.helpers import ROOT, insert_in_state, notifyq_env, processes
from tests.unit.test_guards import TOKEN

RIGHT = {"authorization": f"Bearer {TOKEN}"}
EVIL = "https://evil.example"


@contextlib.asynccontextmanager
async def api(
    settings: Settings, base_url: str = "http://localhost:8000", **overrides: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """The app (no worker unless asked) with its lifespan, and a client sending ``base_url``'s
    Host."""
    app = create_app(settings.model_copy(update={"run_worker": False, **overrides}))
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url=base_url) as client,
    ):
        yield client


async def paused(conn: psycopg.AsyncConnection[Any], queue: str) -> bool:
    cursor = await conn.execute("SELECT paused FROM notifyq.queues WHERE name = %s", [queue])
    row = await cursor.fetchone()
    return bool(row and row[0])


# -- the token ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", "   "])
def test_the_app_refuses_a_blank_token_that_skipped_validation(
    settings: Settings, value: str
) -> None:
    # model_copy does not validate: the app checks again rather than accept an empty bearer.
    with pytest.raises(ConfigurationError, match="NOTIFYQ_API_TOKEN"):
        create_app(settings.model_copy(update={"api_token": SecretStr(value)}))


# -- binding --------------------------------------------------------------------------------


# -- Host, without a token (DNS rebinding) --------------------------------------------------


LOOPBACK = ["localhost", "localhost:8000", "LOCALHOST:1", "localhost.", "127.0.0.1"]
LOOPBACK += ["127.0.0.1:80", "[::1]", "[::1]:8000"]
FOREIGN = ["evil.example", "evil.example:8000", "localhost.evil.example", "127.0.0.1.nip.io"]
FOREIGN += ["10.0.0.5:8000", "[::2]", "", "app.localhost"]


async def test_without_a_token_only_loopback_hosts_are_answered(settings: Settings) -> None:
    async with api(settings) as client:
        for host in FOREIGN:
            for method, path in (("GET", "/queues"), ("GET", "/health"), ("POST", "/jobs")):
                answer = await client.request(
                    method, path, headers={"host": host}, json={"payload": {}}
                )
                assert answer.status_code == 400, (host, method, path, answer.text)
                assert "NOTIFYQ_ALLOWED_HOSTS" in answer.json()["detail"]
        for host in LOOPBACK:
            answer = await client.get("/queues", headers={"host": host})
            assert answer.status_code == 200, (host, answer.text)


async def test_allowed_hosts_are_answered_and_others_refused(settings: Settings) -> None:
    async with api(settings, allowed_hosts=["queue.internal", "10.0.0.5", "::5"]) as client:
        for host in ("queue.internal", "Queue.Internal:8000", "10.0.0.5:8000", "[::5]:1"):
            answer = await client.post("/jobs", headers={"host": host}, json={"payload": {}})
            assert answer.status_code == 201, (host, answer.text)
        refused = await client.get("/queues", headers={"host": "other.internal"})
    assert refused.status_code == 400


async def test_the_host_is_checked_only_without_a_token(settings: Settings) -> None:
    # A rebound page cannot know the token: with one, any Host is answered (to the token).
    async with api(settings, base_url="http://queue.example.com", api_token=SecretStr(TOKEN)) as c:
        assert (await c.get("/queues", headers=RIGHT)).status_code == 200
        assert (await c.get("/queues")).status_code == 401
    async with api(settings, base_url="http://queue.example.com") as c:
        assert (await c.get("/queues")).status_code == 400


# -- cross-site requests, without a token (CSRF) --------------------------------------------


async def test_a_cross_site_form_post_does_not_pause_a_queue(settings: Settings, conn: Any) -> None:
    form = {"content-type": "application/x-www-form-urlencoded", "origin": EVIL}
    async with api(settings) as client:
        answer = await client.post("/queues/default/pause", headers=form, content=b"a=1")
        fetched = await client.post(
            "/queues/default/pause", headers={"sec-fetch-site": "cross-site"}
        )
    for refused in (answer, fetched):
        assert refused.status_code == 403, refused.text
        assert "cross-site" in refused.json()["detail"]
    assert not await paused(conn, "default")


async def test_a_cross_site_retry_requeues_nothing(settings: Settings, conn: Any) -> None:
    await insert_in_state(conn, "fail", status="'failed'")
    async with api(settings) as client:
        answer = await client.post("/jobs/retry", headers={"origin": EVIL})
    assert answer.status_code == 403
    cursor = await conn.execute("SELECT status FROM notifyq.jobs")
    assert [row[0] for row in await cursor.fetchall()] == ["failed"]


CROSS_SITE = [
    {"origin": EVIL},
    {"origin": "null"},
    {"origin": "http://localhost:3000"},  # another local server's page
    {"origin": "http://127.0.0.1:8000"},  # the same server, but not the Host asked
    {"sec-fetch-site": "cross-site"},
    {"sec-fetch-site": "same-site", "origin": "http://localhost:3000"},
    {"sec-fetch-site": "cross-site", "origin": "http://localhost:8000"},
]
SAME_ORIGIN = [
    {},  # curl, scripts: no browser, no page
    {"origin": "http://localhost:8000"},
    {"origin": "https://localhost:8000"},  # TLS ended by a proxy in front
    {"sec-fetch-site": "same-origin", "origin": "http://localhost:8000"},
    {"sec-fetch-site": "none"},
]


async def test_state_changing_requests_from_another_origin_are_403(settings: Settings) -> None:
    async with api(settings) as client:
        for headers in CROSS_SITE:
            for method in ("POST", "PUT", "PATCH", "DELETE"):
                answer = await client.request(
                    method, "/jobs", headers=headers, json={"payload": {}}
                )
                assert answer.status_code == 403, (headers, method, answer.text)
            # Reading is what CORS guards (the page never sees the answer): not refused.
            assert (await client.get("/queues", headers=headers)).status_code == 200
        for headers in SAME_ORIGIN:
            answer = await client.post("/jobs", headers=headers, json={"payload": {}})
            assert answer.status_code == 201, (headers, answer.text)


async def test_with_a_token_cross_site_requests_are_left_to_the_token(settings: Settings) -> None:
    async with api(settings, api_token=SecretStr(TOKEN)) as client:
        answer = await client.post("/jobs", headers={**RIGHT, "origin": EVIL}, json={"payload": {}})
        anonymous = await client.post("/jobs", headers={"origin": EVIL}, json={"payload": {}})
    async with api(settings) as client:
        tokenless = await client.post("/jobs", headers={"origin": EVIL}, json={"payload": {}})
    assert answer.status_code == 201, answer.text
    assert anonymous.status_code == 401
    assert tokenless.status_code == 403


async def test_cors_origins_are_trusted_for_state_changes(settings: Settings, conn: Any) -> None:
    trusted = "https://ops.example"
    async with api(settings, cors_origins=[trusted]) as client:
        answer = await client.post(
            "/queues/mail/pause", headers={"origin": trusted, "sec-fetch-site": "cross-site"}
        )
        other = await client.post("/queues/mail/resume", headers={"origin": EVIL})
    assert answer.status_code == 200, answer.text
    assert answer.headers["access-control-allow-origin"] == trusted
    assert other.status_code == 403
    assert await paused(conn, "mail")


# -- /health's details and CORS preflights, with a token --------------------------------------


async def test_health_shows_details_only_with_the_token(settings: Settings) -> None:
    async with api(settings, run_worker=True, api_token=SecretStr(TOKEN)) as client:
        anonymous = await client.get("/health")
        wrong = await client.get("/health", headers={"authorization": "Bearer nope"})
        right = await client.get("/health", headers=RIGHT)
    async with api(settings, run_worker=True) as client:
        tokenless = (await client.get("/health")).json()
    assert anonymous.status_code == wrong.status_code == 200
    assert anonymous.json() == wrong.json() == {"status": "healthy"}
    assert right.status_code == 200
    assert right.json()["worker"]["id"] and right.json()["database"] == "ok"
    # Without a token configured, the Host check keeps other sites' pages out: details.
    assert tokenless["status"] == "healthy" and tokenless["worker"]["id"]


async def test_an_unhealthy_database_error_is_not_shown_to_anyone(settings: Settings) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    down = settings.model_copy(
        update={"database_url": f"postgresql://postgres@127.0.0.1:{port}/x", "connect_timeout": 1}
    )
    async with api(down, api_token=SecretStr(TOKEN)) as client:
        anonymous = await client.get("/health")
        right = await client.get("/health", headers=RIGHT)
    assert anonymous.status_code == right.status_code == 503
    assert anonymous.json() == {"status": "unhealthy"}
    assert "database is unavailable" in right.json()["database"]


async def test_cors_preflights_pass_the_token_guard(settings: Settings) -> None:
    origin = "https://ops.example"
    preflight = {"origin": origin, "access-control-request-method": "POST"}
    async with api(settings, api_token=SecretStr(TOKEN), cors_origins=[origin]) as client:
        answer = await client.options("/jobs", headers=preflight)
        refused = await client.options("/jobs", headers={**preflight, "origin": EVIL})
        actual = await client.post("/jobs", headers={"origin": origin}, json={"payload": {}})
        allowed = await client.post(
            "/jobs", headers={"origin": origin, **RIGHT}, json={"payload": {}}
        )
    assert answer.status_code == 200, answer.text
    assert answer.headers["access-control-allow-origin"] == origin
    assert "access-control-allow-origin" not in refused.headers
    assert actual.status_code == 401  # the request itself still needs the token
    assert allowed.status_code == 201 and allowed.headers["access-control-allow-origin"] == origin
    async with api(settings, api_token=SecretStr(TOKEN)) as client:
        # Without CORS configured there is nothing to pre-fly: the token is asked as ever.
        assert (await client.options("/jobs", headers=preflight)).status_code == 401


# -- the size of a request's head, on a real server -----------------------------------------

MIB = 1024 * 1024


def peak_rss(pid: int) -> int:
    """The process's peak resident memory, in bytes (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def served(db_url: str, tmp_path: Path, **env: str) -> Iterator[tuple[int, int]]:
    """`notifyq serve` on a loopback port: (its port, its pid)."""
    port = free_port()
    with processes(tmp_path) as start:
        server = start("serve", "--no-worker", "--port", str(port), env=notifyq_env(db_url, **env))
        server.wait_for_output("Uvicorn running on")
        yield port, server.pid


def flood(port: int, size: int) -> tuple[int, bytes]:
    """Sends one header of ``size`` bytes that never ends; answers how many bytes went out
    before the server cut the connection, and what it answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        sock.sendall(b"GET /queues HTTP/1.1\r\nHost: localhost\r\nX-Big: ")
        chunk, sent = b"a" * (64 * 1024), 0
        deadline = time.monotonic() + 60
        try:
            while sent < size and time.monotonic() < deadline:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            return sent, b""
        return sent, _read_answer(sock)


def _read_answer(sock: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(ConnectionResetError, TimeoutError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_a_huge_header_is_cut_off_early_at_little_cost(db_url: str, tmp_path: Path) -> None:
    with served(db_url, tmp_path) as (port, pid):
        # A head just over the limit: the whole of it is read, then 431 and the connection
        # closed.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /queues HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 70_000)
            answer = _read_answer(sock)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert b"larger than 65536 bytes" in answer
        before = peak_rss(pid)
        sent, _ = flood(port, 48 * MIB)
        grown = peak_rss(pid) - before
        # A head below the limit, and the server itself, are fine.
        big_but_fine = {"x-fine": "b" * 30_000}
        ok = httpx.get(f"http://127.0.0.1:{port}/queues", headers=big_but_fine, timeout=10)
    assert sent < 16 * MIB, f"the server read {sent} bytes of one header"
    assert grown < 16 * MIB, f"one header cost {grown / MIB:.0f} MiB"
    assert ok.status_code == 200


def test_the_header_limit_is_a_setting_and_counts_each_request(db_url: str, tmp_path: Path) -> None:
    # Three heads of 3 KiB on one connection: each under the 4 KiB limit, together over it.
    request = b"GET /queues HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + b"d" * 3000 + b"\r\n\r\n"
    with served(db_url, tmp_path, NOTIFYQ_MAX_HEADER_BYTES="4096") as (port, _):
        refused = httpx.get(
            f"http://127.0.0.1:{port}/queues", headers={"x-big": "c" * 5000}, timeout=10
        )
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            heads = []
            for _ in range(3):
                sock.sendall(request)
                heads.append(read_response(sock))
    assert refused.status_code == 431
    assert refused.json()["detail"] == "request line and headers are larger than 4096 bytes"
    assert all(head.startswith(b"HTTP/1.1 200 ") for head in heads), heads


def read_response(sock: socket.socket) -> bytes:
    """One HTTP response (head and Content-Length body) from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, data
        body += chunk
    return head


# -- slow clients and the number of connections, on a real server ---------------------------


def trickle(port: int, count: int, first: bytes, limit: float) -> list[tuple[float, bytes]]:
    """Opens ``count`` connections that send ``first`` and then (unless it is empty) one byte
    each every 0.2 s, until the server closes them (or ``limit`` seconds pass); answers, for
    each, the seconds until it did and what it sent before."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(count)]
    start = time.monotonic()
    ended: dict[socket.socket, tuple[float, bytes]] = {}
    try:
        for sock in socks:
            if first:
                sock.sendall(first)
        while len(ended) < count and time.monotonic() < start + limit:
            open_ = [sock for sock in socks if sock not in ended]
            readable, _, _ = select.select(open_, [], [], 0.2)
            for sock in readable:
                ended[sock] = (time.monotonic() - start, _read_answer(sock))
            for sock in open_:
                if first and sock not in ended:
                    try:
                        sock.send(b"a")
                    except OSError:
                        ended[sock] = (time.monotonic() - start, b"")
    finally:
        for sock in socks:
            sock.close()
    return list(ended.values())


def test_slow_heads_and_bodies_are_cut_off_within_their_timeouts(
    db_url: str, tmp_path: Path
) -> None:
    timeouts = {"NOTIFYQ_HEAD_TIMEOUT": "1", "NOTIFYQ_BODY_TIMEOUT": "1.5"}
    head = b"GET /queues HTTP/1.1\r\nHost: localhost\r\nX-Slow: "
    body = (
        b"POST /jobs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n{"
    )
    with served(db_url, tmp_path, **timeouts) as (port, _):
        silent = trickle(port, 20, b"", limit=10)  # connect, then nothing
        heads = trickle(port, 50, head, limit=10)
        bodies = trickle(port, 20, body, limit=10)
        ok = httpx.get(f"http://127.0.0.1:{port}/queues", timeout=10)
    assert len(silent) == 20 and len(heads) == 50 and len(bodies) == 20
    # Each within its timeout and the slack of a busy machine, however often it sent a byte.
    assert max(seconds for seconds, _ in silent + heads) < 1 + 2, silent + heads
    # A silent client reads the 408; one that sent a byte after the close may get a reset
    # instead, which drops the answer from its socket's buffer.
    assert all(answer.startswith(b"HTTP/1.1 408 ") for _, answer in silent), silent
    assert all(answer == b"" or answer.startswith(b"HTTP/1.1 408 ") for _, answer in heads)
    assert max(seconds for seconds, _ in bodies) < 1.5 + 2, bodies
    assert ok.status_code == 200


def test_connections_past_the_bound_are_answered_503(db_url: str, tmp_path: Path) -> None:
    bound = {"NOTIFYQ_MAX_CONNECTIONS": "5", "NOTIFYQ_HEAD_TIMEOUT": "30"}
    with served(db_url, tmp_path, **bound) as (port, _):
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(5)]
        try:
            refused = httpx.get(f"http://127.0.0.1:{port}/queues", timeout=10)
        finally:
            for sock in idle:
                sock.close()
        deadline = time.monotonic() + 10
        while (
            answer := httpx.get(f"http://127.0.0.1:{port}/queues", timeout=10)
        ).status_code != 200:
            assert time.monotonic() < deadline, answer
    assert refused.status_code == 503


# -- CORS -------------------------------------------------------------------------------------


def test_a_wildcard_origin_without_a_token_is_refused_at_start(
    settings: Settings, db_url: str
) -> None:
    with pytest.raises(ConfigurationError, match=r"NOTIFYQ_CORS_ORIGINS=\* without"):
        create_app(settings.model_copy(update={"cors_origins": ["*"]}))
    create_app(settings.model_copy(update={"cors_origins": ["*"], "api_token": SecretStr(TOKEN)}))
    create_app(settings.model_copy(update={"cors_origins": ["https://ops.example"]}))
    done = subprocess.run(
        [sys.executable, "-m", "notifyq", "serve", "--no-worker", "--port", "0"],
        env=notifyq_env(db_url, NOTIFYQ_CORS_ORIGINS="*"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1 and "NOTIFYQ_CORS_ORIGINS=*" in done.stderr, done.stderr
