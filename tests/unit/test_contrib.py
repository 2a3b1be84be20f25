"""The contrib tasks against real peers, without a database: their settings, an SMTP server
(aiosmtpd) and an HTTP server (uvicorn) started by the tests on 127.0.0.1, files under a
temporary root; each task called as a worker would call it.

The tests here need no database; those that do are in tests/test_contrib.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import email
import email.policy
import gzip
import hashlib
import json
import os
import socket
import ssl
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import aiosmtpd.controller
import aiosmtpd.smtp
import pytest
import uvicorn

from notifyq.contrib import ContribSettings, TransientFailure, contrib_tasks
from notifyq.errors import ConfigurationError, PermanentFailure
from notifyq.tasks import Task


@pytest.fixture(autouse=True)
def _no_contrib_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings come from each test alone, not from NOTIFYQ_* variables of the machine."""
    for name in ContribSettings.model_fields:
        monkeypatch.delenv(f"NOTIFYQ_{name.upper()}", raising=False)


def tasks(**overrides: Any) -> dict[str, Task]:
    """The contrib tasks by name, with test defaults and ``overrides``."""
    fields: dict[str, Any] = {
        "smtp_host": "127.0.0.1",
        "smtp_port": 25,
        "smtp_from": "Queue <queue@example.com>",
        "smtp_timeout": 10.0,
        "http_timeout": 10.0,
        # The test peers listen on loopback, which http_request refuses unless allowed.
        "http_allow": "127.0.0.1",
        "files_root": None,
    }
    fields.update(overrides)
    return {task.name: task for task in contrib_tasks(ContribSettings(**fields))}


async def run(task: Task, payload: dict[str, Any]) -> Any:
    return await task.run(payload, None)


def wait_for(condition: Callable[[], Any], timeout: float = 10.0) -> None:
    """Blocks until ``condition()`` is truthy, for threads that start servers."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.005)


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 bound but not listening, so a connection to it is refused; held for
    the whole block so that nothing else takes it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NOTIFYQ_SMTP_PORT", "587")
    monkeypatch.setenv("NOTIFYQ_SMTP_STARTTLS", "true")
    monkeypatch.setenv("NOTIFYQ_SMTP_USERNAME", "user")
    monkeypatch.setenv("NOTIFYQ_SMTP_PASSWORD", "secret")
    monkeypatch.setenv("NOTIFYQ_FILES_ROOT", str(tmp_path))
    monkeypatch.setenv("NOTIFYQ_SMTP_FROM", "")
    settings = ContribSettings.load()
    assert settings.smtp_port == 587 and settings.smtp_starttls
    assert settings.smtp_password is not None
    assert settings.smtp_password.get_secret_value() == "secret"
    assert "secret" not in repr(settings)
    assert settings.files_root == tmp_path and settings.smtp_from is None
    assert settings.http_max_response_bytes == 1024 * 1024
    # Safe by default: no address of a refused range allowed, the environment not trusted,
    # no login in clear, no file with several hard links.
    assert settings.http_allow == () and settings.http_trust_env is False
    assert settings.smtp_allow_plaintext_login is False
    assert settings.files_allow_hard_links is False
    monkeypatch.setenv("NOTIFYQ_HTTP_ALLOW", "hooks.internal,10.0.0.0/8")
    monkeypatch.setenv("NOTIFYQ_HTTP_TRUST_ENV", "true")
    monkeypatch.setenv("NOTIFYQ_FILES_ALLOW_HARD_LINKS", "true")
    changed = ContribSettings.load()
    assert changed.http_allow == ("hooks.internal", "10.0.0.0/8")
    assert changed.http_trust_env and changed.files_allow_hard_links


def test_settings_refuse_contradictions(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="exclude each other"):
        ContribSettings.load(smtp_ssl=True, smtp_starttls=True)
    with pytest.raises(ConfigurationError, match="NOTIFYQ_SMTP_PASSWORD"):
        ContribSettings.load(smtp_username="user")
    with pytest.raises(ConfigurationError, match="NOTIFYQ_SMTP_FROM"):
        ContribSettings.load(smtp_from="not an address")
    monkeypatch.setenv("NOTIFYQ_HTTP_TIMEOUT", "-1")
    with pytest.raises(ConfigurationError, match="NOTIFYQ_HTTP_TIMEOUT"):
        ContribSettings.load()


@dataclass
class Received:
    sender: str
    recipients: list[str]
    message: EmailMessage


class Mailbox:
    """An aiosmtpd handler that keeps what it receives; ``refuse`` maps an address to the
    reply its RCPT gets instead of 250."""

    def __init__(self, refuse: dict[str, str] | None = None) -> None:
        self.refuse = refuse or {}
        self.received: list[Received] = []

    async def handle_MAIL(
        self, server: Any, session: Any, envelope: Any, address: str, mail_options: list[str]
    ) -> str:
        if address in self.refuse:
            return self.refuse[address]
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: list[str]
    ) -> str:
        if address in self.refuse:
            return self.refuse[address]
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        self.received.append(Received(envelope.mail_from, list(envelope.rcpt_tos), message))
        return "250 Message accepted for delivery"


class SMTPServer(aiosmtpd.controller.Controller):  # type: ignore[misc]
    """aiosmtpd's threaded server on a port the system picked, already bound when it starts
    (no window in which another process could take a free port)."""

    def __init__(self, handler: Any, **kwargs: Any) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        port = self._sock.getsockname()[1]
        super().__init__(handler, hostname="127.0.0.1", port=port, **kwargs)

    def _create_server(self) -> Any:
        return self.loop.create_server(self._factory_invoker, sock=self._sock, ssl=self.ssl_context)


@contextlib.contextmanager
def smtp_servers() -> Iterator[Callable[..., SMTPServer]]:
    """Starts SMTP servers (keyword arguments go to aiosmtpd); stops them after the test."""
    started: list[SMTPServer] = []

    def start(handler: Mailbox, **kwargs: Any) -> SMTPServer:
        server = SMTPServer(handler, **kwargs)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def smtp_server() -> Iterator[Callable[..., SMTPServer]]:
    """Starts SMTP servers, stopped after the test (see smtp_servers)."""
    with smtp_servers() as value:
        yield value


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, Path]:
    """A server TLS context with a certificate for 127.0.0.1, and the PEM file of the CA that
    signed it, for the client to trust."""
    trustme = pytest.importorskip("trustme", reason="trustme makes the test certificates")
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(server_context)
    ca_file = tmp_path_factory.mktemp("tls") / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return server_context, ca_file


def authenticator(server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any) -> Any:
    login = auth_data if isinstance(auth_data, aiosmtpd.smtp.LoginPassword) else None
    ok = login is not None and (login.login, login.password) == (b"mailer", b"s3cret")
    # handled=False: aiosmtpd then answers 535 itself.
    return aiosmtpd.smtp.AuthResult(success=ok, handled=False)


async def test_email_arrives_with_its_headers_and_body(
    smtp_server: Callable[..., SMTPServer],
) -> None:
    mailbox = Mailbox()
    server = smtp_server(mailbox)
    send = tasks(smtp_port=server.port)["send_email"]
    result = await run(
        send,
        {
            "to": ["Ada <ada@example.com>", "bob@example.com"],
            "cc": "carol@example.com",
            "bcc": ["dan@example.com"],
            "reply_to": "help@example.com",
            "subject": "Your report — ready",
            "text": "Hello Ada,\nthe report is ready.\n",
            "html": "<p>Hello Ada, the report is <b>ready</b>.</p>",
        },
    )
    everyone = ["ada@example.com", "bob@example.com", "carol@example.com", "dan@example.com"]
    assert result["accepted"] == everyone
    assert "refused" not in result
    [received] = mailbox.received
    assert received.sender == "queue@example.com"
    assert received.recipients == everyone
    message = received.message
    assert message["From"] == "Queue <queue@example.com>"
    assert message["To"] == "Ada <ada@example.com>, bob@example.com"
    assert message["Cc"] == "carol@example.com"
    assert message["Reply-To"] == "help@example.com"
    assert message["Bcc"] is None
    assert message["Subject"] == "Your report — ready"
    assert message["Message-ID"] == result["message_id"]
    assert result["message_id"].endswith("@example.com>")
    assert message["Date"] is not None
    text = message.get_body(("plain",))
    html = message.get_body(("html",))
    assert text is not None and html is not None
    assert isinstance(text, EmailMessage) and isinstance(html, EmailMessage)
    assert text.get_content().replace("\r\n", "\n") == "Hello Ada,\nthe report is ready.\n"
    assert "<b>ready</b>" in html.get_content()


async def test_payload_from_wins_and_a_bad_payload_names_the_field(
    smtp_server: Callable[..., SMTPServer],
) -> None:
    mailbox = Mailbox()
    server = smtp_server(mailbox)
    send = tasks(smtp_port=server.port, smtp_from=None)["send_email"]
    base = {"to": "ada@example.com", "subject": "hi", "text": "hi"}
    with pytest.raises(PermanentFailure, match="NOTIFYQ_SMTP_FROM"):
        await run(send, base)
    await run(send, {**base, "from": "other@example.org"})
    assert mailbox.received[0].sender == "other@example.org"
    for bad, field in [
        ({**base, "to": "nobody"}, "to.0"),
        ({**base, "to": []}, "to"),
        ({**base, "subject": "a\r\nBcc: x@example.com"}, "subject"),
        ({key: v for key, v in base.items() if key != "text"}, "text"),
        ({**base, "cc": ["ok@example.com", "a@b, c@d"]}, "cc.1"),
        ({**base, "attachments": []}, "attachments"),
    ]:
        with pytest.raises(PermanentFailure, match=rf"invalid payload: {field}: "):
            await run(send, bad)
    assert len(mailbox.received) == 1


async def test_a_refused_recipient_fails_for_good(smtp_server: Callable[..., SMTPServer]) -> None:
    mailbox = Mailbox(refuse={"ghost@example.com": "550 no such user"})
    server = smtp_server(mailbox)
    send = tasks(smtp_port=server.port)["send_email"]
    with pytest.raises(PermanentFailure, match=r"ghost@example.com: 550 no such user"):
        await run(send, {"to": "ghost@example.com", "subject": "s", "text": "t"})
    assert mailbox.received == []


async def test_a_partly_refused_message_reports_who_did_not_get_it(
    smtp_server: Callable[..., SMTPServer],
) -> None:
    # The others already have it: failing (and retrying) would send it to them twice.
    mailbox = Mailbox(refuse={"ghost@example.com": "550 no such user"})
    server = smtp_server(mailbox)
    send = tasks(smtp_port=server.port)["send_email"]
    result = await run(
        send, {"to": ["ada@example.com", "ghost@example.com"], "subject": "s", "text": "t"}
    )
    assert result["accepted"] == ["ada@example.com"]
    assert result["refused"] == {"ghost@example.com": "550 no such user"}
    assert mailbox.received[0].recipients == ["ada@example.com"]


async def test_a_temporary_refusal_is_retried(smtp_server: Callable[..., SMTPServer]) -> None:
    mailbox = Mailbox(refuse={"busy@example.com": "450 mailbox busy, try later"})
    server = smtp_server(mailbox)
    send = tasks(smtp_port=server.port)["send_email"]
    with pytest.raises(TransientFailure, match="450 mailbox busy"):
        await run(send, {"to": "busy@example.com", "subject": "s", "text": "t"})


async def test_a_refused_sender_fails_for_good_or_for_now(
    smtp_server: Callable[..., SMTPServer],
) -> None:
    mailbox = Mailbox(
        refuse={
            "spoof@example.com": "553 sender not allowed",
            "slow@example.com": "451 try again later",
        }
    )
    server = smtp_server(mailbox)
    send = tasks(smtp_port=server.port)["send_email"]
    mail = {"to": "ada@example.com", "subject": "s", "text": "t"}
    with pytest.raises(PermanentFailure, match="SMTPSenderRefused: 553 sender not allowed"):
        await run(send, {**mail, "from": "spoof@example.com"})
    with pytest.raises(TransientFailure, match="SMTPSenderRefused: 451 try again later"):
        await run(send, {**mail, "from": "slow@example.com"})
    assert mailbox.received == []


async def test_a_server_that_is_down_is_retried() -> None:
    with closed_port() as port:
        send = tasks(smtp_port=port)["send_email"]
        with pytest.raises(TransientFailure, match=rf"127.0.0.1:{port}: ConnectionRefused"):
            await run(send, {"to": "ada@example.com", "subject": "s", "text": "t"})


async def test_a_server_that_never_answers_times_out_and_is_retried() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never greets
        send = tasks(smtp_port=silent.getsockname()[1], smtp_timeout=0.3)["send_email"]
        started = time.monotonic()
        with pytest.raises(TransientFailure, match="timed out"):
            await run(send, {"to": "ada@example.com", "subject": "s", "text": "t"})
        assert time.monotonic() - started < 5


async def test_login_over_starttls(
    smtp_server: Callable[..., SMTPServer], tls: tuple[ssl.SSLContext, Path]
) -> None:
    server_context, ca_file = tls
    mailbox = Mailbox()
    server = smtp_server(
        mailbox,
        tls_context=server_context,
        require_starttls=True,
        authenticator=authenticator,
        auth_required=True,
    )
    common = {"smtp_port": server.port, "smtp_starttls": True, "smtp_ca_file": ca_file}
    mail = {"to": "ada@example.com", "subject": "s", "text": "t"}

    good = tasks(**common, smtp_username="mailer", smtp_password="s3cret")["send_email"]
    result = await run(good, mail)
    assert result["accepted"] == ["ada@example.com"]
    assert len(mailbox.received) == 1

    wrong = tasks(**common, smtp_username="mailer", smtp_password="wrong")["send_email"]
    with pytest.raises(PermanentFailure, match="535"):
        await run(wrong, mail)

    anonymous = tasks(**common)["send_email"]
    with pytest.raises(PermanentFailure, match="530"):
        await run(anonymous, mail)

    untrusted = tasks(smtp_port=server.port, smtp_starttls=True)["send_email"]
    with pytest.raises(TransientFailure, match="CERTIFICATE_VERIFY_FAILED"):
        await run(untrusted, mail)
    assert len(mailbox.received) == 1


async def test_starttls_required_but_not_offered_fails_for_good(
    smtp_server: Callable[..., SMTPServer],
) -> None:
    mailbox = Mailbox()
    server = smtp_server(mailbox)
    send = tasks(smtp_port=server.port, smtp_starttls=True)["send_email"]
    with pytest.raises(PermanentFailure, match="STARTTLS"):
        await run(send, {"to": "ada@example.com", "subject": "s", "text": "t"})
    assert mailbox.received == []


async def test_implicit_tls(
    smtp_server: Callable[..., SMTPServer], tls: tuple[ssl.SSLContext, Path]
) -> None:
    server_context, ca_file = tls
    mailbox = Mailbox()
    server = smtp_server(mailbox, ssl_context=server_context)
    send = tasks(smtp_port=server.port, smtp_ssl=True, smtp_ca_file=ca_file)["send_email"]
    result = await run(send, {"to": "ada@example.com", "subject": "s", "text": "t"})
    assert result["accepted"] == ["ada@example.com"]
    assert len(mailbox.received) == 1


def recording_authenticator(logins: list[tuple[bytes, bytes]]) -> Any:
    def check(server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any) -> Any:
        assert isinstance(auth_data, aiosmtpd.smtp.LoginPassword)
        logins.append((auth_data.login, auth_data.password))
        return aiosmtpd.smtp.AuthResult(success=True)

    return check


async def test_login_without_tls_is_refused_unless_allowed(
    smtp_server: Callable[..., SMTPServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server that would take the password in clear: the settings never let it get there.
    logins: list[tuple[bytes, bytes]] = []
    mailbox = Mailbox()
    server = smtp_server(
        mailbox, authenticator=recording_authenticator(logins), auth_require_tls=False
    )
    login = {"smtp_port": server.port, "smtp_username": "mailer", "smtp_password": "s3cret"}
    with pytest.raises(ConfigurationError) as caught:
        ContribSettings.load(**login)
    for advice in ("NOTIFYQ_SMTP_STARTTLS", "NOTIFYQ_SMTP_SSL", "NOTIFYQ_SMTP_ALLOW_PLAINTEXT"):
        assert advice in str(caught.value)
    monkeypatch.setenv("NOTIFYQ_SMTP_USERNAME", "mailer")
    monkeypatch.setenv("NOTIFYQ_SMTP_PASSWORD", "s3cret")
    with pytest.raises(ConfigurationError, match="would travel in clear"):
        ContribSettings.load()
    assert logins == []
    # Asked for explicitly, it logs in as before.
    send = tasks(**login, smtp_allow_plaintext_login=True)["send_email"]
    await run(send, {"to": "ada@example.com", "subject": "s", "text": "t"})
    assert logins == [(b"mailer", b"s3cret")] and len(mailbox.received) == 1


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"subject": "Report\u2028Bcc: eve@example.com"}, "subject"),
        ({"subject": "a\u2029b"}, "subject"),
        ({"subject": "a\x85b"}, "subject"),
        ({"subject": "a\x0bb"}, "subject"),
        ({"to": "Ada\u2028 <ada@example.com>"}, "to.0"),
        ({"from": "Queue\x1c <queue@example.com>"}, "from"),
    ],
)
async def test_a_line_separator_in_a_header_fails_at_once(
    smtp_server: Callable[..., SMTPServer], change: dict[str, str], field: str
) -> None:
    # The email package refuses them (ValueError) as it refuses CR and LF: every attempt would
    # fail the same way, so the first one fails the job, naming the field.
    mailbox = Mailbox()
    server = smtp_server(mailbox)
    mail = {"to": "ada@example.com", "subject": "s", "text": "t", **change}
    with pytest.raises(PermanentFailure, match=rf"invalid payload: {field}: .*line break"):
        await run(tasks(smtp_port=server.port)["send_email"], mail)
    assert mailbox.received == []


async def test_a_text_that_cannot_be_encoded_fails_at_once(
    smtp_server: Callable[..., SMTPServer],
) -> None:
    mailbox = Mailbox()
    server = smtp_server(mailbox)
    send = tasks(smtp_port=server.port)["send_email"]
    for part in ("text", "html"):
        mail = {"to": "ada@example.com", "subject": "s", "text": "t", part: "half \ud83d pair"}
        with pytest.raises(PermanentFailure, match=r"cannot be written: .*surrogates"):
            await run(send, mail)
    assert mailbox.received == []


async def read_body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def answer(
    send: Any, status: int, body: bytes, content_type: str = "text/plain", **headers: str
) -> None:
    raw = [(b"content-type", content_type.encode())]
    raw += [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def web_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The peer for http_request: a bare ASGI app, so nothing between the wire and the test."""
    assert scope["type"] == "http"
    path: str = scope["path"]
    query = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    body = await read_body(receive)
    if path == "/json":
        await answer(send, 200, b'{"hello": "world", "n": [1, 2]}', "application/json")
    elif path == "/created":
        await answer(send, 201, "made: ✓".encode(), "text/plain; charset=utf-8")
    elif path == "/echo":
        echoed = {
            "method": scope["method"],
            "headers": {k.decode(): v.decode() for k, v in scope["headers"]},
            "body": body.decode(),
        }
        await answer(send, 200, json.dumps(echoed).encode(), "application/problem+json")
    elif path.startswith("/status/"):
        status = int(path.removeprefix("/status/"))
        extra = {"retry_after": "7"} if status == 429 else {}
        await answer(send, status, b"status body " + b"x" * 1000, **extra)
    elif path.startswith("/redirect/"):
        left = int(path.removeprefix("/redirect/"))
        location = "/json" if left == 0 else f"/redirect/{left - 1}"
        await answer(send, 302, b"", location=location)
    elif path == "/see-other":
        await answer(send, 303, b"", location="/echo")
    elif path == "/redirect-to":
        await answer(send, 302, b"", location=query["url"])
    elif path == "/big":
        await answer(send, 200, b"y" * int(query["n"]), "application/json")
    elif path == "/nul":
        await answer(send, 200, b"a\x00b", "application/octet-stream")
    elif path == "/charset":
        await answer(send, 200, b"caf\xc3\xa9 \\ud800", f"text/plain; charset={query['cs']}")
    elif path == "/deep":
        await answer(send, 200, b"[" * 100_000 + b"]" * 100_000, "application/json")
    elif path == "/hang":
        # Answers nothing until the client gives up and disconnects.
        while (await receive())["type"] != "http.disconnect":
            pass
    else:
        await answer(send, 404, b"no such page")


@contextlib.contextmanager
def serving_web_app() -> Iterator[str]:
    """Base URL of :func:`web_app`, served by uvicorn in a thread on a port the system picked."""
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(web_app, log_level="warning", lifespan="off", ws="none", http="h11")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive())
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture(scope="module")
def web() -> Iterator[str]:
    """Base URL of web_app, served for this module (see serving_web_app)."""
    with serving_web_app() as value:
        yield value


async def test_http_get_json(web: str) -> None:
    result = await run(tasks()["http_request"], {"url": f"{web}/json"})
    assert result["status"] == 200
    assert result["json"] == {"hello": "world", "n": [1, 2]}
    assert json.loads(result["body"]) == result["json"]
    assert result["headers"]["content-type"] == "application/json"
    assert result["truncated"] is False
    assert result["url"] == f"{web}/json"


async def test_http_201_with_text(web: str) -> None:
    result = await run(tasks()["http_request"], {"url": f"{web}/created", "method": "post"})
    assert result["status"] == 201
    assert result["body"] == "made: ✓"
    assert result["json"] is None


async def test_http_post_sends_json_and_headers(web: str) -> None:
    http = tasks()["http_request"]
    result = await run(
        http,
        {
            "url": f"{web}/echo",
            "method": "POST",
            "headers": {"X-Signature": "abc123", "Authorization": "Bearer t"},
            "json": {"event": "paid", "amount": 12.5},
        },
    )
    echoed = result["json"]  # application/problem+json counts as JSON
    assert echoed["method"] == "POST"
    assert echoed["headers"]["x-signature"] == "abc123"
    assert echoed["headers"]["authorization"] == "Bearer t"
    assert echoed["headers"]["content-type"] == "application/json"
    assert json.loads(echoed["body"]) == {"event": "paid", "amount": 12.5}

    text = await run(http, {"url": f"{web}/echo", "method": "PUT", "body": "plain ✓"})
    assert text["json"]["method"] == "PUT" and text["json"]["body"] == "plain ✓"

    null = await run(http, {"url": f"{web}/echo", "method": "POST", "json": None})
    assert null["json"]["body"] == "null"


@pytest.mark.parametrize("status", [500, 503, 429, 408])
async def test_http_server_errors_and_throttling_are_retried(web: str, status: int) -> None:
    with pytest.raises(TransientFailure, match=rf"HTTP {status}") as caught:
        await run(tasks()["http_request"], {"url": f"{web}/status/{status}"})
    message = str(caught.value)
    assert "status body" in message and len(message) < 400
    if status == 429:
        assert "Retry-After: 7" in message


@pytest.mark.parametrize("status", [404, 400, 401, 410, 422])
async def test_http_client_errors_fail_for_good(web: str, status: int) -> None:
    with pytest.raises(PermanentFailure, match=rf"HTTP {status} .*'status body x+\.\.\.'"):
        await run(tasks()["http_request"], {"url": f"{web}/status/{status}"})


async def test_http_timeout_is_retried_and_capped_by_the_setting(web: str) -> None:
    started = time.monotonic()
    with pytest.raises(TransientFailure, match=r"timed out|within 0\.3s"):
        await run(tasks()["http_request"], {"url": f"{web}/hang", "timeout": 0.3})
    # The payload may only shorten the setting's timeout.
    with pytest.raises(TransientFailure, match=r"timed out|within 0\.2s"):
        await run(tasks(http_timeout=0.2)["http_request"], {"url": f"{web}/hang", "timeout": 60})
    assert time.monotonic() - started < 5


async def test_http_connection_refused_is_retried() -> None:
    with closed_port() as port:
        with pytest.raises(TransientFailure, match="ConnectError"):
            await run(tasks()["http_request"], {"url": f"http://127.0.0.1:{port}/"})


async def test_http_follows_up_to_five_redirects(web: str) -> None:
    http = tasks()["http_request"]
    result = await run(http, {"url": f"{web}/redirect/4"})  # 5 redirects in all
    assert result["status"] == 200 and result["url"] == f"{web}/json"
    with pytest.raises(PermanentFailure, match="more than 5 redirects"):
        await run(http, {"url": f"{web}/redirect/5"})
    # 303 turns a POST into a GET without its body.
    after_post = await run(http, {"url": f"{web}/see-other", "method": "POST", "json": [1]})
    assert after_post["json"]["method"] == "GET" and after_post["json"]["body"] == ""


@pytest.mark.parametrize("target", ["file:///etc/passwd", "ftp://127.0.0.1/x", "gopher://h/"])
async def test_http_never_follows_a_redirect_out_of_http(web: str, target: str) -> None:
    scheme = target.split(":")[0]
    with pytest.raises(PermanentFailure, match=f"redirect to a {scheme}: URL"):
        await run(tasks()["http_request"], {"url": f"{web}/redirect-to?url={target}"})


async def test_http_body_is_truncated_to_the_setting(web: str) -> None:
    http = tasks(http_max_response_bytes=1000)["http_request"]
    result = await run(http, {"url": f"{web}/big?n=5000000"})
    assert result["body"] == "y" * 1000
    assert result["truncated"] is True
    assert result["json"] is None  # half a document is not parsed
    whole = await run(http, {"url": f"{web}/big?n=1000"})
    assert whole["truncated"] is False and len(whole["body"]) == 1000


async def test_http_result_is_always_storable(web: str) -> None:
    result = await run(tasks()["http_request"], {"url": f"{web}/nul"})
    assert result["body"] == "a\ufffdb"


@pytest.mark.parametrize(
    ("charset", "body"),
    [
        # Codecs that are no text encoding, or cannot replace: read as UTF-8, like unknown ones.
        ("hex", "café \\ud800"),
        ("rot13", "café \\ud800"),
        ("idna", "café \\ud800"),
        # A codec that turns the text \ud800 into an unpaired surrogate, which jsonb refuses.
        ("unicode_escape", "cafÃ© \ufffd"),
    ],
)
async def test_http_a_charset_that_cannot_decode_does_not_fail_the_job(
    web: str, charset: str, body: str
) -> None:
    # The request was made and answered: neither a retry nor a failure would be better.
    result = await run(tasks()["http_request"], {"url": f"{web}/charset?cs={charset}"})
    assert result["body"] == body


async def test_http_json_nested_too_deep_is_kept_as_text(web: str) -> None:
    result = await run(tasks()["http_request"], {"url": f"{web}/deep"})
    assert result["json"] is None and result["body"].startswith("[[[")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"headers": {"X-Name": "Zoë"}}, r"headers: header 'X-Name': .*printable ASCII"),
        ({"headers": {"X-Sep": "a\u2028b"}}, r"headers: header 'X-Sep': .*printable ASCII"),
        ({"headers": {"X-Bell": "a\x07"}}, r"headers: header 'X-Bell': .*printable ASCII"),
        ({"method": "POST", "body": "half \ud83d pair"}, r"body: cannot be sent: .*surrogates"),
        ({"method": "POST", "json": {"a": "\udc00"}}, r"json: cannot be sent: .*surrogates"),
        ({"method": "POST", "json": float("nan")}, r"json: cannot be sent: .*not JSON"),
    ],
)
async def test_http_a_request_that_cannot_be_encoded_fails_at_once(
    web: str, change: dict[str, Any], message: str
) -> None:
    with pytest.raises(PermanentFailure, match=rf"invalid payload: {message}"):
        await run(tasks()["http_request"], {"url": f"{web}/echo", **change})


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"url": "ftp://example.com/x"}, "url"),
        ({"url": "/relative"}, "url"),
        ({"url": "http://x", "method": "BREW"}, "method"),
        ({"url": "http://x", "headers": {"X-A": "1\r\nX-B: 2"}}, "headers"),
        ({"url": "http://x", "headers": {"X-A": 1}}, "headers.X-A"),
        ({"url": "http://x", "json": {}, "body": "b"}, "payload"),
        ({"url": "http://x", "timeout": 0}, "timeout"),
        ({"url": "http://x", "data": "?"}, "data"),
    ],
)
async def test_http_bad_payloads_fail_for_good(payload: dict[str, Any], field: str) -> None:
    with pytest.raises(PermanentFailure, match=rf"invalid payload: {field}: "):
        await run(tasks()["http_request"], payload)


IN_ACCESS, IN_MODIFY, IN_ATTRIB, IN_OPEN, IN_CREATE = 0x1, 0x2, 0x4, 0x20, 0x100


class OpenWatch:
    """Linux inotify on a folder: reports every open, read, write or creation of anything in
    it, so a test can tell that a file was never even opened."""

    def __init__(self, folder: Path) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        mask = IN_ACCESS | IN_MODIFY | IN_ATTRIB | IN_OPEN | IN_CREATE
        if self._libc.inotify_add_watch(self.fd, os.fsencode(folder), mask) < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch")

    def events(self) -> list[tuple[int, str]]:
        """The events so far, as (mask, name); inotify queues them before the call that
        caused them returns, so nothing is still in flight."""
        data = b""
        while True:
            try:
                data += os.read(self.fd, 65536)
            except BlockingIOError:
                break
        found = []
        while data:
            _, mask, _, length = struct.unpack_from("iIII", data)
            name = data[16 : 16 + length].rstrip(b"\0").decode()
            found.append((mask, name))
            data = data[16 + length :]
        return found

    def close(self) -> None:
        os.close(self.fd)


@dataclass
class Tree:
    root: Path
    outside: Path
    watch: OpenWatch | None


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Tree]:
    """A root folder with files, links and a FIFO, and a folder outside it holding a secret,
    watched with inotify where the system has it."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n")
    (outside / "target.gz").write_bytes(b"not yours")
    (root / "sub").mkdir()
    (root / "sub" / "inner.txt").write_text("inner\n")
    (root / "hello.txt").write_text("hello\nworld\n")
    (root / "link_out").symlink_to(outside / "secret.txt")
    (root / "dir_out").symlink_to(outside)
    (root / "dangling_out").symlink_to(outside / "missing.txt")
    (root / "dangling_in").symlink_to(root / "missing.txt")
    (root / "link_in").symlink_to("sub/inner.txt")
    (root / "loop").symlink_to("loop")
    os.mkfifo(root / "fifo")
    watch = OpenWatch(outside) if sys.platform == "linux" else None
    yield Tree(root, outside, watch)
    if watch is not None:
        watch.close()


def assert_outside_untouched(tree: Tree) -> None:
    if tree.watch is not None:
        assert tree.watch.events() == [], "the task touched a file outside the root"
    assert sorted(p.name for p in tree.outside.iterdir()) == ["secret.txt", "target.gz"]
    assert (tree.outside / "secret.txt").read_text() == "top secret\n"
    assert (tree.outside / "target.gz").read_bytes() == b"not yours"
    if tree.watch is not None:
        tree.watch.events()  # forget the opens of the checks just above


def file_tasks(tree: Tree) -> dict[str, Task]:
    return tasks(files_root=tree.root)


async def test_digest_of_a_known_file(tree: Tree) -> None:
    content = b"line of text\n" * 300_000 + b"last line without a break"  # several chunks
    (tree.root / "sub" / "big.txt").write_bytes(content)
    digest = file_tasks(tree)["file_digest"]
    result = await run(digest, {"path": "sub/big.txt"})
    assert result == {
        "path": "sub/big.txt",
        "size": len(content),
        "sha256": hashlib.sha256(content).hexdigest(),
        "lines": 300_001,
    }
    assert (await run(digest, {"path": "hello.txt"}))["lines"] == 2
    (tree.root / "empty").write_bytes(b"")
    empty = await run(digest, {"path": "empty"})
    assert (empty["size"], empty["lines"]) == (0, 0)
    assert empty["sha256"] == hashlib.sha256(b"").hexdigest()
    # A symlink that stays inside the root is followed.
    assert (await run(digest, {"path": "link_in"}))["sha256"] == hashlib.sha256(
        b"inner\n"
    ).hexdigest()


async def test_gzip_round_trip(tree: Tree) -> None:
    content = os.urandom(300_000) + b"text\n" * 200_000
    (tree.root / "sub" / "data.bin").write_bytes(content)
    (tree.root / "sub" / "data.bin").chmod(0o640)
    gz = file_tasks(tree)["file_gzip"]
    result = await run(gz, {"path": "sub/data.bin"})
    written = tree.root / "sub" / "data.bin.gz"
    assert result == {
        "path": "sub/data.bin",
        "dest": "sub/data.bin.gz",
        "size": len(content),
        "gzip_size": written.stat().st_size,
        "sha256": hashlib.sha256(content).hexdigest(),
    }
    assert gzip.decompress(written.read_bytes()) == content
    assert stat.S_IMODE(written.stat().st_mode) == 0o640  # the original's mode
    assert sorted(p.name for p in (tree.root / "sub").iterdir()) == [
        "data.bin",
        "data.bin.gz",
        "inner.txt",
    ]  # no temporary file left

    other = await run(gz, {"path": "hello.txt", "dest": "sub/hello-archive.gz"})
    assert other["dest"] == "sub/hello-archive.gz"
    assert gzip.decompress((tree.root / "sub" / "hello-archive.gz").read_bytes()) == (
        b"hello\nworld\n"
    )
    assert_outside_untouched(tree)


async def test_gzip_refuses_to_overwrite_unless_told(tree: Tree) -> None:
    gz = file_tasks(tree)["file_gzip"]
    (tree.root / "hello.txt.gz").write_bytes(b"older")
    with pytest.raises(PermanentFailure, match='exists; pass "overwrite": true'):
        await run(gz, {"path": "hello.txt"})
    assert (tree.root / "hello.txt.gz").read_bytes() == b"older"
    await run(gz, {"path": "hello.txt", "overwrite": True})
    assert gzip.decompress((tree.root / "hello.txt.gz").read_bytes()) == b"hello\nworld\n"
    with pytest.raises(PermanentFailure, match="is the source file"):
        await run(gz, {"path": "hello.txt", "dest": "hello.txt", "overwrite": True})
    with pytest.raises(PermanentFailure, match="is a folder"):
        await run(gz, {"path": "hello.txt", "dest": "sub", "overwrite": True})
    assert (tree.root / "hello.txt").read_text() == "hello\nworld\n"
    assert not [p for p in tree.root.iterdir() if p.name.endswith(".tmp")]


async def test_gzip_replaces_a_symlinked_dest_without_writing_through_it(tree: Tree) -> None:
    (tree.root / "out.gz").symlink_to(tree.outside / "target.gz")
    gz = file_tasks(tree)["file_gzip"]
    with pytest.raises(PermanentFailure, match="exists"):
        await run(gz, {"path": "hello.txt", "dest": "out.gz"})
    await run(gz, {"path": "hello.txt", "dest": "out.gz", "overwrite": True})
    assert not (tree.root / "out.gz").is_symlink()
    assert gzip.decompress((tree.root / "out.gz").read_bytes()) == b"hello\nworld\n"
    assert_outside_untouched(tree)


ESCAPES = [
    ("../outside/secret.txt", "contains '..'"),
    ("sub/../../outside/secret.txt", "contains '..'"),
    ("/etc/passwd", "is absolute"),
    ("link_out", "leads outside"),
    ("dir_out/secret.txt", "leads outside"),
    ("dangling_out", "leads outside"),
    ("dir_out/missing.txt", "leads outside"),
]


@pytest.mark.parametrize(("path", "reason"), ESCAPES)
@pytest.mark.parametrize("name", ["file_digest", "file_gzip"])
async def test_paths_out_of_the_root_are_refused_untouched(
    tree: Tree, name: str, path: str, reason: str
) -> None:
    with pytest.raises(PermanentFailure, match=reason):
        await run(file_tasks(tree)[name], {"path": path})
    assert_outside_untouched(tree)


def test_the_open_watch_sees_an_open(tree: Tree) -> None:
    # The instrument the escape tests rely on: it must see a plain read of the secret.
    if tree.watch is None:
        pytest.skip("inotify is Linux only")
    assert tree.watch.events() == []
    (tree.outside / "secret.txt").read_bytes()
    assert (IN_OPEN, "secret.txt") in [(m & IN_OPEN, n) for m, n in tree.watch.events()]


async def test_a_folder_swapped_for_a_symlink_mid_task_never_leads_out(tree: Tree) -> None:
    # A real race: a thread keeps replacing folder "d" with a symlink to the outside folder,
    # which holds a file of the same name. Whatever the timing, the task reads the inside file
    # or refuses; it never reads the outside one.
    (tree.root / "d").mkdir()
    (tree.root / "d" / "secret.txt").write_text("inside\n")
    inside = hashlib.sha256(b"inside\n").hexdigest()
    stop = threading.Event()

    def swap() -> None:
        d, saved = tree.root / "d", tree.root / "d-saved"
        while not stop.is_set():
            d.rename(saved)
            d.symlink_to(tree.outside)
            d.unlink()
            saved.rename(d)

    swapper = threading.Thread(target=swap)
    swapper.start()
    outcomes: dict[str, int] = {}
    try:
        digest = file_tasks(tree)["file_digest"]
        deadline = time.monotonic() + 5
        for _ in range(2000):
            if time.monotonic() > deadline:
                break
            try:
                result = await run(digest, {"path": "d/secret.txt"})
            except PermanentFailure as exc:
                key = str(exc).split("'d/secret.txt' ")[-1][:20]
            else:
                assert result["sha256"] == inside
                key = "read inside"
            outcomes[key] = outcomes.get(key, 0) + 1
    finally:
        stop.set()
        swapper.join(10)
    assert outcomes
    assert_outside_untouched(tree)


async def test_the_absolute_path_of_an_outside_file_is_refused(tree: Tree) -> None:
    for name in ("file_digest", "file_gzip"):
        with pytest.raises(PermanentFailure, match="is absolute"):
            await run(file_tasks(tree)[name], {"path": str(tree.outside / "secret.txt")})
    assert_outside_untouched(tree)


@pytest.mark.parametrize(
    ("dest", "reason"),
    [
        ("../outside/x.gz", "contains '..'"),
        ("dir_out/x.gz", "leads outside"),
        ("/tmp/x.gz", "is absolute"),
        ("dir_out/target.gz", "leads outside"),
    ],
)
async def test_gzip_dest_out_of_the_root_is_refused(tree: Tree, dest: str, reason: str) -> None:
    with pytest.raises(PermanentFailure, match=reason):
        await run(
            file_tasks(tree)["file_gzip"], {"path": "hello.txt", "dest": dest, "overwrite": True}
        )
    assert_outside_untouched(tree)
    assert sorted(p.name for p in tree.root.iterdir() if p.suffix in (".gz", ".tmp")) == []


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("sub", "not a regular file"),
        ("fifo", "not a regular file"),
        ("missing.txt", "does not exist"),
        ("dangling_in", "does not exist"),
        ("sub/nope/x.txt", "does not exist"),
        ("hello.txt/x", "a part of it is not a folder"),
        ("loop", "symlink that loops"),
        (".", "root folder itself"),
        ("", "invalid payload: path"),
    ],
)
@pytest.mark.parametrize("name", ["file_digest", "file_gzip"])
async def test_what_is_not_a_regular_file_is_refused(
    tree: Tree, name: str, path: str, reason: str
) -> None:
    # A FIFO is never opened: opening it for reading would wait for a writer.
    with pytest.raises(PermanentFailure, match=reason):
        await run(file_tasks(tree)[name], {"path": path})


async def test_file_tasks_refuse_to_run_without_a_root(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    unset = tasks(files_root=None)
    for name in ("file_digest", "file_gzip"):
        with pytest.raises(PermanentFailure, match="set NOTIFYQ_FILES_ROOT"):
            await run(unset[name], {"path": "a.txt"})
    missing = tasks(files_root=tmp_path / "nope")
    with pytest.raises(PermanentFailure, match=r"NOTIFYQ_FILES_ROOT=.*cannot be used"):
        await run(missing["file_digest"], {"path": "a.txt"})
    assert not (tmp_path / "a.txt.gz").exists()


@pytest.mark.parametrize("name", ["file_digest", "file_gzip"])
async def test_a_hard_link_to_an_outside_file_is_refused_unless_allowed(
    tree: Tree, name: str
) -> None:
    # No path check can see it: the link is a plain file inside the root, the same file as
    # the secret outside.
    os.link(tree.outside / "secret.txt", tree.root / "sub" / "hard.txt")
    with pytest.raises(PermanentFailure, match=r"'sub/hard.txt' has 2 hard links") as caught:
        await run(file_tasks(tree)[name], {"path": "sub/hard.txt"})
    assert "NOTIFYQ_FILES_ALLOW_HARD_LINKS=true" in str(caught.value)
    assert not (tree.root / "sub" / "hard.txt.gz").exists()
    allowed = tasks(files_root=tree.root, files_allow_hard_links=True)[name]
    result = await run(allowed, {"path": "sub/hard.txt"})
    assert result["sha256"] == hashlib.sha256(b"top secret\n").hexdigest()
