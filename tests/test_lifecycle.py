"""Processes that cannot serve do not pretend to (the hardening issue's findings 5 and 10).

A fatal error in the worker inside ``notifyq serve`` starts a new worker, and ``/ready`` says so
while it lasts; a standalone worker ends with one line and exit 1. Without ``DATABASE_URL``, only
``notifyq dev`` starts an embedded PostgreSQL: every other entry point refuses in one line,
so that a forgotten variable in production never creates a second job store.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from notifyq.client import Queue
from notifyq.errors import ConfigurationError
from tests.helpers import ROOT, notifyq_env, processes, wait_for_status, wait_until


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_worker_that_fails_inside_serve_is_replaced_and_ready_says_so(
    db_url: str, conn: Any, tmp_path: Path
) -> None:
    port = free_port()
    env = notifyq_env(db_url, NOTIFYQ_IMPORT="tests.broken_service", NQ_BREAK_TIMES="1")
    with processes(tmp_path) as start:
        serve = start("serve", "--port", str(port), env=env, name="serve")
        serve.wait_for_output("Uvicorn running on")
        serve.wait_for_output(
            "the worker of this process stopped: RuntimeError: a bug in a service"
        )
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            posted = await client.post("/jobs", json={"task": "echo", "payload": {"n": 1}})
            assert posted.status_code == 201, posted.text
            # The first worker died; a new one starts after a second and runs the job.
            await wait_for_status(conn, posted.json()["job_id"], "completed", timeout=15)

            async def ready() -> bool:
                return (await client.get("/ready")).status_code == 200

            await wait_until(ready, timeout=10)


async def test_ready_reports_a_worker_that_keeps_failing_while_the_api_serves(
    db_url: str, conn: Any, tmp_path: Path
) -> None:
    port = free_port()
    env = notifyq_env(db_url, NOTIFYQ_IMPORT="tests.broken_service")
    with processes(tmp_path) as start:
        serve = start("serve", "--port", str(port), env=env, name="serve")
        serve.wait_for_output("Uvicorn running on")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:

            async def not_ready() -> httpx.Response | None:
                answer = await client.get("/ready")
                return answer if answer.status_code == 503 and "worker" in answer.json() else None

            answer = await wait_until(not_ready, timeout=10)
            assert "a bug in a service" in answer.json()["worker"]
            # The API itself still serves: a job is accepted and can be read.
            posted = await client.post("/jobs", json={"task": "echo", "payload": {}})
            assert posted.status_code == 201, posted.text
            read = await client.get(f"/jobs/{posted.json()['job_id']}")
            assert read.status_code == 200
            assert (await client.get("/health")).status_code == 200


def test_a_standalone_worker_with_a_fatal_error_exits_1_with_one_line(db_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "notifyq", "worker", "--import", "tests.broken_service"],
        env=notifyq_env(db_url),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("notifyq: error: the worker stopped on an unexpected error")
    assert "RuntimeError: a bug in a service" in last


@pytest.fixture
def no_database_env() -> Iterator[dict[str, str]]:
    """An environment without DATABASE_URL; an embedded server, if one were wrongly started,
    would live in a folder of this test's own, and is stopped and removed afterwards."""
    data = Path(tempfile.mkdtemp(prefix="notifyq-nodb-"))
    data.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFYQ_", "DATABASE_URL"))}
    env.update(PYTHONPATH=str(ROOT), NOTIFYQ_DATA_DIR=str(data))
    try:
        yield env
    finally:
        for pid_file in data.glob("*/postmaster.pid"):
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGINT)
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.parametrize(
    "args",
    [
        ["worker"],
        ["serve", "--port", "0"],
        ["enqueue", "echo"],
        ["migrate"],
        ["-m", "uvicorn", "notifyq.api:app", "--port", "0"],
    ],
    ids=["worker", "serve", "enqueue", "migrate", "uvicorn"],
)
def test_without_database_url_only_dev_starts_an_embedded_server(
    no_database_env: dict[str, str], args: list[str]
) -> None:
    command = (
        [sys.executable, *args] if args[0] == "-m" else [sys.executable, "-m", "notifyq", *args]
    )
    done = subprocess.run(
        command, env=no_database_env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "DATABASE_URL is not set" in lines[0] and "notifyq dev" in lines[0]
    assert not list(Path(no_database_env["NOTIFYQ_DATA_DIR"]).iterdir()), "a server was made"


def test_a_queue_without_a_url_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match="DATABASE_URL is not set"):
        Queue()
