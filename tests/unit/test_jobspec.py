"""A job's options are spelled once (notifyq/jobspec.py): every surface takes each of them
from there, and the SQL that stores them takes every one.

What would go wrong without these checks: an option added to JobOptions but not to the SQL
enqueue functions is silently dropped by the store, and one whose surface was written by hand
drifts from the others (different bounds, a missing flag)."""

from __future__ import annotations

import inspect
import re
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID, uuid4

import pytest

from notifyq import Queue, SyncQueue
from notifyq.api.schemas import JobIn, WorkflowJobIn
from notifyq.cli._parser import build_parser
from notifyq.errors import InvalidJob
from notifyq.jobspec import JobOptions, JobSpec, options
from notifyq.queries import load_queries
from notifyq.store._submit import enqueue_statement, many_statement


def test_every_option_is_declared_once_with_its_rules() -> None:
    found = options()
    assert list(found) == list(JobOptions.__annotations__)
    for name, option in found.items():
        assert option.name == name
        assert option.doc.endswith("."), f"{name}: its doc is a sentence"


def test_the_api_model_has_a_documented_field_for_each_option() -> None:
    fields = JobIn.model_fields
    for name, option in options().items():
        assert name in fields, f"JobIn lacks {name}"
        assert fields[name].description == option.doc
        assert fields[name].default is None
    assert set(fields) == {"payload", "task", *options()}
    # A workflow's job takes the same options, its depends_on naming refs.
    assert set(WorkflowJobIn.model_fields) == {*fields, "ref"}


def test_the_command_line_has_a_flag_for_each_option() -> None:
    parser = build_parser()
    flags = [f"--{name.replace('_', '-')}" for name in options() if options()[name].parse]
    args = ["enqueue", "echo"]
    values = {
        "queue": "q",
        "priority": "3",
        "run_at": "2030-01-02T03:04:05+00:00",
        "delay": "1.5",
        "dedup_key": "d",
        "max_attempts": "4",
        "depends_on": f"{UUID(int=1)},{UUID(int=2)}",
        "group_key": "g",
        "fair_key": "tenant-1",
        "on_conflict": "keep_first",
        "debounce": "2.5",
    }
    for flag in flags:
        args += [flag, values[flag[2:].replace("-", "_")]]
    namespace = parser.parse_args(args)
    assert set(namespace.options) == set(values)
    # delay and debounce each set the start, which run_at sets here.
    given = {k: v for k, v in namespace.options.items() if k not in ("delay", "debounce")}
    spec = JobSpec.create("echo", {}, **given)
    assert spec.options["depends_on"] == (UUID(int=1), UUID(int=2))
    assert spec.options["run_at"] == datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


@pytest.mark.parametrize("function", [Queue.enqueue, SyncQueue.enqueue])
def test_the_python_clients_take_the_options_as_keywords(function: Any) -> None:
    parameters = inspect.signature(function).parameters
    assert parameters["options"].kind is inspect.Parameter.VAR_KEYWORD
    assert "JobOptions" in str(parameters["options"].annotation)


def test_each_option_is_checked_and_none_means_not_given() -> None:
    spec = JobSpec.create("t", {"n": 1}, queue=None, priority=2, delay=timedelta(seconds=3))
    assert dict(spec.options) == {"priority": 2, "delay": 3.0}
    bad: list[tuple[dict[str, Any], str]] = [
        ({"queue": ""}, "queue must be a non-empty string"),
        ({"priority": True}, "priority must be an integer"),
        ({"priority": 2**31}, "priority must fit in 32 bits"),
        ({"delay": -1}, "delay must be from 0"),
        ({"run_at": "tomorrow"}, "run_at must be a datetime"),
        ({"delay": 1, "run_at": datetime.now(timezone.utc)}, "give run_at or delay, not both"),
        ({"max_attempts": 0}, "max_attempts must be an integer from 1 to"),
        ({"dedup_key": "x" * 513}, "dedup_key is longer than 512"),
        ({"depends_on": ["nope"]}, "depends_on[0] is not a job id"),
        ({"group_key": "a\x00b"}, "NUL"),
        ({"colour": "red"}, "unknown job field 'colour'"),
    ]
    for given, message in bad:
        with pytest.raises(InvalidJob, match=re.escape(message)):
            JobSpec.create("t", {}, **given)


def test_the_store_sends_every_option_by_its_name() -> None:
    ids = [uuid4(), uuid4()]
    spec = JobSpec.create("t", {}, dedup_key="d", depends_on=ids, group_key="g")
    query, params = enqueue_statement(spec, None)
    assert query == "enqueue"
    assert set(options()) <= set(params)
    assert params["depends_on"] == ids and params["delay"] == 0.0
    query, params = many_statement([spec, JobSpec.create("t", {})], None)
    assert query == "enqueue_many"
    assert set(options()) <= set(params)
    assert params["depends_on"] == ["{" + ",".join(map(str, ids)) + "}", None]


def test_every_enqueue_statement_names_every_option() -> None:
    """The statements that store a job through notifyq.enqueue_v5 / enqueue_many_v6 pass
    each option by its name; the plain INSERTs those marked plain."""
    queries = load_queries()
    for name, option in options().items():
        for query in ("enqueue", "enqueue_many"):
            assert f"%({name})".encode() in queries[query], f"{query} does not pass {name}"
        if option.plain:
            for query in ("enqueue_plain", "enqueue_many_plain"):
                assert f"%({name})".encode() in queries[query], f"{query} does not pass {name}"
