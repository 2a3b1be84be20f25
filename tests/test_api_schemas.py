"""The API's models: importable without a web framework, and the one truth of what the API
answers (the hand-built JSON of the submission routes agrees with them)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import ROOT, notifyq_env

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


def test_notifyq_status_prints_a_job_without_importing_fastapi(db_url: str) -> None:
    env = notifyq_env(db_url)
    enqueued = subprocess.run(
        [sys.executable, "-m", "notifyq", "enqueue", "echo", '{"n": 1}'],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert enqueued.returncode == 0, enqueued.stderr
    job_id = enqueued.stdout.strip()
    done = run_python(
        "import sys\n"
        "from notifyq.cli import main\n"
        f"code = main(['status', {job_id!r}])\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {WEB_FRAMEWORKS})\n"
        "assert not loaded, loaded\n"
        "sys.exit(code)\n",
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["job_id"] == job_id
