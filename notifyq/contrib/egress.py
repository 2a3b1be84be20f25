"""Where ``http_request`` may connect, and the httpx transport that keeps it there.

A destination is judged by the addresses its name resolves to, not by the name: the transport
resolves each host once, refuses it when any of its addresses lies in a refused range (see
:func:`refused_range`) that ``NOTIFYQ_HTTP_ALLOW`` does not list, and then connects to one of the
very addresses it checked. No second lookup happens between the check and the connection, so a
name that answers differently the next time (DNS rebinding) cannot slip through. Only the
socket's address is pinned: the Host header, TLS SNI and the certificate check still use the
host name.

The check lives in the connection step (an httpcore network backend), so it applies to every
connection the client opens, redirects included; a connection kept alive is reused only for the
host it was opened (and checked) for.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
import ssl
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias

import anyio
import httpcore
import httpx

from notifyq.errors import PermanentFailure

__all__ = [
    "DestinationRefused",
    "EgressPolicy",
    "PinnedTransport",
    "normal_allow_entry",
    "refused_range",
    "resolve_host",
]

IPAddress: TypeAlias = "ipaddress.IPv4Address | ipaddress.IPv6Address"
IPNetwork: TypeAlias = "ipaddress.IPv4Network | ipaddress.IPv6Network"
#: Resolves a host name to the addresses (as text) to connect to; :func:`resolve_host` by default.
Resolver: TypeAlias = Callable[[str, int], Awaitable[list[str]]]


def _networks(*cidrs: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(cidr) for cidr in cidrs)


# Named here rather than left to ipaddress's is_private/is_global, whose lists changed between
# Python versions: the ranges the contract names are refused on every version.
_NAMED_RANGES: tuple[tuple[str, tuple[IPNetwork, ...]], ...] = (
    ("unspecified", _networks("0.0.0.0/8", "::/128")),
    ("loopback", _networks("127.0.0.0/8", "::1/128")),
    ("link-local", _networks("169.254.0.0/16", "fe80::/10")),
    ("private", _networks("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")),
    ("unique-local", _networks("fc00::/7")),
    ("site-local", _networks("fec0::/10")),
    ("CGNAT (shared)", _networks("100.64.0.0/10")),
    ("multicast", _networks("224.0.0.0/4", "ff00::/8")),
    ("broadcast", _networks("255.255.255.255/32")),
)
#: NAT64's well-known prefix: the last 32 bits are the IPv4 address actually reached.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")

_HOST_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,62})(?:\.[a-z0-9_](?:[a-z0-9_-]{0,62}))*")


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (IPv4-mapped, NAT64, 6to4), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def refused_range(address: IPAddress) -> str | None:
    """The kind of refused range ``address`` lies in (``"loopback"``, ``"private"``,
    ``"link-local"``, ``"unique-local"``, ``"CGNAT (shared)"``, ``"multicast"``,
    ``"unspecified"``, ``"broadcast"``, ``"reserved"``...), or None for a public address. An
    IPv6 address that embeds an IPv4 one (``::ffff:10.0.0.1``, NAT64, 6to4) is judged by the
    IPv4 address it reaches."""
    for name, networks in _NAMED_RANGES:
        if any(address in network for network in networks):
            return name
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            inner = refused_range(embedded)
            return None if inner is None else f"{inner} (IPv4 {embedded} inside IPv6)"
    # Everything else that is not public: "this host on this network", documentation and
    # benchmark ranges, 240/4, IPv4-compatible IPv6 (::a.b.c.d), Teredo, ORCHID...
    if address.is_reserved or not address.is_global:
        return "reserved"
    return None


class DestinationRefused(PermanentFailure):
    """Raised when ``http_request`` would connect to an address in a refused range (see
    :func:`refused_range`) that ``NOTIFYQ_HTTP_ALLOW`` does not list; nothing was sent."""

    def __init__(self, host: str, address: IPAddress, reason: str) -> None:
        self.host, self.address, self.reason = host, address, reason
        where = host if _literal(host) == address else f"{host}: it resolves to {address}"
        super().__init__(
            f"refusing to connect to {where}, a {reason} address; list the host or the "
            "network in NOTIFYQ_HTTP_ALLOW to allow it"
        )


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def normal_allow_entry(entry: str) -> str:
    """``entry`` of NOTIFYQ_HTTP_ALLOW in its normal form: a network in CIDR notation (a single
    address becomes a /32 or /128) or a lower-case ASCII host name. Raises ValueError for
    anything else (a port, a path, a wildcard)."""
    text = entry.strip()
    unbracketed = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        return str(ipaddress.ip_network(unbracketed, strict=False))
    except ValueError:
        pass
    name = text.lower().removesuffix(".")
    if not name.isascii():
        try:
            name = httpx.URL(scheme="http", host=name).raw_host.decode("ascii")
        except (httpx.InvalidURL, UnicodeError):
            name = ""
    if not _HOST_NAME.fullmatch(name) or len(name) > 253:
        raise ValueError(
            f"{entry!r} is neither a host name, an address nor a network (CIDR such as "
            "10.0.0.0/8); give no scheme, port, path or wildcard"
        )
    return name


def _host_key(host: str) -> str:
    return host.lower().removesuffix(".")


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """Which destinations of a refused range ``http_request`` may reach anyway: the host names
    and the networks of ``NOTIFYQ_HTTP_ALLOW``. Public addresses are always allowed."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> EgressPolicy:
        """The policy allowing ``entries`` (see :func:`normal_allow_entry`)."""
        hosts: set[str] = set()
        networks: list[IPNetwork] = []
        for entry in entries:
            normal = normal_allow_entry(entry)
            try:
                networks.append(ipaddress.ip_network(normal))
            except ValueError:
                hosts.add(normal)
        return cls(frozenset(hosts), tuple(networks))

    def allows_address(self, address: IPAddress) -> bool:
        """Whether ``address``, or the IPv4 address it embeds, is in a listed network."""
        candidates: list[IPAddress] = [address]
        if isinstance(address, ipaddress.IPv6Address):
            embedded = _embedded_ipv4(address)
            if embedded is not None:
                candidates.append(embedded)
        return any(a in network for a in candidates for network in self.networks)

    def check(self, host: str, addresses: Iterable[IPAddress]) -> None:
        """Raises :class:`DestinationRefused` unless ``host`` is listed or every one of its
        ``addresses`` is public or in a listed network. All of them, not just the first: which
        one a connection ends up using is not ours to choose."""
        if _host_key(host) in self.hosts:
            return
        for address in addresses:
            reason = refused_range(address)
            if reason is not None and not self.allows_address(address):
                raise DestinationRefused(host, address, reason)


async def resolve_host(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to for a TCP connection, in the resolver's order."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class _PinnedBackend(httpcore.AsyncNetworkBackend):
    """An httpcore network backend that resolves once, checks, and connects to an address
    it checked (by its IP literal, so the inner backend looks nothing up again)."""

    def __init__(self, policy: EgressPolicy, resolve: Resolver) -> None:
        self._policy = policy
        self._resolve = resolve
        self._inner = httpcore.AnyIOBackend()

    # httpcore's interface names the parameter `timeout`.
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        found = await self._addresses(host, port, timeout)
        self._policy.check(host, (address for _, address in found))
        failure: httpcore.ConnectError | None = None
        for text, _ in found:
            try:
                return await self._inner.connect_tcp(
                    text,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except httpcore.ConnectError as exc:
                failure = exc  # try the next address, as a connection by name would
        assert failure is not None
        raise failure

    async def _addresses(
        self, host: str, port: int, seconds: float | None
    ) -> list[tuple[str, IPAddress]]:
        literal = _literal(host)
        if literal is not None:
            return [(host, literal)]  # an address already: nothing to look up
        try:
            with anyio.fail_after(seconds):
                texts = await self._resolve(host, port)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"resolving {host} took longer than {seconds}s") from None
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        found: dict[str, IPAddress] = {}
        for text in texts:
            found.setdefault(text, ipaddress.ip_address(text))
        if not found:
            raise httpcore.ConnectError(f"{host} resolves to no address")
        return list(found.items())

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("http_request never connects to a unix socket")

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


# httpcore's exceptions as the httpx ones callers expect of a transport; subclasses first.
_HTTPX_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
)


@contextlib.contextmanager
def _as_httpx_errors(request: httpx.Request) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for core, mapped in _HTTPX_ERRORS:
            if isinstance(exc, core):
                raise mapped(str(exc), request=request) from exc
        raise


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, inner: AsyncIterable[bytes], request: httpx.Request) -> None:
        self._inner = inner
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx_errors(self._request):
            async for part in self._inner:
                yield part

    async def aclose(self) -> None:
        close: Any = getattr(self._inner, "aclose", None)
        if close is not None:
            await close()


class PinnedTransport(httpx.AsyncBaseTransport):
    """An httpx transport whose every connection goes through the address check of
    ``policy`` and then to an address checked. Plain HTTP/1.1, no proxy (a proxy would resolve
    the name itself, out of the check's sight), no unix sockets. ``resolve`` replaces the
    system resolver (tests)."""

    def __init__(
        self,
        policy: EgressPolicy,
        *,
        ssl_context: ssl.SSLContext,
        resolve: Resolver | None = None,
    ) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            network_backend=_PinnedBackend(policy, resolve or resolve_host),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Sends ``request`` over a checked connection (see :class:`EgressPolicy`)."""
        assert isinstance(request.stream, httpx.AsyncByteStream)
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _as_httpx_errors(request):
            response = await self._pool.handle_async_request(core)
        assert isinstance(response.stream, AsyncIterable)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream, request),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        """Closes every pooled connection."""
        await self._pool.aclose()
