"""The contrib tasks against real peers: an SMTP server (aiosmtpd) and an HTTP server (uvicorn)
started by the tests on 127.0.0.1, files under a temporary root, and a real worker.

The tests of this that need no database are in tests/unit/test_contrib.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from notifyq.builtins import worker_registry
from notifyq.contrib import ContribSettings, contrib_tasks
from notifyq.settings import Settings
from notifyq.tasks import Registry
from tests.helpers import running_worker, wait_for_status
from tests.unit.test_contrib import (
    Mailbox,
    SMTPServer,
    serving_web_app,
    smtp_servers,
)


@pytest.fixture(scope="module")
def web() -> Iterator[str]:
    """Base URL of web_app, served for this module (see serving_web_app)."""
    with serving_web_app() as value:
        yield value


@pytest.fixture
def smtp_server() -> Iterator[Callable[..., SMTPServer]]:
    """Starts SMTP servers, stopped after the test (see smtp_servers)."""
    with smtp_servers() as value:
        yield value


@pytest.fixture(autouse=True)
def _no_contrib_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings come from each test alone, not from NOTIFYQ_* variables of the machine."""
    for name in ContribSettings.model_fields:
        monkeypatch.delenv(f"NOTIFYQ_{name.upper()}", raising=False)


# -- send_email --------------------------------------------------------------------------------


# -- http_request ------------------------------------------------------------------------------


# -- file_digest and file_gzip -----------------------------------------------------------------


# -- through a real worker ---------------------------------------------------------------------


async def insert(conn: psycopg.AsyncConnection[Any], task: str, payload: dict[str, Any]) -> Any:
    cursor = await conn.execute(
        "INSERT INTO notifyq.jobs (task, payload) VALUES (%s, %s) RETURNING id",
        [task, json.dumps(payload)],
    )
    row = await cursor.fetchone()
    assert row is not None
    return row[0]


async def test_contrib_jobs_through_a_worker(
    settings: Settings,
    conn: psycopg.AsyncConnection[Any],
    web: str,
    smtp_server: Callable[..., SMTPServer],
) -> None:
    server = smtp_server(Mailbox(refuse={"ghost@example.com": "550 no such user"}))
    contrib = ContribSettings(
        smtp_host="127.0.0.1",
        smtp_port=server.port,
        smtp_from="queue@example.com",
        http_allow="127.0.0.1",
    )
    registry = worker_registry(Registry(contrib_tasks(contrib)))
    async with running_worker(settings, registry):
        webhook = await insert(conn, "http_request", {"url": f"{web}/json"})
        mail = await insert(
            conn, "send_email", {"to": "ghost@example.com", "subject": "s", "text": "t"}
        )
        done = await wait_for_status(conn, webhook, "completed", "failed")
        refused = await wait_for_status(conn, mail, "completed", "failed")
    assert done["status"] == "completed", done
    assert done["result"]["status"] == 200
    assert done["result"]["json"] == {"hello": "world", "n": [1, 2]}
    assert refused["status"] == "failed"
    assert refused["attempt_count"] == 1
    assert refused["max_attempts"] == 5
    assert "ghost@example.com: 550 no such user" in refused["last_error"]


async def test_jobs_that_can_never_work_fail_after_one_attempt(
    settings: Settings,
    conn: psycopg.AsyncConnection[Any],
    web: str,
    smtp_server: Callable[..., SMTPServer],
) -> None:
    # Each of these raised a plain ValueError or UnicodeEncodeError, which the worker retried
    # with backoff until the attempts ran out.
    server = smtp_server(Mailbox())
    contrib = ContribSettings(
        smtp_host="127.0.0.1", smtp_port=server.port, smtp_from="queue@example.com"
    )
    registry = worker_registry(Registry(contrib_tasks(contrib)))
    jobs = {
        "a U+2028 subject": (
            "send_email",
            {"to": "a@example.com", "subject": "a\u2028b", "text": "t"},
        ),
        "a non-ASCII header": ("http_request", {"url": f"{web}/json", "headers": {"X-A": "é"}}),
    }
    async with running_worker(settings, registry):
        ids = {what: await insert(conn, task, payload) for what, (task, payload) in jobs.items()}
        rows = {
            what: await wait_for_status(conn, i, "completed", "failed") for what, i in ids.items()
        }
    for what, row in rows.items():
        assert (row["status"], row["attempt_count"]) == ("failed", 1), what
        assert "invalid payload" in row["last_error"], what
