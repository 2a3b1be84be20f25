"""What operators take from notifyq/ops/: Prometheus alert rules (checked and unit-tested by
Prometheus's own promtool), a Grafana dashboard whose every query names metrics notifyq exposes,
Kubernetes and KEDA manifests whose timings agree with notifyq's settings; and the worker's
metrics endpoint, which follows the API's rule: beyond loopback only with a token.

The tests of this that need no database are in tests/unit/test_ops.py.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import Any

from tests.helpers import ROOT, notifyq_env
from tests.unit.test_ops import manifests


async def test_the_keda_query_counts_due_and_running_jobs(conn: Any) -> None:
    scaled = manifests("keda-scaledobject.yml")["ScaledObject", "notifyq-worker"]
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    await conn.execute(
        "INSERT INTO notifyq.jobs (task, run_at) VALUES ('echo', now()), ('echo', now()), "
        "('echo', now() + interval '1 hour')"
    )
    await conn.execute(
        "INSERT INTO notifyq.jobs (task, group_key) VALUES ('echo', 'g'), ('echo', 'g')"
    )
    assert await (await conn.execute(query)).fetchone() == (3,)


def test_notifyq_worker_says_why_it_will_not_serve_metrics(db_url: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "notifyq",
            "worker",
            "--metrics-port",
            str(port),
            "--host",
            "0.0.0.0",
        ],
        env=notifyq_env(db_url),
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode != 0
    assert "refusing to serve metrics on 0.0.0.0 without a token" in done.stderr.decode()
    assert "Traceback" not in done.stderr.decode()
