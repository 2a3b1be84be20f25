"""docker-compose.yml and the Dockerfile, rehearsed without Docker.

The CI machines have no Docker daemon and cannot pull images, so ``docker compose up`` itself is
not run here. What is run is everything it would do with this repository's files: the compose
file is read as compose reads it (YAML merge keys, ``${VAR:?message}``), the image's build
context is the Dockerfile's COPY lines filtered by .dockerignore, the package is built and
installed from exactly those files, and each service's command runs with the image's ENV and
WORKDIR and the service's environment, against a role and database like the ``db`` service's
on the test server. Then it checks what the files' comments promise.

The tests of this that need no database are in tests/unit/test_compose.py.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from psycopg import sql

from notifyq.queries import sql_dir
from tests.helpers import ROOT, Process, processes
from tests.unit.test_compose import (
    COMPOSE,
    PASSWORDS,
    WORKER_ROLE,
    load_compose,
    seconds,
)

DOCKERFILE = ROOT / "Dockerfile"


# -- compose's reading of docker-compose.yml ----------------------------------------------------


def read_dotenv(path: Path) -> dict[str, str]:
    """The ``KEY=value`` lines of a compose .env file."""
    env: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, _, value = line.partition("=")
                env[key.strip()] = value.strip().strip("'\"")
    return env


def header_command(pattern: str) -> str:
    """The shell command of the compose file's header comment that matches ``pattern``, its
    backslash-continued lines joined."""
    comments = []
    for line in COMPOSE.read_text().splitlines():
        if not line.startswith("#"):
            break
        comments.append(line[1:].strip())
    text = "\n".join(comments).replace("\\\n", " ")
    match = re.search(pattern, text, re.M)
    assert match is not None, f"the header of docker-compose.yml has no {pattern!r}"
    return match.group(0)


# -- the Dockerfile and its build context ----------------------------------------------------


@dataclass
class Dockerfile:
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = "root"
    expose: list[str] = field(default_factory=list)
    copies: list[tuple[list[str], str]] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)


def read_dockerfile() -> Dockerfile:
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        if raw.lstrip().startswith("#") or not raw.strip():
            continue
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        lines.append(pending + raw)
        pending = ""
    image = Dockerfile()
    for line in lines:
        instruction, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        match instruction.upper():
            case "ENV":
                image.env.update(dict(word.split("=", 1) for word in shlex.split(rest)))
            case "WORKDIR":
                image.workdir = str(Path(image.workdir, rest))
            case "USER":
                image.user = rest
            case "EXPOSE":
                image.expose += rest.split()
            case "COPY":
                *sources, dest = shlex.split(rest)
                assert not any(s.startswith("--") for s in sources), line  # no --from/--chown
                image.copies.append((sources, dest))
            case "RUN":
                image.runs.append(rest)
            case "CMD":
                image.cmd = json.loads(rest)  # the exec form: no shell of Docker's in between
            case "FROM":
                pass
            case _:
                raise AssertionError(f"the rehearsal does not know {instruction}: {line}")
    return image


def _ignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go's filepath.Match plus ``**``) as a regular expression."""
    pattern = pattern.strip("/")
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


def dockerignored() -> Any:
    """Whether .dockerignore keeps a path (relative to the context) out of the build context:
    the last matching pattern decides, ``!`` re-includes, and a pattern that matches a folder
    matches everything in it."""
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), _ignore_regex(line.lstrip("!"))))

    def ignored(relative: str) -> bool:
        parts = relative.split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        verdict = False
        for negated, regex in rules:
            if any(regex.match(prefix) for prefix in prefixes):
                verdict = not negated
        return verdict

    return ignored


def build_context(destination: Path, image: Dockerfile) -> list[str]:
    """Copies what the Dockerfile's COPY lines take from the build context into
    ``destination`` (the image's WORKDIR), leaving out what .dockerignore excludes; answers the
    relative paths copied."""
    ignored = dockerignored()
    copied = []
    for sources, dest in image.copies:
        for source in sources:
            path = ROOT / source
            assert path.exists(), f"the Dockerfile copies {source}, which does not exist"
            assert not ignored(source), f".dockerignore excludes {source}, which is copied"
            files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
            for file in files:
                relative = file.relative_to(ROOT).as_posix()
                if ignored(relative):
                    continue
                if dest.endswith("/") and path.is_file():
                    target = destination / dest / file.name
                else:
                    target = destination / dest / file.relative_to(path)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, target)
                copied.append(relative)
    return copied


@dataclass
class Image:
    """The image, rehearsed: its WORKDIR with the copied files, and a virtual environment in
    which the RUN line's ``pip install .`` installed the package (and its ``notifyq``
    command) from exactly those files."""

    dockerfile: Dockerfile
    workdir: Path
    bin: Path

    def env(self, service: dict[str, Any], home: Path) -> dict[str, str]:
        """A container's environment: the image's ENV, then the service's, and no variable
        of this test run's (notifyq's, PYTHONPATH) but the PATH to the installed command."""
        env = {"PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}", "HOME": str(home)}
        env.update(self.dockerfile.env)
        env.update(service["environment"])
        return env


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    dockerfile = read_dockerfile()
    root = tmp_path_factory.mktemp("image")
    workdir = root / dockerfile.workdir.lstrip("/")
    workdir.mkdir(parents=True)
    build_context(workdir, dockerfile)
    assert any("pip install ." in run for run in dockerfile.runs)
    # `pip install .` as a wheel built from the copied files only (the build backend comes
    # from the configured index, as in the image), then installed into a fresh environment
    # that sees this interpreter's dependencies but not notifyq's editable install from the
    # checkout.
    wheels = root / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), "."],
        cwd=workdir,
        check=True,
        capture_output=True,
    )
    venv = root / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
        check=True,
    )
    (wheel,) = wheels.glob("notifyq-*.whl")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    return Image(dockerfile, workdir, venv / "bin")


# -- the db service, on the test server ------------------------------------------------------


@dataclass
class Database:
    """A role and database like the ``db`` service's, and a name for the worker role that the
    setup service makes, under names of this run's own (roles are global to the server)."""

    role: str
    password: str
    host: str
    port: int

    @property
    def worker(self) -> str:
        return f"{self.role}_worker"

    def map_url(self, url: str) -> str:
        """A compose DATABASE_URL (``postgresql://notifyq:...@db:5432/notifyq``, or
        ``notifyq_worker``'s) pointed at this run's role and database on the test server."""
        parts = urlsplit(url)
        assert (parts.hostname, parts.port) == ("db", 5432), url
        assert parts.password, url
        user = {"notifyq": self.role, WORKER_ROLE: self.worker}[parts.username or ""]
        netloc = f"{quote(user)}:{quote(parts.password)}@{self.host}:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc, path=f"/{self.role}"))

    def map_command(self, command: list[str]) -> list[str]:
        """A service's command with the worker role's name mapped."""
        return [part.replace(WORKER_ROLE, self.worker) for part in command]


@pytest.fixture
def database(server_url: str) -> Iterator[Database]:
    db = load_compose({"NOTIFYQ_API_TOKEN": "x", **PASSWORDS})["services"]["db"]["environment"]
    assert db["POSTGRES_USER"] == db["POSTGRES_DB"] == "notifyq"
    # The pid prefix lets the suite's stale-database sweep drop it after a killed run.
    name = f"nq_test_{os.getpid()}_compose_{secrets.token_hex(3)}"
    parts = urlsplit(server_url)
    admin = psycopg.connect(server_url, autocommit=True)
    try:
        # The postgres image makes POSTGRES_USER a superuser that owns POSTGRES_DB. This
        # server trusts every login, so the password is not checked here; the URL still
        # carries it, as the services' does.
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
                sql.Identifier(name), sql.Literal(db["POSTGRES_PASSWORD"])
            )
        )
        admin.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(name), sql.Identifier(name)
            )
        )
        yield Database(
            name, db["POSTGRES_PASSWORD"], parts.hostname or "127.0.0.1", parts.port or 5432
        )
    finally:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        for role in (f"{name}_worker", name):  # the setup service made the first
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
        admin.close()


# -- the tests ---------------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow  # the image fixture builds and installs a wheel (about 10 s)
def test_the_image_installs_the_package_with_its_sql_files(image: Image, tmp_path: Path) -> None:
    dockerfile = image.dockerfile
    assert dockerfile.user != "root" and dockerfile.workdir == "/app"
    assert dockerfile.expose == ["8000"]
    assert dockerfile.cmd[:2] == ["sh", "-c"]
    # The installed package, not the copied source next to it, answers (run elsewhere, as
    # the `notifyq` command imports it), and it carries every SQL file of the checkout.
    found = subprocess.run(
        [str(image.bin / "python"), "-c", "import notifyq.queries as q; print(q.sql_dir())"],
        cwd=tmp_path,
        env=image.env({"environment": {}}, tmp_path),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    installed = Path(found)
    assert image.bin.parent in installed.parents, installed
    assert sorted(p.name for p in installed.glob("*.sql")) == sorted(
        p.name for p in sql_dir().glob("*.sql")
    )


def _start_api(
    start: Callable[..., Process],
    image: Image,
    api: dict[str, Any],
    env: dict[str, str],
    port: int,
    host: str,
) -> Process:
    """The api service: its command, with the port (and for the running stack the address)
    mapped."""
    command = list(api["command"])
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert command[command.index("--port") + 1] == "8000"
    command[command.index("--host") + 1] = host
    command[command.index("--port") + 1] = str(port)
    return start("api", env=env, argv=command, cwd=image.workdir)


def _run_setup(
    start: Callable[..., Process],
    image: Image,
    setup: dict[str, Any],
    database: Database,
    home: Path,
) -> None:
    """The setup service, run to its end: migrations, and the worker role made and granted."""
    env = image.env(setup, home)
    env["DATABASE_URL"] = database.map_url(env["DATABASE_URL"])
    command = database.map_command(setup["command"])
    process = start("setup", env=env, argv=command, cwd=image.workdir)
    assert process.wait(timeout=120) == 0, process.output()


@pytest.mark.slow  # the image fixture builds and installs a wheel (about 10 s)
def test_the_api_without_a_token_stops_at_once_with_a_one_line_reason(
    image: Image, database: Database, tmp_path: Path
) -> None:
    services = load_compose({"NOTIFYQ_API_TOKEN": "unused", **PASSWORDS})["services"]
    api = services["api"]
    with processes(tmp_path) as start:
        _run_setup(start, image, services["setup"], database, tmp_path)
    env = image.env(api, tmp_path)
    env["DATABASE_URL"] = database.map_url(env["DATABASE_URL"])
    del env["NOTIFYQ_API_TOKEN"]  # as if compose had not stopped first
    with processes(tmp_path) as start:
        # The address stays the CMD's 0.0.0.0; only the port is a free one, so that another
        # server on 8000 cannot make a bind error pass for the refusal.
        api_process = _start_api(start, image, api, env, free_port(), "0.0.0.0")
        assert api_process.wait(timeout=30) != 0
        output = api_process.output()
    reason = [line for line in output.splitlines() if "refusing to serve" in line]
    assert len(reason) == 1 and "NOTIFYQ_API_TOKEN" in reason[0], output
    assert "Traceback" not in output and "Uvicorn running" not in output, output


@pytest.mark.slow  # the image fixture builds and installs a wheel (about 10 s)
def test_the_stack_serves_the_header_example_and_drains_its_workers(
    image: Image, database: Database, tmp_path: Path
) -> None:
    # The header's first step, run as written in a folder of its own: it makes the .env
    # file that compose reads the token from.
    project = tmp_path / "project"
    project.mkdir()
    make_env = header_command(r"^echo .*>> \.env")
    subprocess.run(["sh", "-c", make_env], cwd=project, check=True)
    secrets_made = read_dotenv(project / ".env")
    token = secrets_made["NOTIFYQ_API_TOKEN"]
    for name in ("NOTIFYQ_API_TOKEN", *PASSWORDS):
        assert re.fullmatch(r"[0-9a-f]{64}", secrets_made[name]), name
    services = load_compose(read_dotenv(project / ".env"))["services"]
    api, worker = services["api"], services["worker"]

    if shutil.which("pg_isready"):  # the db service's healthcheck, against the mapped server
        check = services["db"]["healthcheck"]["test"]
        assert check[0] == "CMD-SHELL"
        command = f"{check[1]} -h {database.host} -p {database.port}".replace(
            "-U notifyq -d notifyq", f"-U {database.role} -d {database.role}"
        )
        subprocess.run(["sh", "-c", command], check=True, capture_output=True)

    # Bound to 127.0.0.1 rather than the container's 0.0.0.0: outside a container, 0.0.0.0
    # is every interface of this machine, and compose publishes the port on loopback only
    # anyway. A free port stands for the container's 8000.
    port = free_port()
    with processes(tmp_path) as start:
        _run_setup(start, image, services["setup"], database, tmp_path)
        api_env = image.env(api, tmp_path)
        api_env["DATABASE_URL"] = database.map_url(api_env["DATABASE_URL"])
        api_process = _start_api(start, image, api, api_env, port, "127.0.0.1")
        worker_env = image.env(worker, tmp_path)
        worker_env["DATABASE_URL"] = database.map_url(worker_env["DATABASE_URL"])
        workers = [
            start(
                "worker",
                env=worker_env,
                argv=database.map_command(worker["command"]),
                cwd=image.workdir,
            )
            for _ in range(worker["deploy"]["replicas"])
        ]
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        with httpx.Client(base_url=base, timeout=5) as client:
            while True:
                assert api_process.popen.poll() is None, api_process.output()
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, api_process.output()
                time.sleep(0.05)
            for process in workers:
                process.wait_for_output("ready", timeout=30)
            # The API and the workers connect as the worker role, which is no superuser.
            owner_url = database.map_url(services["setup"]["environment"]["DATABASE_URL"])
            with psycopg.connect(owner_url) as owner:
                users = owner.execute(
                    "SELECT DISTINCT usename FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name LIKE 'notifyq-%%'"
                ).fetchall()
                superuser = owner.execute(
                    "SELECT rolsuper FROM pg_roles WHERE rolname = %s", [database.worker]
                ).fetchone()
            assert users == [(database.worker,)], users
            assert superuser == (False,)

            # The api's healthcheck, run as written (inside the container) with the port mapped.
            api_check = api["healthcheck"]["test"]
            assert api_check[0] == "CMD"
            argv = [arg.replace(":8000/", f":{port}/") for arg in api_check[1:]]
            argv[0] = str(image.bin / argv[0])  # the image's python
            healthy = subprocess.run(
                argv,
                env=image.env(api, tmp_path),
                timeout=seconds(api["healthcheck"]["timeout"]),
                capture_output=True,
                text=True,
            )
            assert healthy.returncode == 0, healthy.stderr

            # The header's curl example, run as written with the port mapped.
            curl = header_command(r"curl .*")
            curl = curl.replace("localhost:8000", f"localhost:{port}")
            posted = subprocess.run(
                ["sh", "-c", curl + " --fail-with-body -sS"],
                env={**os.environ, "NOTIFYQ_API_TOKEN": token},
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert posted.returncode == 0, posted.stdout + posted.stderr
            job_id = json.loads(posted.stdout)["job_id"]
            auth = {"Authorization": f"Bearer {token}"}
            deadline = time.monotonic() + 20
            while (job := client.get(f"/jobs/{job_id}", headers=auth).json())[
                "status"
            ] != "completed":
                assert job["status"] in ("queued", "processing"), job
                assert time.monotonic() < deadline, job
                time.sleep(0.05)
            assert job["task"] == "hello_world"

            # Without the token the API refuses, and /health stays open.
            refused = client.post("/jobs", json={"task": "hello_world", "payload": {}})
            assert refused.status_code == 401, refused.text
            assert client.get("/jobs", params={"limit": 1}).status_code == 401

            # `docker compose stop`: SIGTERM to each worker while one runs a job; it finishes
            # the job and exits 0 within the stop grace period, before any SIGKILL.
            slow = client.post(
                "/jobs", headers=auth, json={"task": "sleep", "payload": {"seconds": 1}}
            ).json()["job_id"]
            deadline = time.monotonic() + 20
            while client.get(f"/jobs/{slow}", headers=auth).json()["status"] != "processing":
                assert time.monotonic() < deadline
                time.sleep(0.02)
            began = time.monotonic()
            for process in workers:
                process.signal(signal.SIGTERM)
            grace = seconds(worker["stop_grace_period"])
            for process in workers:
                left = grace - (time.monotonic() - began)
                assert process.wait(timeout=left) == 0, process.output()
            assert client.get(f"/jobs/{slow}", headers=auth).json()["status"] == "completed"
            api_process.signal(signal.SIGTERM)
            assert api_process.wait(timeout=grace) == 0, api_process.output()
