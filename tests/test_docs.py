"""The documentation site (mkdocs.yml, docs/) and the README: the site builds with
``mkdocs build --strict``, every code block of every page is run by a test or marked as not run
(see tests/docs.py for the markers), the SQL of every page runs on a database of its own, the
pages' other snippets that no other test runs are run here as printed, the generated reference
covers every setting, command, route and public SQL function, and every schema version has its
upgrade page."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from notifyq import SyncQueue
from notifyq.queries import sql_dir
from tests.docs import DOCS, README, blocks, blocks_of, doc_block, pages
from tests.helpers import ROOT, notifyq_env, processes

MKDOCS_YML = ROOT / "mkdocs.yml"


def reference_hook() -> ModuleType:
    """docs/hooks/reference.py, the MkDocs hook that generates the reference's sections."""
    spec = importlib.util.spec_from_file_location(
        "notifyq_docs_reference", DOCS / "hooks" / "reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def _test_exists(marker: str) -> str | None:
    """None when the test a ``run:`` marker names exists, else why not."""
    target = marker.removeprefix("run:").strip()
    path, _, name = target.partition("::")
    file = ROOT / path
    if not name or not file.is_file():
        return f"{target!r} names no test file and test (tests/test_x.py::test_name)"
    tree = ast.parse(file.read_text())
    tests = (ast.FunctionDef, ast.AsyncFunctionDef)
    names = {node.name for node in ast.walk(tree) if isinstance(node, tests)}
    return None if name in names else f"{path} has no test {name}"


def test_every_code_block_is_run_by_a_test_or_marked_as_not_run() -> None:
    problems = []
    for block in blocks():
        if block.marker.startswith("run:"):
            why = _test_exists(block.marker)
            if why:
                problems.append(f"{block.where}: {why}")
        elif block.marker.startswith("not run:"):
            if len(block.marker.removeprefix("not run:").strip()) < 10:
                problems.append(f"{block.where}: a 'not run' marker must say why")
        elif block.lang != "sql":
            problems.append(
                f"{block.where}: a {block.lang or 'plain'} block that no test runs: run it in a "
                "test and mark it <!-- run: tests/test_x.py::test_name -->, or mark it "
                "<!-- not run: why --> if it is output or cannot run here"
            )
    assert not problems, "\n".join(problems)


def test_the_generated_reference_marks_its_blocks_as_output() -> None:
    hook = reference_hook()
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        if "<!-- reference: " not in text:
            continue
        generated = hook.generate(text, str(page.relative_to(DOCS)))
        assert "<!-- reference: " not in generated, page
        unmarked = [b for b in blocks_of(page, generated) if not b.marker and b.lang != "sql"]
        assert not unmarked, [b.where for b in unmarked]


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


def test_every_page_of_the_site_is_in_its_nav() -> None:
    nav = MKDOCS_YML.read_text()
    listed = set(re.findall(r"([\w/-]+\.md)$", nav, re.M))
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert on_disk == listed, {"not in the nav": on_disk - listed, "missing": listed - on_disk}


def test_every_schema_version_has_its_upgrade_page() -> None:
    nav = MKDOCS_YML.read_text()
    missing = []
    for migration in sorted(sql_dir().glob("0*.sql")):
        number = migration.name[:3]
        page = DOCS / "upgrading" / f"{number}.md"
        if not page.is_file() or f"upgrading/{number}.md" not in nav:
            missing.append(
                f"{migration.name}: add docs/upgrading/{number}.md (as 019.md is made), list it "
                "in mkdocs.yml's nav and in docs/upgrading/index.md, and its entry in CHANGELOG.md"
            )
    assert not missing, "\n".join(missing)


def test_the_readme_is_short_and_its_links_lead_somewhere() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"


def test_the_changelog_has_every_schema_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    for migration in sorted(sql_dir().glob("0*.sql")):
        number = int(migration.name[:3])
        if number >= 20:
            continue  # the storage rewrite's: listed under [Unreleased] as they land
        assert f"### Schema version {number}:" in changelog, migration.name


# -- the generated reference ---------------------------------------------------------------


def test_the_settings_reference_names_every_variable() -> None:
    from notifyq.contrib import ContribSettings
    from notifyq.settings import Settings

    text = reference_hook().settings_reference()
    for name in [*Settings.model_fields, *ContribSettings.model_fields]:
        variable = {"database_url": "DATABASE_URL", "imports": "NOTIFYQ_IMPORT"}.get(
            name, f"NOTIFYQ_{name.upper()}"
        )
        assert f"| `{variable}` |" in text, variable
    assert "`--concurrency`" in text


def test_the_cli_reference_has_every_command() -> None:
    from notifyq.cli._parser import build_parser

    text = reference_hook().cli_reference()
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name in commands.choices:
        assert f"### `notifyq {name}`" in text, name
    assert "usage: notifyq worker" in text


def test_the_http_reference_has_every_route() -> None:
    hook = reference_hook()
    text = hook.http_reference()
    for path, methods in json.loads(hook.openapi_json())["paths"].items():
        for method in methods:
            assert f"#### `{method.upper()} {path}`" in text, (method, path)


def test_the_sql_reference_has_the_public_functions_and_every_column() -> None:
    text = reference_hook().sql_reference()
    assert "### `notifyq.enqueue`" in text
    assert "claim_v4" not in text, "the workers' own functions are not listed"
    for column in ("id", "task", "payload", "status", "depends_on", "trace_context", "ref"):
        assert f"| `{column}` |" in text, column


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
        db_url, "SELECT name, paused, notify, rate_limit FROM notifyq.queues ORDER BY name"
    ) == [("imports", False, False, None), ("mail", False, True, 5.0)]


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


@pytest.mark.parametrize("name", ["tasks.py", "views.py"])
def test_the_django_task_files_are_the_tested_ones(name: str) -> None:
    block = doc_block(f"# newsletter/{name}\n")
    tested = ROOT / "tests" / "django_project" / "newsletter" / name
    assert block.split("\n", 1)[1] == tested.read_text()


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


def test_the_sites_first_screen_is_the_readmes() -> None:
    # tests/test_first_screen.py runs the README's commands and checks its output block; the
    # site's copies must say the same.
    commands, output = blocks_of(README)[:2]
    assert output.lang == "text", "the README's output of notifyq dev comes second"
    for page in (DOCS / "getting-started.md", DOCS / "index.md"):
        assert blocks_of(page)[0].code == commands.code, page
    (shown,) = [b for b in blocks_of(DOCS / "getting-started.md") if b.lang == "text"]
    assert shown.code == output.code


def test_blocks_that_tests_find_by_their_first_line_are_the_same_wherever_shown() -> None:
    # Tests find a block by its first line, the README's first: a copy on another page with
    # the same first line must be the same block, or the copy is not the one they run.
    by_first_line: dict[str, set[str]] = {}
    for block in blocks():
        if block.marker.startswith("run:"):
            by_first_line.setdefault(block.first_line, set()).add(block.code)
    differing = [line for line, codes in by_first_line.items() if len(codes) > 1]
    assert not differing, differing
