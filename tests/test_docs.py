"""The documentation site (mkdocs.yml, docs/) and the README: the site builds with
``mkdocs build --strict``, every code block of every page is run by a test or marked as not run
(see tests/docs.py for the markers), the SQL of every page runs on a database of its own, the
pages' other snippets that no other test runs are run here as printed, the generated reference
covers every setting, command, route and public SQL function, and every schema version has its
upgrade page.

The tests of this that need no database are in tests/unit/test_docs.py.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from notifyq import SyncQueue
from tests.docs import blocks_of, doc_block, pages
from tests.helpers import ROOT, notifyq_env, processes


def shell_commands(code: str) -> list[str]:
    """The commands of a shell block, one a line, without their comments."""
    return [line.split(" #", 1)[0].strip() for line in code.splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rows(db_url: str, query: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(query, params).fetchall()


def run_cli(command: str, db_url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A ``notifyq ...`` line of a page, run as printed (the ``notifyq`` of this Python)."""
    words = shlex.split(command)
    assert words[0] == "notifyq", command
    return subprocess.run(
        [sys.executable, "-m", "notifyq", *words[1:]],
        cwd=cwd,
        env=notifyq_env(db_url),
        capture_output=True,
        text=True,
        timeout=60,
    )


# -- every block is run or marked ----------------------------------------------------------


@pytest.mark.parametrize(
    "page",
    [p for p in pages() if any(b.lang == "sql" and not b.marker for b in blocks_of(p))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_sql_of_every_page_runs_as_printed(page: Path, db_url: str) -> None:
    # A page's SQL runs in the order it is printed, as a psql user pastes it, on a database
    # of its own with notifyq's schema.
    with psycopg.connect(db_url, autocommit=True) as conn:
        for block in blocks_of(page):
            if block.lang == "sql" and not block.marker:
                try:
                    conn.execute(block.code.encode())
                except psycopg.Error as exc:
                    pytest.fail(f"{block.where}: {exc}")


# -- the site --------------------------------------------------------------------------------


@pytest.mark.slow  # CI also builds it in a step of its own, before the tests
def test_the_site_builds_with_mkdocs_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        # Material's notice about its own future, printed on every build.
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    assert "WARNING" not in build.stderr, build.stderr
    settings = (tmp_path / "reference" / "settings" / "index.html").read_text()
    assert "NOTIFYQ_CONCURRENCY" in settings
    python = (tmp_path / "reference" / "python" / "index.html").read_text()
    assert "enqueue_many" in python, "mkdocstrings rendered the Python API"
    assert (tmp_path / "images" / "dashboard.png").is_file()


# -- the generated reference ---------------------------------------------------------------


# -- the snippets run here ------------------------------------------------------------------


def test_notifyq_dev_on_your_own_postgresql_runs_as_printed(db_url: str, tmp_path: Path) -> None:
    code = doc_block("export DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres")
    export, dev = shell_commands(code)
    assert export.startswith("export DATABASE_URL=") and dev == "notifyq dev", code
    # The page's server is the default local one; this test's database is on the same server.
    port = str(free_port())
    with processes(tmp_path) as start:
        running = start("dev", "--port", port, env=notifyq_env(db_url))
        running.wait_for_output("Uvicorn running on", timeout=60)
        assert "starting embedded PostgreSQL" not in running.output()
        running.signal(signal.SIGINT)
        assert running.wait() == 0, running.output()


def test_the_queue_switches_run_as_printed(db_url: str, tmp_path: Path) -> None:
    for command in shell_commands(doc_block("notifyq queue mail --pause")):
        run = run_cli(command, db_url, tmp_path)
        assert run.returncode == 0, run.stdout + run.stderr
    assert rows(
        db_url,
        "SELECT name, paused, notify, rate_limit, max_depth FROM notifyq.queues ORDER BY name",
    ) == [("imports", False, False, None, None), ("mail", False, True, 5.0, 10000)]


def test_the_retries_example_runs_on_a_worker(db_url: str, tmp_path: Path) -> None:
    (tmp_path / "flaky.py").write_text(doc_block("# flaky.py"))
    start_worker, enqueue = shell_commands(doc_block("notifyq worker --import flaky"))
    with processes(tmp_path) as start, SyncQueue(db_url) as q:
        worker = start(*shlex.split(start_worker)[1:], env=notifyq_env(db_url), cwd=tmp_path)
        worker.wait_for_output("ready")
        run = run_cli(enqueue, db_url, tmp_path)
        assert run.returncode == 0, run.stderr
        charged = q.wait(run.stdout.strip(), timeout=30)
        refused = q.wait(q.enqueue("charge", {"card": "stolen"}).job_id, timeout=30)
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output()
    assert (charged.status, charged.result) == ("completed", {"charged": 42, "attempts": 3})
    assert [e["error"].split("\n")[0] for e in charged.errors] == [
        "ConnectionError: the bank did not answer (attempt 1)",
        "ConnectionError: the bank did not answer (attempt 2)",
    ]
    assert (refused.status, refused.attempt_count) == ("failed", 1)
    assert refused.last_error == "PermanentFailure: the card was refused"


def test_the_periodic_example_enqueues_its_ticks(db_url: str, tmp_path: Path) -> None:
    (tmp_path / "cleanup.py").write_text(doc_block("# cleanup.py"))
    start_worker, list_jobs = shell_commands(doc_block("notifyq worker --import cleanup"))
    with processes(tmp_path) as start:
        worker = start(*shlex.split(start_worker)[1:], env=notifyq_env(db_url), cwd=tmp_path)
        worker.wait_for_output("ready")
        # A worker that starts enqueues the tick of the minute before it: one job at once.
        deadline = time.monotonic() + 30
        while not rows(
            db_url,
            "SELECT 1 FROM notifyq.jobs WHERE task = 'purge_exports' AND status = %s",
            "completed",
        ):
            assert time.monotonic() < deadline, worker.output()
            time.sleep(0.05)
        listed = run_cli(list_jobs, db_url, tmp_path)
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output()
    assert listed.returncode == 0, listed.stderr
    assert "purge_exports" in listed.stdout and "completed" in listed.stdout
    ((payload, result),) = rows(
        db_url,
        "SELECT payload, result FROM notifyq.jobs WHERE task = 'purge_exports' "
        "AND status = 'completed' LIMIT 1",
    )
    assert payload == {"older_than_days": 30}
    assert result == {"purged": 0, "older_than_days": 30}
    ((cron, queue),) = rows(
        db_url,
        "SELECT options->>'cron', options->>'queue' FROM notifyq.tasks WHERE name = %s",
        "weekly_report",
    )
    assert (cron, queue) == ("0 3 * * 1", "reports")


# -- Django ------------------------------------------------------------------------------------


def test_the_django_commands_run_as_printed(
    server_url: str, empty_db_url: str, tmp_path: Path
) -> None:
    pytest.importorskip("django")
    commands = [
        *shell_commands(doc_block("python manage.py migrate")),
        *shell_commands(doc_block("python manage.py notifyq_worker --queues mail,default\n")),
    ]
    dbname = str(conninfo_to_dict(empty_db_url)["dbname"])
    env = notifyq_env(server_url, SHOP_DATABASE=dbname)
    manage = str(ROOT / "tests" / "django_project" / "manage.py")
    with processes(tmp_path) as start:
        for command in commands:
            words = shlex.split(command)
            assert words[:2] == ["python", "manage.py"], command
            argv = [sys.executable, manage, *words[2:]]
            if "--burst" in words or words[2] == "migrate":
                run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90)
                assert run.returncode == 0, command + "\n" + run.stdout + run.stderr
                continue
            worker = start(*words[2:], env=env, argv=argv)
            worker.wait_for_output("ready", timeout=60)
            worker.signal(signal.SIGTERM)
            assert worker.wait() == 0, worker.output()
    assert rows(empty_db_url, "SELECT count(*) FROM notifyq.jobs") == [(0,)]
