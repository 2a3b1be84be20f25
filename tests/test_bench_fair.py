"""The bench's ``fair`` scenario runs end to end in its quick size: its four figures (pickup
beside a flood, key_concurrency across four worker processes, the share under weights 4:1, the
throughput with keys against without) are in the JSON and printed, and no scratch database is
left. Speed is not asserted here; what is correctness is: no key ran more than key_concurrency
jobs at once, every key's jobs ran beside the flood, and the shares follow the weights."""

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
def test_quick_fair_scenario_prints_its_four_targets(tmp_path: Path) -> None:
    url = os.environ.get("DATABASE_URL") or DEFAULT_LOCAL_URL
    out = tmp_path / "out.json"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "notifyq", "bench", "--quick", "--scenario", "fair"),
            *("--json", str(out)),
        ],
        cwd=tmp_path,
        env=_bench_env(DATABASE_URL=url),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for label in ("beside 10,000 of key A", "key_concurrency=2", "weights 4:1", "a fair_key on"):
        assert label in done.stdout, done.stdout
    results = json.loads(out.read_text())
    assert results["meta"]["failed"] == []
    figures = {f["key"]: f for f in results["figures"]}
    assert figures["fair.pickup_beside_flood.p99"]["median"] > 0
    assert figures["fair.key_concurrency.peak"]["values"] == [2.0]
    # The share is a measure of the claim's arithmetic more than of the machine: it holds
    # within a wider band than the target's even on a busy machine.
    assert figures["fair.weighted_share"]["values"][0] <= 8.0
    assert figures["fair.throughput_ratio"]["median"] > 0
    raw = results["scenarios"]["fair"]
    (capped,) = raw["capped"]
    assert capped["moments_over_limit"] == 0 and capped["finished_without_their_key"] == 0
    (beside,) = raw["beside_flood"]
    assert beside["jobs"] == 90 and beside["flood_left"] > 0
    scratch = results["meta"]["scratch_databases"]
    with psycopg.connect(url, autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)", [scratch]
        ).fetchall()
    assert left == []
