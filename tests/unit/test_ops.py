"""What operators take from notifyq/ops/: Prometheus alert rules (checked by promtool), a
Grafana dashboard whose every query names metrics notifyq exposes, Kubernetes manifests whose
timings agree with notifyq's settings; and the worker's metrics endpoint, which follows the
API's rule: beyond loopback only with a token.

The tests here need no database; those that do are in tests/test_ops.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from notifyq.errors import ConfigurationError
from notifyq.metrics import Metrics
from notifyq.metrics_server import serve_metrics
from notifyq.settings import Settings
from tests.helpers import ROOT

OPS = ROOT / "notifyq" / "ops"


PROMTOOL = shutil.which("promtool")


needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="no promtool (apt-get install prometheus) to check"
)


def exposed_names() -> set[str]:
    """Every series name notifyq's metrics can have (histograms with their suffixes)."""
    names = set()
    for line in Metrics().render().decode().splitlines():
        match = re.match(r"# TYPE (\S+) (\S+)", line)
        if match:
            name, kind = match.groups()
            suffixes = {
                "counter": ["_total"],
                "histogram": ["_bucket", "_sum", "_count"],
            }.get(kind, [""])
            names |= {name + suffix for suffix in suffixes} | {name}
    return names


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bnotifyq_[a-z_]+", expr))


@needs_promtool
def test_the_alert_rules_pass_promtool_and_fire_when_they_should(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    rules = OPS / "prometheus-alerts.yml"
    checked = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True)
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
    # promtool's unit tests: a queue whose oldest job waits 10 minutes, one where 1 job in 10
    # fails, and no worker up.
    (tmp_path / "tests.yml").write_text(
        textwrap.dedent(
            f"""\
            rule_files: [{rules}]
            evaluation_interval: 1m
            tests:
              - interval: 1m
                input_series:
                  - series: 'notifyq_queue_oldest_due_seconds{{queue="mail"}}'
                    values: '600+60x15'
                  - series: 'notifyq_queue_oldest_due_seconds{{queue="fast"}}'
                    values: '1x15'
                  - series: 'notifyq_jobs_failed_total{{queue="mail",task="send"}}'
                    values: '0+1x40'
                  - series: 'notifyq_jobs_completed_total{{queue="mail",task="send"}}'
                    values: '0+9x40'
                  - series: 'up{{job="notifyq-worker",instance="w1"}}'
                    values: '0x15'
                alert_rule_test:
                  - eval_time: 10m
                    alertname: NotifyqQueueBacklogOld
                    exp_alerts:
                      - exp_labels: {{severity: warning, queue: mail}}
                        exp_annotations:
                          summary: "notifyq queue mail: the oldest due job has waited 20m 0s"
                          description: >-
                            Jobs of queue mail are due but not started. Check that workers
                            serve this queue and are up (notifyq stats, notifyq tasks), and that
                            it is not paused or rate-limited (notifyq queue mail).
                  - eval_time: 10m
                    alertname: NotifyqNoWorker
                    exp_alerts:
                      - exp_labels: {{severity: critical}}
                        exp_annotations:
                          summary: "notifyq: no worker is up"
                          description: >-
                            No notifyq-worker target answers its scrape. Jobs are accepted but
                            none run until a worker starts.
                  - eval_time: 40m
                    alertname: NotifyqFailureRateHigh
                    exp_alerts:
                      - exp_labels: {{severity: warning, queue: mail}}
                        exp_annotations:
                          summary: "notifyq queue mail: 10% of jobs fail"
                          description: >-
                            Look at the failed jobs of queue mail (notifyq jobs --status failed
                            --queue mail): their last_error says why.
            """
        )
    )
    tested = subprocess.run(
        [PROMTOOL, "test", "rules", str(tmp_path / "tests.yml")], capture_output=True
    )
    assert tested.returncode == 0, tested.stdout.decode() + tested.stderr.decode()


def test_every_rule_and_panel_names_metrics_that_notifyq_exposes() -> None:
    known = exposed_names()
    rules = yaml.safe_load((OPS / "prometheus-alerts.yml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.loads((OPS / "grafana-dashboard.json").read_text())
    exprs += [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(exprs) > 10
    for expr in exprs:
        assert metric_names(expr) or expr.startswith("absent(up{"), expr
        assert metric_names(expr) <= known, (expr, metric_names(expr) - known)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def manifests(name: str) -> dict[tuple[str, str], Any]:
    return {
        (doc["kind"], doc["metadata"]["name"]): doc
        for doc in yaml.safe_load_all((OPS / name).read_text())
    }


def container_env(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["containers"]
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def test_the_kubernetes_pods_have_time_to_drain_and_take_the_token() -> None:
    docs = manifests("kubernetes.yml")
    for name in ("notifyq-api", "notifyq-worker"):
        pod = docs["Deployment", name]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = container_env(pod)
        assert "NOTIFYQ_API_TOKEN" in env and "DATABASE_URL" in env, name
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {})
        sleep = float(pre_stop["command"][1]) if pre_stop else 0.0
        grace = float(
            env.get("NOTIFYQ_SHUTDOWN_GRACE", Settings.model_fields["shutdown_grace"].default)
        )
        # The API's server drains for the grace + 5 s (notifyq serve); then 5 s of margin.
        drain = grace + 5 if name == "notifyq-api" else grace
        assert pod["terminationGracePeriodSeconds"] >= sleep + drain + 5, name
    api = docs["Deployment", "notifyq-api"]["spec"]["template"]["spec"]["containers"][0]
    assert api["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert api["livenessProbe"]["httpGet"]["path"] == "/health"
    worker = docs["Deployment", "notifyq-worker"]["spec"]["template"]["spec"]
    assert "--metrics-port" in worker["containers"][0]["command"]
    scaled = manifests("keda-scaledobject.yml")["ScaledObject", "notifyq-worker"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == "notifyq-worker"
    concurrency = container_env(worker)["NOTIFYQ_CONCURRENCY"]
    assert scaled["spec"]["triggers"][0]["metadata"]["targetQueryValue"] == concurrency


def test_the_worker_metrics_port_takes_the_token() -> None:
    settings = Settings.load(database_url="postgresql://x@127.0.0.1/x", api_token="s3cret")
    server = serve_metrics(Metrics(), settings, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
        answer = httpx.get(url, headers={"Authorization": "Bearer s3cret"})
        assert answer.status_code == 200 and "notifyq_jobs_completed_total" in answer.text
    finally:
        server.close()


def test_the_worker_metrics_port_refuses_other_addresses_without_a_token() -> None:
    settings = Settings.load(database_url="postgresql://x@127.0.0.1/x")
    with pytest.raises(ConfigurationError, match="NOTIFYQ_API_TOKEN"):
        serve_metrics(Metrics(), settings, "0.0.0.0", 0)
    opted_out = settings.model_copy(update={"allow_unauthenticated": True})
    serve_metrics(Metrics(), opted_out, "127.0.0.1", 0).close()
