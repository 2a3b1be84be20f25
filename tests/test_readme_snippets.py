"""The snippets a user would paste, from the README and the documentation site (docs/), run
exactly as printed: the Python examples of the tutorial (each a file of its own, run by
``python``, a real worker running beside it), its SQL, the curl commands of the FastAPI and
Django recipes against a real server, and the ports the pages have servers listen on, which must
not collide with each other.

The one liberty taken: a server started here listens on a free port, not the README's, and the
README's command that reaches it has its port mapped to that one (another test, or a developer's
``notifyq dev``, may hold the README's port).

The tests of this that need no database are in tests/unit/test_readme_snippets.py.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from notifyq import SyncQueue
from tests.helpers import ROOT, Process, notifyq_env, processes
from tests.readme import readme_block
from tests.unit.test_readme_snippets import DEFAULT_PORT, server_port, shell_blocks


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def shell_line(start: str, *holding: str) -> str:
    """The README's shell line that starts with ``start`` and holds each of ``holding``."""
    for block in shell_blocks():
        for line in block.splitlines():
            if line.startswith(start) and all(part in line for part in holding):
                return line
    raise AssertionError(f"README.md has no shell line {start!r}...{holding!r}")


def on_port(command: str, readme_port: int, port: int) -> str:
    """``command`` with the README's port of a server replaced by this test's."""
    mapped = command.replace(f"127.0.0.1:{readme_port}", f"127.0.0.1:{port}")
    mapped = mapped.replace(f"--port {readme_port}", f"--port {port}")
    assert mapped != command, f"{command!r} names no port {readme_port}"
    return mapped


def run_python(first_line: str, tmp_path: Path, db_url: str, timeout: float = 60) -> str:
    """Runs the README's Python block as ``python <file>``, its first line naming the file (or
    ``snippet.py``), and answers what it printed."""
    name = first_line.removeprefix("# ") if first_line.startswith("# ") else "snippet.py"
    (tmp_path / name).write_text(readme_block(first_line))
    run = subprocess.run(
        [sys.executable, name],
        cwd=tmp_path,
        env=notifyq_env(db_url),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def shell(script: str, tmp_path: Path) -> list[str]:
    """Runs ``script`` with ``sh -e`` and answers the lines it printed. Its curl commands stay as
    printed: a curlrc (which curl reads from CURL_HOME) makes each fail on an HTTP error, quietly
    but for errors, and end its output with a newline."""
    (tmp_path / ".curlrc").write_text('fail-with-body\nsilent\nshow-error\nwrite-out = "\\n"\n')
    run = subprocess.run(
        ["sh", "-e", "-c", script],
        env={"PATH": os.environ["PATH"], "CURL_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, f"{script}\n{run.stdout}{run.stderr}"
    return run.stdout.splitlines()


def curl(command: str, tmp_path: Path) -> dict[str, Any]:
    (line,) = shell(command, tmp_path)
    answer: dict[str, Any] = json.loads(line)
    return answer


def worker(start: object, db_url: str) -> Process:
    assert callable(start)
    process: Process = start("worker", env=notifyq_env(db_url), name="worker")
    process.wait_for_output("ready")
    return process


def rows(db_url: str, query: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(query, params).fetchall()


def wait_for_port(process: Process, port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert process.popen.poll() is None, process.output()
        assert time.monotonic() < deadline, f"nothing on port {port}:\n{process.output()}"
        time.sleep(0.05)


# -- ports -----------------------------------------------------------------------------------


# -- the API ---------------------------------------------------------------------------------


def test_the_first_curl_and_the_http_examples_run_as_printed(db_url: str, tmp_path: Path) -> None:
    port = free_port()
    with processes(tmp_path) as start:
        serve = start("serve", "--port", str(port), env=notifyq_env(db_url), name="serve")
        serve.wait_for_output("Uvicorn running on", timeout=60)
        first = curl(
            on_port(shell_line("curl -X POST", "hello_world"), DEFAULT_PORT, port), tmp_path
        )
        assert first["status"] == "queued"
        deadline = time.monotonic() + 20
        while (job := curl(f"curl http://127.0.0.1:{port}/jobs/{first['job_id']}", tmp_path))[
            "status"
        ] != "completed":
            assert time.monotonic() < deadline, job
            time.sleep(0.05)
        assert job["result"] == {"message": "Hello, you!"}
        (block,) = [b for b in shell_blocks() if "/jobs/batch" in b]
        printed = shell(on_port(block, DEFAULT_PORT, port), tmp_path)
        serve.signal(signal.SIGTERM)
        assert serve.wait() == 0, serve.output()
    submitted, read, batch, failed = (json.loads(line) for line in printed)
    assert (submitted["status"], submitted["duplicate"]) == ("queued", False)
    assert read["status"] in ("queued", "processing", "completed")
    assert [job["status"] for job in batch["results"]] == ["queued", "queued"], batch
    assert failed["jobs"] == [], failed


# -- Submitting jobs -------------------------------------------------------------------------


def test_the_queue_examples_run_as_printed(db_url: str, tmp_path: Path) -> None:
    with processes(tmp_path) as start:
        worker(start, db_url)
        out = run_python("import asyncio\nimport notifyq\n", tmp_path, db_url)
        assert out == "completed {'n': 1}\n"
        run_python("import notifyq\n\nqueue = notifyq.SyncQueue()", tmp_path, db_url)
    assert rows(db_url, "SELECT count(*) FROM notifyq.jobs") == [(1 + 1000 + 1 + 1000 + 2,)]


def test_the_in_transaction_example_commits_the_order_with_its_job(
    db_url: str, tmp_path: Path
) -> None:
    printed = run_python("# in_transaction.py", tmp_path, db_url)
    order, job_id = printed.split()
    assert rows(
        db_url, "SELECT id::text, task, payload->>'order' FROM notifyq.jobs ORDER BY created_at"
    ) == [(job_id, "send_receipt", order)]
    assert rows(db_url, "SELECT id::text, total FROM orders") == [(order, 42)]


def test_every_readme_snippet_that_writes_orders_shares_one_table(
    db_url: str, tmp_path: Path
) -> None:
    # Pasted one after the other into one database, the in-transaction example, the FastAPI
    # recipe's table and the SQLAlchemy recipe must agree on `orders`.
    run_python("# in_transaction.py", tmp_path, db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(readme_block("CREATE TABLE IF NOT EXISTS orders"))
    run_python("# in_transaction.py", tmp_path, db_url)
    pytest.importorskip("sqlalchemy")
    run_python("# orders.py", tmp_path, db_url)
    assert rows(db_url, "SELECT total FROM orders ORDER BY id") == [(42,), (42,), (42,), (43,)]


def test_the_dependencies_example_runs_as_printed(db_url: str, tmp_path: Path) -> None:
    with processes(tmp_path) as start:
        running = worker(start, db_url)
        out = run_python("# dependencies.py", tmp_path, db_url)
        running.signal(signal.SIGTERM)
        assert running.wait() == 0, running.output()
    assert out == "completed\ncompleted\n"


def test_the_readmes_sql_runs_as_printed(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(readme_block("INSERT INTO notifyq.jobs (task, payload) VALUES"))
        conn.execute(readme_block("WITH parent AS"))
        waiting = conn.execute(
            "SELECT group_key, cardinality(depends_on) FROM notifyq.jobs WHERE status = 'waiting'"
        ).fetchall()
    assert waiting == [("k", 1)]


def test_the_durable_payment_example_runs_end_to_end(db_url: str, tmp_path: Path) -> None:
    # Three checkouts by the README's curl, each charged once, suspended, then signalled one
    # way each (HTTP, Python, psql) and completed with its receipt.
    for name in ("# payments.py", "# webhook.py"):
        (tmp_path / name.removeprefix("# ")).write_text(readme_block(name))
    port = free_port()
    env = notifyq_env(db_url, NOTIFYQ_IMPORT="payments", PYTHONPATH=f"{tmp_path}:{ROOT}")
    with processes(tmp_path) as start:
        server = start("serve", "--port", str(port), env=env, cwd=tmp_path)
        wait_for_port(server, port)
        enqueue = on_port(shell_line("curl -X POST", '"task": "checkout"'), DEFAULT_PORT, port)
        ids = [curl(enqueue, tmp_path)["job_id"] for _ in range(3)]
        for job_id in ids:
            _wait_for(db_url, job_id, "suspended")
        signal_by_http = on_port(shell_line("curl -X POST", "/signals/"), DEFAULT_PORT, port)
        sent = curl(signal_by_http.replace("<job_id>", ids[0]), tmp_path)
        assert sent == {"job_id": ids[0], "name": "payment_webhook", "duplicate": False}
        by_python = subprocess.run(
            [sys.executable, "webhook.py", ids[1]],
            cwd=tmp_path,
            env=notifyq_env(db_url),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert by_python.stdout == "True\n", by_python.stdout + by_python.stderr
        with psycopg.connect(db_url, autocommit=True) as conn:
            sql = readme_block("SELECT notifyq.signal('<job_id>'")
            assert conn.execute(sql.replace("<job_id>", ids[2])).fetchone() == (True,)
        for job_id in ids:
            _wait_for(db_url, job_id, "completed")
        server.signal(signal.SIGTERM)
        assert server.wait() == 0, server.output()
    assert rows(
        db_url,
        "SELECT DISTINCT result->>'receipt', attempt_count FROM notifyq.jobs"
        " WHERE task = 'checkout'",
    ) == [("receipt for ch_A1: paid", 1)]
    assert rows(
        db_url,
        "SELECT name, count(*) FROM notifyq.job_steps WHERE kind = 'step' GROUP BY name"
        " ORDER BY name",
    ) == [("charge", 3), ("receipt", 3)]


def test_the_multi_tenant_example_serves_the_small_tenant_first(
    db_url: str, tmp_path: Path
) -> None:
    # tenant-a's 100,000 jobs go in first; tenant-b's one job runs within a few of them, not
    # after them all, and never more than two of tenant-a's run at once (key_concurrency=2).
    (tmp_path / "tenants.py").write_text(readme_block("# tenants.py"))
    env = notifyq_env(db_url, PYTHONPATH=f"{tmp_path}:{ROOT}")
    with processes(tmp_path) as start:
        worker = start("worker", "--import", "tenants", "--concurrency", "8", env=env, cwd=tmp_path)
        worker.wait_for_output("ready")
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(readme_block("INSERT INTO notifyq.jobs (task, payload, fair_key)"))
            deadline = time.monotonic() + 60  # from the commit of both statements
            while rows(db_url, "SELECT status FROM notifyq.jobs WHERE fair_key = 'tenant-b'") != [
                ("completed",)
            ]:
                assert time.monotonic() < deadline, worker.output()
                time.sleep(0.02)
            before = rows(
                db_url,
                "SELECT count(*) FROM notifyq.jobs WHERE fair_key = 'tenant-a'"
                " AND started_at <= (SELECT started_at FROM notifyq.jobs"
                "                    WHERE fair_key = 'tenant-b')",
            )[0][0]
            running = rows(
                db_url,
                "SELECT count(*) FROM notifyq.jobs WHERE status = 'processing'",
            )[0][0]
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output()
    assert before <= 10, before
    assert running <= 2


def _wait_for(db_url: str, job_id: str, status: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while rows(db_url, "SELECT status FROM notifyq.jobs WHERE id = %s", job_id) != [(status,)]:
        assert time.monotonic() < deadline, f"job {job_id} not {status} within {timeout}s"
        time.sleep(0.02)


# -- Writing tasks ---------------------------------------------------------------------------


def test_the_writing_tasks_example_runs_on_the_worker_its_command_starts(
    db_url: str, tmp_path: Path
) -> None:
    (tmp_path / "mytasks.py").write_text(readme_block("# mytasks.py"))
    command = shell_line("notifyq worker --import mytasks")
    assert command == "notifyq worker --import mytasks", command
    with processes(tmp_path) as start, SyncQueue(db_url) as q:
        running = start(*command.split()[1:], env=notifyq_env(db_url), cwd=tmp_path)
        running.wait_for_output("ready")
        resized = q.enqueue("resize", {"path": "a.png"})
        mailed = q.enqueue("send_receipt", {"order": 42, "email": "you@example.org"})
        assert q.wait(resized.job_id, timeout=20).result == {"resized": "a.png"}
        assert q.wait(mailed.job_id, timeout=20).status == "completed"
        running.signal(signal.SIGTERM)
        assert running.wait() == 0, running.output()
        assert f"attempt 1 of job {mailed.job_id}: mail to you@example.org" in running.output()


def test_the_running_workers_commands_start_and_drain(db_url: str, tmp_path: Path) -> None:
    (tmp_path / "mytasks.py").write_text(readme_block("# mytasks.py"))
    (block,) = [b for b in shell_blocks() if "notifyq serve --no-worker" in b]
    commands = [line.split(" #", 1)[0].strip() for line in block.splitlines()]
    assert len(commands) == 3 and all(c.startswith("notifyq ") for c in commands), commands
    serve = next(c for c in commands if c.startswith("notifyq serve"))
    port = free_port()
    with processes(tmp_path) as start:
        for command in commands:
            if command == serve:
                command = on_port(command, server_port("notifyq serve", command), port)
            words = shlex.split(command)[1:]
            running = start(*words, env=notifyq_env(db_url), cwd=tmp_path)
            running.wait_for_output(
                "Uvicorn running on" if command.startswith("notifyq serve") else "ready"
            )
            running.signal(signal.SIGTERM)
            assert running.wait() == 0, running.output()


# -- recipes ---------------------------------------------------------------------------------


def test_the_fastapi_recipes_curl_gets_the_order_and_its_job(db_url: str, tmp_path: Path) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(readme_block("CREATE TABLE IF NOT EXISTS orders"))
    (tmp_path / "shop_api.py").write_text(readme_block("# shop_api.py"))
    serve = shell_line("uvicorn shop_api:app")
    readme_port = server_port("uvicorn", serve.split("uvicorn shop_api:app", 1)[1])
    port = free_port()
    with processes(tmp_path) as start:
        argv = ["sh", "-c", f"exec {sys.executable} -m {on_port(serve, readme_port, port)}"]
        uvicorn = start("uvicorn", env=notifyq_env(db_url), argv=argv, cwd=tmp_path)
        wait_for_port(uvicorn, port)
        command = on_port(shell_line("curl -X POST", "/orders?total="), readme_port, port)
        created = curl(command, tmp_path)
        receipt = curl(f"curl http://127.0.0.1:{port}/receipts/{created['job_id']}", tmp_path)
        uvicorn.signal(signal.SIGTERM)
        # Uvicorn stops gracefully and then ends by the signal it got.
        assert uvicorn.wait() in (0, -signal.SIGTERM), uvicorn.output()
    assert receipt == {"status": "queued", "result": None}
    assert rows(db_url, "SELECT id, total FROM orders") == [(created["order"], 42)]


def test_the_django_views_curl_gets_the_order_and_its_job(
    server_url: str, empty_db_url: str, tmp_path: Path
) -> None:
    pytest.importorskip("django")
    manage = [sys.executable, str(ROOT / "tests" / "django_project" / "manage.py")]
    dbname = conninfo_to_dict(empty_db_url)["dbname"]  # a socket URL has ?host= after it
    env = notifyq_env(server_url, SHOP_DATABASE=str(dbname))
    migrate = subprocess.run(
        [*manage, "migrate", "--noinput"], env=env, capture_output=True, text=True, timeout=90
    )
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    serve = shell_line("python manage.py runserver")
    readme_port = server_port("manage.py runserver", serve.split("runserver", 1)[1])
    port = free_port()
    with processes(tmp_path) as start:
        argv = [*manage, "runserver", str(port), "--noreload"]
        django = start("runserver", env=env, argv=argv)
        wait_for_port(django, port)
        created = curl(
            on_port(shell_line("curl -X POST", "/checkout"), readme_port, port), tmp_path
        )
        django.signal(signal.SIGTERM)
        django.wait()
    job = rows(
        empty_db_url, "SELECT task, payload FROM notifyq.jobs WHERE id = %s", created["job_id"]
    )
    assert job == [("send_receipt", {"order": created["order"]})]
