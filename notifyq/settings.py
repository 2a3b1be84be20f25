"""Settings: read from the environment (and CLI flags) once, at the entry point, then passed down.

Every field is an environment variable (``NOTIFYQ_<NAME>``, and ``DATABASE_URL`` for the
database); the CLI turns its flags into keyword arguments, which win over the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from notifyq.errors import ConfigurationError

#: The public database URL the tests and docs use when nothing else is configured.
DEFAULT_LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

CommaList = Annotated[list[str], NoDecode]


def _split_commas(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class _DatabaseAndWorker(BaseSettings):
    """The first half of :class:`Settings`: the database, the worker, retries and retention
    (a class of its own only to keep each under 300 lines; Settings is the one to use)."""

    model_config = SettingsConfigDict(
        env_prefix="NOTIFYQ_", extra="ignore", frozen=True, populate_by_name=True
    )

    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("DATABASE_URL", "database_url"),
        description="libpq URL of the database; unset means an embedded PostgreSQL.",
    )
    data_dir: Path | None = Field(
        default=None,
        description="Where the embedded PostgreSQL keeps its data when DATABASE_URL is unset "
        "(default: the user's data folder, /var/lib/notifyq for root).",
    )
    listen_url: str | None = Field(
        default=None,
        description="URL for the LISTEN connection when the pool goes through a transaction-mode "
        "pooler (PgBouncer, Supavisor) that drops LISTEN; defaults to database_url.",
    )
    pooler: Literal["auto", "none", "transaction"] = Field(
        default="auto",
        description="What DATABASE_URL goes through: `transaction` for a transaction-mode pooler "
        "(PgBouncer, Supavisor: no prepared statements on its connections), `none` for the "
        "server or a session-mode pool; `auto` means `transaction` when NOTIFYQ_LISTEN_URL "
        "is set to another URL.",
    )
    imports: CommaList = Field(
        default_factory=list,
        validation_alias=AliasChoices("NOTIFYQ_IMPORT", "imports"),
        description="Modules imported at start to register tasks.",
    )
    queues: CommaList | None = Field(
        default=None, description="Queues a worker serves; unset or empty means all queues."
    )
    concurrency: int = Field(
        default=10, ge=1, le=10_000, description="Jobs one worker process runs at once."
    )
    poll_interval: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="Seconds between a worker's fallback polls, which bound a lost notification.",
    )
    lease_seconds: float = Field(
        default=30.0,
        gt=0,
        le=86_400,
        description="How long a claimed job is held without a heartbeat; then another worker "
        "rescues it.",
    )
    heartbeat_interval: float | None = Field(
        default=None, gt=0, description="Seconds between lease renewals; default lease / 4."
    )
    shutdown_grace: float = Field(
        default=25.0,
        ge=0,
        le=3600,
        description="Seconds running jobs get to finish on SIGTERM or SIGINT; the rest go back "
        "to the queue.",
    )
    statement_timeout: float | None = Field(
        default=None,
        gt=0,
        description="Seconds a query may run before PostgreSQL cancels it; default one heartbeat.",
    )
    connect_timeout: float | None = Field(
        default=None,
        gt=0,
        le=300,
        description="Seconds to wait for a connection (and, in the API, for a free pooled "
        "one); default 5, or a third of the lease when that is shorter.",
    )
    default_task: str = Field(
        default="echo",
        min_length=1,
        max_length=200,
        description="Task of a job that names none (neither `task` nor a string `payload.task`).",
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        le=1000,
        description="Attempts of a job whose task and submission set none.",
    )
    retry_base: float = Field(
        default=1.0,
        ge=0,
        description="Seconds before the first retry, for tasks that set no backoff.",
    )
    retry_factor: float = Field(
        default=2.0, ge=1, description="How much each retry's wait grows, for tasks that set none."
    )
    retry_cap: float = Field(
        default=3600.0, ge=0, description="Longest wait between attempts, for tasks that set none."
    )
    breaker_threshold: int | None = Field(
        default=None,
        ge=1,
        description="Consecutive failures that open a task's circuit breaker, for tasks that "
        "set none; unset means no breaker.",
    )
    breaker_cooldown: float = Field(
        default=30.0,
        gt=0,
        description="Seconds an open circuit breaker keeps its task from being claimed before "
        "one probe job runs, for tasks that set none.",
    )
    keep_completed: float | None = Field(
        default=7 * 86_400,
        ge=0,
        description="Seconds a completed job is kept before workers delete it; unset or empty "
        "keeps them for good.",
    )
    keep_failed: float | None = Field(
        default=None, ge=0, description="Seconds a failed job is kept; default: for good."
    )
    keep_cancelled: float | None = Field(
        default=7 * 86_400, ge=0, description="Seconds a cancelled job is kept."
    )
    horizon_warn_after: float = Field(
        default=300.0,
        gt=0,
        le=7 * 86_400,
        description="Seconds after which a snapshot that holds the xmin horizon (a long "
        "transaction, a REPEATABLE READ session, a prepared transaction) is a problem: the "
        "maintenance leader logs a warning naming it, and `notifyq doctor` fails.",
    )
    prune_interval: float = Field(
        default=60.0, gt=0, description="Seconds between a worker's retention passes."
    )
    archive_after: float | None = Field(
        default=None,
        ge=0,
        description="Seconds after which a finished job moves from notifyq.jobs to the "
        "archive (notifyq.jobs_archive, one partition a day, dropped whole once older than "
        "the longest NOTIFYQ_KEEP_*); unset or empty: no archive.",
    )


class Settings(_DatabaseAndWorker):
    """Everything a notifyq process can be told. Immutable; build it once with :meth:`load`.
    Its fields from the database to retention are declared in :class:`_DatabaseAndWorker`; the
    HTTP API's, the logs' and tracing's here."""

    api_token: SecretStr | None = Field(
        default=None,
        description="When set, every route but /health (and the docs and dashboard page) "
        "needs Authorization: Bearer <token>. Empty or whitespace is refused at start.",
    )
    allow_unauthenticated: bool = Field(
        default=False,
        description="Let `serve`/`dev` bind an address other than loopback without a token.",
    )
    allowed_hosts: CommaList = Field(
        default_factory=list,
        description="Without a token, Host names the API answers besides localhost, "
        "127.0.0.1 and [::1] (comma-separated; a DNS rebinding guard).",
    )
    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=16 * 1024 * 1024,
        description="Most bytes of a request's line and headers `serve`/`dev` read; past "
        "them the connection gets 431 and is closed.",
    )
    head_timeout: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="Seconds a client of `serve`/`dev` has to send a request's line and "
        "headers, from its connection (or its request's first byte); past them 408 and the "
        "connection is closed.",
    )
    body_timeout: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="Seconds a client of `serve`/`dev` has to send a request's body once its "
        "head is in; past them the connection is closed.",
    )
    max_connections: int = Field(
        default=2048,
        ge=1,
        le=1_000_000,
        description="Most connections (and requests in progress) `serve`/`dev` hold at once; "
        "past them a request gets 503.",
    )
    cors_origins: CommaList = Field(
        default_factory=list,
        description="Origins allowed to call the API from a browser (comma-separated); none "
        "by default, so CORS stays off.",
    )
    host: str = Field(
        default="127.0.0.1", description="Address `serve` and `dev` (and --metrics-port) listen on."
    )
    port: int = Field(default=8000, ge=0, le=65535, description="Port `serve` and `dev` listen on.")
    run_worker: bool = Field(default=True, description="Run a worker inside `notifyq serve`.")
    auto_migrate: bool = Field(default=True, description="Apply migrations when a process starts.")
    max_body_bytes: int = Field(
        default=1024 * 1024, ge=1024, description="Largest request body the API reads; past it 413."
    )
    pool_size: int = Field(
        default=10,
        ge=1,
        le=1000,
        description="Connections of the API's pool (its worker's besides).",
    )
    max_streams: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Open GET /jobs/{id}/events streams one API process serves at once.",
    )
    otel: bool = Field(
        default=False,
        description="Trace enqueues and attempts with OpenTelemetry (the otel extra): spans go "
        "to the process's tracer provider, and each job keeps the trace context it was "
        "enqueued in.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Least level of the log lines a process writes."
    )
    log_format: Literal["text", "json"] = Field(
        default="text", description="text for people, json for one object per line."
    )

    @field_validator("imports", "queues", "cors_origins", "allowed_hosts", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return _split_commas(value)

    @field_validator("queues")
    @classmethod
    def _empty_means_all(cls, value: list[str] | None) -> list[str] | None:
        return value or None

    @field_validator("keep_completed", "keep_failed", "keep_cancelled", mode="before")
    @classmethod
    def _empty_means_forever(cls, value: Any) -> Any:
        return None if value in ("", "none", "None", "forever") else value

    @field_validator("archive_after", mode="before")
    @classmethod
    def _empty_means_off(cls, value: Any) -> Any:
        return None if value in ("", "none", "None", "off") else value

    @field_validator("api_token", mode="before")
    @classmethod
    def _token_is_not_blank(cls, value: Any) -> Any:
        # An empty variable must never mean "an empty bearer is accepted"; and whitespace
        # around a token is never meant (HTTP strips it from the header anyway).
        raw = value.get_secret_value() if isinstance(value, SecretStr) else value
        if isinstance(raw, str):
            if not raw.strip():
                raise PydanticCustomError(
                    "blank_token",
                    "is empty or whitespace: set it to a long random secret (for example "
                    "the output of `openssl rand -hex 32`), or unset it",
                )
            return raw.strip()
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("log_format", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _timeouts_are_consistent(self) -> Settings:
        if self.heartbeat_interval is not None and self.heartbeat_interval * 3 > self.lease_seconds:
            raise ValueError(
                f"NOTIFYQ_HEARTBEAT_INTERVAL={self.heartbeat_interval:g} must be at most a third "
                f"of NOTIFYQ_LEASE_SECONDS={self.lease_seconds:g}, so that a lease survives two "
                "missed beats"
            )
        if self.statement_timeout is not None and self.statement_timeout > self.lease_seconds / 2:
            raise ValueError(
                f"NOTIFYQ_STATEMENT_TIMEOUT={self.statement_timeout:g} must be at most half of "
                f"NOTIFYQ_LEASE_SECONDS={self.lease_seconds:g}, or a stuck heartbeat outlives "
                "the lease"
            )
        if self.connect_timeout is not None and self.connect_timeout > self.lease_seconds / 2:
            raise ValueError(
                f"NOTIFYQ_CONNECT_TIMEOUT={self.connect_timeout:g} must be at most half of "
                f"NOTIFYQ_LEASE_SECONDS={self.lease_seconds:g}, or a reconnecting heartbeat "
                "outlives the lease"
            )
        return self

    @property
    def connect_wait(self) -> float:
        """Seconds to wait for a connection."""
        if self.connect_timeout is not None:
            return self.connect_timeout
        return min(5.0, max(1.0, self.lease_seconds / 3))

    @property
    def heartbeat(self) -> float:
        """Seconds between lease renewals."""
        return self.heartbeat_interval or self.lease_seconds / 4

    @property
    def transaction_pooled(self) -> bool:
        """Whether DATABASE_URL goes through a transaction-mode pooler (see ``pooler``)."""
        if self.pooler == "auto":
            return bool(self.listen_url) and self.listen_url != self.database_url
        return self.pooler == "transaction"

    @property
    def query_timeout(self) -> float:
        """Seconds after which PostgreSQL cancels one of our statements."""
        return self.statement_timeout or max(self.heartbeat, 1.0)

    @classmethod
    def load(cls, **overrides: Any) -> Settings:
        """Builds settings from the environment, with ``overrides`` (CLI flags) winning.

        Raises :class:`ConfigurationError` with one readable line per bad value.
        """
        given = {key: value for key, value in overrides.items() if value is not None}
        try:
            return cls(**given)
        except ValidationError as exc:
            raise ConfigurationError(describe_validation_error(exc)) from exc


def describe_validation_error(exc: ValidationError) -> str:
    """One line naming each bad setting by its environment variable."""
    parts = []
    for error in exc.errors():
        loc = error.get("loc") or ()
        name = str(loc[0]) if loc else ""
        if name in ("", "__root__"):
            parts.append(str(error["msg"]).removeprefix("Value error, "))
            continue
        env = "DATABASE_URL" if name == "database_url" else f"NOTIFYQ_{name.upper()}"
        if name == "imports":
            env = "NOTIFYQ_IMPORT"
        parts.append(f"{env}: {error['msg']}")
    return "invalid settings: " + "; ".join(parts)


def explicit_max_attempts(settings: Settings) -> int | None:
    """NOTIFYQ_MAX_ATTEMPTS when it was set, else None (the database's default applies)."""
    return settings.max_attempts if "max_attempts" in settings.model_fields_set else None
