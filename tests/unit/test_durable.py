"""Durable jobs without a database: what ctx.step, ctx.sleep and ctx.wait_for_signal decide
from a job's record (given by a fake store), and the checks of a signal."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID, uuid4

import pytest

from notifyq import JobContext, SignalRefused, SignalTimeout
from notifyq.context import DurableState, Suspend
from notifyq.errors import InvalidJob, InvalidStepResult, JobNotFound, LeaseLost
from notifyq.models import signal_payload_json, signal_sent


class Record:
    """A job's durable record, in memory: rows as notifyq.durable_state_v1 answers them."""

    def __init__(self, rows: list[tuple[str, str, Any]] | None = None, answer: str = "written"):
        self.rows = list(rows or [])
        self.answer = answer
        self.loads = 0
        self.written: list[tuple[str, str]] = []

    async def durable_state(self, job_id: UUID) -> list[tuple[str, str, Any]]:
        self.loads += 1
        return [*self.rows, ("now", "", time.time())]

    async def record_step(self, job_id: UUID, claim: int, name: str, result_json: str) -> str:
        self.written.append((name, result_json))
        return self.answer


def context(record: Record) -> JobContext:
    job_id = uuid4()
    state = DurableState(record, job_id, 1)
    return JobContext(job_id, "t", "default", 1, 3, 0, "w", _durable=state)


async def test_a_step_runs_once_then_answers_its_result_decoded_from_json() -> None:
    record = Record()
    ctx = context(record)
    calls = 0

    def pair() -> tuple[int, int]:
        nonlocal calls
        calls += 1
        return (1, 2)

    assert await ctx.step("pair", pair) == [1, 2]  # as every later run will see it
    assert await ctx.step("pair", pair) == [1, 2]
    assert calls == 1 and record.written == [("pair", "[1,2]")] and record.loads == 1


async def test_a_recorded_step_is_not_called() -> None:
    ctx = context(Record([("step", "charge", {"id": "ch_1"})]))

    def boom() -> None:
        raise AssertionError("called again")

    assert await ctx.step("charge", boom) == {"id": "ch_1"}


async def test_a_step_refused_by_the_fence_raises_lease_lost() -> None:
    ctx = context(Record(answer="refused"))
    with pytest.raises(LeaseLost, match="no longer holds the job"):
        await ctx.step("s", lambda: 1)


async def test_step_results_must_be_json_and_bounded() -> None:
    ctx = context(Record())
    with pytest.raises(InvalidStepResult, match="not JSON-serialisable"):
        await ctx.step("s", lambda: object())
    with pytest.raises(InvalidStepResult, match="larger than"):
        await ctx.step("s", lambda: "x" * (1024 * 1024))


@pytest.mark.parametrize("name", ["", "x" * 201, 7, "a\x00b"])
async def test_step_names_are_1_to_200_characters_without_nul(name: Any) -> None:
    with pytest.raises(ValueError, match=r"1 to 200|NUL"):
        await context(Record()).step(name, lambda: 1)


async def test_a_sleep_suspends_then_the_same_sleep_returns_once_its_time_has_passed() -> None:
    with pytest.raises(Suspend) as first:
        await context(Record()).sleep(30)
    assert (first.value.kind, first.value.mark, first.value.delay) == ("sleep", "1", 30.0)
    past = Record([("sleep", "1", {"until": time.time() - 1})])
    ctx = context(past)
    await ctx.sleep(30)  # the first sleep: over
    with pytest.raises(Suspend) as second:
        await ctx.sleep(5)  # the second: not taken yet
    assert second.value.mark == "2"
    woken_early = Record([("sleep", "1", {"until": time.time() + 100})])
    with pytest.raises(Suspend) as again:
        await context(woken_early).sleep(30)
    assert again.value.delay is not None and 90 < again.value.delay <= 100


async def test_sleep_arguments_are_checked() -> None:
    ctx = context(Record())
    await ctx.sleep(0)
    await ctx.sleep(until=datetime.now(timezone.utc) - timedelta(seconds=1))
    for bad in ({"seconds": -1}, {"seconds": float("inf")}, {}):
        with pytest.raises((ValueError, TypeError)):
            await ctx.sleep(**bad)
    with pytest.raises(TypeError, match="timezone-aware"):
        await ctx.sleep(until=datetime.now())


async def test_a_wait_answers_a_signal_already_sent_else_suspends_or_times_out() -> None:
    sent = context(Record([("signal", "go", {"n": 1})]))
    assert await sent.wait_for_signal("go") == {"n": 1}
    with pytest.raises(Suspend) as waiting:
        await context(Record()).wait_for_signal("go", timeout=60)
    assert (waiting.value.signal, waiting.value.delay, waiting.value.kind) == ("go", 60.0, "wait")
    over = Record([("wait", "go", {"until": time.time() - 1})])
    with pytest.raises(SignalTimeout, match="no signal 'go' came within 60s"):
        await context(over).wait_for_signal("go", timeout=60)
    forever = Record([("wait", "go", {"until": None})])
    with pytest.raises(Suspend) as still:
        await context(forever).wait_for_signal("go")
    assert still.value.delay is None


async def test_durable_calls_outside_a_worker_say_so() -> None:
    ctx = JobContext(uuid4(), "t", "default", 1, 3, 0, "w")
    with pytest.raises(RuntimeError, match="only in a job run by a worker"):
        await ctx.step("s", lambda: 1)


def test_a_signal_is_checked_and_its_outcome_is_an_answer_or_an_error() -> None:
    assert signal_payload_json("go", None) == "{}"
    assert signal_payload_json("go", {"k": 1}) == '{"k":1}'
    for name, payload in (("", {}), ("x" * 201, {}), ("go", [1]), ("go", {"x": "y" * 70_000})):
        with pytest.raises(InvalidJob):
            signal_payload_json(name, payload)
    job = uuid4()
    assert signal_sent(job, "sent") is True
    assert signal_sent(job, "duplicate") is False
    with pytest.raises(JobNotFound):
        signal_sent(job, "unknown")
    with pytest.raises(SignalRefused, match="has ended"):
        signal_sent(job, "final")
    with pytest.raises(SignalRefused, match="100 signals"):
        signal_sent(job, "too_many")
