""":class:`ContribSettings`: the settings of the contrib tasks, read from ``NOTIFYQ_*``
environment variables once, at the entry point, and passed to
:func:`~notifyq.contrib.contrib_tasks`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from notifyq.contrib._shared import check_address
from notifyq.contrib.egress import normal_allow_entry
from notifyq.errors import ConfigurationError
from notifyq.settings import describe_validation_error

__all__ = ["ContribSettings"]


def _blank_is_none(value: Any) -> Any:
    return None if isinstance(value, str) and not value.strip() else value


class ContribSettings(BaseSettings):
    """Settings of the contrib tasks, from ``NOTIFYQ_*`` environment variables. Immutable; build
    it once at the entry point with :meth:`load` and pass it to
    :func:`~notifyq.contrib.contrib_tasks`."""

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
        return None if value is None else check_address(value)

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
