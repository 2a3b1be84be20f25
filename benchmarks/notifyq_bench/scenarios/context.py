"""What every scenario is given: the sizes of a run and the :class:`Context` (scratch
database, the processes it starts, the results); and the :class:`Scenario` type of the
registry."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from notifyq_bench.harness import Child, Children, Progress, child_env, free_port, wait_http
from notifyq_bench.peers.base import Peer
from notifyq_bench.report import Results

TASKS_MODULE = "notifyq_bench.tasks"
NOTIFYQ_JOBS = sql.SQL("notifyq.jobs")
BARE_JOBS = sql.SQL("bench.jobs")
WORKER_CONCURRENCY = 50


@dataclass(frozen=True)
class Sizes:
    """How much each scenario does; ``--quick`` shrinks everything."""

    idle_seconds: float
    burst: int
    drain_jobs: int
    memory_jobs: int
    api_seconds: float
    api_connections: int
    batch_calls: int
    batch_size: int
    insert_seconds: float
    #: Jobs of one bulk INSERT ... SELECT.
    bulk_rows: int
    history_rows: int
    history_queued: int
    claim_reps: int
    levels: tuple[int, ...]
    level_jobs_per_slot: int
    #: Jobs of a 1x1 drain (one slot: a job a round trip, so fewer than ``drain_jobs``).
    single_jobs: int
    #: Jobs of a peer's 1x50 and 2x50 drains (``--peers``): the peers are several times slower.
    peer_jobs: int
    dependent_pairs: int
    waits: int
    group_keys: int
    #: Seconds of the ``horizon`` scenario's stream of jobs under a pinned xmin.
    horizon_seconds: float
    #: The ``durable`` scenario: jobs signalled one at a time (wake-up latency), suspended jobs
    #: during the second drain, and ``kill -9`` trials (``--kill-trials`` overrides).
    signal_wakes: int = 20
    suspended_jobs: int = 1_000
    kill_trials: int = 3
    #: The ``fair`` scenario: the flood of one key beside which the other keys' jobs are
    #: picked up, the rounds of those jobs (one each of nine keys a round), the jobs of the
    #: key_concurrency part, and the claims counted under weights 4:1.
    fair_flood: int = 10_000
    fair_rounds: int = 10
    fair_capped_jobs: int = 2_000
    fair_weighted_claims: int = 5_000

    @classmethod
    def of(cls, quick: bool) -> Sizes:
        if quick:
            return cls(
                idle_seconds=2.0,
                burst=100,
                drain_jobs=5_000,
                memory_jobs=3_000,
                api_seconds=2.0,
                api_connections=32,
                batch_calls=5,
                batch_size=1_000,
                insert_seconds=2.0,
                bulk_rows=10_000,
                history_rows=100_000,
                history_queued=1_000,
                claim_reps=100,
                levels=(1, 50),
                level_jobs_per_slot=40,
                single_jobs=200,
                peer_jobs=1_000,
                dependent_pairs=20,
                waits=10,
                group_keys=1_000,
                horizon_seconds=30.0,
                signal_wakes=20,
                suspended_jobs=1_000,
                kill_trials=3,
                fair_flood=10_000,
                fair_rounds=10,
                fair_capped_jobs=2_000,
                fair_weighted_claims=5_000,
            )
        return cls(
            idle_seconds=10.0,
            burst=100,
            drain_jobs=50_000,
            memory_jobs=20_000,
            api_seconds=6.0,
            api_connections=32,
            batch_calls=50,
            batch_size=1_000,
            insert_seconds=6.0,
            bulk_rows=100_000,
            history_rows=1_000_000,
            history_queued=1_000,
            claim_reps=500,
            levels=(1, 10, 50, 100),
            level_jobs_per_slot=200,
            single_jobs=2_000,
            peer_jobs=5_000,
            dependent_pairs=100,
            waits=30,
            group_keys=10_000,
            horizon_seconds=600.0,
            signal_wakes=200,
            suspended_jobs=10_000,
            kill_trials=1_000,
            fair_flood=100_000,
            fair_rounds=30,
            fair_capped_jobs=10_000,
            fair_weighted_claims=20_000,
        )


@dataclass
class Context:
    """What every scenario needs: the scratch database, the processes, the results."""

    url: str
    scratch_url: Callable[[str], str]
    repeat: int
    sizes: Sizes
    children: Children
    progress: Progress
    results: Results
    workdir: Path
    #: The peer systems (:mod:`notifyq_bench.peers`) that ``--peers`` asked for and that are
    #: installed; the throughput and latency scenarios run each of them too.
    peers: list[Peer] = field(default_factory=list)
    #: The round trip the ``multihost`` scenario adds to each host's link (``--lan-delay``), ms.
    lan_delay_ms: float = 0.2
    _servers: dict[str, int] = field(default_factory=dict)
    servers: dict[str, Child] = field(default_factory=dict)

    def connect(self, url: str | None = None, **kwargs: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(url or self.url, autocommit=True, **kwargs)

    def step(self, what: str) -> None:
        self.progress.show(what)

    def done(self, what: str = "") -> None:
        self.progress.advance()
        if what:
            self.progress.show(what)

    def note(self, text: str) -> None:
        self.results.notes.append(text)
        self.progress.say("note: " + text)

    # -- processes -------------------------------------------------------------------------

    def start_workers(
        self, count: int, concurrency: int, url: str | None = None, **env: str
    ) -> list[Child]:
        """``count`` worker processes, returned once every one logged that it is ready."""
        workers = []
        for index in range(count):
            workers.append(
                self.children.start(
                    f"worker{index}-c{concurrency}",
                    [
                        sys.executable,
                        "-m",
                        "notifyq",
                        "worker",
                        "--import",
                        TASKS_MODULE,
                        "--concurrency",
                        str(concurrency),
                    ],
                    child_env(
                        DATABASE_URL=url or self.url,
                        NOTIFYQ_LOG_LEVEL="INFO",
                        NOTIFYQ_SHUTDOWN_GRACE="1",
                        **env,
                    ),
                )
            )
        for worker in workers:
            worker.wait_for(r"\bready\b")
        return workers

    def start_bare_loop(self, batch: int = WORKER_CONCURRENCY, count: int = 1) -> list[Child]:
        """``count`` processes of the strict floor (:mod:`notifyq_bench.bare`) with ``batch``
        slots each, returned once every one listens."""
        loops = [
            self.children.start(
                f"bare-loop{index}-b{batch}",
                [sys.executable, "-m", "notifyq_bench.bare", self.url, "--batch", str(batch)],
                child_env(),
            )
            for index in range(count)
        ]
        for loop in loops:
            loop.wait_for(r"\bready\b")
        return loops

    def notifyq_api(self) -> int:
        """The port of ``notifyq serve --no-worker`` on the scratch database (one uvicorn
        process), started on first use."""
        if "notifyq" not in self._servers:
            port = free_port()
            child = self.children.start(
                "notifyq-api",
                [
                    sys.executable,
                    "-m",
                    "notifyq",
                    "serve",
                    "--no-worker",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                ],
                child_env(DATABASE_URL=self.url, NOTIFYQ_LOG_LEVEL="WARNING"),
            )
            wait_http(port, "/health", child)
            self._servers["notifyq"] = port
            self.servers["notifyq"] = child
        return self._servers["notifyq"]

    def bare_api(self) -> int:
        """The port of the bare FastAPI endpoint (one uvicorn process), started on first use."""
        if "bare" not in self._servers:
            port = free_port()
            child = self.children.start(
                "bare-api",
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "notifyq_bench.bare_api:create_app",
                    "--factory",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                ],
                child_env(NOTIFYQ_BENCH_CONNINFO=self.url),
            )
            wait_http(port, "/health", child)
            self._servers["bare"] = port
            self.servers["bare"] = child
        return self._servers["bare"]

    def stop_everything(self) -> None:
        self.children.stop_all()
        self._servers.clear()
        self.servers.clear()


@dataclass(frozen=True)
class Scenario:
    """A scenario of the registry: its name on the command line, what runs it, and how many
    progress steps it takes at a repeat count and sizes (for the progress bar)."""

    name: str
    run: Callable[[Context], None]
    steps: Callable[[int, Sizes], int]
