"""The value types: a job as stored, a job to enqueue, and what enqueueing answers.

These are plain frozen dataclasses; the HTTP request and response models live in
:mod:`notifyq.api` and convert to and from them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any
from uuid import UUID

from notifyq.errors import InvalidJob, JobNotFound, SignalRefused

#: Bounds of what one job may say; past them PostgreSQL would refuse the row, or worse.
MAX_NAME_LENGTH = 200
MAX_DEDUP_KEY_LENGTH = 512
MAX_DELAY_SECONDS = 10 * 366 * 86_400
MAX_ATTEMPTS_LIMIT = 1000
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
#: Deepest nesting of a payload or result (the API's JSON serialiser stops at 255).
MAX_DEPTH = 100
#: Most jobs one job may depend on (the database's bound too).
MAX_DEPENDENCIES = 1000
#: Longest group_key (the database's bound too).
MAX_GROUP_KEY_LENGTH = 512
MAX_FAIR_KEY_LENGTH = 512
#: A fair key's weight (notifyq.fair_weights): its share of the claims beside a key of 1.
MIN_FAIR_WEIGHT = 1.0
MAX_FAIR_WEIGHT = 1000.0


class JobStatus(str, Enum):
    """Where a job is in its life: waiting (for the jobs it depends on) → queued → processing
    (⇄ suspended: a durable job's sleep or signal wait, holding no slot) → completed | failed
    (or cancelled)."""

    WAITING = "waiting"
    QUEUED = "queued"
    PROCESSING = "processing"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value

    @property
    def finished(self) -> bool:
        """Whether the job will not run again unless retried."""
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


@dataclass(frozen=True, slots=True)
class Job:
    """A row of ``notifyq.jobs``."""

    id: UUID
    task: str
    queue: str
    payload: dict[str, Any]
    status: JobStatus
    priority: int
    run_at: datetime
    attempt_count: int
    max_attempts: int
    dedup_key: str | None
    result: Any
    last_error: str | None
    errors: list[dict[str, Any]]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None
    lease_expires_at: datetime | None
    cancel_requested_at: datetime | None = None
    #: The jobs this one waits for (it runs once every one is completed).
    depends_on: list[UUID] = field(default_factory=list)
    group_key: str | None = None
    workflow_id: UUID | None = None
    #: A running (or finished) job's last report: {"fraction": 0..1 or None, "message": ...}.
    progress: dict[str, Any] | None = None
    #: Whether it was read from the archive (NOTIFYQ_ARCHIVE_AFTER): finished, and kept until
    #: its day's partition is dropped; it can no longer be retried, cancelled or deleted.
    archived: bool = False
    #: Its name in its workflow (the ``ref`` it was submitted with); None outside a workflow.
    ref: str | None = None
    #: A suspended job: when it is due again (None: only when its signal comes).
    suspended_until: datetime | None = None
    #: A suspended job: the signal it waits for.
    waiting_for_signal: str | None = None
    #: Its recorded steps (``ctx.step``), in the order they finished: (name, finished_at).
    steps: list[tuple[str, datetime]] = field(default_factory=list)
    #: Its key for the fair claims (round-robin across the keys of a queue); None: none.
    fair_key: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Job:
        """A job from a ``dict_row`` of the jobs table."""
        values = dict(row)
        names = values.pop("step_names", None)
        times = values.pop("step_times", None)
        if names and times:
            values["steps"] = list(zip(names, times, strict=False))
        values["status"] = JobStatus(values["status"])
        if not isinstance(values.get("errors"), list):
            values["errors"] = []  # a stored value that could not be decoded
        if "progress" in values and not _is_progress(values["progress"]):
            values["progress"] = None  # written by hand, or undecodable
        return cls(**values)

    @classmethod
    def of(cls, **columns: Any) -> Job:
        """A job from a row of the jobs table (a ``kwargs_row`` factory)."""
        return cls.from_row(columns)


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """What enqueueing one job answers."""

    job_id: UUID
    status: JobStatus
    duplicate: bool
    run_at: datetime
    created_at: datetime

    @classmethod
    def of(
        cls,
        *,
        job_id: UUID,
        status: str,
        duplicate: bool,
        run_at: datetime,
        created_at: datetime,
        ord: int | None = None,
    ) -> EnqueueResult:
        """The result from a row of the enqueue functions (a ``kwargs_row`` factory)."""
        return cls(job_id, JobStatus(status), duplicate, run_at, created_at)


def job_id_of(job_id: UUID | str) -> UUID:
    """A job id given as a UUID or its text; InvalidJob when it is neither."""
    if isinstance(job_id, UUID):
        return job_id
    try:
        return UUID(str(job_id))
    except ValueError:
        raise InvalidJob(f"{job_id!r} is not a job id (a UUID)") from None


def check_job_ids(what: str, ids: Iterable[UUID | str]) -> tuple[UUID, ...]:
    """Job ids (UUIDs, or their text), in their order, without repeats; at most
    MAX_DEPENDENCIES of them."""
    if isinstance(ids, (str, bytes, Mapping)) or not isinstance(ids, Iterable):
        raise InvalidJob(f"{what} must be a list of job ids")
    found: dict[UUID, None] = {}
    for index, item in enumerate(ids):
        if isinstance(item, UUID):
            found[item] = None
        elif isinstance(item, str):
            try:
                found[UUID(item)] = None
            except ValueError:
                raise InvalidJob(
                    f"{what}[{index}] is not a job id (a UUID): {item[:60]!r}"
                ) from None
        else:
            raise InvalidJob(f"{what}[{index}] must be a job id (a UUID string)")
        if len(found) > MAX_DEPENDENCIES:
            raise InvalidJob(f"{what} names more than {MAX_DEPENDENCIES} jobs")
    return tuple(found)


def _is_progress(value: object) -> bool:
    return value is None or (isinstance(value, dict) and not isinstance(value, Undecodable))


def check_name(what: str, value: object) -> str:
    """A task or queue name: a non-empty string of at most 200 characters, without NUL."""
    if type(value) is str and 0 < len(value) <= MAX_NAME_LENGTH and value.isascii():
        if "\x00" not in value:
            return value  # the common case, checked in one pass
    return check_key(what, value, MAX_NAME_LENGTH)


def check_key(what: str, value: object, longest: int) -> str:
    """A non-empty string of at most ``longest`` characters that PostgreSQL's text can hold."""
    if not isinstance(value, str) or not value:
        raise InvalidJob(f"{what} must be a non-empty string")
    if len(value) > longest:
        raise InvalidJob(f"{what} is longer than {longest} characters")
    check_text(what, value)
    return value


def check_text(what: str, value: str) -> None:
    """Refuses what a PostgreSQL text value cannot hold: NUL, and unpaired surrogates."""
    if "\x00" in value:
        raise InvalidJob(f"{what} contains a NUL character, which PostgreSQL cannot store")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidJob(f"{what} contains an unpaired surrogate; send valid UTF-8") from None


def check_run_at(run_at: object) -> datetime:
    """``run_at`` in UTC (naive means UTC), refused unless both PostgreSQL and Python can hold
    it comfortably."""
    if not isinstance(run_at, datetime):
        raise InvalidJob("run_at must be a datetime")
    if run_at.tzinfo is None:
        run_at = run_at.replace(tzinfo=timezone.utc)
    try:
        utc = run_at.astimezone(timezone.utc)
    except OverflowError:
        raise InvalidJob("run_at must fall between the years 1900 and 9998 (UTC)") from None
    if not 1900 <= utc.year <= 9998:
        # Both ends keep a margin, so that any time zone's view of it stays representable.
        raise InvalidJob("run_at must fall between the years 1900 and 9998 (UTC)")
    return utc


def check_delay(delay: object) -> float:
    """Seconds of delay: finite, from 0 to ten years."""
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):
        raise InvalidJob("delay must be a number of seconds")
    if not math.isfinite(delay) or not 0 <= delay <= MAX_DELAY_SECONDS:
        raise InvalidJob(f"delay must be from 0 to {MAX_DELAY_SECONDS} seconds")
    return float(delay)


#: One encoder for every payload and result: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def encode_json(value: Any, *, what: str) -> str:
    """``value`` as JSON text that PostgreSQL's jsonb accepts, or InvalidJob saying why not."""
    if value is None:
        return "null"  # what most handlers return
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidJob(f"{what} is not JSON-serialisable: {exc}") from None
    if text.count("[") + text.count("{") > MAX_DEPTH:
        # Only values with many brackets can be too deep: walk just those.
        _check_depth(value, what)
    if "\\u0000" in text:
        # Rare: only now walk the value to tell a real NUL from a literal backslash-u0000.
        _refuse_nul(value, what)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidJob(f"{what} contains an unpaired surrogate; send valid UTF-8") from None
    return text


class Undecodable(dict[str, str]):
    """Stands in for a stored JSON value that notifyq cannot decode: one nested deeper than
    :data:`MAX_DEPTH` (inserted by SQL, where jsonb takes thousands of levels), or holding a number
    longer than Python reads. It is the object ``{"undecodable": reason}``, so a reader of the row
    (``GET /jobs``, say) still works; a worker that claims a job whose payload is one fails that
    job at once with the reason, without running it."""

    __slots__ = ()

    def __init__(self, reason: str) -> None:
        super().__init__(undecodable=reason)

    @property
    def reason(self) -> str:
        """Why the value could not be decoded."""
        return self["undecodable"]


#: json.loads' own decoder (default options), called without json.loads around it.
_DECODER = json.JSONDecoder()


def decode_stored_json(data: bytes | bytearray | memoryview | str) -> Any:
    """A JSON value as PostgreSQL stores it, or :class:`Undecodable` saying why it cannot be
    read. Never raises: one row's data must not break a worker's loop or the API."""
    # PostgreSQL sends JSON text in the client encoding with no BOM and no NUL, for which
    # json.loads detects UTF-8 and decodes it so: that, without its two Python calls (it runs
    # for every payload a worker claims). Bytes that are not UTF-8 fail as they did there.
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8", "surrogatepass")
        value = _DECODER.decode(text)
    except RecursionError:
        return Undecodable(
            "the stored JSON nests too deeply for Python to read (more than about 1000 levels)"
        )
    except ValueError as exc:
        return Undecodable(f"the stored JSON cannot be read: {exc}")
    if text.count("[") + text.count("{") > MAX_DEPTH:
        # Only values with many brackets can be too deep: walk just those.
        try:
            _check_depth(value, "the stored JSON")
        except InvalidJob as exc:
            return Undecodable(str(exc))
    return value


def _check_depth(value: Any, what: str) -> None:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > MAX_DEPTH:
            raise InvalidJob(f"{what} nests deeper than {MAX_DEPTH} levels")
        stack.extend((child, depth + 1) for child in children)


def _refuse_nul(value: Any, what: str) -> None:
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidJob(f"{what} contains a NUL character, which PostgreSQL cannot store")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _refuse_nul(key, what)
            _refuse_nul(item, what)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _refuse_nul(item, what)


@dataclass(slots=True)
class ClaimedJob:
    """A job a worker has claimed: what its handler needs, and the (id, attempt) fence."""

    id: UUID
    task: str
    queue: str
    payload: dict[str, Any]
    priority: int
    attempt: int
    max_attempts: int
    #: The claim number: with the worker's id, it fences every write about this attempt.
    claim: int
    #: Seconds since the epoch, as floats: a row written by hand with a date Python cannot
    #: hold must not make the claim itself fail.
    created_at: float
    run_at: float
    #: The results of the jobs it depends on, by id (text); None when it depends on none.
    dependencies: dict[str, Any] | None = None
    #: The trace context it was enqueued in, as stored (``notifyq.tracing`` reads it, and
    #: treats anything but an object of strings as none); None when it has none.
    trace_context: Any = None


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """What a claim asks for: up to ``limit`` due jobs of ``tasks`` in ``queues`` (None: every
    queue), each held for ``lease`` seconds."""

    tasks: Sequence[str]
    queues: Sequence[str] | None
    limit: int
    lease: float


# -- what a worker reports about the jobs it holds ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Held:
    """A job a worker holds: its id and the claim number that fences its writes."""

    job_id: UUID
    claim: int


@dataclass(frozen=True, slots=True)
class Success:
    """A finished attempt, its result already encoded as JSON. ``claim`` is the claim number
    that fences the write (see notifyq.holds_v1)."""

    job_id: UUID
    claim: int
    result_json: str
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt: retried after ``delay`` seconds while attempts are left and it is
    ``retryable``, else final."""

    job_id: UUID
    claim: int
    error: str
    retryable: bool
    delay: float
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Snoozed:
    """An attempt whose handler raised :class:`~notifyq.Snooze`: back to the queue in
    ``delay`` seconds, the attempt not counted."""

    job_id: UUID
    claim: int
    delay: float
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Suspended:
    """An attempt whose handler suspended its job (``ctx.sleep``, ``ctx.wait_for_signal``):
    ``delay`` seconds from now it is due again (None: only when signal ``signal`` comes); its
    ``mark`` of kind ``kind`` (``sleep`` or ``wait``) records the time, so that the same call
    returns at once when the job runs again. The attempt is not counted."""

    job_id: UUID
    claim: int
    delay: float | None
    signal: str | None
    mark: str
    kind: str
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Progress:
    """A running job's progress report, as a worker writes it."""

    job_id: UUID
    claim: int
    fraction: float | None
    message: str | None


class OutcomeKind(str, Enum):
    """What became of an attempt, as a worker writes it (and names it in logs and metrics)."""

    COMPLETED = "completed"
    FAILED = "failed"
    RELEASED = "released"
    CANCELLED = "cancelled"
    SNOOZED = "snoozed"
    SUSPENDED = "suspended"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Rescued:
    """A job whose lease ran out, the status the rescue gave it, and whether the attempt
    counted (False: no heartbeat had confirmed its handler running, so it was given back)."""

    job_id: UUID
    status: JobStatus
    counted: bool = True

    @classmethod
    def of(cls, *, id: UUID, status: str, counted: bool) -> Rescued:
        """From a row of notifyq.rescue_v3 (a ``kwargs_row`` factory)."""
        return cls(id, JobStatus(status), counted)


@dataclass(frozen=True, slots=True)
class Cancelled:
    """What a cancel request found (``was``) and left (``now``): ``now`` is still
    ``processing`` when the job's worker was asked to stop it."""

    was: JobStatus
    now: JobStatus

    @classmethod
    def of(cls, *, was: str, status: str) -> Cancelled:
        """From the row of notifyq.cancel_job_v2 (a ``kwargs_row`` factory)."""
        return cls(JobStatus(was), JobStatus(status))


@dataclass(frozen=True, slots=True)
class Retried:
    """What a retry found: the job's status now, and why it did not go back (None: it did)."""

    status: JobStatus
    refused: str | None

    @classmethod
    def of(cls, *, status: str, refused: str | None) -> Retried:
        """From the row of notifyq.retry_v2 (a ``kwargs_row`` factory)."""
        return cls(JobStatus(status), refused)


@dataclass(frozen=True, slots=True)
class TaskRegistration:
    """What a worker records about a task it serves (notifyq.tasks): its options as JSON, its
    limits and its circuit breaker."""

    name: str
    max_attempts: int | None
    options_json: str
    breaker_threshold: int | None
    breaker_cooldown: float
    max_concurrency: int | None
    rate_limit: float | None
    key_concurrency: int | None = None


#: Largest payload of a signal, as JSON (the database's bound too).
MAX_SIGNAL_PAYLOAD_BYTES = 64 * 1024
#: Most signal names one job may receive.
MAX_SIGNALS_PER_JOB = 100


def signal_payload_json(name: object, payload: Any) -> str:
    """A signal's payload as JSON text, after checking the signal: ``name`` 1 to 200
    characters, ``payload`` a JSON object (None: ``{}``) of 64 KiB at most; InvalidJob if not."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_LENGTH or "\x00" in name:
        raise InvalidJob(f"a signal's name must be a string of 1 to {MAX_NAME_LENGTH} characters")
    if payload is None:
        return "{}"
    if not isinstance(payload, Mapping):
        raise InvalidJob("a signal's payload must be a JSON object")
    text = encode_json(payload, what="the signal's payload")
    if len(text.encode()) > MAX_SIGNAL_PAYLOAD_BYTES:
        raise InvalidJob(f"a signal's payload is {MAX_SIGNAL_PAYLOAD_BYTES} bytes at most as JSON")
    return text


def signal_sent(job_id: UUID, outcome: str) -> bool:
    """What sending a signal answers (True: sent; False: a signal of that name came first), or
    the error of an ``outcome`` of notifyq.signal_v1 that is not one."""
    if outcome == "sent":
        return True
    if outcome == "duplicate":
        return False
    if outcome == "unknown":
        raise JobNotFound(f"no job with id {job_id}")
    if outcome == "final":
        raise SignalRefused(f"job {job_id} has ended: no signal can reach it")
    raise SignalRefused(
        f"job {job_id} has received {MAX_SIGNALS_PER_JOB} signals, the most one job may"
    )
