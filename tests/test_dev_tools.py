"""The dev extra installs checkers that give the same answer on a new machine as on ours.

A fresh `pip install -e ".[dev]"` takes the newest release that the bounds allow; a new major of
mypy (2.x) once reported new errors, so CI turned red on a new machine with no change of ours.

The tests of this that need no database are in tests/unit/test_dev_tools.py.
"""

from __future__ import annotations

import subprocess
import sys

from tests.unit.test_dev_tools import ROOT


def test_the_bench_peers_type_check_without_the_peers_installed() -> None:
    # The dev extra does not install PgQueuer or procrastinate: their decorators are then Any,
    # and the check of the peers' modules must still pass (as it does with them installed).
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "-p", "notifyq_bench.peers"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
