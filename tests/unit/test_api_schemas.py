"""The API's models: importable without a web framework, and the one truth of what the API
answers (the hand-built JSON of the submission routes agrees with them).

The tests here need no database; those that do are in tests/test_api_schemas.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from uuid import uuid4
from zoneinfo import ZoneInfo

import pytest

from notifyq.api.fast import batch_json, enqueued_json
from notifyq.api.schemas import BatchOut, EnqueuedOut
from notifyq.models import EnqueueResult, JobStatus
from tests.helpers import ROOT

WEB_FRAMEWORKS = "('fastapi', 'starlette')"


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_schemas_import_without_fastapi_or_starlette() -> None:
    done = run_python(
        "import sys, notifyq.api.schemas\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {WEB_FRAMEWORKS})\n"
        "assert not loaded, loaded\n"
    )
    assert done.returncode == 0, done.stderr


UTC = timezone.utc


#: Times as the database may hand them over: with and without microseconds (isoformat leaves
#: ".000000" out), with leading zeros in them, in UTC as psycopg gives it for a UTC session,
#: and with the offset of a session in another time zone.
TIMES = [
    datetime(2026, 12, 1, 10, 0, 0, 123456, tzinfo=UTC),
    datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC),
    datetime(2026, 12, 1, 10, 0, 0, 100, tzinfo=UTC),
    datetime(2026, 12, 1, 10, 0, 5, 5000, tzinfo=ZoneInfo("Etc/UTC")),
    datetime(2026, 12, 1, 15, 30, 0, 250000, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    datetime(2026, 12, 1, 0, 0, 0, tzinfo=ZoneInfo("America/New_York")),
]


def result(run_at: datetime, created_at: datetime, *, duplicate: bool = False) -> EnqueueResult:
    return EnqueueResult(
        job_id=uuid4(),
        status=JobStatus.QUEUED,
        duplicate=duplicate,
        run_at=run_at,
        created_at=created_at,
    )


def as_model(enqueued: EnqueueResult) -> EnqueuedOut:
    return EnqueuedOut.model_validate(enqueued, from_attributes=True)


def in_utc(moment: datetime) -> bool:
    return moment.utcoffset() == timedelta(0)


RESULTS = [
    result(TIMES[0], TIMES[0]),
    result(TIMES[1], TIMES[0], duplicate=True),
    *(result(moment, TIMES[(i + 1) % len(TIMES)]) for i, moment in enumerate(TIMES)),
    *(result(moment, moment, duplicate=True) for moment in TIMES),
]


def described(enqueued: EnqueueResult) -> str:
    kind = "duplicate" if enqueued.duplicate else "new"
    return f"{kind}-{enqueued.run_at.isoformat()}-{enqueued.created_at.isoformat()}"


@pytest.mark.parametrize("enqueued", RESULTS, ids=described)
def test_the_json_of_one_submission_is_what_enqueuedout_says(enqueued: EnqueueResult) -> None:
    raw = enqueued_json(enqueued)
    assert EnqueuedOut.model_validate_json(raw) == as_model(enqueued)
    expected = as_model(enqueued).model_dump_json()
    assert json.loads(raw).keys() == json.loads(expected).keys()
    if in_utc(enqueued.run_at) and in_utc(enqueued.created_at):
        assert raw == expected  # the very bytes the response model would write
    else:
        # The model keeps the offset it was given; the route answers in UTC: the same instant.
        assert raw.count("Z") == 2
        assert EnqueuedOut.model_validate_json(raw) == EnqueuedOut.model_validate_json(expected)


def test_the_json_of_a_batch_is_what_batchout_says() -> None:
    raw = batch_json(RESULTS)
    expected = BatchOut(results=[as_model(r) for r in RESULTS])
    assert BatchOut.model_validate_json(raw) == expected
    utc = [r for r in RESULTS if in_utc(r.run_at) and in_utc(r.created_at)]
    assert batch_json(utc) == BatchOut(results=[as_model(r) for r in utc]).model_dump_json()
    assert batch_json([]) == BatchOut(results=[]).model_dump_json()
