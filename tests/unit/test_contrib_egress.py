"""Where http_request may connect, against real peers on 127.0.0.1: the address check of every
hop and NOTIFYQ_HTTP_ALLOW, the headers that go along a redirect to another origin, TLS on the
host name, the environment it ignores, and decompression with a bounded buffer.

A socket audit hook watches every test here: it records each connection and lookup, and aborts
any connection to an address other than 127.0.0.1 or ::1 before it is made, so that a test can
tell that nothing was even attempted, and so that a broken check never reaches a real network.
"""

from __future__ import annotations

import contextlib
import gzip
import ipaddress
import json
import re
import socket
import ssl
import struct
import sys
import threading
import tracemalloc
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import httpx
import pytest
import uvicorn

from notifyq.contrib import ContribSettings, TransientFailure, contrib_tasks
from notifyq.contrib.egress import EgressPolicy, PinnedTransport, refused_range
from notifyq.errors import ConfigurationError, PermanentFailure
from notifyq.tasks import Task
from tests.unit.test_contrib import answer, read_body, run, wait_for

LOOPBACK = ("127.0.0.1", "::1")


@pytest.fixture(autouse=True)
def _no_contrib_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings come from each test alone, not from NOTIFYQ_* variables of the machine."""
    for name in ContribSettings.model_fields:
        monkeypatch.delenv(f"NOTIFYQ_{name.upper()}", raising=False)


def http_task(**overrides: Any) -> Task:
    """http_request with a test timeout, no allow list unless given, and ``overrides``."""
    fields: dict[str, Any] = {"http_timeout": 10.0, "http_allow": ""}
    fields.update(overrides)
    [task] = [t for t in contrib_tasks(ContribSettings(**fields)) if t.name == "http_request"]
    return task


# -- the guard ---------------------------------------------------------------------------------


@dataclass
class NetLog:
    """What the process did on the network during one test."""

    connects: list[Any] = field(default_factory=list)
    lookups: list[Any] = field(default_factory=list)

    def hosts(self) -> list[str]:
        return [a[0] if isinstance(a, tuple) else str(a) for a in self.connects]


_current: NetLog | None = None
_hooked = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    log = _current
    if log is None:
        return
    if event == "socket.connect":
        address = args[1]
        log.connects.append(address)
        if isinstance(address, tuple) and address[0] not in LOOPBACK:
            raise ConnectionAbortedError(f"test guard: connection to {address!r} aborted")
    elif event == "socket.getaddrinfo":
        host = args[0]
        log.lookups.append(host.decode() if isinstance(host, bytes) else host)


@pytest.fixture(autouse=True)
def network() -> Iterator[NetLog]:
    """Records (and fences) this test's connections; see the module docstring."""
    global _current, _hooked
    if not _hooked:
        # An audit hook cannot be removed; it does nothing while no test records.
        sys.addaudithook(_audit)
        _hooked = True
    _current = NetLog()
    try:
        yield _current
    finally:
        _current = None


def test_the_guard_sees_and_stops_a_connection(network: NetLog) -> None:
    # The instrument the tests below rely on: it must see a connection and stop one that is
    # not to loopback before anything is sent (192.0.2.1 is a documentation address).
    with socket.socket() as sock, pytest.raises(ConnectionAbortedError, match="test guard"):
        sock.connect(("192.0.2.1", 9))
    assert network.hosts() == ["192.0.2.1"]


# -- peers -------------------------------------------------------------------------------------


@dataclass
class Peer:
    """A real HTTP server on 127.0.0.1 (uvicorn in a thread) that records every request."""

    port: int
    seen: list[dict[str, Any]]
    scheme: str = "http"

    def url(self, path: str = "/", host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"


async def peer_app(seen: list[dict[str, Any]], scope: Any, receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    path: str = scope["path"]
    query = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    body = await read_body(receive)
    headers = {k.decode(): v.decode() for k, v in scope["headers"]}
    seen.append({"method": scope["method"], "path": path, "headers": headers, "body": body})
    if path == "/echo":
        echoed = {"method": scope["method"], "headers": headers, "body": body.decode()}
        await answer(send, 200, json.dumps(echoed).encode(), "application/json")
    elif path == "/redirect-to":
        await answer(send, int(query.get("status", "302")), b"", location=query["url"])
    elif path == "/secret":
        await answer(send, 200, b"internal secret")
    elif path == "/coded":
        text = b"hello, " * 2000
        coded = {
            "gzip": gzip.compress(text),
            "deflate": zlib.compress(text),
            "raw-deflate": zlib.compress(text, wbits=-15),
        }[query["as"]]
        coding = query["as"].removeprefix("raw-")
        await answer(send, 200, coded, content_encoding=coding)
    else:
        await answer(send, 404, b"no such page")


@contextlib.contextmanager
def serving(tls: tuple[Path, Path] | None = None) -> Iterator[Peer]:
    """A :class:`Peer`, over TLS with ``tls`` (certificate file, key file)."""
    sock = socket.create_server(("127.0.0.1", 0))
    seen: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await peer_app(seen, scope, receive, send)

    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="off",
        ws="none",
        http="h11",
        ssl_certfile=None if tls is None else str(tls[0]),
        ssl_keyfile=None if tls is None else str(tls[1]),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive())
    assert server.started, "uvicorn did not start"
    try:
        yield Peer(sock.getsockname()[1], seen, "http" if tls is None else "https")
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture(scope="module")
def first() -> Iterator[Peer]:
    with serving() as peer:
        yield peer


@pytest.fixture(scope="module")
def second() -> Iterator[Peer]:
    """Another origin: the same address, another port."""
    with serving() as peer:
        yield peer


@pytest.fixture(autouse=True)
def _fresh_peers(request: pytest.FixtureRequest) -> None:
    for name in ("first", "second"):
        if name in request.fixturenames:
            request.getfixturevalue(name).seen.clear()


def redirect(peer: Peer, target: str, status: int = 302, host: str = "127.0.0.1") -> str:
    """A URL of ``peer`` that redirects to ``target``."""
    return peer.url(f"/redirect-to?status={status}&url={quote(target, safe='')}", host)


# -- the address check -------------------------------------------------------------------------


async def test_loopback_is_refused_without_an_allow_list(first: Peer, network: NetLog) -> None:
    with pytest.raises(PermanentFailure) as caught:
        await run(http_task(), {"url": first.url("/secret")})
    message = str(caught.value)
    assert "refusing to connect to 127.0.0.1, a loopback address" in message
    assert "NOTIFYQ_HTTP_ALLOW" in message
    assert first.seen == [] and network.connects == []


REFUSED = [
    ("127.0.0.1", "loopback"),
    ("127.1.2.3", "loopback"),
    ("[::1]", "loopback"),
    ("10.1.2.3", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("169.254.169.254", "link-local"),
    ("[fe80::1]", "link-local"),
    ("[fd00:ec2::254]", "unique-local"),
    ("100.64.0.1", "CGNAT (shared)"),
    ("224.0.0.1", "multicast"),
    ("[ff02::1]", "multicast"),
    ("0.0.0.0", "unspecified"),
    ("[::]", "unspecified"),
    ("255.255.255.255", "broadcast"),
    ("240.0.0.1", "reserved"),
    ("192.0.2.1", "reserved"),
    ("[::127.0.0.1]", "reserved"),
    ("[::ffff:127.0.0.1]", "loopback (IPv4 127.0.0.1 inside IPv6)"),
    ("[::ffff:169.254.169.254]", "link-local (IPv4 169.254.169.254 inside IPv6)"),
    ("[64:ff9b::a00:1]", "private (IPv4 10.0.0.1 inside IPv6)"),
    ("[2002:a9fe:a9fe::1]", "link-local (IPv4 169.254.169.254 inside IPv6)"),
]


@pytest.mark.parametrize(("host", "reason"), REFUSED)
async def test_refused_addresses_fail_for_good_before_any_connection(
    host: str, reason: str, network: NetLog
) -> None:
    # 169.254.169.254 is the cloud metadata address; fd00:ec2::254 its IPv6 twin.
    with pytest.raises(PermanentFailure, match=re.escape(f", a {reason} address")) as caught:
        await run(http_task(), {"url": f"http://{host}/latest/meta-data/"})
    assert host.strip("[]") in str(caught.value)
    assert network.connects == [] and network.lookups == []


def test_public_addresses_are_not_refused() -> None:
    for text in [
        "8.8.8.8",
        "2606:4700::1111",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
        "2002:808:808::",
    ]:
        assert refused_range(ipaddress.ip_address(text)) is None, text


async def test_a_host_name_is_judged_by_the_address_it_resolves_to(
    first: Peer, network: NetLog
) -> None:
    # "localhost" and the decimal form of 127.0.0.1 are names to the URL, loopback once
    # resolved: the check sees the resolved address.
    for host in ("localhost", "2130706433"):
        with pytest.raises(PermanentFailure) as caught:
            await run(http_task(), {"url": first.url("/secret", host)})
        assert f"refusing to connect to {host}: it resolves to 127.0.0.1, a loopback" in str(
            caught.value
        )
    assert first.seen == [] and network.connects == []
    assert "localhost" in network.lookups


async def test_the_allow_list_takes_host_names_addresses_and_networks(first: Peer) -> None:
    cases = [
        ("127.0.0.1", "127.0.0.1", True),
        ("127.0.0.0/8", "127.0.0.1", True),
        ("10.0.0.0/8", "127.0.0.1", False),
        ("127.0.0.2", "127.0.0.1", False),
        ("localhost", "localhost", True),
        ("LocalHost.", "localhost", True),
        ("localhost", "127.0.0.1", False),  # a name allows that name, not its address
        ("127.0.0.0/8, ::1", "localhost", True),  # every address localhost may resolve to
        ("example.com", "localhost", False),
    ]
    for allow, host, allowed in cases:
        http = http_task(http_allow=allow)
        if allowed:
            assert (await run(http, {"url": first.url("/secret", host)}))[
                "body"
            ] == "internal secret"
        else:
            with pytest.raises(PermanentFailure, match="a loopback address"):
                await run(http, {"url": first.url("/secret", host)})
    assert len(first.seen) == sum(allowed for _, _, allowed in cases)


def test_bad_allow_entries_are_refused_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFYQ_HTTP_ALLOW", " 127.0.0.1 ,10.0.0.0/8,[::1], Example.COM.,")
    assert ContribSettings.load().http_allow == (
        "127.0.0.1/32",
        "10.0.0.0/8",
        "::1/128",
        "example.com",
    )
    for bad in ["localhost:8000", "http://localhost", "*.internal", "10.0.0.0/33", "a b"]:
        with pytest.raises(ConfigurationError, match="NOTIFYQ_HTTP_ALLOW"):
            ContribSettings.load(http_allow=bad)


async def test_a_redirect_from_an_allowed_host_to_a_refused_one_is_refused(
    first: Peer, second: Peer, network: NetLog
) -> None:
    http = http_task(http_allow="localhost")
    with pytest.raises(PermanentFailure) as caught:
        await run(http, {"url": redirect(first, second.url("/secret"), host="localhost")})
    assert (
        f"redirected to {second.url('/secret')}: refusing to connect to 127.0.0.1, a loopback"
        in str(caught.value)
    )
    assert [r["path"] for r in first.seen] == ["/redirect-to"]
    assert second.seen == []
    # And into the metadata address: refused before any connection to it.
    with pytest.raises(
        PermanentFailure, match=r"refusing to connect to 169\.254\.169\.254, a link"
    ):
        await run(http, {"url": redirect(first, "http://169.254.169.254/", host="localhost")})
    assert set(network.hosts()) <= set(LOOPBACK)


async def test_a_name_is_looked_up_once_and_the_address_checked_is_the_one_used(
    first: Peer, network: NetLog
) -> None:
    # A resolver (the seam the transport takes) that answers loopback once, then a private
    # address: what a rebinding name does. The connection uses the checked answer, by address,
    # with nothing looked up again; the next connection's lookup is checked anew.
    answers = [["127.0.0.1"], ["10.0.0.1"]]
    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return answers.pop(0)

    policy = EgressPolicy.parse(["127.0.0.1"])
    url = first.url("/echo", "rebind.test")
    for attempt in range(2):
        transport = PinnedTransport(
            policy, ssl_context=ssl.create_default_context(), resolve=resolve
        )
        async with httpx.AsyncClient(transport=transport) as client:
            if attempt == 0:
                response = await client.get(url)
                assert response.json()["headers"]["host"] == f"rebind.test:{first.port}"
            else:
                with pytest.raises(
                    PermanentFailure, match=r"it resolves to 10\.0\.0\.1, a private"
                ):
                    await client.get(url)
    assert asked == ["rebind.test", "rebind.test"]
    assert "rebind.test" not in network.lookups
    assert network.hosts() == ["127.0.0.1"]


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A certificate for the name "localhost" only (not for 127.0.0.1): its file, its key,
    and the file of the CA that signed it."""
    trustme = pytest.importorskip("trustme", reason="trustme makes the test certificates")
    folder = tmp_path_factory.mktemp("egress-tls")
    ca = trustme.CA()
    issued = ca.issue_cert("localhost")
    issued.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    issued.private_key_pem.write_to_path(str(folder / "key.pem"))
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    return folder / "cert.pem", folder / "key.pem", folder / "ca.pem"


async def test_tls_checks_the_host_name_while_connecting_to_the_address(
    certificates: tuple[Path, Path, Path], network: NetLog
) -> None:
    cert, key, ca = certificates
    trusted = ssl.create_default_context(cafile=str(ca))
    with serving((cert, key)) as peer:
        policy = EgressPolicy.parse(["127.0.0.0/8", "::1"])
        async with httpx.AsyncClient(
            transport=PinnedTransport(policy, ssl_context=trusted)
        ) as client:
            response = await client.get(peer.url("/echo", "localhost"))
            assert response.json()["headers"]["host"] == f"localhost:{peer.port}"
            # The certificate names localhost, not 127.0.0.1: the name above was checked.
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.get(peer.url("/echo"))
    assert set(network.hosts()) <= set(LOOPBACK)


async def test_the_environment_is_ignored_unless_asked(
    certificates: tuple[Path, Path, Path],
    first: Peer,
    second: Peer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cert, key, ca = certificates
    # A proxy would look the name up itself, out of the check's sight: never used.
    monkeypatch.setenv("HTTP_PROXY", second.url())
    monkeypatch.setenv("ALL_PROXY", second.url())
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    result = await run(http_task(http_allow="127.0.0.1"), {"url": first.url("/secret")})
    assert result["body"] == "internal secret"
    assert second.seen == []
    with serving((cert, key)) as peer:
        url = peer.url("/secret", "localhost")
        with pytest.raises(TransientFailure, match="CERTIFICATE_VERIFY_FAILED"):
            await run(http_task(http_allow="localhost"), {"url": url})
        trusting = http_task(http_allow="localhost", http_trust_env=True)
        assert (await run(trusting, {"url": url}))["body"] == "internal secret"


# -- redirects to another origin ---------------------------------------------------------------

SECRETS = {
    "X-Api-Key": "key-1",
    "Private-Token": "token-2",
    "Proxy-Authorization": "Basic cHJveHk6c2VjcmV0",
    "Authorization": "Bearer bearer-3",
    "Cookie": "session=4",
    "X-Signature": "sig-5",
}
SAFE = {
    "Accept": "application/json",
    "Accept-Language": "fr",
    "User-Agent": "billing-hook/2",
    "Content-Type": "application/json; charset=utf-8",
}


def payload_headers(seen: dict[str, Any]) -> dict[str, str]:
    """The headers of a request that the payload could have set (not the transport's own)."""
    names = {k.lower() for k in [*SECRETS, *SAFE]}
    return {k: v for k, v in seen["headers"].items() if k in names}


@pytest.mark.parametrize("status", [302, 307, 308])
async def test_a_redirect_to_another_origin_keeps_only_harmless_headers(
    first: Peer, second: Peer, status: int
) -> None:
    http = http_task(http_allow="127.0.0.1")
    payload = {"method": "POST", "headers": {**SECRETS, **SAFE}, "json": {"paid": 1}}
    result = await run(http, {**payload, "url": redirect(first, second.url("/echo"), status)})
    assert result["url"] == second.url("/echo")
    [arrived] = second.seen
    expected = {k.lower(): v for k, v in SAFE.items()}
    if status == 302:  # a POST becomes a GET without its body, and without its type
        assert arrived["method"] == "GET" and arrived["body"] == b""
        del expected["content-type"]
    else:
        assert arrived["method"] == "POST" and json.loads(arrived["body"]) == {"paid": 1}
    assert payload_headers(arrived) == expected
    assert arrived["headers"]["host"] == f"127.0.0.1:{second.port}"
    # The first origin got everything, as the payload asked.
    assert payload_headers(first.seen[0]) == {k.lower(): v for k, v in {**SECRETS, **SAFE}.items()}


async def test_headers_dropped_on_the_way_out_stay_dropped_on_the_way_back(
    first: Peer, second: Peer
) -> None:
    http = http_task(http_allow="127.0.0.1")
    there_and_back = redirect(second, first.url("/echo"))
    await run(http, {"url": redirect(first, there_and_back), "headers": {**SECRETS, **SAFE}})
    assert [r["path"] for r in first.seen] == ["/redirect-to", "/echo"]
    assert payload_headers(first.seen[1]) == {k.lower(): v for k, v in SAFE.items()}


async def test_a_redirect_within_the_origin_keeps_every_header(first: Peer) -> None:
    http = http_task(http_allow="127.0.0.1")
    await run(http, {"url": redirect(first, "/echo"), "headers": {**SECRETS, **SAFE}})
    assert payload_headers(first.seen[1]) == {k.lower(): v for k, v in {**SECRETS, **SAFE}.items()}


# -- decompression -----------------------------------------------------------------------------

BOMB_CHUNK = b"A" * (1 << 20)


def gzip_bomb(mebibytes: int) -> bytes:
    """A valid gzip stream of ``mebibytes`` MiB of "A" in about one KiB per MiB: one deflate
    block, flushed so that it depends on nothing before it, repeated."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = compressor.compress(BOMB_CHUNK) + compressor.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(mebibytes):
        crc = zlib.crc32(BOMB_CHUNK, crc)
    end = zlib.compressobj(9, zlib.DEFLATED, -15).flush()
    size = (mebibytes << 20) & 0xFFFFFFFF
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + block * mebibytes + end + struct.pack("<II", crc, size)


def test_the_gzip_bomb_is_one_mebibyte_that_inflates_a_thousandfold() -> None:
    small = gzip_bomb(3)
    assert gzip.decompress(small) == BOMB_CHUNK * 3
    assert len(gzip_bomb(1024)) < 1.1 * (1 << 20)


@contextlib.contextmanager
def raw_peer(response: bytes) -> Iterator[int]:
    """A bare TCP server on 127.0.0.1 that answers every request with ``response`` (status
    line, headers and body), sent from that one buffer: it allocates nothing while it serves,
    so the memory a test measures is the client's."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # the listener was closed: the test is over
            with conn, contextlib.suppress(OSError):  # the client may hang up mid-body
                request = b""
                while b"\r\n\r\n" not in request:
                    received = conn.recv(65536)
                    if not received:
                        break
                    request += received
                conn.sendall(response)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        listener.close()
        thread.join(10)


async def test_a_gzip_bomb_costs_no_more_than_the_response_limit(first: Peer) -> None:
    # Decoded here with a bounded buffer, an honest compressed body still reads as it should.
    for coding in ("gzip", "deflate", "raw-deflate"):
        small = http_task(http_allow="127.0.0.1", http_max_response_bytes=1000)
        result = await run(small, {"url": first.url(f"/coded?as={coding}")})
        assert result["body"] == ("hello, " * 2000)[:1000] and result["truncated"] is True
    assert first.seen[0]["headers"]["accept-encoding"] == "gzip, deflate"

    bomb = gzip_bomb(1024)  # 1 MiB on the wire, 1 GiB inflated
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Encoding: gzip\r\n"
        f"Content-Length: {len(bomb)}\r\nConnection: close\r\n\r\n"
    ).encode()
    limit = 1 << 20
    http = http_task(http_allow="127.0.0.1", http_max_response_bytes=limit)
    with raw_peer(head + bomb) as port:
        tracemalloc.start()
        try:
            result = await run(http, {"url": f"http://127.0.0.1:{port}/"})
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert result["truncated"] is True
    assert result["body"] == "A" * limit
    # The body kept, a copy or two of it, and small change; not the inflated gigabyte, nor
    # even one inflated network read (64 KiB of this bomb are 64 MiB).
    assert peak < 6 * limit, f"peak {peak / (1 << 20):.1f} MiB"
