"""The benchmark harness runs end to end: a quick run of two scenarios exits 0, writes its JSON
and leaves no scratch database or process behind. Speed is not asserted here.

The bench is a distribution of its own (benchmarks/, notifyq-bench) that CI does not install:
these tests run it from this checkout, with benchmarks/ on the path.

The tests of this that need no database are in tests/unit/test_bench.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from notifyq.settings import DEFAULT_LOCAL_URL
from tests.unit.test_bench import _bench_env, _bench_module


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_bench_writes_json_and_cleans_up(tmp_path: Path) -> None:
    url = os.environ.get("DATABASE_URL") or DEFAULT_LOCAL_URL
    out = tmp_path / "out.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "notifyq",
            "bench",
            "--quick",
            "--scenario",
            "latency,throughput",
            "--json",
            str(out),
        ],
        cwd=tmp_path,
        env=_bench_env(DATABASE_URL=url),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pickup latency" in done.stdout  # the table

    results = json.loads(out.read_text())
    assert {"meta", "figures", "scenarios", "notes", "table_markdown"} <= set(results)
    assert results["meta"]["scenarios"] == ["latency", "throughput"]
    assert results["meta"]["failed"] == []
    assert {"latency", "throughput"} <= set(results["scenarios"])
    figures = {f["key"]: f for f in results["figures"]}
    for key in (
        "latency.idle.p50",
        "latency.idle.p99",
        "latency.burst.p99",
        "throughput.bare",
        "throughput.one",
        "throughput.one_vs_bare",
        "throughput.two",
        "throughput.two_vs_one",
        "throughput.two_vs_bare_two",
        "throughput.bare_two",
        "throughput.bare_single",
        "throughput.single",
    ):
        figure = figures[key]
        assert {"values", "median", "min", "max", "target", "met", "unit", "label"} <= set(figure)
        assert len(figure["values"]) == 1  # --quick runs each figure once
        assert figure["median"] is not None and figure["median"] > 0
    assert figures["latency.idle.p50"]["floor_median"] is not None  # the floor ran too
    # Each shape's ratio is against the strict floor in the same shape, in the same run.
    assert figures["throughput.two"]["floor"] == figures["throughput.bare_two"]["values"]
    assert figures["throughput.single"]["floor"] == figures["throughput.bare_single"]["values"]
    assert figures["throughput.one"]["floor"] == figures["throughput.bare"]["values"]

    scratch = results["meta"]["scratch_databases"]
    assert scratch and all(name.startswith("notifyq_bench_") for name in scratch)
    with psycopg.connect(url, autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)", [scratch]
        ).fetchall()
        backends = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = ANY(%s)", [scratch]
        ).fetchone()
    assert left == []
    assert backends == (0,)
    assert _processes_mentioning(scratch) == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_bulk_insert_scenario_compares_with_a_plain_table_and_drops_it(
    tmp_path: Path,
) -> None:
    url = os.environ.get("DATABASE_URL") or DEFAULT_LOCAL_URL
    out = tmp_path / "out.json"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "notifyq", "bench", "--quick", "--quiet"),
            *("--scenario", "bulk-insert", "--json", str(out)),
        ],
        cwd=tmp_path,
        env=_bench_env(DATABASE_URL=url),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())
    figures = {f["key"]: f for f in results["figures"]}
    raw = results["scenarios"]["bulk_insert"]
    assert raw["rows"] == 10_000
    assert len(raw["notifyq"]) == len(raw["plain"]) == 1
    assert figures["bulk_insert.notifyq"]["floor"] == [raw["plain"][0]["jobs_per_s"]]
    ratio = figures["bulk_insert.vs_plain"]
    assert ratio["target"] is not None
    assert ratio["values"] == [raw["notifyq"][0]["jobs_per_s"] / raw["plain"][0]["jobs_per_s"]]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_history_scenario_fills_a_history_the_schema_accepts(tmp_path: Path) -> None:
    # The history is inserted with notifyq's defaults trigger off, so every NOT NULL column
    # without a default must be named by the bench itself.
    url = os.environ.get("DATABASE_URL") or DEFAULT_LOCAL_URL
    out = tmp_path / "out.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "notifyq",
            "bench",
            "--quick",
            "--quiet",
            "--scenario",
            "history",
            "--json",
            str(out),
        ],
        cwd=tmp_path,
        env=_bench_env(DATABASE_URL=url),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())
    assert results["meta"]["failed"] == []
    figures = {f["key"]: f for f in results["figures"]}
    assert figures["history.full"]["median"] > 0
    assert figures["history.ratio"]["median"] > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_workflow_scenario_reports_every_workflow_figure(tmp_path: Path) -> None:
    # Whether the targets are met depends on the machine; that every figure is there, measured
    # and plausible does not.
    url = os.environ.get("DATABASE_URL") or DEFAULT_LOCAL_URL
    out = tmp_path / "out.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "notifyq",
            "bench",
            "--quick",
            "--quiet",
            "--scenario",
            "workflow",
            "--json",
            str(out),
        ],
        cwd=tmp_path,
        env=_bench_env(DATABASE_URL=url),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "dependent job's handler start" in done.stdout  # the table
    results = json.loads(out.read_text())
    assert results["meta"]["failed"] == []
    figures = {f["key"]: f for f in results["figures"] if f["scenario"] == "workflow"}
    targets = {
        "workflow.idle.p50": ("<=", 3.0),
        "workflow.idle.p99": ("<=", 10.0),
        "workflow.chain": ("<=", 0.5),
        "workflow.grouped_vs_ungrouped": (">=", 0.7),
        "workflow.wait.p50": ("<=", 5.0),
    }
    info = {"workflow.busy.p50", "workflow.busy.p99", "workflow.grouped", "workflow.wait.p99"}
    assert set(figures) == set(targets) | info
    for key, figure in figures.items():
        assert len(figure["values"]) == 1  # --quick runs each figure once
        assert figure["met"] in ((True, False) if key in targets else (None,))
        if key in targets:
            op, value = targets[key]
            assert (figure["target"]["op"], figure["target"]["value"]) == (op, value)
    for key in ("workflow.idle.p50", "workflow.busy.p50", "workflow.wait.p50"):
        # Both ends are stamps of this host's clock: a child starts after its parent ended, a
        # wait returns after its job ended, and neither takes seconds.
        point = key.replace(".p50", ".p99")
        assert 0 < figures[key]["median"] <= figures[point]["median"] < 1000
    assert 0 < figures["workflow.chain"]["median"] < 30
    assert figures["workflow.grouped"]["median"] > 0
    assert figures["workflow.grouped"]["floor_median"] > 0  # the ungrouped drain
    assert 0 < figures["workflow.grouped_vs_ungrouped"]["median"] < 5

    raw = results["scenarios"]["workflow"]
    assert abs(raw["clock"]["offset_ms"]) < 5
    assert raw["grouped"][0]["jobs"] == raw["group_keys"] * 2
    assert raw["busy"][0]["backlog_left"] > 0  # the worker stayed busy throughout


def _processes_mentioning(names: list[str]) -> list[int]:
    """Pids of processes whose command line or environment names one of ``names`` (every
    process the bench starts has its scratch database in one or the other)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        for part in ("cmdline", "environ"):
            try:
                text = (proc / part).read_bytes().decode(errors="replace")
            except OSError:
                continue
            if any(name in text for name in names):
                found.append(int(proc.name))
                break
    return found


async def test_the_floor_table_has_the_columns_indexes_and_checks_of_notifyq_jobs(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    # The bare loop is a floor only while its table costs what notifyq.jobs costs to write: a
    # change of schema in sql/ that bench.jobs does not follow fails here. Column defaults are
    # left out (notifyq's defaults trigger fills queue and priority; the floor has none), and
    # so are the triggers (the floor's notify trigger is its own, bare one).
    bare = _bench_module("notifyq_bench.bare")
    await conn.execute(bare.SCHEMA.encode())
    for table in ("jobs", "jobs_done"):
        real = await _table_shape(conn, "notifyq", table)
        assert real["columns"] and real["indexes"] and real["checks"] and real["options"]
        assert await _table_shape(conn, "bench", table) == real, table


async def _table_shape(
    conn: psycopg.AsyncConnection[Any], schema: str, table: str
) -> dict[str, Any]:
    """What a write to ``schema``.``table`` pays for: columns in order with their types and
    nullability, index definitions (without their names), CHECK clauses and storage options."""
    columns = await (
        await conn.execute(
            "SELECT column_name, data_type, datetime_precision, is_nullable "
            "FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
            "ORDER BY ordinal_position",
            [schema, table],
        )
    ).fetchall()
    indexes = await (
        await conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s AND tablename = %s",
            [schema, table],
        )
    ).fetchall()
    checks = await (
        await conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = %s::regclass AND contype = 'c'",
            [f"{schema}.{table}"],
        )
    ).fetchall()
    options = await (
        await conn.execute(
            "SELECT reloptions FROM pg_class WHERE oid = %s::regclass", [f"{schema}.{table}"]
        )
    ).fetchone()
    assert options is not None
    prefix = re.compile(r"^CREATE (UNIQUE )?INDEX \S+ ON \S+ ")
    return {
        "columns": columns,
        "indexes": sorted(prefix.sub(r"CREATE \1INDEX ON jobs ", d) for _, d in indexes),
        # NOT VALID only says that rows from before the constraint went unchecked.
        "checks": sorted(c.removesuffix(" NOT VALID") for (c,) in checks),
        "options": sorted(options[0] or []),
    }


def test_the_strict_floor_claims_and_completes_in_one_statement_each_job_once(
    empty_db_url: str, tmp_path: Path
) -> None:
    # 120 jobs in one multi-row INSERT, one floor process with 50 slots: three claims (50, 50,
    # 20), each batch completed by the statement that claims the next one, every job once.
    bare = _bench_module("notifyq_bench.bare")
    harness = _bench_module("notifyq_bench.harness")
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(bare.SCHEMA.encode())
        children = harness.Children(tmp_path)
        try:
            loop = children.start(
                "bare",
                [sys.executable, "-m", "notifyq_bench.bare", empty_db_url, "--batch", "50"],
                _bench_env(),
            )
            loop.wait_for(r"\bready\b", timeout=30)
            conn.execute(
                "INSERT INTO bench.jobs (task, payload) "
                "SELECT 'noop', jsonb_build_object('n', g) FROM generate_series(1, 120) AS g"
            )

            def all_done() -> bool:
                row = conn.execute(
                    "SELECT count(*) FROM bench.jobs WHERE status = 'completed'"
                ).fetchone()
                return row == (120,)

            harness.poll_until(all_done, 30.0, "the floor to complete 120 jobs")
            loop.check_alive()
        finally:
            children.stop_all()
        rows = conn.execute(
            "SELECT attempt_count, started_at, finished_at, worker_id, result ? 't' FROM bench.jobs"
        ).fetchall()
    assert len(rows) == 120
    assert {(attempts, has_stamp) for attempts, _, _, _, has_stamp in rows} == {(1, True)}
    assert len({worker for *_, worker, _ in rows}) == 1
    claims: dict[Any, int] = {}
    for _, started, _, _, _ in rows:
        claims[started] = claims.get(started, 0) + 1
    assert sorted(claims.values()) == [20, 50, 50]
    # One statement a round trip: a batch's completion carries the now() of the claim of the
    # next batch (the last one's, of the claim that found the queue empty).
    finishes = {finished for _, _, finished, _, _ in rows}
    assert len(finishes) == 3
    assert len(finishes & set(claims)) == 2
    assert all(finished >= started for _, started, finished, _, _ in rows)


@pytest.mark.parametrize("name", ["pgqueuer", "procrastinate"])
def test_an_installed_peer_drains_a_few_jobs_and_stamps_its_pickups(
    name: str, empty_db_url: str, tmp_path: Path
) -> None:
    pytest.importorskip(name)
    peers = _bench_module("notifyq_bench.peers")
    harness = _bench_module("notifyq_bench.harness")
    (peer,), missing = peers.load((name,))
    assert missing == []
    asyncio.run(peer.install(empty_db_url))
    children = harness.Children(tmp_path)
    try:
        workers = peer.start_workers(children, empty_db_url, 1, 4)
        drained = peer.drain(empty_db_url, 40, workers)
        with psycopg.connect(empty_db_url, autocommit=True) as conn:
            left = peer.pending(conn)
        picked = peer.pickup(empty_db_url, 5, 50.0, workers)
    finally:
        children.stop_all()
    assert drained["jobs"] == 40 and drained["jobs_per_s"] > 0
    assert left == 0
    # The stamps are the handlers' own (PgQueuer may still hold their acknowledgements).
    assert 0 < picked["p50_ms"] <= picked["p99_ms"] < 5_000
