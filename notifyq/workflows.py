"""Workflows: jobs submitted together that name each other by local refs.

A workflow is a list of jobs, each a mapping with a ``ref`` of its own and the keys of
``Queue.enqueue`` (or a ``POST /jobs`` body); its ``depends_on`` names refs of the same
workflow, or ids of jobs already stored. :func:`plan` checks it (refs unique, every ref known,
no cycle), gives every job its id and the workflow's id, and orders the jobs so that each comes
after those it depends on: the store then enqueues them in one transaction, each job with its
ref, by which a workflow read back names its jobs.

:func:`chain`, :func:`group` and :func:`chord` build the common shapes, as Celery users know
them::

    flow = chain(step("fetch", {"url": u}), group(step("resize", {"w": 100}),
                 step("resize", {"w": 400})), step("publish"))
    result = await q.enqueue_workflow(flow)

A job's handler reads the results of the jobs it depends on from ``ctx.dependencies``.
"""

from __future__ import annotations

import abc
import dataclasses
import heapq
import itertools
import secrets
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from uuid import UUID

from notifyq.errors import InvalidJob
from notifyq.jobspec import JobSpec, options
from notifyq.models import MAX_NAME_LENGTH, Job, JobStatus, check_text

__all__ = [
    "MAX_WORKFLOW_JOBS",
    "Part",
    "Plan",
    "Step",
    "Workflow",
    "WorkflowResult",
    "WorkflowStatus",
    "chain",
    "chord",
    "group",
    "plan",
    "step",
    "workflow_status",
]

#: Most jobs one workflow holds.
MAX_WORKFLOW_JOBS = 1000

#: A workflow's overall status (see :func:`workflow_status`).
WorkflowStatus = Literal["running", "completed", "failed", "cancelled"]


def job_keys() -> frozenset[str]:
    """The keys of one job of a workflow: those of Queue.enqueue, and its ref."""
    return frozenset({"ref", "task", "payload", *options()})


@dataclass(frozen=True)
class Plan:
    """A checked workflow: its id, each ref's job id, and the specs to enqueue, in an order
    where every job comes after those it depends on."""

    workflow_id: UUID
    ids: dict[str, UUID]
    specs: list[JobSpec]


@dataclass(frozen=True)
class WorkflowResult:
    """What enqueueing a workflow answers: its id, and the job id of each ref."""

    workflow_id: UUID
    jobs: dict[str, UUID]


class MakeSpec(Protocol):
    """Turns the job at ``index`` into its spec (the API's validation, or the client's), with
    the ids it depends on, its workflow's id and its own."""

    def __call__(
        self, index: int, job: Mapping[str, Any], depends_on: list[UUID], workflow_id: UUID,
        job_id: UUID,
    ) -> JobSpec: ...  # fmt: skip


def plan(jobs: Sequence[Mapping[str, Any]], make_spec: MakeSpec) -> Plan:
    """Checks a workflow and plans its enqueue: ``make_spec`` builds each job's spec. Raises
    InvalidJob (nothing is enqueued) for an empty or oversized workflow, a missing or duplicate
    ref, a ``depends_on`` naming neither a ref nor a job id, or a cycle, naming the refs at
    fault."""
    if not jobs:
        raise InvalidJob("a workflow needs at least one job")
    if len(jobs) > MAX_WORKFLOW_JOBS:
        raise InvalidJob(f"a workflow holds at most {MAX_WORKFLOW_JOBS} jobs, not {len(jobs)}")
    refs = [_ref_of(index, job) for index, job in enumerate(jobs)]
    seen: dict[str, int] = {}
    for index, ref in enumerate(refs):
        if ref in seen:
            raise InvalidJob(f"jobs[{index}]: ref {ref!r} is also the ref of jobs[{seen[ref]}]")
        seen[ref] = index
    workflow_id = uuid.uuid4()
    parents: list[list[int]] = []  # the indexes of the workflow's jobs each one waits for
    outside: list[list[UUID]] = []  # the stored jobs each one waits for
    for index, job in enumerate(jobs):
        inner, stored = _dependencies(index, job, seen)
        parents.append(inner)
        outside.append(stored)
    order = _topological(refs, parents)
    # Ids that sort in the order the jobs go in: one transaction gives them one created_at, so
    # the id is what keeps a workflow read back in that order.
    made = dict(zip(order, ordered_ids(len(order)), strict=True))
    ids = {ref: made[index] for index, ref in enumerate(refs)}
    # Each job keeps its ref, so that a workflow read back names its jobs as they were sent.
    specs = [
        dataclasses.replace(
            make_spec(
                index,
                jobs[index],
                [ids[refs[p]] for p in parents[index]] + outside[index],
                workflow_id,
                ids[refs[index]],
            ),
            ref=refs[index],
        )
        for index in order
    ]
    return Plan(workflow_id, ids, specs)


def ordered_ids(count: int) -> list[UUID]:
    """``count`` new job ids in increasing order, laid out as UUID version 7 (RFC 9562): the
    time in milliseconds, then a counter from a random start in the 74 bits the layout leaves
    random, so they also sort after ids made earlier and are as hard to guess."""
    millis = time.time_ns() // 1_000_000
    start = secrets.randbits(73)  # leaves room for any count without wrapping
    ids = []
    for n in range(start, start + count):
        value = (millis & (2**48 - 1)) << 80 | 0x7 << 76 | (n >> 62) << 64 | 0b10 << 62
        ids.append(UUID(int=value | (n & (2**62 - 1))))
    return ids


def _ref_of(index: int, job: Mapping[str, Any]) -> str:
    if not isinstance(job, Mapping):
        raise InvalidJob(f"jobs[{index}] must be an object")
    ref = job.get("ref")
    if not isinstance(ref, str) or not ref:
        raise InvalidJob(f"jobs[{index}] needs a ref: a non-empty string naming it")
    if len(ref) > MAX_NAME_LENGTH:
        raise InvalidJob(f"jobs[{index}]: ref is longer than {MAX_NAME_LENGTH} characters")
    check_text(f"jobs[{index}].ref", ref)
    return ref


def _dependencies(
    index: int, job: Mapping[str, Any], refs: Mapping[str, int]
) -> tuple[list[int], list[UUID]]:
    """The refs (as indexes) and the stored job ids that ``job`` depends on, without repeats."""
    named = job.get("depends_on") or []
    if isinstance(named, (str, bytes, Mapping)) or not isinstance(named, Iterable):
        raise InvalidJob(f"jobs[{index}].depends_on must be a list of refs or job ids")
    inner: dict[int, None] = {}
    stored: dict[UUID, None] = {}
    for position, name in enumerate(named):
        where = f"jobs[{index}].depends_on[{position}]"
        if isinstance(name, UUID):
            stored[name] = None
        elif not isinstance(name, str):
            raise InvalidJob(f"{where} must be a ref or a job id (a string)")
        elif name in refs:
            if refs[name] == index:
                raise InvalidJob(f"{where}: job {name!r} cannot depend on itself")
            inner[refs[name]] = None
        else:
            try:
                stored[UUID(name)] = None
            except ValueError:
                raise InvalidJob(
                    f"{where}: {name[:60]!r} is neither a ref of this workflow nor a job id"
                ) from None
    return list(inner), list(stored)


def _topological(refs: list[str], parents: list[list[int]]) -> list[int]:
    """The indexes in an order where each job follows its parents, otherwise as given (so
    that the jobs of one group keep their order); InvalidJob naming a cycle."""
    children: list[list[int]] = [[] for _ in refs]
    waiting = [len(p) for p in parents]
    for child, its_parents in enumerate(parents):
        for parent in its_parents:
            children[parent].append(child)
    ready = [index for index, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for child in children[index]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, child)
    if len(order) < len(refs):
        raise InvalidJob(f"the workflow has a cycle: {' -> '.join(_a_cycle(refs, parents))}")
    return order


def _a_cycle(refs: list[str], parents: list[list[int]]) -> list[str]:
    """The refs of one cycle among jobs that could not be ordered, first ref repeated last."""
    state = [0] * len(refs)  # 0: not seen, 1: on the path, 2: done
    for start in range(len(refs)):
        if state[start]:
            continue
        path: list[int] = []
        stack: list[tuple[int, Iterator[int]]] = [(start, iter(parents[start]))]
        state[start] = 1
        path.append(start)
        while stack:
            node, pending = stack[-1]
            for parent in pending:
                if state[parent] == 1:
                    cycle = path[path.index(parent) :]
                    # The path runs from children to parents: show it parent first.
                    names = [refs[i] for i in reversed(cycle)]
                    return [*names, names[0]]
                if state[parent] == 0:
                    state[parent] = 1
                    path.append(parent)
                    stack.append((parent, iter(parents[parent])))
                    break
            else:
                state[node] = 2
                path.pop()
                stack.pop()
    return []  # unreachable when called for a graph that could not be ordered


def workflow_status(jobs: Sequence[Job]) -> WorkflowStatus:
    """A workflow's overall status: ``completed`` when every job is, ``failed`` when one
    failed, ``cancelled`` when one was cancelled (and none failed), else ``running``."""
    statuses = {job.status for job in jobs}
    if statuses and statuses == {JobStatus.COMPLETED}:
        return "completed"
    if JobStatus.FAILED in statuses:
        return "failed"
    if JobStatus.CANCELLED in statuses:
        return "cancelled"
    return "running"


# -- builders: chain, group, chord ---------------------------------------------------------


class Part(abc.ABC):
    """A part of a workflow being built (a :class:`Step` or a :class:`Workflow`): its steps,
    the steps it starts with (heads) and ends with (tails), and the dependencies between its
    steps."""

    @abc.abstractmethod
    def _parts(self) -> list[Step]: ...

    @abc.abstractmethod
    def _heads(self) -> list[Step]: ...

    @abc.abstractmethod
    def _tails(self) -> list[Step]: ...

    def _edges(self) -> list[tuple[Step, Step]]:
        return []


@dataclass(eq=False)
class Step(Part):
    """One job of a workflow being built (see :func:`step`)."""

    task: str
    payload: Mapping[str, Any] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    ref: str | None = None

    def _parts(self) -> list[Step]:
        return [self]

    def _heads(self) -> list[Step]:
        return [self]

    def _tails(self) -> list[Step]:
        return [self]


class Workflow(Part):
    """What :func:`chain`, :func:`group` and :func:`chord` build: parts, and the dependencies
    between them. ``Queue.enqueue_workflow`` takes it as it is; :meth:`jobs` shows it as
    ``POST /workflows`` takes it."""

    shape = "workflow"

    def __init__(self, parts: Sequence[Part]) -> None:
        if not parts:
            raise InvalidJob(f"{self.shape}() needs at least one step")
        for part in parts:
            if not isinstance(part, Part):
                raise InvalidJob(
                    f"a workflow is built of step(), chain(), group() and chord(), not "
                    f"{type(part).__name__}"
                )
        self.parts = list(parts)
        #: (parent, child) pairs added by this shape.
        self.edges: list[tuple[Step, Step]] = []

    def _parts(self) -> list[Step]:
        return [s for part in self.parts for s in part._parts()]

    def _edges(self) -> list[tuple[Step, Step]]:
        return [*self.edges, *(edge for part in self.parts for edge in part._edges())]

    def jobs(self) -> list[dict[str, Any]]:
        """The workflow as ``Queue.enqueue_workflow`` and ``POST /workflows`` take it: one
        mapping per step, with a ref (given, else the step's task and its position) and the
        refs it depends on."""
        steps = self._parts()
        if len({id(s) for s in steps}) < len(steps):
            raise InvalidJob("a step() appears twice in one workflow: make one step per job")
        refs: dict[int, str] = {}
        taken = {s.ref for s in steps if s.ref is not None}
        for position, s in enumerate(steps, 1):
            ref = s.ref
            if ref is None:
                ref = f"{s.task}-{position}"
                while ref in taken:
                    ref += "'"
                taken.add(ref)
            refs[id(s)] = ref
        parents: dict[int, list[str]] = {id(s): [] for s in steps}
        for parent, child in self._edges():
            parents[id(child)].append(refs[id(parent)])
        return [
            {
                **s.options,
                "ref": refs[id(s)],
                "task": s.task,
                "payload": dict(s.payload or {}),
                "depends_on": [*s.options.get("depends_on", ()), *parents[id(s)]],
            }
            for s in steps
        ]


class _Chain(Workflow):
    shape = "chain"

    def __init__(self, parts: Sequence[Part]) -> None:
        super().__init__(parts)
        for before, after in itertools.pairwise(self.parts):
            self.edges += [(t, h) for t in before._tails() for h in after._heads()]

    def _heads(self) -> list[Step]:
        return self.parts[0]._heads()

    def _tails(self) -> list[Step]:
        return self.parts[-1]._tails()


class _Group(Workflow):
    shape = "group"

    def _heads(self) -> list[Step]:
        return [h for part in self.parts for h in part._heads()]

    def _tails(self) -> list[Step]:
        return [t for part in self.parts for t in part._tails()]


def step(
    task: str, payload: Mapping[str, Any] | None = None, *, ref: str | None = None, **options: Any
) -> Step:
    """One job of a workflow: ``task`` and ``payload``, and any option of ``Queue.enqueue``
    (``queue``, ``priority``, ``delay``, ``run_at``, ``max_attempts``, ``group_key``, and
    ``depends_on`` for ids of jobs already stored). ``ref`` names it; by default its task and
    its position."""
    unknown = set(options) - job_keys()
    if unknown:
        raise InvalidJob(f"step(): unknown option(s) {', '.join(sorted(unknown))}")
    return Step(task, payload, options, ref)


def chain(*parts: Part) -> Workflow:
    """Runs its parts one after the other: each starts once the one before has completed (all
    of it, for a group). A part that fails or is cancelled cancels the rest."""
    return _Chain(parts)


def group(*parts: Part) -> Workflow:
    """Runs its parts side by side; what follows a group waits for all of them."""
    return _Group(parts)


def chord(header: Sequence[Part] | Workflow, body: Part) -> Workflow:
    """A group whose results feed one job: ``body`` starts once every part of ``header`` has
    completed, and reads their results in ``ctx.dependencies``."""
    parts = header if isinstance(header, Workflow) else _Group(list(header))
    return _Chain([parts, body])


def mapping_spec(
    index: int, job: Mapping[str, Any], depends_on: list[UUID], workflow_id: UUID, job_id: UUID
) -> JobSpec:
    """The :class:`MakeSpec` of the Python clients: the spec of the workflow's job at
    ``index``, given as a mapping, without a dedup_key (a duplicate would leave the workflow's
    other jobs naming a job that is not theirs)."""
    if job.get("dedup_key") is not None:
        raise InvalidJob(f"jobs[{index}]: a job of a workflow cannot have a dedup_key")
    fields = {key: value for key, value in job.items() if key != "ref"}
    try:
        return JobSpec.of(fields, depends_on=depends_on, workflow_id=workflow_id, id=job_id)
    except InvalidJob as exc:
        raise InvalidJob(f"jobs[{index}] (ref {job.get('ref')!r}): {exc}") from None
