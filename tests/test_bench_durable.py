"""The bench's ``durable`` scenario runs end to end in its quick size, with the kill -9 trials
given by ``--kill-trials``: its four figures (signal wake-up, the slots suspended jobs hold, the
throughput beside them, completed steps run twice) are in the JSON and printed, and no scratch
database is left. Speed is not asserted here; the two counts that are correctness are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from notifyq.settings import DEFAULT_LOCAL_URL
from tests.unit.test_bench import _bench_env


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_durable_scenario_prints_its_three_targets(tmp_path: Path) -> None:
    url = os.environ.get("DATABASE_URL") or DEFAULT_LOCAL_URL
    out = tmp_path / "out.json"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "notifyq", "bench", "--quick", "--scenario", "durable"),
            *("--kill-trials", "2", "--json", str(out)),
        ],
        cwd=tmp_path,
        env=_bench_env(DATABASE_URL=url),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for label in ("signal committed → job running again", "suspended jobs: slots", "kill -9"):
        assert label in done.stdout, done.stdout
    results = json.loads(out.read_text())
    assert results["meta"]["failed"] == []
    figures = {f["key"]: f for f in results["figures"]}
    assert figures["durable.signal_wake.p99"]["median"] > 0
    assert figures["durable.throughput_ratio"]["median"] > 0
    assert figures["durable.slots_held"]["values"] == [0.0]
    assert figures["durable.kill_repeats"]["values"] == [0.0]
    kills = results["scenarios"]["durable"]["kills"]
    assert kills["trials"] == 2 and kills["steps_recorded"] == 3 * kills["jobs"]
    scratch = results["meta"]["scratch_databases"]
    with psycopg.connect(url, autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)", [scratch]
        ).fetchall()
    assert left == []
