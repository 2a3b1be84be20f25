"""The arguments of each command, as typed values: what :mod:`notifyq.cli._parser` reads from
the command line, and what the commands take (with the settings built from them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from notifyq.grants import Kind

JobStatusName = Literal[
    "waiting", "queued", "processing", "suspended", "completed", "failed", "cancelled"
]


@dataclass(frozen=True, kw_only=True)
class Arguments:
    """The options of every command, and what a command's arguments say about it."""

    database_url: str | None
    log_level: str | None

    #: Whether it runs until stopped (a server or a worker), leaving handler threads behind.
    long_running: ClassVar[bool] = False

    def needs_database_url(self) -> bool:
        """Whether the command refuses to start without DATABASE_URL (see notifyq.bootstrap)."""
        return True

    def settings_overrides(self) -> dict[str, object]:
        """The settings its flags give, over the environment's (None: not given)."""
        return {"database_url": self.database_url, "log_level": self.log_level}


# -- running processes -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class MigrateArgs(Arguments):
    """``notifyq migrate``."""


@dataclass(frozen=True, kw_only=True)
class WorkerOptions(Arguments):
    """The options of every command that runs a worker."""

    queues: str | None
    concurrency: int | None
    poll_interval: float | None
    archive_after: float | None
    imports: list[str] | None

    long_running: ClassVar[bool] = True

    def settings_overrides(self) -> dict[str, object]:
        overrides = super().settings_overrides()
        overrides.update(
            concurrency=self.concurrency,
            poll_interval=self.poll_interval,
            archive_after=self.archive_after,
        )
        if self.queues is not None:
            overrides["queues"] = self.queues
        if self.imports:
            overrides["imports"] = ",".join(self.imports)
        return overrides


@dataclass(frozen=True, kw_only=True)
class WorkerArgs(WorkerOptions):
    """``notifyq worker``."""

    burst: bool
    metrics_port: int | None
    #: The address of the metrics port.
    host: str | None

    def settings_overrides(self) -> dict[str, object]:
        return {**super().settings_overrides(), "host": self.host}


@dataclass(frozen=True, kw_only=True)
class ServeArgs(WorkerOptions):
    """``notifyq serve``."""

    host: str | None
    port: int | None
    no_worker: bool

    def settings_overrides(self) -> dict[str, object]:
        overrides = {**super().settings_overrides(), "host": self.host, "port": self.port}
        if self.no_worker:
            overrides["run_worker"] = False
        return overrides


@dataclass(frozen=True, kw_only=True)
class DevArgs(WorkerOptions):
    """``notifyq dev``."""

    host: str | None
    port: int | None
    reset: bool

    def needs_database_url(self) -> bool:
        return False  # it starts or joins an embedded server without one

    def settings_overrides(self) -> dict[str, object]:
        return {**super().settings_overrides(), "host": self.host, "port": self.port}


# -- jobs ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class EnqueueArgs(Arguments):
    """``notifyq enqueue``."""

    task: str
    #: As typed: the command decodes it.
    payload: str
    #: The job's options given as flags (notifyq.jobspec), not checked yet; None when none.
    options: dict[str, Any] | None


@dataclass(frozen=True, kw_only=True)
class StatusArgs(Arguments):
    """``notifyq status``."""

    job_id: str


@dataclass(frozen=True, kw_only=True)
class WaitArgs(Arguments):
    """``notifyq wait``."""

    job_id: str
    #: Seconds; None waits for as long as it takes.
    timeout: float | None


@dataclass(frozen=True, kw_only=True)
class JobsArgs(Arguments):
    """``notifyq jobs``."""

    status: JobStatusName | None
    task: str | None
    queue: str | None
    limit: int
    as_json: bool


@dataclass(frozen=True, kw_only=True)
class RetryArgs(Arguments):
    """``notifyq retry``: the jobs named, or else every one the filters choose."""

    job_ids: list[str]
    task: str | None
    queue: str | None
    status: Literal["failed", "cancelled"]
    every: bool


@dataclass(frozen=True, kw_only=True)
class CancelArgs(Arguments):
    """``notifyq cancel``."""

    job_ids: list[str]


@dataclass(frozen=True, kw_only=True)
class PruneArgs(Arguments):
    """``notifyq prune``."""

    batch: int


# -- queues and tasks ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class QueueArgs(Arguments):
    """``notifyq queue``."""

    name: str
    pause: bool
    resume: bool
    rate_limit: float | None
    max_depth: int | None
    notify: Literal["on", "off"] | None

    @property
    def paused(self) -> bool | None:
        """True to pause, False to resume, None to leave as it is."""
        return True if self.pause else False if self.resume else None

    @property
    def notifying(self) -> bool | None:
        """Whether inserts should wake workers, or None to leave it as it is."""
        return None if self.notify is None else self.notify == "on"


@dataclass(frozen=True, kw_only=True)
class StatsArgs(Arguments):
    """``notifyq stats``."""


@dataclass(frozen=True, kw_only=True)
class DoctorArgs(Arguments):
    """``notifyq doctor``."""

    json: bool
    horizon_warn_after: float | None

    def settings_overrides(self) -> dict[str, object]:
        return super().settings_overrides() | {"horizon_warn_after": self.horizon_warn_after}


@dataclass(frozen=True, kw_only=True)
class TopArgs(Arguments):
    """``notifyq top``."""

    interval: float


@dataclass(frozen=True, kw_only=True)
class TasksArgs(Arguments):
    """``notifyq tasks``."""


@dataclass(frozen=True, kw_only=True)
class FairArgs(Arguments):
    """``notifyq fair set KEY WEIGHT``, ``notifyq fair unset KEY``, ``notifyq fair list``."""

    action: Literal["set", "unset", "list"]
    key: str | None = None
    weight: float | None = None
    limit: int = 20


# -- roles -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GrantArgs(Arguments):
    """``notifyq grant``."""

    role: str
    kind: Kind
    print_only: bool
    login_password_env: str | None

    def needs_database_url(self) -> bool:
        return not self.print_only  # printing the statements needs no database
