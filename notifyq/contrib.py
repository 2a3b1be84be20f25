"""Extra built-in tasks that talk to the outside world: ``send_email`` (SMTP), ``http_request``
(a webhook call), and ``file_digest`` / ``file_gzip`` (confined to one folder).

Nothing here runs at import. :func:`contrib_tasks` builds the tasks as closures over a
:class:`ContribSettings`, read from the environment once at the entry point::

    from notifyq.builtins import worker_registry
    from notifyq.contrib import ContribSettings

    registry = worker_registry(contrib=ContribSettings.load())

Every handler validates its payload with a pydantic model (the ``*Payload`` classes below); a bad
payload fails the job at once with :class:`~notifyq.errors.PermanentFailure` naming the field.
A failure that may pass (a server answering 4xx over SMTP or 5xx over HTTP, a timeout, a refused
connection) raises :class:`TransientFailure` and the job is retried with backoff; one that will
not (a refused recipient, an HTTP 404, a path outside the root, a text that cannot be encoded)
raises ``PermanentFailure``, and so does any ValueError, LookupError or TypeError that escapes a
handler, since the same payload would raise it again at every attempt.

Safe by default: ``http_request`` reaches only public addresses, on every hop, unless
NOTIFYQ_HTTP_ALLOW lists more (:mod:`notifyq.egress`), and sends the payload's secrets to no
other origin; ``send_email`` never logs in without TLS unless told; the file tasks refuse a
file with several hard links.
"""

from __future__ import annotations

import codecs
import contextlib
import email.utils
import errno
import gzip
import hashlib
import json
import logging
import os
import re
import secrets
import smtplib
import ssl
import stat
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, TypeVar

import anyio
import httpx
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from notifyq._version import __version__
from notifyq.egress import DestinationRefused, EgressPolicy, PinnedTransport, normal_allow_entry
from notifyq.errors import ConfigurationError, InvalidJob, NotifyQError, PermanentFailure
from notifyq.models import encode_json
from notifyq.settings import describe_validation_error
from notifyq.tasks import Task, make_task

logger = logging.getLogger(__name__)

__all__ = [
    "ContribSettings",
    "EmailPayload",
    "FileDigestPayload",
    "FileGzipPayload",
    "HttpRequestPayload",
    "TransientFailure",
    "contrib_tasks",
]

#: Seconds a task may run past its own network timeout before the worker cancels it: our own
#: deadline fires first, so the worker's cancellation (which abandons a thread) is a last resort.
TIMEOUT_MARGIN = 5.0
MAX_REDIRECTS = 5
#: Bytes of a refused answer's body quoted in the job's error.
ERROR_EXCERPT = 200
CHUNK = 1024 * 1024

P = TypeVar("P", bound=BaseModel)


class TransientFailure(NotifyQError):
    """Raised by a contrib task for a failure that may pass by itself: an SMTP 4xx answer, an
    HTTP 5xx or 429, a timeout, a refused or dropped connection. Like any exception other than
    :class:`~notifyq.errors.PermanentFailure`, the job is retried with backoff."""


# -- settings ----------------------------------------------------------------------------------


def _blank_is_none(value: Any) -> Any:
    return None if isinstance(value, str) and not value.strip() else value


class ContribSettings(BaseSettings):
    """Settings of the contrib tasks, from ``NOTIFYQ_*`` environment variables. Immutable; build
    it once at the entry point with :meth:`load` and pass it to :func:`contrib_tasks`."""

    model_config = SettingsConfigDict(env_prefix="NOTIFYQ_", extra="ignore", frozen=True)

    smtp_host: str = Field(default="localhost", description="SMTP server that send_email uses.")
    smtp_port: int = Field(
        default=25,
        ge=1,
        le=65535,
        description="SMTP server port (25 or 587 with STARTTLS, 465 with implicit TLS).",
    )
    smtp_username: str | None = Field(
        default=None, description="User name to log in with (AUTH); unset means no login."
    )
    smtp_password: SecretStr | None = Field(default=None, description="Password for smtp_username.")
    smtp_starttls: bool = Field(
        default=False,
        description="Upgrade the connection with STARTTLS before logging in and sending; the "
        "job fails if the server does not offer it (never falls back to plain text).",
    )
    smtp_ssl: bool = Field(
        default=False, description="Implicit TLS: speak TLS from the first byte (port 465)."
    )
    smtp_ca_file: Path | None = Field(
        default=None,
        description="PEM file of the certificate authorities to trust for the SMTP server's "
        "certificate, instead of the system's (for a relay with a private CA).",
    )
    smtp_from: str | None = Field(
        default=None,
        description="Sender address for emails whose payload gives no 'from'; with neither, "
        "send_email fails.",
    )
    smtp_timeout: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Seconds one email may take in all: connect, TLS, login and sending.",
    )
    smtp_allow_plaintext_login: bool = Field(
        default=False,
        description="Allow logging in (NOTIFYQ_SMTP_USERNAME) over a connection without TLS, "
        "which sends the password in clear; without it such settings are refused.",
    )
    http_timeout: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Seconds one http_request may take in all, redirects included; a payload's "
        "'timeout' may only shorten it.",
    )
    http_max_response_bytes: int = Field(
        default=1024 * 1024,
        ge=0,
        description="Bytes of the (decompressed) response body kept in an http_request's "
        "result; the rest is not read and the result says 'truncated'.",
    )
    http_allow: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="Comma-separated host names, addresses and networks (CIDR) that "
        "http_request may reach although they are loopback, private, link-local, "
        "unique-local, CGNAT, multicast or reserved; none by default.",
    )
    http_trust_env: bool = Field(
        default=False,
        description="Let http_request take its trusted certificates from SSL_CERT_FILE and "
        "SSL_CERT_DIR. Proxy variables are never used: a proxy would resolve the host itself, "
        "out of reach of the address check.",
    )
    files_root: Path | None = Field(
        default=None,
        description="The only folder that file_digest and file_gzip may read and write; unset "
        "means the file tasks refuse to run.",
    )
    files_allow_hard_links: bool = Field(
        default=False,
        description="Let file_digest and file_gzip read a file that has more than one hard "
        "link; refused by default, since the other link may be outside NOTIFYQ_FILES_ROOT.",
    )

    @field_validator(
        "smtp_username", "smtp_password", "smtp_from", "smtp_ca_file", "files_root", mode="before"
    )
    @classmethod
    def _unset_when_blank(cls, value: Any) -> Any:
        return _blank_is_none(value)

    @field_validator("smtp_from")
    @classmethod
    def _sender_is_an_address(cls, value: str | None) -> str | None:
        return None if value is None else _check_address(value)

    @field_validator("http_allow", mode="before")
    @classmethod
    def _split_allow(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part for part in value.split(",") if part.strip())
        return value

    @field_validator("http_allow")
    @classmethod
    def _allow_entries(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(normal_allow_entry(entry) for entry in value))

    @model_validator(mode="after")
    def _consistent(self) -> ContribSettings:
        if self.smtp_ssl and self.smtp_starttls:
            raise ValueError(
                "NOTIFYQ_SMTP_SSL (implicit TLS) and NOTIFYQ_SMTP_STARTTLS exclude each other: "
                "set one, for port 465 or 587 respectively"
            )
        if (self.smtp_username is None) != (self.smtp_password is None):
            raise ValueError("set both NOTIFYQ_SMTP_USERNAME and NOTIFYQ_SMTP_PASSWORD, or neither")
        plaintext = not (self.smtp_ssl or self.smtp_starttls)
        if self.smtp_username is not None and plaintext and not self.smtp_allow_plaintext_login:
            raise ValueError(
                "NOTIFYQ_SMTP_USERNAME is set but the SMTP connection has no TLS, so the "
                "password would travel in clear: set NOTIFYQ_SMTP_STARTTLS=true (port 587) or "
                "NOTIFYQ_SMTP_SSL=true (port 465), or NOTIFYQ_SMTP_ALLOW_PLAINTEXT_LOGIN=true "
                "to log in without TLS anyway"
            )
        return self

    @classmethod
    def load(cls, **overrides: Any) -> ContribSettings:
        """Builds settings from the environment, with ``overrides`` winning.

        Raises :class:`~notifyq.errors.ConfigurationError` with one readable line per bad value.
        """
        given = {key: value for key, value in overrides.items() if value is not None}
        try:
            return cls(**given)
        except ValidationError as exc:
            raise ConfigurationError(describe_validation_error(exc)) from exc


def contrib_tasks(settings: ContribSettings) -> list[Task]:
    """The contrib tasks (``send_email``, ``http_request``, ``file_digest``, ``file_gzip``),
    bound to ``settings``."""
    return [
        make_task(
            _email_handler(settings),
            "send_email",
            max_attempts=5,
            timeout=settings.smtp_timeout + TIMEOUT_MARGIN,
        ),
        make_task(
            _http_handler(settings),
            "http_request",
            max_attempts=5,
            timeout=settings.http_timeout + TIMEOUT_MARGIN,
        ),
        make_task(_digest_handler(settings), "file_digest"),
        make_task(_gzip_handler(settings), "file_gzip"),
    ]


def _validate(model: type[P], payload: dict[str, Any], task: str) -> P:
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            where = ".".join(str(part) for part in error["loc"]) or "payload"
            problems.append(f"{where}: {error['msg'].removeprefix('Value error, ')}")
        raise PermanentFailure(f"{task}: invalid payload: {'; '.join(problems)}") from None


#: Exceptions that the same job would raise again on every attempt: a text that cannot be
#: encoded, an unknown codec, a value of the wrong kind, data nested too deep.
_NEVER_PASSES = (ValueError, LookupError, TypeError, RecursionError)


@contextlib.contextmanager
def _fails_for_good(task: str) -> Iterator[None]:
    """Turns an exception that no retry can cure into a PermanentFailure naming it, so such a
    job fails once instead of being retried with backoff until its attempts run out."""
    try:
        yield
    except _NEVER_PASSES as exc:
        # Not expected (each known case has its own message): keep the traceback in the log.
        logger.warning("%s failed for good on an unexpected error", task, exc_info=True)
        raise PermanentFailure(f"{task}: {type(exc).__name__}: {exc}") from exc


# -- send_email --------------------------------------------------------------------------------


#: What str.splitlines() breaks on, and the email package refuses in a header: CR and LF, but
#: also VT, FF, the file/group/record separators, NEL, U+2028 and U+2029.
_LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def _has_line_break(value: str) -> bool:
    return "\x00" in value or not _LINE_BREAKS.isdisjoint(value)


def _check_address(value: str) -> str:
    if _has_line_break(value):
        raise ValueError(
            "an address must not contain a line break (CR, LF, U+2028 and the like) or NUL"
        )
    parsed = email.utils.getaddresses([value])
    if len(parsed) != 1:
        raise ValueError(f"{value!r} is not one email address")
    address = parsed[0][1]
    local, at, domain = address.rpartition("@")
    if not (at and local and domain) or any(c.isspace() for c in address):
        raise ValueError(f"{value!r} is not an email address")
    return value


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _single_line(value: str) -> str:
    if _has_line_break(value):
        raise ValueError(
            "must be a single line (no CR, LF, U+2028 or other line break, and no NUL)"
        )
    return value


Address = Annotated[str, AfterValidator(_check_address)]
Addresses = Annotated[list[Address], BeforeValidator(_one_or_many)]


class EmailPayload(BaseModel):
    """The payload of ``send_email``. Every address may be ``"a@example.com"`` or
    ``"Name <a@example.com>"``; ``to``, ``cc``, ``bcc`` and ``reply_to`` take one address or a
    list. ``bcc`` recipients get the message but appear in no header."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    to: Addresses = Field(min_length=1)
    subject: Annotated[str, AfterValidator(_single_line)] = Field(max_length=998)
    text: str
    html: str | None = None
    cc: Addresses = Field(default_factory=list)
    bcc: Addresses = Field(default_factory=list)
    reply_to: Addresses = Field(default_factory=list)
    sender: Address | None = Field(default=None, alias="from")


def _bare(address: str) -> str:
    return email.utils.parseaddr(address)[1]


def _email_handler(settings: ContribSettings) -> Callable[[dict[str, Any]], dict[str, Any]]:
    # A plain function: Task.run calls it in a worker thread, where smtplib may block.
    def send_email(payload: dict[str, Any]) -> dict[str, Any]:
        """Sends an email over SMTP (see :class:`EmailPayload`); answers
        ``{"accepted": [...], "message_id": ...}``. A recipient the server refuses for good
        (5xx) fails the job without retries; a 4xx answer or a connection problem is retried."""
        with _fails_for_good("send_email"):
            mail = _validate(EmailPayload, payload, "send_email")
            sender = mail.sender or settings.smtp_from
            if sender is None:
                raise PermanentFailure(
                    "send_email: no sender: give 'from' in the payload or set NOTIFYQ_SMTP_FROM"
                )
            message, message_id = _compose(mail, sender)
            recipients = list(dict.fromkeys(_bare(a) for a in [*mail.to, *mail.cc, *mail.bcc]))
            refused = _deliver(settings, message, _bare(sender), recipients)
        result: dict[str, Any] = {
            "accepted": [r for r in recipients if r not in refused],
            "message_id": message_id,
        }
        if refused:
            # The others got the message, so a retry would send it to them twice: report it.
            logger.warning("send_email %s: some recipients refused: %s", message_id, refused)
            result["refused"] = {r: _smtp_reply(code, text) for r, (code, text) in refused.items()}
        return result

    return send_email


def _compose(mail: EmailPayload, sender: str) -> tuple[EmailMessage, str]:
    """The message and its Message-ID. Rendered once here, before any connection, so that a
    text the email package cannot encode fails the job at once rather than at every attempt."""
    try:
        message = EmailMessage()
        message["From"] = sender
        message["To"] = ", ".join(mail.to)
        if mail.cc:
            message["Cc"] = ", ".join(mail.cc)
        if mail.reply_to:
            message["Reply-To"] = ", ".join(mail.reply_to)
        message["Subject"] = mail.subject
        message["Date"] = email.utils.formatdate(localtime=True)
        # The sender's domain, not socket.getfqdn(): that may wait on a DNS lookup.
        message_id = email.utils.make_msgid(domain=_bare(sender).rpartition("@")[2])
        message["Message-ID"] = message_id
        message.set_content(mail.text)
        if mail.html is not None:
            message.add_alternative(mail.html, subtype="html")
        message.as_bytes()
    except (ValueError, LookupError) as exc:  # UnicodeEncodeError is a ValueError
        raise PermanentFailure(f"send_email: the message cannot be written: {exc}") from None
    return message, message_id


def _smtp_reply(code: int, text: bytes | str) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return f"{code} {text}".replace("\x00", "")


def _tls_context(settings: ContribSettings) -> ssl.SSLContext:
    ca = settings.smtp_ca_file
    return ssl.create_default_context(cafile=None if ca is None else str(ca))


def _narrow(smtp: smtplib.SMTP, seconds: float) -> None:
    if smtp.sock is not None:
        smtp.sock.settimeout(seconds)


def _deliver(
    settings: ContribSettings, message: EmailMessage, sender: str, recipients: list[str]
) -> dict[str, tuple[int, bytes]]:
    """Sends ``message``; answers the recipients refused while others were accepted."""
    host, port = settings.smtp_host, settings.smtp_port
    where = f"SMTP server {host}:{port}"
    deadline = time.monotonic() + settings.smtp_timeout

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{where} took longer than {settings.smtp_timeout:g}s")
        return left

    context = _tls_context(settings) if settings.smtp_ssl or settings.smtp_starttls else None
    try:
        smtp: smtplib.SMTP
        if settings.smtp_ssl:
            smtp = smtplib.SMTP_SSL(host, port, timeout=remaining(), context=context)
        else:
            smtp = smtplib.SMTP(host, port, timeout=remaining())
        try:
            # smtplib's timeout holds for each socket operation; narrowing it before each step
            # makes it a deadline for the whole exchange.
            if settings.smtp_starttls:
                _narrow(smtp, remaining())
                smtp.starttls(context=context)
            if settings.smtp_username is not None and settings.smtp_password is not None:
                _narrow(smtp, remaining())
                smtp.login(settings.smtp_username, settings.smtp_password.get_secret_value())
            _narrow(smtp, remaining())
            return smtp.send_message(message, from_addr=sender, to_addrs=recipients)
        finally:
            # Not `with smtp`: its QUIT raises on an odd answer, after the message went out.
            try:
                smtp.quit()
            except (smtplib.SMTPException, OSError):
                smtp.close()
    except smtplib.SMTPRecipientsRefused as exc:
        replies = {r: (code, _smtp_reply(code, text)) for r, (code, text) in exc.recipients.items()}
        permanent = {r: reply for r, (code, reply) in replies.items() if 500 <= code < 600}
        if permanent:
            named = "; ".join(f"{r}: {reply}" for r, reply in permanent.items())
            raise PermanentFailure(f"{where} refused recipient(s) {named}") from None
        named = "; ".join(f"{r}: {reply}" for r, (_, reply) in replies.items())
        raise TransientFailure(f"{where} refused recipient(s) for now: {named}") from None
    except smtplib.SMTPNotSupportedError as exc:
        raise PermanentFailure(f"{where} does not support what is configured: {exc}") from None
    except smtplib.SMTPResponseException as exc:
        # Sender refused, login refused, message refused, greeting refused: the server says
        # whether to try again (4xx) or not (5xx).
        reply = f"{type(exc).__name__}: {_smtp_reply(exc.smtp_code, exc.smtp_error)}"
        if 500 <= exc.smtp_code < 600:
            raise PermanentFailure(f"{where} answered {reply}") from None
        raise TransientFailure(f"{where} answered {reply}") from exc
    except (smtplib.SMTPException, OSError) as exc:
        # Refused or dropped connections, TLS errors, timeouts (TimeoutError is an OSError).
        raise TransientFailure(f"{where}: {type(exc).__name__}: {exc}") from exc


# -- http_request ------------------------------------------------------------------------------

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


def _http_handler(settings: ContribSettings) -> Callable[[dict[str, Any]], Any]:
    policy = EgressPolicy.parse(settings.http_allow)

    async def http_request(payload: dict[str, Any]) -> dict[str, Any]:
        """Makes an HTTP request (see :class:`HttpRequestPayload`), following up to 5 redirects
        to http(s) URLs. Every connection, the first and each redirect's, goes only to an
        address that is public or allowed by NOTIFYQ_HTTP_ALLOW (see :mod:`notifyq.egress`);
        any other fails the job without retries, naming the address. A 2xx answer gives
        ``{"status", "headers", "body", "json", "url", "truncated"}``; 5xx, 408, 425, 429,
        timeouts and connection errors are retried; any other answer fails the job without
        retries."""
        with _fails_for_good("http_request"):
            return await _http_request(settings, policy, payload)

    return http_request


async def _http_request(
    settings: ContribSettings, policy: EgressPolicy, payload: dict[str, Any]
) -> dict[str, Any]:
    request = _validate(HttpRequestPayload, payload, "http_request")
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


# -- file_digest and file_gzip -----------------------------------------------------------------


class FileDigestPayload(BaseModel):
    """The payload of ``file_digest``: ``path``, relative to NOTIFYQ_FILES_ROOT."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)


class FileGzipPayload(BaseModel):
    """The payload of ``file_gzip``: ``path`` and optional ``dest`` (default ``path + ".gz"``),
    both relative to NOTIFYQ_FILES_ROOT; an existing ``dest`` is replaced only with
    ``"overwrite": true``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)
    dest: str | None = Field(default=None, min_length=1)
    overwrite: bool = False


@dataclass(frozen=True, slots=True)
class _Place:
    """A confined path: the real root, the real path's components under it, and the path as
    the payload gave it (for messages)."""

    root: Path
    parts: tuple[str, ...]
    given: str


def _root(settings: ContribSettings, task: str) -> Path:
    if settings.files_root is None:
        raise PermanentFailure(
            f"{task} is disabled: set NOTIFYQ_FILES_ROOT to the folder the file tasks may use"
        )
    try:
        root = settings.files_root.resolve(strict=True)
    except OSError as exc:
        raise PermanentFailure(
            f"{task}: NOTIFYQ_FILES_ROOT={settings.files_root} cannot be used: {exc}"
        ) from None
    if not root.is_dir():
        raise PermanentFailure(f"{task}: NOTIFYQ_FILES_ROOT={settings.files_root} is no folder")
    return root


def _confine(root: Path, given: str, task: str, *, parent_only: bool = False) -> _Place:
    """Where ``given`` really is under ``root``, refusing any way out of it. Only looks at
    names (lstat and readlink); opens nothing.

    With ``parent_only``, the last component is kept as given (it may not exist yet) and only
    the folder holding it is resolved."""
    if "\x00" in given:
        raise PermanentFailure(f"{task}: path {given!r} contains NUL")
    relative = PurePosixPath(given)
    if relative.is_absolute():
        raise PermanentFailure(
            f"{task}: path {given!r} is absolute; give a path relative to NOTIFYQ_FILES_ROOT"
        )
    if ".." in relative.parts:
        raise PermanentFailure(f"{task}: path {given!r} contains '..', which is not allowed")
    if not relative.parts or relative.parts == (".",):
        raise PermanentFailure(f"{task}: path {given!r} names the root folder itself")
    try:
        if parent_only:
            folder = Path(os.path.realpath(root.joinpath(*relative.parts[:-1])))
            real = folder / relative.name
        else:
            # Not strict: a dangling symlink still resolves to where it points, to be judged.
            real = Path(os.path.realpath(root.joinpath(*relative.parts)))
    except OSError as exc:
        # Even when not strict, realpath fails on a link removed while it reads it.
        raise _path_error(exc, given, task) from None
    if real == root or not real.is_relative_to(root):
        raise PermanentFailure(
            f"{task}: path {given!r} leads outside NOTIFYQ_FILES_ROOT (through '..', a "
            "symlink or a symlinked folder); refusing to touch it"
        )
    return _Place(root, real.relative_to(root).parts, given)


@contextlib.contextmanager
def _folder(place: _Place, task: str) -> Iterator[int]:
    """A descriptor of the folder holding ``place``, opened one component at a time from the
    root without following any symlink: a folder swapped for a symlink after :func:`_confine`
    looked at it makes this fail instead of leading out of the root."""
    fd = os.open(place.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in place.parts[:-1]:
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise _path_error(exc, place.given, task) from None
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


def _path_error(exc: OSError, given: str, task: str) -> Exception:
    """The failure to raise for ``exc``: a permanent one when the path is the problem."""
    if isinstance(exc, FileNotFoundError):
        return PermanentFailure(f"{task}: {given!r} does not exist")
    if exc.errno == errno.ENOTDIR:
        return PermanentFailure(
            f"{task}: {given!r}: a part of it is not a folder (a file, or a symlink that "
            "appeared while it was being opened); refusing to follow it"
        )
    if exc.errno == errno.ELOOP:
        return PermanentFailure(
            f"{task}: {given!r} changed into a symlink while being opened; refusing to follow it"
        )
    if isinstance(exc, PermissionError):
        return PermanentFailure(f"{task}: {given!r}: permission denied")
    if exc.errno == errno.EINVAL:  # readlink on what stopped being a symlink
        return PermanentFailure(f"{task}: {given!r} changed while being resolved")
    return exc


def _open_regular(
    place: _Place, folder: int, task: str, settings: ContribSettings
) -> tuple[int, os.stat_result]:
    """Opens the regular file ``place`` for reading, or fails without opening anything else.
    A file with more than one hard link is refused unless NOTIFYQ_FILES_ALLOW_HARD_LINKS: a
    link made inside the root to a file outside it is the same file, and no path check can
    tell (the other name may be anywhere on the file system)."""
    name = place.parts[-1]
    try:
        # Looked at first, so a FIFO or a device is never opened (opening one may block or act).
        info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):  # only a link that realpath could not resolve: a loop
            raise PermanentFailure(f"{task}: {place.given!r} is a symlink that loops")
        _check_regular(info, place, task, settings)
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except OSError as exc:
        raise _path_error(exc, place.given, task) from None
    try:
        # Again on what was opened: the name may have changed hands since it was looked at.
        info = os.fstat(fd)
        _check_regular(info, place, task, settings)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def _check_regular(
    info: os.stat_result, place: _Place, task: str, settings: ContribSettings
) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise PermanentFailure(f"{task}: {place.given!r} is not a regular file")
    if info.st_nlink > 1 and not settings.files_allow_hard_links:
        raise PermanentFailure(
            f"{task}: {place.given!r} has {info.st_nlink} hard links, and another link may be "
            "outside NOTIFYQ_FILES_ROOT; refusing to read it (set "
            "NOTIFYQ_FILES_ALLOW_HARD_LINKS=true to allow files with several links)"
        )


def _digest_handler(settings: ContribSettings) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def file_digest(payload: dict[str, Any]) -> dict[str, Any]:
        """Reads a file under NOTIFYQ_FILES_ROOT in chunks and answers ``{"path", "size",
        "sha256", "lines"}``. ``lines`` counts line breaks, plus one for a last line without
        one (so ``"a\\nb"`` has 2 lines, where ``wc -l`` says 1)."""
        with _fails_for_good("file_digest"):
            request = _validate(FileDigestPayload, payload, "file_digest")
            place = _confine(_root(settings, "file_digest"), request.path, "file_digest")
            with _folder(place, "file_digest") as folder:
                fd, _ = _open_regular(place, folder, "file_digest", settings)
                with os.fdopen(fd, "rb") as source:
                    size, sha256, lines = _scan(source, None)
        return {"path": request.path, "size": size, "sha256": sha256, "lines": lines}

    return file_digest


def _scan(source: Any, sink: Any) -> tuple[int, str, int]:
    """Reads ``source`` to the end in chunks, copying to ``sink`` if given; answers the size,
    the SHA-256 and the number of lines."""
    digest = hashlib.sha256()
    size = lines = 0
    last = b""
    while chunk := source.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
        lines += chunk.count(b"\n")
        last = chunk[-1:]
        if sink is not None:
            sink.write(chunk)
    if size and last != b"\n":
        lines += 1
    return size, digest.hexdigest(), lines


def _gzip_handler(settings: ContribSettings) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def file_gzip(payload: dict[str, Any]) -> dict[str, Any]:
        """Compresses a file under NOTIFYQ_FILES_ROOT to ``dest`` (default ``path + ".gz"``,
        also under the root), written to a temporary file in the same folder and then renamed
        into place, so ``dest`` is never seen half-written. Answers ``{"path", "dest", "size",
        "gzip_size", "sha256"}``, the size and SHA-256 being the original's."""
        with _fails_for_good("file_gzip"):
            request = _validate(FileGzipPayload, payload, "file_gzip")
            root = _root(settings, "file_gzip")
            source = _confine(root, request.path, "file_gzip")
            dest_given = request.dest or request.path + ".gz"
            dest = _confine(root, dest_given, "file_gzip", parent_only=True)
            with _folder(source, "file_gzip") as source_folder:
                fd, info = _open_regular(source, source_folder, "file_gzip", settings)
                with os.fdopen(fd, "rb") as reader, _folder(dest, "file_gzip") as dest_folder:
                    _check_dest(dest, dest_folder, info, request.overwrite)
                    size, sha256, gzip_size = _write_gzip(
                        reader, dest, dest_folder, info, request.overwrite
                    )
        return {
            "path": request.path,
            "dest": dest_given,
            "size": size,
            "gzip_size": gzip_size,
            "sha256": sha256,
        }

    return file_gzip


def _check_dest(dest: _Place, folder: int, source: os.stat_result | None, overwrite: bool) -> None:
    try:
        existing = os.stat(dest.parts[-1], dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return
    if source is not None and (existing.st_dev, existing.st_ino) == (source.st_dev, source.st_ino):
        raise PermanentFailure(f"file_gzip: dest {dest.given!r} is the source file")
    if stat.S_ISDIR(existing.st_mode):
        raise PermanentFailure(f"file_gzip: dest {dest.given!r} is a folder")
    if not overwrite:
        raise PermanentFailure(
            f'file_gzip: dest {dest.given!r} exists; pass "overwrite": true to replace it'
        )


def _write_gzip(
    reader: Any, dest: _Place, folder: int, source: os.stat_result, overwrite: bool
) -> tuple[int, str, int]:
    name = dest.parts[-1]
    temporary = f".{name[:200]}.{secrets.token_hex(6)}.tmp"
    fd = os.open(
        temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder
    )
    try:
        # The archive is as private as the original, as with gzip(1).
        os.fchmod(fd, stat.S_IMODE(source.st_mode))
        with os.fdopen(fd, "wb") as raw:
            with gzip.GzipFile(
                filename=name.removesuffix(".gz"),
                mode="wb",
                fileobj=raw,
                compresslevel=6,
                mtime=source.st_mtime,
            ) as compressed:
                size, sha256, _ = _scan(reader, compressed)
            raw.flush()
            os.fsync(raw.fileno())
            gzip_size = os.fstat(raw.fileno()).st_size
        _publish(temporary, name, folder, overwrite, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=folder)
        raise
    # The rename is durable once the folder is.
    os.fsync(folder)
    return size, sha256, gzip_size


def _publish(temporary: str, name: str, folder: int, overwrite: bool, dest: _Place) -> None:
    """Moves the finished file into place: a rename when replacing is allowed; else a hard
    link, which fails if ``name`` appeared meanwhile, where a rename would replace it."""
    if overwrite:
        os.rename(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
        return
    try:
        os.link(temporary, name, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
    except FileExistsError:
        raise PermanentFailure(
            f'file_gzip: dest {dest.given!r} exists; pass "overwrite": true to replace it'
        ) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        # A file system without hard links: check, then rename (a narrow race).
        _check_dest(dest, folder, None, overwrite)
        os.rename(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
        return
    os.unlink(temporary, dir_fd=folder)
