"""The ``multihost`` bench scenario: its arithmetic (throughput buckets, recovery time, the
judgement of every job's runs), and a small run of the real thing (two network namespaces, a
bench-owned PostgreSQL over TCP, a few hundred jobs, one partition) that must leave nothing
behind. The run needs root and ``ip netns``, and is skipped, saying so, without them.

The bench is a distribution of its own (benchmarks/) that CI does not install: it is imported
from this checkout.

The tests of this that need no database are in tests/unit/test_bench_multihost.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import ROOT

if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

from notifyq_bench import lanrelay, netns
from notifyq_bench.harness import Children, Progress
from notifyq_bench.report import Results
from notifyq_bench.scenarios import Context, Sizes
from notifyq_bench.scenarios.multihost import (
    Plan,
    run_plan,
)

# -- the delay relay (loopback: no namespaces needed) ---------------------------------------------


def _ours() -> tuple[list[str], str]:
    """This process's namespaces, and its bridges' listing."""
    pid = os.getpid()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    mine = [line for line in names.splitlines() if line.startswith(f"{netns.NS_PREFIX}{pid}-")]
    bridges = subprocess.run(
        ["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True
    ).stdout
    return mine, bridges


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_small_multihost_run_measures_the_partition_and_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    why = netns.unavailable()
    if why is not None:
        pytest.skip(f"the multihost scenario cannot run here: {why}")
    # A temporary folder of this run's own, so another test's bench server (on another xdist
    # process) is not counted as ours. The server's unprivileged account must pass through it,
    # which pytest's 0700 tmp_path does not allow.
    own_tmp = Path(tempfile.mkdtemp(prefix="notifyq-multihost-"))
    own_tmp.chmod(0o711)
    request.addfinalizer(lambda: shutil.rmtree(own_tmp, ignore_errors=True))
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))
    children = Children(tmp_path)
    results = Results()
    ctx = Context(
        url="",  # unused: the scenario makes a server and scratch database of its own
        scratch_url=lambda suffix: "",
        repeat=1,
        sizes=Sizes.of(True),
        children=children,
        progress=Progress(1, enabled=False),
        results=results,
        workdir=tmp_path,
    )
    try:
        run_plan(
            ctx, Plan(hosts=(1, 2), drain_jobs=300, pickup_jobs=20, partition_hosts=2, lease=3.0)
        )
    finally:
        children.stop_all()

    figures = {f.key: f for f in results.figures}
    for key in (
        "multihost.rtt.p50",
        "multihost.rtt.p99",
        "multihost.rtt.straight.p50",
        "multihost.rtt.added",
        "multihost.h1.throughput",
        "multihost.h2.throughput",
        "multihost.h2.pickup.p99",
        "multihost.scaling",
        "multihost.partition.recovery",
        "multihost.partition.cluster_recovery",
        "multihost.partition.after",
        "multihost.partition.dip",
    ):
        assert key in figures, key
    assert figures["multihost.h2.throughput"].median > 0
    # notifyq's guarantee: an accepted job is never lost. Whether any job ran twice is the
    # bench's verdict on the product (a figure with a target), not this test's.
    assert figures["multihost.partition.lost"].values == [0]
    part = results.raw["multihost"]["partition"]
    assert part["run_twice_by_live_worker"] <= part["jobs_run_again"]
    assert part["extra_runs"] == part["runs"] - part["jobs_run"]
    assert figures["multihost.partition.live_double"].values == [part["run_twice_by_live_worker"]]
    assert part["inserted"] > 0
    assert part["statuses"] == {"completed": part["inserted"]}
    assert part["runs"] >= part["inserted"]
    assert part["completed_without_a_recorded_run"] == 0
    # The links got their 0.2 ms (netem or the relay, 0.1 ms each way), measured and reported.
    # Without netem and a C compiler the links stay bare, and a note says so.
    raw = results.raw["multihost"]
    assert figures["multihost.rtt.straight.p50"].median > 0
    if raw["lan_delay_by"] == "none":
        assert lanrelay.unavailable() is not None, raw["lan_delay"]
        assert any("no delay added" in note for note in results.notes)
    else:
        assert raw["lan_delay_by"] in ("netem", "relay")
        assert figures["multihost.rtt.p50"].median >= 0.2
        assert figures["multihost.rtt.added"].median >= 0.1
        assert any("round trip added to the links" in note for note in results.notes)

    mine, bridges = _ours()
    assert mine == []
    assert f"nqb{os.getpid()}" not in bridges
    assert sorted(p.name for p in own_tmp.iterdir()) == []
