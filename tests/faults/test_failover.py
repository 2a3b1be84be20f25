"""Failover as the failover guide (docs/how-to/failover.md) sets it up: a primary and its
synchronous streaming standby, and a ``DATABASE_URL`` that names both hosts with
``target_session_attrs=read-write``. The primary is stopped at once (``-m immediate``: no
shutdown checkpoint, sessions cut) under HTTP load, the standby promoted as the guide says:
no acknowledged job is lost, the API answers 503 in the gap, and from the promotion the API,
the claims and the LISTEN connection are back within 10 s."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.faults.cluster import free_port, primary_and_synchronous_standby, readme_failover_url
from tests.faults.report import Figures
from tests.helpers import notifyq_env, processes
from tests.sample_tasks import read_runs

# Longer than the suite's default per-test timeout: the scenario's own length is fixed.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TARGET_S = 10.0
#: A probe job counts when it ran within this of its insert: quicker than any poll.
PROBE_S = 1.0


def test_a_promoted_synchronous_standby_keeps_every_acknowledged_job(tmp_path: Path) -> None:
    figures = Figures("failover to a synchronous standby")
    runs = tmp_path / "runs.txt"
    api_port = free_port()
    accepted: list[int] = []
    answers = Counter[int]()
    in_gap: list[tuple[int, float]] = []
    gap = threading.Event()
    stop = threading.Event()
    promoted_at: list[float] = []
    api_back: list[float] = []
    with primary_and_synchronous_standby() as (primary, standby):
        url = readme_failover_url(
            f"postgres:{primary.password}",
            [("127.0.0.1", primary.port), ("127.0.0.1", standby.port)],
            "postgres",
        )
        env = notifyq_env(
            url,
            NOTIFYQ_IMPORT="tests.sample_tasks",
            NQ_RUNS_FILE=str(runs),
            NOTIFYQ_CONNECT_TIMEOUT="2",
            # Far off: a probe job that runs within a second was woken by LISTEN.
            NOTIFYQ_POLL_INTERVAL="30",
        )
        with processes(tmp_path) as start:
            api = start("serve", "--no-worker", "--port", str(api_port), env=env, name="api")
            api.wait_for_output("Uvicorn running on", timeout=60)
            worker = start("worker", env=env, name="worker")
            worker.wait_for_output("ready")

            def load() -> None:
                with httpx.Client(base_url=f"http://127.0.0.1:{api_port}", timeout=15) as client:
                    n = 1
                    while not stop.is_set():
                        began = time.monotonic()
                        answer = client.post("/jobs", json={"task": "record", "payload": {"n": n}})
                        answers[answer.status_code] += 1
                        if answer.status_code == 201:
                            accepted.append(n)
                            if promoted_at and not api_back:
                                api_back.append(time.monotonic() - promoted_at[0])
                        elif gap.is_set():
                            in_gap.append((answer.status_code, time.monotonic() - began))
                        n += 1
                        stop.wait(0.005)

            loader = threading.Thread(target=load)
            loader.start()
            try:
                deadline = time.monotonic() + 60
                while len(accepted) < 150:
                    assert loader.is_alive() and time.monotonic() < deadline, answers
                    time.sleep(0.01)
                gap.set()
                primary.stop("immediate")  # a crash: no shutdown checkpoint, sessions cut
                deadline = time.monotonic() + 20
                while not in_gap:
                    assert time.monotonic() < deadline, f"no request met the gap: {answers}"
                    time.sleep(0.02)
                standby.run("pg_ctl", "-D", str(standby.data), "-w", "promote")
                # The guide's step: the promoted node must not wait for a standby it lacks.
                standby.sql("ALTER SYSTEM SET synchronous_standby_names = ''")
                standby.sql("SELECT pg_reload_conf()")
                promoted_at.append(time.monotonic())
                gap.clear()
                before = len(read_runs(runs))
                while len(read_runs(runs)) == before:
                    assert time.monotonic() - promoted_at[0] < 30, worker.output()[-3000:]
                    time.sleep(0.01)
                figures.recovery_s["claims"] = time.monotonic() - promoted_at[0]
                time.sleep(1)  # load after the failover: a scenario parameter
            finally:
                stop.set()
                loader.join(60)
            # The worker idle: nothing queued, and what is left of the accepted jobs unchanged
            # for a second. A claim whose answer the failover cut off is committed (the standby
            # is synchronous) but unknown to the worker: that job stays `processing` until its
            # lease runs out and the rescue requeues it, after the LISTEN probe below.
            _wait_idle(standby, runs, accepted, worker)
            # The LISTEN connection follows: with the load stopped and the worker idle, a job
            # runs within a second of its insert only if a notification on the new primary
            # woke it (a busy worker claims its next jobs as it writes its last ones). An upper
            # bound: it counts from the promotion, through the load's last second and drain.
            figures.recovery_s["LISTEN"] = _listen_back(url, runs, promoted_at[0])
            # Every accepted job ends completed: one whose claim the standby had not received
            # at the promotion (claims do not wait for it) ran, had its completion refused, and
            # runs again; one whose claim's answer the failover cut off waits for its lease.
            deadline = time.monotonic() + 90  # a lease (30 s) and the rescue's next pass
            while True:
                completed = standby.sql(
                    "SELECT (payload->>'n')::int FROM notifyq.jobs WHERE status = 'completed'"
                )
                if set(accepted) <= {n for (n,) in completed}:
                    break
                if time.monotonic() > deadline:
                    break  # counted as lost below, with the worker's log
                time.sleep(0.05)
            unfinished = standby.sql(
                "SELECT count(*) FROM notifyq.jobs WHERE status IN ('queued', 'processing')"
            )
            api.signal(15)
            worker.signal(15)
            codes = [api.wait(), worker.wait()]
            log = worker.output()[-6000:]
    figures.lost = len(set(accepted) - {n for (n,) in completed})
    figures.stuck = int(unfinished[0][0])
    ran = Counter(n for n, _ in read_runs(runs))
    figures.run_twice = sum(1 for times in ran.values() if times > 1)
    if api_back:
        figures.recovery_s["API"] = api_back[0]
    figures.notes.update(
        accepted=len(accepted),
        answers=dict(answers),
        slowest_503_in_gap_s=round(max((s for _, s in in_gap), default=0), 2),
    )
    figures.report()
    assert codes == [0, 0], (api.output()[-3000:], worker.output()[-3000:])
    assert figures.lost == 0, "an acknowledged job was lost\n" + log
    assert figures.stuck == 0, figures.line()
    assert set(answers) <= {201, 503}, answers
    # In the gap a refusal comes once the hosts have been tried: at once here, where the dead
    # primary refuses and the standby is read-only; within the connect timeout (2 s) at worst.
    assert all(code == 503 and seconds < 3 for code, seconds in in_gap), in_gap
    assert api_back, "the API never took a job after the promotion"
    late = {part: s for part, s in figures.recovery_s.items() if s > TARGET_S}
    assert not late, f"{figures.line()}\n{log}"


def _wait_idle(standby: Any, runs: Path, accepted: list[int], worker: Any) -> None:
    """Waits until no job is queued and the accepted jobs not run yet stay the same for a
    second (at most 60 s)."""
    deadline = time.monotonic() + 60
    missing: set[int] | None = None
    steady_since = time.monotonic()
    while True:
        assert time.monotonic() < deadline, worker.output()[-3000:]
        now_missing = set(accepted) - {n for n, _ in read_runs(runs)}
        if now_missing != missing:
            missing, steady_since = now_missing, time.monotonic()
        queued = standby.sql("SELECT count(*) FROM ONLY notifyq.jobs WHERE status = 'queued'")
        if not missing or (queued[0][0] == 0 and time.monotonic() - steady_since >= 1):
            return
        time.sleep(0.05)


def _listen_back(url: str, runs: Path, since: float) -> float:
    """Seconds from ``since`` until a probe job ran within PROBE_S of its insert."""
    n = 10_000_000
    deadline = time.monotonic() + 30
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        while time.monotonic() < deadline:
            n += 1
            conn.execute(
                "INSERT INTO notifyq.jobs (task, payload) "
                "VALUES ('record', jsonb_build_object('n', %s::int))",
                [n],
            )
            inserted = time.monotonic()
            while time.monotonic() - inserted < PROBE_S:
                if any(ran == n for ran, _ in read_runs(runs)):
                    return time.monotonic() - since
                time.sleep(0.01)
    return float("inf")
