"""The bench's command line without a run: an unknown scenario refused, the line that installs
the bench when it is missing, and peers that are not installed skipped with theirs.

The tests here need no database; those that do are in tests/test_bench.py.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from types import ModuleType

import pytest

from tests.helpers import ROOT

BENCH_ROOT = ROOT / "benchmarks"


def _bench_env(**extra: str) -> dict[str, str]:
    """The environment of a process that runs ``notifyq bench`` from this checkout, with the
    bench importable whether it is installed or not, and its entry point (the one notifyq
    finds it by) declared by tests/bench_entry_point."""
    env = {**os.environ, **extra}
    declared = ROOT / "tests" / "bench_entry_point"
    path = (str(BENCH_ROOT), str(declared), str(ROOT), env.get("PYTHONPATH", ""))
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    return env


def _bench_module(name: str) -> ModuleType:
    """The bench's module ``name``, imported from this checkout."""
    if str(BENCH_ROOT) not in sys.path:
        sys.path.insert(0, str(BENCH_ROOT))
    return importlib.import_module(name)


def test_bench_refuses_an_unknown_scenario() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "notifyq", "bench", "--scenario", "nope"],
        cwd=ROOT,
        env=_bench_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "unknown scenario" in done.stderr


def test_notifyq_bench_says_how_to_install_the_bench_when_it_is_missing() -> None:
    # As if notifyq-bench were not installed, also where it is. Asked to run (not for help,
    # which always works: tests/test_cli.py), it says what to install.
    script = (
        "import sys; import notifyq.cli._main as m; m.entry_points = lambda **_: (); "
        "sys.exit(m.main(['bench', '--quick']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=_bench_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "notifyq bench: needs notifyq-bench; from a source checkout: pip install -e ./benchmarks"
    ]


def test_peers_that_are_not_installed_are_skipped_with_the_line_that_installs_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner = _bench_module("notifyq_bench.runner")
    monkeypatch.setitem(sys.modules, "pgqueuer", None)
    monkeypatch.setitem(sys.modules, "procrastinate", None)
    peers, note = runner.peer_systems(True, ["latency", "throughput"])
    assert peers == []
    assert note == (
        "peers not installed, skipped: pgqueuer, procrastinate; "
        'install them with pip install -e "./benchmarks[peers]"'
    )
    assert runner.peer_systems(False, ["throughput"]) == ([], None)
