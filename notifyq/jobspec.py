"""A job to enqueue: its options, each spelled once, and :class:`JobSpec`, the checked job.

:class:`JobOptions` is the one definition of what a job may say besides its task and payload:
each key's type is what Python callers pass, and its :class:`Option` says what the option
means, how it is checked, how JSON and the command line spell it, and its SQL type.
``Queue.enqueue``, ``SyncQueue.enqueue`` and ``notifyq.django.enqueue`` take them as keyword
arguments (typed by ``Unpack[JobOptions]``), the API's ``JobIn`` and ``notifyq enqueue``'s flags
are made from them, the store sends them by name, and ``tests/test_jobspec.py`` checks that the
SQL enqueue functions take every one. Adding an option is one entry here plus its migration
(ARCHITECTURE.md, "Adding a job option").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cache
from typing import Annotated, Any, Literal, TypedDict, get_args, get_type_hints
from uuid import UUID

from notifyq.errors import InvalidJob
from notifyq.models import (
    MAX_ATTEMPTS_LIMIT,
    MAX_DEDUP_KEY_LENGTH,
    MAX_DELAY_SECONDS,
    MAX_DEPENDENCIES,
    MAX_FAIR_KEY_LENGTH,
    MAX_GROUP_KEY_LENGTH,
    MAX_NAME_LENGTH,
    PRIORITY_RANGE,
    check_delay,
    check_job_ids,
    check_key,
    check_name,
    check_run_at,
    encode_json,
)


@dataclass(frozen=True)
class Option:
    """What one option of a job is, beside its Python type (the key's in :class:`JobOptions`).

    ``check(name, value)`` answers the value to store, or raises InvalidJob saying what is
    wrong; it never sees None (None means "not given"). ``api`` is the annotation of the
    HTTP field and ``bounds`` its pydantic constraints; ``parse`` reads a command-line flag's
    text (None: no flag), ``many`` makes the flag repeatable. ``sql`` is the type the enqueue
    statements cast the value to. ``plain`` says that a plain INSERT stores it (the statement
    ``enqueue_plain`` of sql/queries.sql); any other option sends the job through
    ``notifyq.enqueue_v5``.
    """

    doc: str
    check: Callable[[str, Any], Any]
    api: Any
    sql: str
    bounds: Mapping[str, Any] = field(default_factory=dict)
    parse: Callable[[str], Any] | None = str
    many: bool = False
    plain: bool = False
    #: The parameter sent when the option is not given.
    unset: Any = None
    #: The key of :class:`JobOptions` (filled in by :func:`options`).
    name: str = ""

    def to_sql(self, value: Any) -> Any:
        """The statement parameter of ``value`` (a checked value, or None)."""
        if value is None:
            return self.unset
        if self.many:
            return list(value) if value else None
        return value


def _integer(low: int, high: int, what: str) -> Callable[[str, Any], int]:
    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidJob(f"{name} must be an integer")
        if not low <= value <= high:
            raise InvalidJob(f"{name} must {what}")
        return value

    return check


def _key(longest: int) -> Callable[[str, Any], str]:
    def check(name: str, value: Any) -> str:
        return check_key(name, value, longest)

    return check


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    return check_delay(value)


def _when(name: str, value: Any) -> datetime:
    return check_run_at(value)


#: What a submission does to a queued job of the same queue and dedup_key.
OnConflict = Literal["keep_latest", "keep_first"]


def _on_conflict(name: str, value: Any) -> str:
    if value not in get_args(OnConflict):
        raise InvalidJob(f"{name} must be one of {', '.join(get_args(OnConflict))}")
    return str(value)


def _ids(text: str) -> list[str]:
    return [part.strip() for part in text.split(",")]


_NAME_BOUNDS = {"min_length": 1, "max_length": MAX_NAME_LENGTH, "strict": True}


class JobOptions(TypedDict, total=False):
    """The options of a job, every one optional; see each :class:`Option`'s ``doc``."""

    queue: Annotated[
        str | None,
        Option(
            "The queue; workers can be limited to some queues. Default: the task's queue, "
            "else 'default'.",
            check_name,
            api=str | None,
            bounds=_NAME_BOUNDS,
            sql="text",
            plain=True,
        ),
    ]
    priority: Annotated[
        int | None,
        Option(
            "Higher runs first. Default: the task's priority, else 0.",
            _integer(*PRIORITY_RANGE, "fit in 32 bits"),
            api=int | None,
            bounds={"ge": PRIORITY_RANGE[0], "le": PRIORITY_RANGE[1], "strict": True},
            sql="integer",
            parse=int,
            plain=True,
        ),
    ]
    run_at: Annotated[
        datetime | None,
        Option(
            "Do not start before this time (ISO 8601; no time zone means UTC). Exclusive "
            "with delay.",
            _when,
            api=datetime | None,
            sql="timestamptz",
            parse=datetime.fromisoformat,
            plain=True,
        ),
    ]
    delay: Annotated[
        float | timedelta | None,
        Option(
            "Do not start before this many seconds from now. Exclusive with run_at.",
            _seconds,
            api=float | None,
            bounds={"ge": 0, "le": MAX_DELAY_SECONDS, "allow_inf_nan": False, "strict": True},
            sql="float8",
            parse=float,
            plain=True,
            unset=0.0,
        ),
    ]
    dedup_key: Annotated[
        str | None,
        Option(
            "While a queued job of the same queue has this key, a new submission replaces "
            "its payload, priority, run_at and max_attempts instead of adding a job.",
            _key(MAX_DEDUP_KEY_LENGTH),
            api=str | None,
            bounds={"min_length": 1, "max_length": MAX_DEDUP_KEY_LENGTH, "strict": True},
            sql="text",
        ),
    ]
    max_attempts: Annotated[
        int | None,
        Option(
            "Attempts before the job is failed. Default: the task's, else NOTIFYQ_MAX_ATTEMPTS.",
            _integer(1, MAX_ATTEMPTS_LIMIT, f"be an integer from 1 to {MAX_ATTEMPTS_LIMIT}"),
            api=int | None,
            bounds={"ge": 1, "le": MAX_ATTEMPTS_LIMIT, "strict": True},
            sql="integer",
            parse=int,
            plain=True,
        ),
    ]
    depends_on: Annotated[
        Iterable[UUID | str] | None,
        Option(
            "Job ids: the job is 'waiting' until every one of them is completed, then queued "
            "at once; cancelled if one of them fails or is cancelled. An unknown id is "
            "refused.",
            check_job_ids,
            api=list[UUID] | None,
            bounds={"max_length": MAX_DEPENDENCIES},
            sql="uuid[]",
            parse=_ids,
            many=True,
        ),
    ]
    group_key: Annotated[
        str | None,
        Option(
            "Jobs of one (queue, group_key) run one at a time, in the order they were "
            "submitted, across every worker.",
            _key(MAX_GROUP_KEY_LENGTH),
            api=str | None,
            bounds={"min_length": 1, "max_length": MAX_GROUP_KEY_LENGTH, "strict": True},
            sql="text",
        ),
    ]
    fair_key: Annotated[
        str | None,
        Option(
            "A tenant, a customer: within a queue and priority, claims go round-robin across "
            "keys, so that one key's backlog delays another key's next job by about one job "
            "of its own (weights: notifyq fair set). Jobs without one share one key.",
            _key(MAX_FAIR_KEY_LENGTH),
            api=str | None,
            bounds={"min_length": 1, "max_length": MAX_FAIR_KEY_LENGTH, "strict": True},
            sql="text",
            plain=True,
        ),
    ]
    on_conflict: Annotated[
        OnConflict | None,
        Option(
            "What this submission does to a queued job with its dedup_key: keep_latest (the "
            "default) gives that job this payload, priority, run_at and max_attempts; "
            "keep_first leaves it as it is. Needs dedup_key.",
            _on_conflict,
            api=OnConflict | None,
            sql="text",
        ),
    ]
    debounce: Annotated[
        float | timedelta | None,
        Option(
            "Run the job once no newer submission with its dedup_key came for this many "
            "seconds: each one replaces the queued job and moves its start. Needs dedup_key; "
            "exclusive with run_at, delay and keep_first.",
            _seconds,
            api=float | None,
            bounds={"ge": 0, "le": MAX_DELAY_SECONDS, "allow_inf_nan": False, "strict": True},
            sql="float8",
            parse=float,
        ),
    ]


@cache
def options() -> dict[str, Option]:
    """Every option of :class:`JobOptions`, by name, in the order it declares them."""
    found = {}
    for name, hint in get_type_hints(JobOptions, include_extras=True).items():
        (option,) = (m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Option))
        found[name] = replace(option, name=name)
    return found


def check_options(given: Mapping[str, Any]) -> dict[str, Any]:
    """The options ``given`` (None values left out), each checked; InvalidJob names an
    unknown one or says what is wrong with one."""
    known = options()
    checked = {}
    for name, value in given.items():
        option = known.get(name)
        if option is None:
            raise InvalidJob(f"unknown job field {name!r} (known: {', '.join(known)})")
        if value is not None:
            checked[name] = option.check(name, value)
    if "run_at" in checked and "delay" in checked:
        raise InvalidJob("give run_at or delay, not both")
    for needs_key in ("on_conflict", "debounce"):
        if needs_key in checked and "dedup_key" not in checked:
            raise InvalidJob(f"{needs_key} needs a dedup_key")
    if "debounce" in checked and (
        "run_at" in checked or "delay" in checked or checked.get("on_conflict") == "keep_first"
    ):
        raise InvalidJob("debounce sets the start itself: give no run_at, delay or keep_first")
    return checked


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job to enqueue, checked. Build it with :meth:`create`.

    ``task`` may be None: the database then takes ``payload.task`` or its default task.
    ``payload_json`` is the payload already encoded, checked for what PostgreSQL's jsonb
    refuses. ``options`` holds the :class:`JobOptions` given, checked (none of them None): an
    option not given takes the task's registered default, else the settings'.
    """

    task: str | None
    payload_json: str
    options: Mapping[str, Any] = field(default_factory=dict)
    payload: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    workflow_id: UUID | None = None
    #: The job's own id, when the caller chose it (the jobs of a workflow name each other).
    id: UUID | None = None
    #: Its name in its workflow, set by :func:`notifyq.workflows.plan` and stored by
    #: ``enqueue_many`` (which every workflow goes through).
    ref: str | None = None

    @classmethod
    def create(
        cls,
        task: str | None,
        payload: Mapping[str, Any] | None = None,
        *,
        workflow_id: UUID | None = None,
        id: UUID | None = None,
        **given: Any,
    ) -> JobSpec:
        """Checks the task, the payload and every option (see :class:`JobOptions`) and
        encodes the payload; InvalidJob says what is wrong."""
        payload = {} if payload is None else payload
        if not isinstance(payload, Mapping):
            raise InvalidJob(f"payload must be a JSON object, not {type(payload).__name__}")
        if task is not None:
            check_name("task", task)
        elif isinstance(payload.get("task"), str):
            check_name("payload.task", payload["task"])
        return cls(
            task=task,
            payload_json=encode_json(payload, what="payload"),
            options=check_options(given),
            payload=payload,
            workflow_id=workflow_id,
            id=id,
        )

    @classmethod
    def of(cls, job: Mapping[str, Any], **given: Any) -> JobSpec:
        """The spec of a job given as a mapping with ``task``, ``payload`` and options (what
        ``enqueue_many`` takes); ``given`` adds or replaces options."""
        if "task" not in job:
            raise InvalidJob("each job needs a task")
        fields = {key: value for key, value in job.items() if key not in ("task", "payload")}
        return cls.create(job["task"], job.get("payload"), **(fields | given))

    @property
    def plain(self) -> bool:
        """Whether a plain INSERT stores it: its task known, every option one that the INSERT
        names, and none of the columns of workflows."""
        known = options()
        return (
            self.task is not None
            and self.workflow_id is None
            and self.id is None
            and self.ref is None
            and all(known[name].plain for name in self.options)
        )

    @property
    def queue(self) -> str | None:
        """The queue given, or None for the task's or the default."""
        return self.options.get("queue")

    @property
    def run_at(self) -> datetime | None:
        return self.options.get("run_at")

    @property
    def delay(self) -> float | None:
        return self.options.get("delay")

    @property
    def depends_on(self) -> tuple[UUID, ...]:
        """The jobs it waits for, without repeats."""
        ids: tuple[UUID, ...] = self.options.get("depends_on", ())
        return ids

    def sql_params(self) -> Iterator[tuple[str, Any]]:
        """Each option's name and statement parameter, None where it was not given."""
        for name, option in options().items():
            yield name, option.to_sql(self.options.get(name))
