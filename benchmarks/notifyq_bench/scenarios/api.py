"""``api``: requests/s and paced p99 latency of ``POST /jobs`` on ``notifyq serve`` against a
bare FastAPI endpoint doing one INSERT."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from notifyq_bench.harness import BenchError, child_env, postgres_cpu
from notifyq_bench.report import RATIO, Figure, Target
from notifyq_bench.scenarios.context import BARE_JOBS, NOTIFYQ_JOBS, Context, Scenario
from notifyq_bench.scenarios.measure import settle, truncate
from notifyq_bench.tasks import NOOP

API_RATE = 300.0
API_BODY = json.dumps({"task": NOOP, "payload": {"n": 1}})


def _wrk(port: int, seconds: float, connections: int, workdir: Path) -> dict[str, Any]:
    script = workdir / "post.lua"
    body = API_BODY.replace("\\", "\\\\").replace('"', '\\"')
    script.write_text(
        'wrk.method = "POST"\n'
        f'wrk.body = "{body}"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    url = f"http://127.0.0.1:{port}/jobs"
    wrk = shutil.which("wrk") or "wrk"
    # A short unmeasured run first, so pools are full and code paths warm.
    warm = subprocess.run(
        [wrk, "-t1", f"-c{connections}", "-d1s", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    warm_total = re.search(r"(\d+) requests in", warm)
    out = subprocess.run(
        [
            wrk,
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 30,
    ).stdout
    total = re.search(r"(\d+) requests in ([\d.]+)(\w+)", out)
    if total is None:
        raise BenchError("could not read wrk's output:\n" + out)
    scale = {"s": 1.0, "ms": 0.001, "m": 60.0}.get(total.group(3), 1.0)
    elapsed = float(total.group(2)) * scale
    requests = int(total.group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    not_ok = int(bad.group(1)) if bad else 0
    socket_errors = sum(int(g) for g in errors.groups()) if errors else 0
    return {
        "tool": "wrk",
        "requests": requests,
        "ok": requests - not_ok,
        "not_ok": not_ok,
        "socket_errors": socket_errors,
        "seconds": elapsed,
        "rate": (requests - not_ok) / elapsed,
        "all_requests": requests + (int(warm_total.group(1)) if warm_total else 0),
    }


def _loadgen(workdir: Path, port: int, seconds: float, mode: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "notifyq_bench.loadgen",
            "http",
            "--port",
            str(port),
            "--body",
            API_BODY,
            "--seconds",
            str(seconds),
            *mode,
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=workdir,
        timeout=seconds + 60,
    )
    if out.returncode != 0:
        raise BenchError("the load generator failed:\n" + out.stderr[-2000:])
    result: dict[str, Any] = json.loads(out.stdout)
    result["tool"] = "notifyq_bench.loadgen"
    return result


def max_rate(ctx: Context, port: int) -> dict[str, Any]:
    s = ctx.sizes
    if shutil.which("wrk"):
        return _wrk(port, s.api_seconds, s.api_connections, ctx.workdir)
    return _loadgen(
        ctx.workdir, port, s.api_seconds, ["--connections", str(s.api_connections), "--warmup", "1"]
    )


def _server_cpu(run: dict[str, Any], cpu: float, pg_before: float | None) -> None:
    """Adds the CPU per request of the server process and of the database's processes
    (warm-up requests counted in both)."""
    pg_after = postgres_cpu()
    everything = run.get("all_requests") or run.get("requests") or 0
    run["server_cpu_us_per_request"] = cpu / everything * 1e6 if everything else None
    run["postgres_cpu_us_per_request"] = (
        (pg_after - pg_before) / everything * 1e6
        if everything and pg_after is not None and pg_before is not None
        else None
    )


def run(ctx: Context) -> None:
    """Requests/s of POST /jobs on one uvicorn process, against the bare endpoint; p99 latency
    of both at a paced 300 requests/s."""
    ctx.step("starting notifyq serve --no-worker and the bare FastAPI app")
    notifyq_port = ctx.notifyq_api()
    bare_port = ctx.bare_api()
    raw: dict[str, Any] = {
        "tool": "wrk" if shutil.which("wrk") else "notifyq_bench.loadgen",
        "connections": ctx.sizes.api_connections,
        "max": {"notifyq": [], "bare": []},
        "paced": {"notifyq": [], "bare": []},
    }
    targets = (("bare", bare_port, BARE_JOBS), ("notifyq", notifyq_port, NOTIFYQ_JOBS))
    for r in range(ctx.repeat):
        for who, port, table in targets:
            ctx.step(f"{who}: POST /jobs at the maximum rate, repeat {r + 1}")
            with ctx.connect() as conn:
                truncate(conn, table)
                settle(conn)
            before, pg_before = ctx.servers[who].cpu() or 0.0, postgres_cpu()
            run = max_rate(ctx, port)
            _server_cpu(run, (ctx.servers[who].cpu() or 0.0) - before, pg_before)
            if run["ok"] == 0 or run["ok"] < 0.99 * run["requests"]:
                raise BenchError(f"{who}: only {run['ok']} of {run['requests']} requests succeeded")
            raw["max"][who].append(run)
            ctx.done()
        for who, port, table in targets:
            ctx.step(f"{who}: POST /jobs paced at {API_RATE:g}/s, repeat {r + 1}")
            with ctx.connect() as conn:
                truncate(conn, table)
            before, pg_before = ctx.servers[who].cpu() or 0.0, postgres_cpu()
            run = _loadgen(ctx.workdir, port, ctx.sizes.api_seconds, ["--rate", str(API_RATE)])
            _server_cpu(run, (ctx.servers[who].cpu() or 0.0) - before, pg_before)
            if run["ok"] < run["requests"]:
                raise BenchError(f"{who}: {run['requests'] - run['ok']} paced requests failed")
            raw["paced"][who].append(run)
            ctx.done()
    ctx.results.raw["api"] = raw
    bare = [run["rate"] for run in raw["max"]["bare"]]
    ours = [run["rate"] for run in raw["max"]["notifyq"]]
    add = ctx.results.add
    add(Figure("api.bare", "api", "POST /jobs, bare FastAPI + one INSERT (floor)", "req/s", bare))
    add(
        Figure(
            "api.notifyq",
            "api",
            "POST /jobs, one uvicorn process",
            "req/s",
            ours,
            None,
            bare,
            "bare FastAPI endpoint",
        )
    )
    add(
        Figure(
            "api.notifyq_cpu",
            "api",
            "  server CPU per POST /jobs",
            "us",
            [run["server_cpu_us_per_request"] for run in raw["max"]["notifyq"]],
            None,
            [run["server_cpu_us_per_request"] for run in raw["max"]["bare"]],
            "bare FastAPI endpoint",
        )
    )
    add(
        Figure(
            "api.notifyq_vs_bare",
            "api",
            "POST /jobs / bare endpoint",
            RATIO,
            [a / b for a, b in zip(ours, bare, strict=True)],
            Target(">=", 0.75),
        )
    )
    add(
        Figure(
            "api.paced_p99",
            "api",
            f"POST /jobs p99 latency at {API_RATE:g} req/s",
            "ms",
            [run["p99_ms"] for run in raw["paced"]["notifyq"]],
            Target("<=", 10.0),
            [run["p99_ms"] for run in raw["paced"]["bare"]],
            "bare FastAPI endpoint",
        )
    )


SCENARIO = Scenario("api", run, lambda repeat, s: 4 * repeat)
