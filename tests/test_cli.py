"""The notifyq command, as a user runs it: real processes, real databases.

The tests of this that need no database are in tests/unit/test_cli.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from notifyq.embedded import EmbeddedPostgres
from tests.helpers import ROOT, notifyq_env, processes


def notifyq(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "notifyq", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The failure's stderr, which must be exactly one line starting with notifyq: error:."""
    assert done.returncode != 0, done
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("notifyq: error: "), lines[0]
    assert "Traceback" not in done.stderr
    return lines[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_migrate_twice_at_once_then_again(empty_db_url: str) -> None:
    env = notifyq_env(empty_db_url)
    both = [
        subprocess.Popen(
            [sys.executable, "-m", "notifyq", "migrate"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60) for p in both]
    assert [p.returncode for p in both] == [0, 0], outputs
    again = notifyq("migrate", env=env)
    assert again.returncode == 0
    assert "nothing to apply" in again.stderr


def test_enqueue_and_status(db_url: str) -> None:
    env = notifyq_env(db_url)
    done = notifyq("enqueue", "echo", '{"n": 1}', "--priority", "4", "--delay", "60", env=env)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    uuid.UUID(job_id)
    dup1 = notifyq("enqueue", "echo", "{}", "--dedup-key", "k", env=env).stdout.strip()
    dup2 = notifyq("enqueue", "echo", '{"v": 2}', "--dedup-key", "k", env=env)
    assert dup2.stdout.strip() == dup1 and "replaced" in dup2.stderr
    status = notifyq("status", job_id, env=env)
    assert status.returncode == 0, status.stderr
    job = json.loads(status.stdout)
    assert (job["task"], job["payload"], job["priority"], job["status"]) == (
        "echo",
        {"n": 1},
        4,
        "queued",
    )


def test_enqueue_with_dependencies_and_a_group_key_and_status_shows_them(db_url: str) -> None:
    env = notifyq_env(db_url)
    first, second = (
        notifyq("enqueue", "echo", "{}", "--delay", "60", env=env).stdout.strip() for _ in "ab"
    )
    done = notifyq(
        "enqueue", "echo", '{"n": 3}', "--depends-on", first, "--depends-on", f"{second}, {first}",
        "--group-key", "g", env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    child = done.stdout.strip()
    assert "waits for the jobs it depends on" in done.stderr
    job = json.loads(notifyq("status", child, env=env).stdout)
    assert job["status"] == "waiting"
    assert job["depends_on"] == sorted([first, second])
    assert (job["group_key"], job["workflow_id"], job["progress"]) == ("g", None, None)
    plain = json.loads(notifyq("status", first, env=env).stdout)
    assert (plain["depends_on"], plain["group_key"], plain["progress"]) == ([], None, None)
    waiting = notifyq("jobs", "--status", "waiting", "--json", env=env)
    assert [json.loads(line)["job_id"] for line in waiting.stdout.splitlines()] == [child]
    assert notifyq("cancel", first, env=env).returncode == 0
    doomed = notifyq("enqueue", "echo", "--depends-on", first, env=env)
    assert doomed.returncode == 0 and "cancelled at once" in doomed.stderr
    assert json.loads(notifyq("status", doomed.stdout.strip(), env=env).stdout)["error"] == (
        f"cancelled: job {first}, which it depends on, was cancelled"
    )


def test_wait_prints_the_final_job_and_exits_zero_only_if_it_completed(db_url: str) -> None:
    """Exit 0: completed; 3: failed or cancelled; 124: the timeout came first; 1: it could not
    wait at all (as the command's help says)."""
    env = notifyq_env(db_url)
    good = notifyq("enqueue", "echo", '{"n": 1}', env=env).stdout.strip()
    bad = notifyq("enqueue", "fail", '{"message": "boom"}', "--max-attempts", "1", env=env)
    late = notifyq("wait", good, "--timeout", "0.2", env=env)
    assert f"job {good} has not finished after 0.2s" in one_line_error(late)
    assert late.returncode == 124 and late.stdout == ""
    unknown = notifyq("wait", str(uuid.UUID(int=5)), env=env)
    assert unknown.returncode == 1 and "no job" in one_line_error(unknown)
    never = notifyq("wait", good, "--timeout", "0", env=env)  # it could not even look
    assert never.returncode == 2 and "'0' must be more than 0" in never.stderr
    waiting = subprocess.Popen(
        [sys.executable, "-m", "notifyq", "wait", good, "--timeout", "30"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # It waits (its watch of the job is registered) before the job runs.
        with psycopg.connect(db_url, autocommit=True) as conn:
            deadline = time.monotonic() + 20
            query = "SELECT count(*) FROM notifyq.watched_jobs WHERE job_id = %s"
            while conn.execute(query, [good]).fetchone() != (1,):
                assert waiting.poll() is None, waiting.communicate()
                assert time.monotonic() < deadline, "notifyq wait never watched the job"
                time.sleep(0.02)
        assert notifyq("worker", "--burst", env=env).returncode == 0
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, err
    job = json.loads(out)
    assert (job["job_id"], job["status"], job["result"]) == (good, "completed", {"n": 1})
    failed = notifyq("wait", bad.stdout.strip(), env=env)
    assert json.loads(failed.stdout)["status"] == "failed"
    assert f"job {bad.stdout.strip()} failed: RuntimeError: boom" in one_line_error(failed)
    assert failed.returncode == 3
    help_text = notifyq("wait", "--help", env=env).stdout
    assert "3 it failed or was cancelled" in help_text and "124 --timeout" in help_text


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["enqueue", "echo", "{not json"], "not valid JSON"),
        (["enqueue", "echo", "[1, 2]"], "must be a JSON object"),
        (["enqueue", "", "{}"], "task must be a non-empty string"),
        (["enqueue", "echo", '{"a": "\\u0000"}'], "NUL"),
        (["status", "not-a-uuid"], "is not a job id"),
        (["status", "00000000-0000-0000-0000-000000000000"], "no job with id"),
        (["retry"], "name JOB_IDs"),
        (["cancel", "00000000-0000-0000-0000-000000000000"], "could not be cancelled"),
        (["enqueue", "echo", "--depends-on", "nope"], "is not a job id (a UUID): 'nope'"),
        (
            ["enqueue", "echo", "--depends-on", f"{uuid.UUID(int=1)},"],
            "is not a job id (a UUID): ''",
        ),
        (
            ["enqueue", "echo", "--depends-on", str(uuid.UUID(int=7))],
            f"do not exist: {uuid.UUID(int=7)}",
        ),
        (["enqueue", "echo", "--group-key", ""], "group_key must be a non-empty string"),
        (["enqueue", "echo", "--group-key", "k" * 513], "group_key is longer than 512"),
        (["wait", "not-a-uuid"], "is not a job id"),
        (["wait", "00000000-0000-0000-0000-000000000000"], "no job"),
    ],
)
def test_bad_arguments_are_one_line_errors(db_url: str, args: list[str], fragment: str) -> None:
    assert fragment in one_line_error(notifyq(*args, env=notifyq_env(db_url)))


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_bench_help_works_without_the_bench_and_says_how_to_install_it(
    flag: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from notifyq.cli import main

    # As where it is not installed: no entry point "bench" of the group "notifyq.commands".
    monkeypatch.setattr("notifyq.cli._main.entry_points", lambda **_: ())
    assert main(["bench", flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: notifyq bench") and "pip install -e ./benchmarks" in out
    # Asked to run, not for help, it still says it cannot.
    assert main(["bench", "--scenario", "idle"]) == 2
    assert "pip install -e ./benchmarks" in capsys.readouterr().err


def test_usage_errors_exit_2(db_url: str) -> None:
    env = notifyq_env(db_url)
    for args in (["no-such-command"], ["worker", "--concurrency", "0"], ["enqueue"]):
        done = notifyq(*args, env=env)
        assert done.returncode == 2, done
        assert "Traceback" not in done.stderr


def test_an_unreachable_database_is_one_line_and_quick() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = notifyq_env(f"postgresql://postgres@127.0.0.1:{port}/nothing")
    for args in (["migrate"], ["worker"], ["serve"], ["enqueue", "echo"], ["stats"]):
        began = time.monotonic()
        line = one_line_error(notifyq(*args, env=env))
        assert "cannot connect" in line and "DATABASE_URL" in line
        assert time.monotonic() - began < 10


def test_a_database_without_the_schema_says_to_migrate(empty_db_url: str) -> None:
    line = one_line_error(notifyq("jobs", env=notifyq_env(empty_db_url)))
    assert "notifyq migrate" in line


def test_bad_settings_name_the_variable(db_url: str) -> None:
    env = notifyq_env(db_url, NOTIFYQ_CONCURRENCY="lots")
    assert "NOTIFYQ_CONCURRENCY" in one_line_error(notifyq("worker", env=env))


@pytest.mark.parametrize("command", ["worker", "serve"])
def test_a_bad_contrib_setting_stops_the_command_before_it_migrates(
    empty_db_url: str, command: str
) -> None:
    # The worker's tasks (and the settings of send_email, http_request and the file tasks) are
    # built before the database is touched, so a typo costs one line and changes nothing.
    env = notifyq_env(empty_db_url, NOTIFYQ_SMTP_PORT="0")
    port = ["--port", str(free_port())] if command == "serve" else []
    line = one_line_error(notifyq(command, *port, env=env))
    assert "NOTIFYQ_SMTP_PORT" in line
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT to_regnamespace('notifyq')").fetchone() == (None,)


def test_operator_commands(db_url: str) -> None:
    env = notifyq_env(db_url)
    failing = notifyq("enqueue", "fail", '{"message": "boom"}', "--max-attempts", "1", env=env)
    queued = notifyq("enqueue", "echo", "{}", "--queue", "mail", env=env).stdout.strip()
    assert notifyq("worker", "--burst", "--queues", "default", env=env).returncode == 0
    jobs = notifyq("jobs", "--status", "failed", env=env)
    assert failing.stdout.strip() in jobs.stdout and "RuntimeError: boom" in jobs.stdout
    as_json = [json.loads(line) for line in notifyq("jobs", "--json", env=env).stdout.splitlines()]
    assert {job["job_id"] for job in as_json} == {failing.stdout.strip(), queued}
    stats = notifyq("stats", env=env).stdout
    assert "mail" in stats and "default" in stats
    tasks = notifyq("tasks", env=env).stdout
    assert "send_email" in tasks and "hello_world" in tasks
    cancelled = notifyq("cancel", queued, env=env)
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
    retried = notifyq("retry", failing.stdout.strip(), env=env)
    assert retried.returncode == 0 and "requeued 1 job(s)" in retried.stdout


def test_top_refreshes_until_interrupted(db_url: str, tmp_path: Path) -> None:
    with processes(tmp_path) as start:
        top = start("top", "--interval", "0.1", env=notifyq_env(db_url))
        top.wait_for_output("notifyq top")
        deadline = time.monotonic() + 10
        while top.output().count("notifyq top") < 3:
            assert time.monotonic() < deadline, top.output()
            time.sleep(0.05)
        top.signal(signal.SIGINT)
        assert top.wait() in (0, 130)


def test_json_logs_carry_the_job_fields(db_url: str) -> None:
    env = notifyq_env(db_url, NOTIFYQ_LOG_FORMAT="json", NOTIFYQ_LOG_LEVEL="DEBUG")
    notifyq("enqueue", "hello_world", '{"secret": "do-not-log"}', env=env)
    done = notifyq("worker", "--burst", env=env)
    assert done.returncode == 0, done.stderr
    entries = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert entries, done.stderr
    event = next(e for e in entries if e.get("event") == "completed")
    assert {
        "ts",
        "level",
        "logger",
        "message",
        "job_id",
        "task",
        "queue",
        "attempt",
        "duration_ms",
    } <= set(event)
    assert event["task"] == "hello_world" and event["attempt"] == 1
    assert "do-not-log" not in done.stderr


def test_serve_exposes_metrics_and_stops_on_sigterm(db_url: str, tmp_path: Path) -> None:
    port = free_port()
    with processes(tmp_path) as start:
        server = start("serve", "--port", str(port), env=notifyq_env(db_url))
        server.wait_for_output("Uvicorn running on")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            job_id = client.post("/jobs", json={"payload": {"n": 1}}).json()["job_id"]
            deadline = time.monotonic() + 10
            while client.get(f"/jobs/{job_id}").json()["status"] != "completed":
                assert time.monotonic() < deadline
                time.sleep(0.02)
            text = client.get("/metrics").text
        server.signal(signal.SIGTERM)
        assert server.wait() == 0, server.output()
    assert 'notifyq_jobs_completed_total{queue="default",task="echo"} 1.0' in text
    assert 'notifyq_jobs_enqueued_total{queue="default",task="echo"} 1.0' in text
    assert "notifyq_pickup_latency_seconds_bucket" in text
    assert 'notifyq_queue_jobs{queue="default",status="completed"} 1.0' in text


def test_a_worker_serves_metrics_on_its_own_port(db_url: str, tmp_path: Path) -> None:
    port = free_port()
    with processes(tmp_path) as start:
        worker = start("worker", "--metrics-port", str(port), env=notifyq_env(db_url))
        worker.wait_for_output("ready")
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
    assert "notifyq_claims_total" in text


@pytest.fixture
def embedded_home() -> Iterator[Path]:
    """A data folder for a `notifyq dev` of this test's own. As root it cannot be under tmp_path
    (private to root): the server's unprivileged account must reach it."""
    folder = Path(tempfile.mkdtemp(prefix="notifyq-dev-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _postmaster_alive(data: Path) -> bool:
    pid_files = list(data.rglob("postmaster.pid"))
    for pid_file in pid_files:
        pid = int(pid_file.read_text().split("\n", 1)[0])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().rpartition(")")[2].split()[0] == "Z":
            continue
        return True
    return False


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_dev_with_no_database_url_runs_and_leaves_no_server(
    embedded_home: Path, tmp_path: Path, stop: int
) -> None:
    env = notifyq_env("", NOTIFYQ_DATA_DIR=str(embedded_home))
    del env["DATABASE_URL"]
    port = free_port()
    with processes(tmp_path) as start:
        dev = start("dev", "--port", str(port), env=env, name="dev")
        dev.wait_for_output("Uvicorn running on", timeout=60)
        output = dev.output()
        assert f"http://127.0.0.1:{port}/docs" in output
        assert str(embedded_home) in output
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            answer = client.post("/jobs", json={"task": "hello_world", "payload": {}})
            job_id = answer.json()["job_id"]
            deadline = time.monotonic() + 10
            while (job := client.get(f"/jobs/{job_id}").json())["status"] != "completed":
                assert time.monotonic() < deadline, job
                time.sleep(0.02)
        assert job["result"] == {"message": "Hello, world!"}
        assert _postmaster_alive(embedded_home)
        dev.signal(stop)
        assert dev.wait(timeout=30) == 0, dev.output()
    deadline = time.monotonic() + 10
    while _postmaster_alive(embedded_home):
        assert time.monotonic() < deadline, "the embedded PostgreSQL outlived notifyq dev"
        time.sleep(0.05)
    # The data stays: the job is still there next time.
    with EmbeddedPostgres(embedded_home) as again, psycopg.connect(again.url) as conn:
        row = conn.execute("SELECT status FROM notifyq.jobs WHERE id = %s", [job_id]).fetchone()
    assert row == ("completed",)
    assert not _postmaster_alive(embedded_home)


@pytest.mark.parametrize(
    ("args", "variables", "fragment"),
    [
        (["--host", "0.0.0.0"], {}, "refusing to serve on 0.0.0.0 without a token"),
        ([], {"NOTIFYQ_SMTP_PORT": "0"}, "NOTIFYQ_SMTP_PORT"),
        (["--import", "no_such_module_here"], {}, "cannot import 'no_such_module_here'"),
    ],
    ids=["public-bind", "contrib-setting", "import"],
)
def test_dev_checks_what_it_can_before_it_starts_an_embedded_server(
    embedded_home: Path, args: list[str], variables: dict[str, str], fragment: str
) -> None:
    env = notifyq_env("", NOTIFYQ_DATA_DIR=str(embedded_home), **variables)
    del env["DATABASE_URL"]
    began = time.monotonic()
    line = one_line_error(notifyq("dev", "--port", str(free_port()), *args, env=env))
    assert fragment in line
    assert not list(embedded_home.iterdir()), "a cluster was made before the refusal"
    assert time.monotonic() - began < 10


def test_a_worker_checks_its_metrics_port_before_it_migrates(empty_db_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = notifyq("worker", "--metrics-port", str(port), env=notifyq_env(empty_db_url))
    line = one_line_error(done)
    assert f"cannot serve metrics on 127.0.0.1:{port}" in line
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT to_regnamespace('notifyq')").fetchone() == (None,)


def test_dev_reset_refuses_with_a_database_url(db_url: str) -> None:
    assert "--reset" in one_line_error(notifyq("dev", "--reset", env=notifyq_env(db_url)))


def test_queue_switches(db_url: str) -> None:
    env = notifyq_env(db_url)
    paused = notifyq("queue", "mail", "--pause", "--rate-limit", "5", "--notify", "off", env=env)
    assert paused.returncode == 0, paused.stderr
    assert "paused, 5/s, polled" in paused.stdout
    resumed = notifyq("queue", "mail", "--resume", "--rate-limit", "0", "--notify", "on", env=env)
    assert "active" in resumed.stdout and "/s" not in resumed.stdout
    assert "queue" in one_line_error(notifyq("queue", "", "--pause", env=env))


# -- safe by default: tokens, binds -----------------------------------------------------------


@pytest.mark.parametrize("value", ["", "   "])
@pytest.mark.parametrize("command", ["serve", "dev"])
def test_an_empty_token_stops_serve_and_dev(db_url: str, command: str, value: str) -> None:
    env = notifyq_env(db_url, NOTIFYQ_API_TOKEN=value)
    line = one_line_error(notifyq(command, "--port", str(free_port()), env=env, timeout=20))
    assert "NOTIFYQ_API_TOKEN" in line and "empty" in line


@pytest.mark.parametrize("host", ["192.0.2.1", "0.0.0.0", "::"])
@pytest.mark.parametrize("command", ["serve", "dev"])
def test_a_public_bind_without_a_token_is_refused(db_url: str, command: str, host: str) -> None:
    began = time.monotonic()
    done = notifyq(command, "--host", host, "--port", str(free_port()), env=notifyq_env(db_url))
    line = one_line_error(done)
    assert f"refusing to serve on {host} without a token" in line
    assert "NOTIFYQ_API_TOKEN" in line and "NOTIFYQ_ALLOW_UNAUTHENTICATED=true" in line
    assert time.monotonic() - began < 10


def test_the_image_command_without_a_token_stops_with_one_line(db_url: str) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    cmd = json.loads(next(line for line in dockerfile.splitlines() if line.startswith("CMD "))[4:])
    serve = cmd[-1].split("exec notifyq ", 1)[1].split()
    assert serve[:3] == ["serve", "--host", "0.0.0.0"]
    line = one_line_error(notifyq(*serve, env=notifyq_env(db_url)))
    assert "refusing to serve on 0.0.0.0 without a token" in line


# -- secrets in messages ---------------------------------------------------------------------


def test_an_unreachable_keyword_dsn_does_not_show_its_password() -> None:
    dsn = f"host=127.0.0.1 port={free_port()} user=postgres password=hunter2 dbname=x"
    for command in ("migrate", "worker"):
        line = one_line_error(notifyq(command, "--database-url", dsn, env=notifyq_env("")))
        assert "cannot connect" in line and "hunter2" not in line, line
