"""``http_request``: one HTTP request (a webhook call) and the redirects it leads to, each
connection checked by :mod:`notifyq.contrib.egress`; the body is read, and decompressed, never
past NOTIFYQ_HTTP_MAX_RESPONSE_BYTES."""

from __future__ import annotations

import codecs
import json
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import anyio
import httpx
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from notifyq._version import __version__
from notifyq.contrib._shared import TransientFailure, fails_for_good, validate_payload
from notifyq.contrib.egress import DestinationRefused, EgressPolicy, PinnedTransport
from notifyq.contrib.settings import ContribSettings
from notifyq.errors import InvalidJob, PermanentFailure
from notifyq.models import encode_json

__all__ = ["HttpRequestPayload", "http_handler"]


#: Redirects followed before the job fails.
MAX_REDIRECTS = 5
#: Bytes of a refused answer's body quoted in the job's error.
ERROR_EXCERPT = 200

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: What a header value may hold: visible ASCII, space and tab (httpx sends headers as ASCII).
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
_RETRIED_STATUSES = frozenset({408, 425, 429})
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: The payload's headers that go along on a redirect to another origin (scheme, host, port);
#: the others (API keys, tokens, cookies, signatures) were meant for the first origin only.
CROSS_ORIGIN_HEADERS = frozenset({"accept", "accept-language", "user-agent", "content-type"})
#: The content codings http_request asks for; it decodes them itself, with a bounded buffer.
ACCEPT_ENCODING = "gzip, deflate"
_DEFAULT_PORTS = {"http": 80, "https": 443}
_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_url(value: str) -> str:
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL as exc:
        raise ValueError(f"not a valid URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError("must be an absolute http:// or https:// URL")
    return value


def _check_headers(value: dict[str, str]) -> dict[str, str]:
    for name, text in value.items():
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"{name!r} is not a valid header name")
        if any(c in text for c in "\r\n\x00"):
            raise ValueError(f"header {name!r}: a value must not contain CR, LF or NUL")
        if not _HEADER_VALUE.fullmatch(text):
            raise ValueError(
                f"header {name!r}: a value may hold only printable ASCII, spaces and tabs "
                "(no control character, nothing beyond U+007E); encode other text first, "
                "for example as RFC 8187 or base64"
            )
    return value


class HttpRequestPayload(BaseModel):
    """The payload of ``http_request``: ``url`` (http or https), ``method`` (default GET),
    ``headers``, and at most one body: ``json`` (any JSON value, sent as application/json) or
    ``body`` (text, sent as UTF-8). ``timeout`` may shorten NOTIFYQ_HTTP_TIMEOUT, never
    lengthen it. Header values are printable ASCII."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: Annotated[str, AfterValidator(_check_url)]
    method: Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] = "GET"
    headers: Annotated[dict[str, str], AfterValidator(_check_headers)] = Field(default_factory=dict)
    json_body: Any = Field(default=None, alias="json")
    body: str | None = None
    timeout: float | None = Field(default=None, gt=0)

    @field_validator("method", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_body(self) -> HttpRequestPayload:
        if "json_body" in self.model_fields_set and self.body is not None:
            raise ValueError("give 'json' or 'body', not both")
        return self


class _Refused(Exception):
    """A request chain that will not be followed; the handler reports it as a
    PermanentFailure naming the request."""


@dataclass(frozen=True, slots=True)
class _Hop:
    """One request of a chain of redirects."""

    method: str
    url: httpx.URL
    headers: httpx.Headers
    content: bytes | None

    def redirected(self, status: int, target: httpx.URL) -> _Hop:
        """The request that follows a ``status`` redirect to ``target``: the method and body as
        browsers (and httpx) change them, and of the headers only :data:`CROSS_ORIGIN_HEADERS`
        when the origin changes. Once dropped, a header stays dropped, even on the way back."""
        method, content, headers = self.method, self.content, httpx.Headers(self.headers)
        if (status in (302, 303) and method != "HEAD") or (status == 301 and method == "POST"):
            if method != "GET":
                content = None
                for name in ("content-type", "content-length", "transfer-encoding"):
                    headers.pop(name, None)
            method = "GET"
        if _origin(target) != _origin(self.url):
            kept = [(k, v) for k, v in headers.multi_items() if k.lower() in CROSS_ORIGIN_HEADERS]
            headers = httpx.Headers(kept)
        return _Hop(method, target, headers, content)


def _origin(url: httpx.URL) -> tuple[str, str, int]:
    return url.scheme, url.host, url.port or _DEFAULT_PORTS[url.scheme]


def http_handler(settings: ContribSettings) -> Callable[[dict[str, Any]], Any]:
    policy = EgressPolicy.parse(settings.http_allow)

    async def http_request(payload: dict[str, Any]) -> dict[str, Any]:
        """Makes an HTTP request (see :class:`HttpRequestPayload`), following up to 5 redirects
        to http(s) URLs. Every connection, the first and each redirect's, goes only to an
        address that is public or allowed by NOTIFYQ_HTTP_ALLOW (see :mod:`notifyq.contrib.egress`);
        any other fails the job without retries, naming the address. A 2xx answer gives
        ``{"status", "headers", "body", "json", "url", "truncated"}``; 5xx, 408, 425, 429,
        timeouts and connection errors are retried; any other answer fails the job without
        retries."""
        with fails_for_good("http_request"):
            return await _http_request(settings, policy, payload)

    return http_request


async def _http_request(
    settings: ContribSettings, policy: EgressPolicy, payload: dict[str, Any]
) -> dict[str, Any]:
    request = validate_payload(HttpRequestPayload, payload, "http_request")
    timeout = min(request.timeout or settings.http_timeout, settings.http_timeout)
    what = f"{request.method} {_redacted(request.url)}"
    content, content_type = _request_body(request)
    headers = httpx.Headers(request.headers)
    if content_type is not None:
        headers.setdefault("content-type", content_type)
    headers.setdefault("user-agent", f"notifyq/{__version__}")
    first = _Hop(request.method, httpx.URL(request.url), headers, content)
    ssl_context = httpx.create_ssl_context(trust_env=settings.http_trust_env)
    try:
        with anyio.fail_after(timeout):
            async with httpx.AsyncClient(
                transport=PinnedTransport(policy, ssl_context=ssl_context),
                timeout=timeout,
                trust_env=False,
                headers={"accept-encoding": ACCEPT_ENCODING},
            ) as client:
                response, raw, truncated = await _follow(
                    client, first, settings.http_max_response_bytes
                )
    except _Refused as exc:
        raise PermanentFailure(f"{what}: {exc}") from None
    except TimeoutError:
        raise TransientFailure(f"{what}: no complete answer within {timeout:g}s") from None
    except httpx.TimeoutException as exc:
        raise TransientFailure(f"{what}: timed out ({type(exc).__name__})") from None
    except (httpx.UnsupportedProtocol, httpx.LocalProtocolError) as exc:
        # The request itself cannot be sent as given: no retry will change that.
        raise PermanentFailure(f"{what}: {type(exc).__name__}: {exc}") from None
    except httpx.RequestError as exc:
        raise TransientFailure(f"{what}: {type(exc).__name__}: {exc}") from exc
    return _result(response, raw, truncated, what)


def _request_body(request: HttpRequestPayload) -> tuple[bytes | None, str | None]:
    """The body to send and the content type it implies; a body that cannot be sent (an
    unpaired surrogate is no UTF-8, NaN no JSON) fails the job at once, naming the field."""
    field = "json"
    try:
        if "json_body" in request.model_fields_set:
            # Encoded here: httpx takes json=None for "no body", where we mean JSON null.
            text = json.dumps(request.json_body, ensure_ascii=False, allow_nan=False)
            return text.encode(), "application/json"
        field = "body"
        return (None if request.body is None else request.body.encode()), None
    except (ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        raise PermanentFailure(
            f"http_request: invalid payload: {field}: cannot be sent: {exc}"
        ) from None


async def _follow(
    client: httpx.AsyncClient, hop: _Hop, limit: int
) -> tuple[httpx.Response, bytes, bool]:
    """Sends ``hop`` and the redirects that follow it (each new connection is checked by the
    transport), and answers the last response with the start of its body: at most ``limit``
    bytes of a success, :data:`ERROR_EXCERPT` of anything else."""
    for redirects in range(MAX_REDIRECTS + 1):
        request = client.build_request(
            hop.method, hop.url, headers=hop.headers, content=hop.content
        )
        try:
            response = await client.send(request, stream=True)
        except DestinationRefused as exc:
            where = "" if redirects == 0 else f"redirected to {_redacted(str(hop.url))}: "
            raise _Refused(f"{where}{exc}") from None
        try:
            target = _redirect_target(response)
            if target is None:
                kept = limit if response.is_success else ERROR_EXCERPT
                raw, truncated = await _read_at_most(response, kept)
                return response, raw, truncated
        finally:
            await response.aclose()
        hop = hop.redirected(response.status_code, target)
    raise _Refused(f"more than {MAX_REDIRECTS} redirects")


def _redirect_target(response: httpx.Response) -> httpx.URL | None:
    """Where ``response`` redirects to, or None when it is no redirect."""
    location = response.headers.get("location")
    if response.status_code not in _REDIRECT_STATUSES or location is None:
        return None
    try:
        target = response.url.join(location)
    except httpx.InvalidURL as exc:
        raise _Refused(f"the redirect's Location {location[:200]!r} is no URL: {exc}") from None
    if target.scheme not in ("http", "https"):
        raise _Refused(f"refusing to follow a redirect to a {target.scheme}: URL")
    if not target.host:
        raise _Refused(f"the redirect's Location {location[:200]!r} names no host")
    return target


def _result(response: httpx.Response, raw: bytes, truncated: bool, what: str) -> dict[str, Any]:
    text = _decode(raw, response.charset_encoding)
    status = response.status_code
    if not response.is_success:
        excerpt = text + ("..." if truncated else "")
        message = f"{what}: HTTP {status} {response.reason_phrase}: {excerpt!r}"
        retry_after = response.headers.get("retry-after")
        if retry_after:
            message += f" (Retry-After: {retry_after})"
        if status >= 500 or status in _RETRIED_STATUSES:
            raise TransientFailure(message)
        raise PermanentFailure(message)
    return {
        "status": status,
        "url": str(response.url),
        "headers": dict(response.headers.items()),
        "body": text,
        "truncated": truncated,
        "json": None if truncated else _parse_json(response, text),
    }


def _redacted(url: str) -> str:
    """``url`` without its user info and query, which may hold secrets, for errors and logs."""
    parsed = httpx.URL(url)
    shown = parsed.copy_with(userinfo=b"", query=None, fragment=None)
    return str(shown) + ("?..." if parsed.query else "")


class _Identity:
    """The body as it came: no content coding, or one that was not asked for."""

    def decompress(self, data: bytes, max_length: int) -> bytes:
        return data[:max_length]


class _Inflate:
    """A gzip or deflate body, decompressed at most ``max_length`` bytes at a time."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self._gzip = coding != "deflate"
        self._zlib = zlib.decompressobj(zlib.MAX_WBITS | 16 if self._gzip else zlib.MAX_WBITS)
        self._first = True

    def decompress(self, data: bytes, max_length: int) -> bytes:
        first, self._first = self._first, False
        try:
            return self._zlib.decompress(data, max_length)
        except zlib.error:
            if self._gzip or not first:
                raise
        # "deflate" means zlib-wrapped, but some servers send the raw stream.
        self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
        return self._zlib.decompress(data, max_length)


async def _read_at_most(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """The first ``limit`` bytes of the decoded body, and whether there was more. Reads the raw
    bytes and decompresses them here, never more than one byte past ``limit`` (zlib keeps the
    rest of its input unread), so a small body that inflates to gigabytes costs no more than
    the limit; reads no further, so a huge or endless body costs nothing either."""
    coding = response.headers.get("content-encoding", "").strip().lower()
    decoder = _Inflate(coding) if coding in ("gzip", "x-gzip", "deflate") else _Identity()
    kept = bytearray()
    async for chunk in response.aiter_raw():
        try:
            # The one byte past the limit is how we know that there was more.
            kept += decoder.decompress(chunk, limit + 1 - len(kept))
        except zlib.error as exc:
            raise httpx.DecodingError(
                f"the body is not valid {coding}: {exc}", request=response.request
            ) from None
        if len(kept) > limit:
            return bytes(kept[:limit]), True
    return bytes(kept), False


def _decode(raw: bytes, charset: str | None) -> str:
    try:
        text = raw.decode(codecs.lookup(charset or "utf-8").name, "replace")
    except (LookupError, ValueError):
        # An unknown charset, a codec that is no text encoding (hex, rot13) or one that cannot
        # replace (idna): read the body as UTF-8, as for no charset at all. Failing here would
        # be no better, since the request was made and answered.
        text = raw.decode("utf-8", "replace")
    # PostgreSQL's jsonb cannot hold NUL or an unpaired surrogate (which an escape codec can
    # make), and the result is stored there.
    return _SURROGATE.sub("\ufffd", text.replace("\x00", "\ufffd"))


def _parse_json(response: httpx.Response, text: str) -> Any:
    media_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        return None
    try:
        value = json.loads(text)
        encode_json(value, what="the response")
    except (ValueError, RecursionError, InvalidJob):
        return None
    return value
