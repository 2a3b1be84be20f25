"""``send_email``: one message over SMTP, with the TLS and login that :class:`ContribSettings`
configure. A recipient refused for good (5xx) fails the job; a 4xx answer, a timeout or a
dropped connection is retried. When the server accepts some recipients and refuses others, the
job succeeds and names the refused ones, since a retry would send the message twice to the
others."""

from __future__ import annotations

import email.utils
import logging
import smtplib
import ssl
import time
from collections.abc import Callable
from email.message import EmailMessage
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from notifyq.contrib._shared import (
    TransientFailure,
    check_address,
    fails_for_good,
    has_line_break,
    validate_payload,
)
from notifyq.contrib.settings import ContribSettings
from notifyq.errors import PermanentFailure

logger = logging.getLogger(__name__)

__all__ = ["EmailPayload", "email_handler"]


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _single_line(value: str) -> str:
    if has_line_break(value):
        raise ValueError(
            "must be a single line (no CR, LF, U+2028 or other line break, and no NUL)"
        )
    return value


Address = Annotated[str, AfterValidator(check_address)]
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


def email_handler(settings: ContribSettings) -> Callable[[dict[str, Any]], dict[str, Any]]:
    # A plain function: Task.run calls it in a worker thread, where smtplib may block.
    def send_email(payload: dict[str, Any]) -> dict[str, Any]:
        """Sends an email over SMTP (see :class:`EmailPayload`); answers
        ``{"accepted": [...], "message_id": ...}``. A recipient the server refuses for good
        (5xx) fails the job without retries; a 4xx answer or a connection problem is retried."""
        with fails_for_good("send_email"):
            mail = validate_payload(EmailPayload, payload, "send_email")
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
