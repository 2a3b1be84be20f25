"""The wheel a user installs: built from this tree with the project's build backend, it holds the
package with its SQL as package data (the top-level sql/ of the source, as notifyq/sql) and the
dashboard's files, and nothing else of the repository: no tests, no screenshots, no bench or its
data. Installed into a fresh venv, away from this checkout, the package finds its SQL files
inside itself through the function every reader uses (notifyq.queries.sql_dir), its ``notifyq``
command answers ``--help`` and runs a job from enqueue to completed against the real PostgreSQL.

The venv's dependencies come from a folder of wheels kept between runs (the user's cache), so
that only a first run, or a new dependency, asks the package index."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from notifyq.api.routes.ops import DASHBOARD_MODULES
from notifyq.queries import load_migrations, load_queries, sql_dir
from tests.helpers import ROOT

pytest.importorskip("hatchling", reason="the dev extra installs the build backend")

# A venv and an install: half a minute, which CI spends once, in its full run; a first run also
# fetches the dependencies' wheels.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: Dependency wheels kept between runs: only a first run (or a new dependency) downloads.
WHEEL_CACHE = Path(
    os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "notifyq-tests", "wheels"
)


def pip(python: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    build = pip(
        Path(sys.executable),
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(out),
        str(ROOT),
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (built,) = out.glob("notifyq-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The bin folder of a fresh venv with only the wheel and its dependencies installed."""
    home = tmp_path_factory.mktemp("venv")
    venv.create(home, with_pip=True)
    python = home / "bin" / "python"
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    offline = pip(python, "install", "--no-index", "--find-links", str(WHEEL_CACHE), str(wheel))
    if offline.returncode != 0:  # a first run, or a dependency the cache lacks
        fetched = pip(python, "wheel", "-w", str(WHEEL_CACHE), str(wheel))
        assert fetched.returncode == 0, fetched.stdout + fetched.stderr
        again = pip(python, "install", "--no-index", "--find-links", str(WHEEL_CACHE), str(wheel))
        assert again.returncode == 0, again.stdout + again.stderr
    yield home / "bin"


def test_the_wheel_holds_the_package_its_sql_and_its_static_files_and_nothing_else(
    wheel: Path,
) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    name, version = wheel.name.split("-")[:2]
    assert {n.split("/", 1)[0] for n in names} == {"notifyq", f"{name}-{version}.dist-info"}
    sql_files = sorted(p.name for p in sql_dir().glob("*.sql"))
    assert sorted(
        n.removeprefix("notifyq/sql/") for n in names if n.startswith("notifyq/sql/")
    ) == (sql_files)
    for asset in (
        "dashboard.html",
        "dashboard.css",
        *(f"dashboard/{m}" for m in DASHBOARD_MODULES),
    ):
        assert f"notifyq/static/{asset}" in names, asset
    assert "notifyq/py.typed" in names
    assert "notifyq/django/migrations/0001_schema.py" in names
    assert not [n for n in names if n.endswith(".png")], "screenshots are the docs', not the app's"
    assert not [n for n in names if "/tests/" in n or n.startswith("tests/")]
    assert not [n for n in names if "bench" in n.lower()], "the bench is a distribution of its own"
    assert not [n for n in names if n.endswith((".pyc", ".json.gz"))]


def test_the_installed_wheel_runs_a_job(installed: Path, empty_db_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFYQ_", "PYTHON"))}
    env["DATABASE_URL"] = empty_db_url

    def notifyq(*args: str) -> str:
        # Run from a folder of its own: nothing of this checkout is on the path.
        run = subprocess.run(
            [str(installed / "notifyq"), *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, f"notifyq {' '.join(args)}:\n{run.stdout}{run.stderr}"
        return run.stdout

    assert "usage: notifyq" in notifyq("--help")
    where = subprocess.run(
        [str(installed / "python"), "-c", "import notifyq; print(notifyq.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert str(installed.parent) in where.stdout, where.stdout + where.stderr
    # The SQL files, found and read as every reader finds them: inside the installed package.
    loaded = subprocess.run(
        [
            str(installed / "python"),
            "-c",
            "import json, notifyq.queries as q; print(json.dumps([str(q.sql_dir()), "
            "[m.checksum for m in q.load_migrations()], sorted(q.load_queries())]))",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    folder, checksums, queries = json.loads(loaded.stdout)
    assert Path(folder) == Path(where.stdout.strip()).resolve().parent / "sql"
    assert checksums == [m.checksum for m in load_migrations()]
    assert queries == sorted(load_queries())
    notifyq("migrate")  # the migrations from the wheel's notifyq/sql
    job_id = notifyq("enqueue", "hello_world", '{"name": "wheel"}').strip()
    notifyq("worker", "--burst")
    job = json.loads(notifyq("status", job_id))
    assert (job["status"], job["result"]) == ("completed", {"message": "Hello, wheel!"})
