"""Tasks that worker processes started by the tests import with ``--import tests.sample_tasks``."""

from __future__ import annotations

import os
import time
from typing import Any

from notifyq import task


@task
def record(payload: dict[str, Any]) -> int:
    """Appends payload["n"] to the file named by NQ_RUNS_FILE: one line per run, so that a test
    can count how often each job ran, across processes."""
    with open(os.environ["NQ_RUNS_FILE"], "a", encoding="utf-8") as runs:
        runs.write(f"{payload['n']}\n")
    return int(payload["n"])


@task("nap", max_attempts=5)
def nap(payload: dict[str, Any]) -> str:
    """Blocks a worker thread for payload["seconds"]."""
    time.sleep(float(payload.get("seconds", 1)))
    return "rested"
