"""The database away for 10 s and for 120 s under HTTP and SQL load: while it is away the API
answers 503, never a 500; within 5 s of its return every part works again (each worker's
listener and claims, the API, its event streams, its metrics); no acknowledged job is lost.

One API process (``serve --no-worker``) and two workers, each serving the default queue and a
queue of its own; the fallback poll is 30 s, so a probe job of a worker's own queue that runs
within a second was woken by that worker's LISTEN connection."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.faults.cluster import Cluster, free_port
from tests.faults.report import Figures
from tests.helpers import Process, notifyq_env, processes
from tests.sample_tasks import read_runs

# Longer than the suite's default per-test timeout: the scenario's own length is fixed.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]

WORKERS = 2
#: Seconds every part has to work again once the database is back.
TARGET_S = 5.0
#: A probe counts only when it went through within this: quicker than any poll.
PROBE_S = 1.0
#: Pause between two requests of the HTTP load, and two INSERTs of the SQL load.
PACE_S = 0.05
#: Routes the HTTP load reads (besides POST /jobs), in turn.
READS = ("/jobs/{id}", "/jobs?limit=5", "/queues", "/workers", "/health", "/metrics")
HTTP_CLIENTS = 3
HTTP_BASE = 1
SQL_BASE = 1_000_000
PROBE_BASE = 2_000_000


class Load:
    """HTTP and SQL producers, each in a thread, keeping what was acknowledged and what every
    request answered, by whether the database was away."""

    def __init__(self, api: str, url: str) -> None:
        self.api = api
        self.url = url
        self.away = threading.Event()
        self.stop = threading.Event()
        self.accepted: list[int] = []
        self.answers: dict[bool, Counter[str]] = {False: Counter(), True: Counter()}
        self.slowest_refusal = 0.0
        self.first_created_after: float | None = None
        self.back_at: float | None = None
        self.lock = threading.Lock()
        self.numbers = itertools.count(HTTP_BASE)
        # Several HTTP clients: a refusal waits for the connect timeout, and one client alone
        # would send a handful of requests in a 10 s outage.
        self.threads = [
            *(threading.Thread(target=self._http, daemon=True) for _ in range(HTTP_CLIENTS)),
            threading.Thread(target=self._sql, daemon=True),
        ]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _http(self) -> None:
        last_id = "00000000-0000-0000-0000-000000000000"
        with httpx.Client(base_url=self.api, timeout=15) as client:
            while not self.stop.is_set():
                n = next(self.numbers)
                away = self.away.is_set()
                began = time.monotonic()
                answer = client.post("/jobs", json={"task": "record", "payload": {"n": n}})
                self._count(away, "POST /jobs", answer.status_code, began)
                if answer.status_code == 201:
                    self.accepted.append(n)
                    last_id = answer.json()["job_id"]
                    if self.back_at is not None and self.first_created_after is None:
                        self.first_created_after = time.monotonic() - self.back_at
                read = READS[n % len(READS)]
                began = time.monotonic()
                answer = client.get(read.format(id=last_id))
                self._count(away, f"GET {read.split('?')[0]}", answer.status_code, began)
                self.stop.wait(PACE_S)

    def _count(self, away: bool, route: str, status: int, began: float) -> None:
        with self.lock:
            self.answers[away][f"{route} {status}"] += 1
            if away and status == 503:
                self.slowest_refusal = max(self.slowest_refusal, time.monotonic() - began)

    def _sql(self) -> None:
        n = SQL_BASE
        conn: psycopg.Connection[Any] | None = None
        while not self.stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.url, autocommit=True, connect_timeout=2)
                conn.execute(
                    "INSERT INTO notifyq.jobs (task, payload) "
                    "VALUES ('record', jsonb_build_object('n', %s::int))",
                    [n],
                )
                self.accepted.append(n)  # autocommit: the INSERT returned once committed
                n += 1
            except psycopg.OperationalError:
                if conn is not None:
                    conn.close()
                conn = None
            self.stop.wait(PACE_S)
        if conn is not None:
            conn.close()


def until(probe: Callable[[], bool], timeout: float) -> float | None:
    """Seconds until ``probe`` first answered True (it is tried again at once otherwise), or
    None after ``timeout``."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            if probe():
                return time.monotonic() - began
        except (psycopg.OperationalError, httpx.HTTPError):
            pass
        time.sleep(0.02)
    return None


class Probes:
    """Each part, tried until it works: a worker's listener and claims (a job of its own queue,
    run within PROBE_S), an event stream (a change pushed within PROBE_S), the metrics (a
    depth read from the database since its return)."""

    def __init__(self, api: str, url: str) -> None:
        self.api = api
        self.url = url
        self.numbers = itertools.count(PROBE_BASE)  # next() is atomic: probes run side by side

    def worker(self, i: int) -> bool:
        n = next(self.numbers)
        with psycopg.connect(self.url, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute(
                "INSERT INTO notifyq.jobs (task, payload, queue) "
                "VALUES ('record', jsonb_build_object('n', %s::int), %s) RETURNING id",
                [n, f"own{i}"],
            ).fetchone()
            assert row is not None
            deadline = time.monotonic() + PROBE_S
            while time.monotonic() < deadline:
                done = conn.execute(
                    "SELECT status = 'completed' FROM notifyq.jobs WHERE id = %s", [row[0]]
                ).fetchone()
                if done and done[0]:
                    return True
                time.sleep(0.01)
        return False

    def events(self) -> bool:
        with httpx.Client(base_url=self.api, timeout=5) as client:
            created = client.post(
                "/jobs", json={"task": "record", "payload": {}, "queue": "unserved"}
            )
            if created.status_code != 201:
                return False
            job_id = created.json()["job_id"]
            with client.stream("GET", f"/jobs/{job_id}/events") as stream:
                lines = stream.iter_lines()
                if not any(line.startswith("data:") for line in _upto_event(lines)):
                    return False
                cancelled = time.monotonic()
                if client.post(f"/jobs/{job_id}/cancel").status_code != 200:
                    return False
                event = list(_upto_event(lines))
                return (
                    any('"cancelled"' in line for line in event)
                    and time.monotonic() - cancelled < PROBE_S
                )

    def metrics(self, queued: int) -> bool:
        answer = httpx.get(f"{self.api}/metrics", timeout=5)
        wanted = f'notifyq_queue_jobs{{queue="metered",status="queued"}} {float(queued)}'
        return answer.status_code == 200 and wanted in answer.text


def _upto_event(lines: Any) -> list[str]:
    """The lines of the next event of a stream (up to its blank line)."""
    event = []
    for line in lines:
        if not line:
            if event:
                return event
            continue
        event.append(line)
    return event


@pytest.mark.parametrize("outage_s", [10, 120])
def test_an_outage_under_load_answers_503_and_every_part_is_back_within_5_s(
    cluster: Cluster, tmp_path: Path, outage_s: int
) -> None:
    figures = Figures(f"database away {outage_s} s")
    url = cluster.database(f"outage{outage_s}")
    runs = tmp_path / "runs.txt"
    port = free_port()
    api_url = f"http://127.0.0.1:{port}"
    env = notifyq_env(
        url,
        NOTIFYQ_IMPORT="tests.sample_tasks",
        NQ_RUNS_FILE=str(runs),
        NOTIFYQ_POLL_INTERVAL="30",
        NOTIFYQ_CONNECT_TIMEOUT="2",
    )
    with processes(tmp_path) as start:
        api = start("serve", "--no-worker", "--port", str(port), env=env, name="api")
        workers = [
            start("worker", "--queues", f"default,own{i}", env=env, name=f"w{i}")
            for i in range(WORKERS)
        ]
        api.wait_for_output("Uvicorn running on", timeout=60)
        for worker in workers:
            worker.wait_for_output("ready")
        probes = Probes(api_url, url)
        for i in range(WORKERS):
            assert until(lambda i=i: probes.worker(i), 10) is not None, "no listener before"
        assert until(probes.events, 10) is not None, "no event stream before the outage"
        with Load(api_url, url) as load:
            time.sleep(2)  # load before the outage: a scenario parameter
            load.away.set()
            cluster.stop("fast")
            time.sleep(outage_s)  # the outage's length: a scenario parameter
            cluster.start()
            load.back_at = time.monotonic()
            load.away.clear()
            back = _recoveries(probes, WORKERS, load.back_at)
            time.sleep(2)  # load after the return
        figures.recovery_s.update(back)
        if load.first_created_after is not None:
            figures.recovery_s["API (POST /jobs 201)"] = load.first_created_after
        processes_ = [api, *workers]
        lost = _wait_for(url, runs, load.accepted, 60, processes_)
        figures.lost = len(lost)
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM ONLY notifyq.jobs WHERE queue NOT IN ('unserved', 'metered')"
            ).fetchone()
        figures.stuck = row[0] if row else -1
        ran = Counter(n for n, _ in read_runs(runs))
        twice = sorted(n for n, times in ran.items() if times > 1)
        figures.run_twice = len(twice)
        for process in processes_:
            process.signal(15)
        codes = [p.wait() for p in processes_]
    away = load.answers[True]
    figures.notes.update(
        accepted=len(load.accepted),
        answers_while_away=dict(away),
        slowest_503_s=round(load.slowest_refusal, 2),
        ran_twice=twice[:10],
    )
    figures.report()
    assert codes == [0] * len(processes_), [p.output()[-3000:] for p in processes_]
    assert not lost, f"acknowledged jobs lost: {sorted(lost)[:20]}"
    assert figures.stuck == 0, figures.line()
    assert away, "no request met the outage"
    # "POST /jobs 503": never another 5xx while the database is away.
    assert not [a for a in away if a.split()[-1].startswith("5") and a.split()[-1] != "503"], away
    assert load.slowest_refusal < 3, load.slowest_refusal
    assert "API (POST /jobs 201)" in figures.recovery_s, "the API took no job after the return"
    late = {part: s for part, s in figures.recovery_s.items() if s > TARGET_S}
    assert not late, figures.line()
    if outage_s < 30:  # shorter than the lease: no job lost its worker
        assert figures.run_twice == 0, figures.line()


def _recoveries(probes: Probes, workers: int, back_at: float) -> dict[str, float]:
    """Each part's seconds to work again from the database's return (``back_at``), probed side
    by side; infinity for a part not back within 30 s."""
    found: dict[str, float] = {}

    def take(name: str, probe: Callable[[], bool]) -> None:
        seconds = until(probe, 30)
        found[name] = time.monotonic() - back_at if seconds is not None else float("inf")

    def metered() -> bool:
        with psycopg.connect(probes.url, autocommit=True, connect_timeout=2) as conn:
            conn.execute(
                "INSERT INTO notifyq.jobs (task, queue) "
                "SELECT 'record', 'metered' FROM generate_series(1, 3)"
            )
        return True

    threads = [
        threading.Thread(target=take, args=(f"worker {i}", lambda i=i: probes.worker(i)))
        for i in range(workers)
    ]
    threads.append(threading.Thread(target=take, args=("SSE", probes.events)))
    for thread in threads:
        thread.start()
    if until(metered, 30) is not None:
        take("metrics", lambda: probes.metrics(3))
    for thread in threads:
        thread.join(60)
    return found


def _wait_for(
    url: str, runs: Path, accepted: list[int], timeout: float, watch: list[Process]
) -> set[int]:
    """The acknowledged jobs not completed after ``timeout``."""
    wanted = set(accepted)
    deadline = time.monotonic() + timeout
    while True:
        with psycopg.connect(url, autocommit=True) as conn:
            done = {
                n
                for (n,) in conn.execute(
                    "SELECT (payload->>'n')::int FROM notifyq.jobs_done "
                    "WHERE status = 'completed' AND payload ? 'n'"
                )
            }
        left = wanted - done
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
