"""``multihost``: worker "hosts" in network namespaces, each behind its own veth link to a bridge,
talking to a PostgreSQL of the bench's own over TCP (password logins only): throughput and pickup
latency against the host count (1 to 4), then one host partitioned for longer than a lease while
every host runs a steady stream of 20 ms jobs (throughput per 0.5 s, the dip, the recovery after
healing, and from the table and the handlers' own record of every run: no job lost, none run
twice by a live worker, stale completions discarded).

The links get the round trip of a LAN (``--lan-delay``, 0.2 ms by default, half each way): with
netem on both ends of each veth when the kernel has it, else through the bench's delay relay
(:mod:`notifyq_bench.lanrelay`, a small C program built at run time): it listens on the bridge,
one port per host, and holds every chunk of bytes for the one-way delay in each direction, so the
hosts' traffic still crosses their veth (a cut still partitions them). The round trip achieved
is measured and reported (``SELECT 1`` from inside a namespace, straight and as the workers
connect); with neither netem nor a C compiler, the links stay bare, with a note. Needs root and
``ip``; skipped with a note otherwise.
"""

from __future__ import annotations

import dataclasses
import glob
import itertools
import json
import math
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from notifyq_bench import lanrelay, netns
from notifyq_bench.harness import BenchError, Child, Scratch, child_env, poll_until
from notifyq_bench.multihost_tasks import RUN, RUNLOG_ENV
from notifyq_bench.netns import Host, Network
from notifyq_bench.pgserver import BenchServer
from notifyq_bench.report import RATIO, Figure, Target
from notifyq_bench.scenarios.context import NOTIFYQ_JOBS, TASKS_MODULE, Context, Scenario
from notifyq_bench.scenarios.measure import drain, pickup
from notifyq_bench.stats import median, percentiles

NAME = "multihost"
SWEEP_CONCURRENCY = 50
PARTITION_CONCURRENCY = 10
JOB_MS = 20
BUCKET_S = 0.5
#: Throughput counts as back when this share of the pre-partition rate holds for
#: RECOVERED_BUCKETS buckets in a row.
RECOVERED_SHARE = 0.9
RECOVERED_BUCKETS = 2
PICKUP_RATE = 50.0
#: The host counts of the sweep.
HOSTS = (1, 2, 3, 4)


@dataclass(frozen=True)
class Plan:
    hosts: tuple[int, ...]
    drain_jobs: int
    pickup_jobs: int
    partition_hosts: int
    lease: float

    @classmethod
    def of(cls, ctx: Context) -> Plan:
        quick = ctx.sizes.drain_jobs < 10_000
        if quick:
            return cls(HOSTS, 2_000, 50, 2, 3.0)
        return cls(HOSTS, 10_000, 100, 4, 5.0)


# -- pure arithmetic ----------------------------------------------------------------------------


def bucket_rates(times: list[float], start: float, end: float, width: float) -> list[float]:
    """Events per second in consecutive buckets of ``width`` seconds from ``start``; events
    outside [start, end) are left out, and so is a last partial bucket."""
    count = int((end - start) // width)
    counts = [0] * max(count, 0)
    for t in times:
        index = math.floor((t - start) / width)
        if 0 <= index < count:
            counts[index] += 1
    return [c / width for c in counts]


def recovery_seconds(
    rates: list[float],
    start: float,
    width: float,
    healed: float,
    baseline: float,
    share: float = RECOVERED_SHARE,
    run: int = RECOVERED_BUCKETS,
) -> float:
    """Seconds from ``healed`` to the start of the first bucket (beginning at or after it)
    that opens ``run`` buckets in a row at ``share`` of ``baseline`` or more; NaN if that never
    happens in ``rates``."""
    first = math.ceil((healed - start) / width - 1e-9)
    for index in range(max(first, 0), len(rates) - run + 1):
        if all(r >= share * baseline for r in rates[index : index + run]):
            return max(0.0, start + index * width - healed)
    return float("nan")


def host_shares(host: list[float], others: list[float], other_hosts: int) -> list[float]:
    """Per bucket, one host's rate over the average rate of ``other_hosts`` others (0 where
    the others did nothing, unless the host did something too: then 1)."""
    out = []
    for mine, theirs in zip(host, others, strict=True):
        mean = theirs / other_hosts if other_hosts else 0.0
        out.append(mine / mean if mean > 0 else (1.0 if mine > 0 else 0.0))
    return out


@dataclass(frozen=True)
class Run:
    job: str
    worker: str
    start: float
    end: float
    token: str


def judge_runs(
    runs: list[Run],
    accepted: dict[str, tuple[str | None, str | None]],
    cut_workers: set[str],
    cut: float,
    healed: float,
    lease: float,
) -> dict[str, Any]:
    """What the runs of each job say, given the row's kept result (token, worker) by job id.

    A job run again is *allowed* when its earlier run was on the partitioned host, started
    before the healing, and the later one started after the cut: that worker lost its lease
    (at least once). Any other second run is a *run twice by a live worker*, and so is one
    that overlapped the earlier run while both leases could still be valid (the partitioned
    worker's lease is valid at most until ``cut + lease``). The kept result must not be that of
    a run that lost its lease to a later one (the fence): that is a *stale completion
    accepted*; a run that starts after the kept one without that excuse ran a job already
    completed (*run again after completion*, one kind of run twice by a live worker)."""
    by_job: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_job[r.job].append(r)

    def lost_lease(earlier: Run, later: Run) -> bool:
        """Whether ``earlier`` was a run whose worker lost the lease before ``later``."""
        return earlier.worker in cut_workers and earlier.start < healed and later.start >= cut

    def valid_until(r: Run) -> float:
        if r.worker in cut_workers and r.start < healed:
            return min(r.end, cut + lease)
        return r.end

    rerun_jobs = 0
    extra_runs = 0
    live_double: list[str] = []
    overlapping: list[str] = []
    stale_accepted: list[str] = []
    ran_after_completion: list[str] = []
    never_ran: list[str] = []
    for job in accepted:
        if job not in by_job:
            never_ran.append(job)
    for job, job_runs in by_job.items():
        job_runs.sort(key=lambda r: r.start)
        if len(job_runs) > 1:
            rerun_jobs += 1
            extra_runs += len(job_runs) - 1
        for earlier, later in itertools.pairwise(job_runs):
            allowed = lost_lease(earlier, later)
            if not allowed:
                live_double.append(job)
            if later.start < valid_until(earlier) and earlier.start < valid_until(later):
                overlapping.append(job)
                live_double.append(job)
        token, worker = accepted.get(job, (None, None))
        kept = next((i for i, r in enumerate(job_runs) if r.token == token), None)
        if kept is not None and kept < len(job_runs) - 1:
            if lost_lease(job_runs[kept], job_runs[kept + 1]):
                stale_accepted.append(job)  # the fence let a lost lease's completion in
            else:
                ran_after_completion.append(job)
        elif token is not None and (kept is None or job_runs[kept].worker != worker):
            stale_accepted.append(job)
    return {
        "runs": len(runs),
        "jobs_run": len(by_job),
        "jobs_run_again": rerun_jobs,
        "extra_runs": extra_runs,
        "run_twice_by_live_worker": len(set(live_double)),
        "overlapping_valid_runs": len(set(overlapping)),
        "stale_completions_accepted": len(stale_accepted),
        "run_again_after_completion": len(ran_after_completion),
        "completed_without_a_recorded_run": len(never_ran),
        "examples": {
            "run_twice_by_live_worker": sorted(set(live_double))[:5],
            "stale_completions_accepted": stale_accepted[:5],
            "run_again_after_completion": ran_after_completion[:5],
        },
    }


# -- the scenario -------------------------------------------------------------------------------


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
        return port


class Cluster:
    """The bench's server on the bridge, its scratch database, and workers started in hosts."""

    def __init__(
        self,
        ctx: Context,
        net: Network,
        server: BenchServer,
        dbname: str,
        relay_ports: list[int] | None = None,
    ) -> None:
        self.ctx = ctx
        self.net = net
        self.server = server
        self.dbname = dbname
        #: The delay relay's port for each host, by index; None: hosts connect straight.
        self.relay_ports = relay_ports
        self.runlog = Path(ctx.workdir) / "multihost-runs"
        self.runlog.mkdir(exist_ok=True)

    def url_for(self, host: Host, dbname: str) -> str:
        """The URL (no password) through which ``host`` reaches the server."""
        if self.relay_ports is None:
            return self.server.url_without_password(dbname)
        port = self.relay_ports[host.index]
        return f"postgresql://postgres@{self.net.server_address}:{port}/{dbname}"

    def start_workers(self, hosts: list[Host], concurrency: int, lease: float) -> list[Child]:
        workers = []
        for host in hosts:
            argv = host.command(
                [
                    sys.executable,
                    "-m",
                    "notifyq",
                    "worker",
                    "--import",
                    f"{TASKS_MODULE},notifyq_bench.multihost_tasks",
                    "--concurrency",
                    str(concurrency),
                ]
            )
            env = child_env(
                DATABASE_URL=self.url_for(host, self.dbname),
                PGPASSWORD=self.server.password,
                NOTIFYQ_LOG_LEVEL="INFO",
                NOTIFYQ_SHUTDOWN_GRACE="1",
                NOTIFYQ_LEASE_SECONDS=f"{lease:g}",
                NOTIFYQ_AUTO_MIGRATE="false",
                **{RUNLOG_ENV: str(self.runlog)},
            )
            workers.append(self.ctx.children.start(f"host{host.index}-worker", argv, env))
        for worker in workers:
            worker.wait_for(r"\bready\b")
        return workers


def _rtt(host: Host, server: BenchServer, urls: list[str]) -> list[dict[str, float]]:
    """``SELECT 1`` round trips from inside ``host`` over each of ``urls``, in ms (taking
    turns, so that the machine's load weighs on each alike)."""
    code = (
        "import json, sys, time, psycopg\n"
        "conns = [psycopg.connect(u, autocommit=True) for u in sys.argv[1:]]\n"
        "out = [[] for _ in conns]\n"
        "for i in range(330):\n"
        "    for c, o in zip(conns, out):\n"
        "        t = time.perf_counter(); c.execute('SELECT 1').fetchone()\n"
        "        if i >= 30: o.append((time.perf_counter() - t) * 1000)\n"
        "print(json.dumps(out))\n"
    )
    result = subprocess.run(
        host.command([sys.executable, "-c", code, *urls]),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=child_env(PGPASSWORD=server.password),
    )
    if result.returncode != 0:
        raise BenchError(f"the round trip from a host failed: {result.stderr.strip()[-300:]}")
    out = []
    for samples in json.loads(result.stdout):
        p50, _, p99 = percentiles(samples)
        out.append({"p50_ms": p50, "p99_ms": p99})
    return out


@dataclass
class Lan:
    """How the links got their delay: ``mode`` is netem, relay or none."""

    mode: str
    one_way_ms: float
    why_none: str = ""
    relay: lanrelay.Relay | None = None


def _add_delay(ctx: Context, net: Network, server: BenchServer) -> Lan:
    """The delay of ``ctx.lan_delay_ms`` on every host's link: netem, else the relay."""
    one_way = ctx.lan_delay_ms / 2
    if one_way <= 0:
        return Lan("none", 0.0, "--lan-delay 0")
    no_netem = net.add_delay(one_way)
    if no_netem is None:
        return Lan("netem", one_way)
    no_relay = lanrelay.unavailable()
    if no_relay is not None:
        return Lan("none", 0.0, f"no netem here (tc: {no_netem}) and {no_relay}")
    try:
        binary = lanrelay.build(Path(ctx.workdir))
    except BenchError as exc:
        return Lan("none", 0.0, f"no netem here (tc: {no_netem}) and {exc}")
    relay = lanrelay.Relay.start(
        ctx.children,
        binary,
        one_way,
        (server.address, server.port),
        [(net.server_address, 0) for _ in net.hosts],
        name="multihost-lanrelay",
    )
    return Lan("relay", one_way, f"no netem here (tc: {no_netem})", relay)


def run(ctx: Context) -> None:
    """Throughput and pickup latency against host count, then a partition."""
    why = netns.unavailable()
    if why is not None:
        ctx.note(f"multihost skipped: {why}")
        return
    run_plan(ctx, Plan.of(ctx))


def run_plan(ctx: Context, plan: Plan) -> None:
    """:func:`run` at the sizes of ``plan`` (the tests run a small one)."""
    dropped = netns.drop_stale()
    if dropped:
        ctx.note(f"removed namespaces and bridges of earlier runs: {dropped}")
    ctx.step("making the hosts (network namespaces) and the bench's PostgreSQL")
    with Network(max(max(plan.hosts), plan.partition_hosts)) as net:
        server = BenchServer(net.server_address, _free_port(net.server_address))
        with server:
            scratch = Scratch(server.url)
            lan: Lan | None = None
            try:
                url = scratch.create("_multihost")
                # Straight first: netem, once added, delays every packet of the link.
                straight = _rtt(net.hosts[0], server, [server.url_without_password("postgres")])
                lan = _add_delay(ctx, net, server)
                _measure(ctx, plan, net, server, url, lan, straight[0])
                if lan.relay is not None and NAME in ctx.results.raw:
                    # What the relay cost the machine's (shared) cores over the whole run.
                    ctx.results.raw[NAME]["relay_cpu_s"] = lan.relay.child.cpu()
            finally:
                if lan is not None and lan.relay is not None:
                    lan.relay.stop(ctx.children)
                scratch.drop_all()


def _measure(
    ctx: Context,
    plan: Plan,
    net: Network,
    server: BenchServer,
    url: str,
    lan: Lan,
    straight: dict[str, float],
) -> None:
    dbname = str(conninfo_to_dict(url)["dbname"])
    relay_ports = lan.relay.ports if lan.relay is not None else None
    cluster = Cluster(ctx, net, server, dbname, relay_ports)
    here = dataclasses.replace(ctx, url=url)
    host = net.hosts[0]
    if lan.mode == "relay":
        # Straight and through the relay taking turns, so that the machine's load moves both.
        straight, rtt = _rtt(
            host,
            server,
            [server.url_without_password("postgres"), cluster.url_for(host, "postgres")],
        )
    elif lan.mode == "netem":
        rtt = _rtt(host, server, [server.url_without_password("postgres")])[0]
    else:
        rtt = straight
    added = rtt["p50_ms"] - straight["p50_ms"]
    how = {
        "netem": f"netem, {lan.one_way_ms:g} ms at each end of each host's veth",
        "relay": f"the bench's delay relay, {lan.one_way_ms:g} ms each way; {lan.why_none}",
        "none": f"none ({lan.why_none})",
    }[lan.mode]
    raw: dict[str, Any] = {
        "server": f"PostgreSQL {server.version()} of the bench's own, tcp {net.server_address}",
        "lan_delay_requested_ms": ctx.lan_delay_ms,
        "lan_delay_by": lan.mode,
        "lan_delay": how,
        "added_latency_ms": added,
        "rtt_select1_ms": rtt,
        "rtt_select1_straight_ms": straight,
        "plan": dataclasses.asdict(plan),
        "hosts": [],
    }
    if lan.mode == "none":
        ctx.note(
            f"multihost: no delay added to the links: {lan.why_none}; the round trip over veth "
            f"(SELECT 1 from a host) is p50 {rtt['p50_ms']:.3f} ms, p99 {rtt['p99_ms']:.3f} ms, "
            "where a LAN adds about 0.2 ms"
        )
    else:
        ctx.note(
            f"multihost: {ctx.lan_delay_ms:g} ms round trip added to the links by {how}; "
            f"SELECT 1 from a host: p50 {rtt['p50_ms']:.3f} ms (p99 {rtt['p99_ms']:.3f}), "
            f"straight p50 {straight['p50_ms']:.3f} ms (p99 {straight['p99_ms']:.3f}): "
            f"{added:+.3f} ms at p50"
        )
    ctx.done()
    _add_rtt_figures(ctx, lan, rtt, straight, added)
    for count in plan.hosts:
        raw["hosts"].append(_sweep(ctx, plan, net.hosts[:count], cluster, here))
    first, last = raw["hosts"][0], raw["hosts"][-1]
    ctx.results.add(
        Figure(
            "multihost.scaling",
            NAME,
            f"throughput, {last['hosts']} hosts / 1 host",
            RATIO,
            [a / b for a, b in zip(last["jobs_per_s"], first["jobs_per_s"], strict=True)],
            note="2 shared cores: more hosts add processes, not CPUs",
        )
    )
    ctx.results.raw[NAME] = raw
    raw["partition"] = _partition(ctx, plan, net, cluster, here)


def _add_rtt_figures(
    ctx: Context, lan: Lan, rtt: dict[str, float], straight: dict[str, float], added: float
) -> None:
    """The round trips a worker's host sees, as the workers connect and straight, and what the
    links added."""
    path = {"netem": "veth + netem", "relay": "veth + delay relay", "none": "veth"}[lan.mode]
    for point in ("p50", "p99"):
        ctx.results.add(
            Figure(
                f"multihost.rtt.{point}",
                NAME,
                f"round trip host → PostgreSQL as the workers connect ({path}, SELECT 1): {point}",
                "ms",
                [rtt[f"{point}_ms"]],
                note=f"delay asked: {ctx.lan_delay_ms:g} ms" if lan.mode != "none" else "no delay",
            )
        )
    for point in ("p50", "p99"):
        ctx.results.add(
            Figure(
                f"multihost.rtt.straight.{point}",
                NAME,
                f"round trip host → PostgreSQL over the bare veth (SELECT 1): {point}",
                "ms",
                [straight[f"{point}_ms"]],
            )
        )
    ctx.results.add(
        Figure(
            "multihost.rtt.added",
            NAME,
            "round trip added to the links, measured (p50 as the workers connect minus straight)",
            "ms",
            [added],
            note=f"asked: {ctx.lan_delay_ms if lan.mode != 'none' else 0:g} ms ({lan.mode})",
        )
    )


def _sweep(
    ctx: Context, plan: Plan, hosts: list[Host], cluster: Cluster, here: Context
) -> dict[str, Any]:
    """One step of the sweep: a worker on each of ``hosts``, drains and pickups, and the
    step's figures; answers its raw figures."""
    count = len(hosts)
    ctx.step(f"{count} host(s): starting a worker in each")
    workers = cluster.start_workers(hosts, SWEEP_CONCURRENCY, plan.lease)
    data: dict[str, Any] = {"hosts": count, "jobs_per_s": [], "p50_ms": [], "p99_ms": []}
    try:
        for r in range(ctx.repeat):
            ctx.step(
                f"{count} host(s): draining {plan.drain_jobs:,} jobs, {plan.pickup_jobs} "
                f"at {PICKUP_RATE:g}/s, repeat {r + 1}"
            )
            data["jobs_per_s"].append(
                drain(here, NOTIFYQ_JOBS, plan.drain_jobs, workers)["jobs_per_s"]
            )
            picked = pickup(here, NOTIFYQ_JOBS, plan.pickup_jobs, PICKUP_RATE)
            data["p50_ms"].append(picked["p50_ms"])
            data["p99_ms"].append(picked["p99_ms"])
            ctx.done()
    finally:
        ctx.children.stop(*workers)
    plural = "s" if count > 1 else ""
    label = f"{count} host{plural}, 1 worker each, concurrency {SWEEP_CONCURRENCY}"
    ctx.results.add(
        Figure(
            f"multihost.h{count}.throughput",
            NAME,
            f"throughput, {label}",
            "jobs/s",
            data["jobs_per_s"],
        )
    )
    for point in ("p50", "p99"):
        ctx.results.add(
            Figure(
                f"multihost.h{count}.pickup.{point}",
                NAME,
                f"pickup latency, {label}, {PICKUP_RATE:g} jobs/s: {point}",
                "ms",
                data[f"{point}_ms"],
            )
        )
    return data


class Feeder:
    """Keeps a backlog of 20 ms jobs queued (topped up every 50 ms) in a thread."""

    def __init__(self, ctx: Context, backlog: int) -> None:
        self.ctx = ctx
        self.backlog = backlog
        self.inserted = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with self.ctx.connect() as conn:
                while not self._stop.wait(0.05):
                    row = conn.execute(
                        "SELECT count(*) FROM notifyq.jobs WHERE status = 'queued'"
                    ).fetchone()
                    deficit = self.backlog - (row[0] if row else 0)
                    if deficit > 0:
                        conn.execute(
                            "INSERT INTO notifyq.jobs (task, payload, max_attempts) "
                            "SELECT %s, jsonb_build_object('ms', %s::int), 5 "
                            "FROM generate_series(1, %s)",
                            [RUN, JOB_MS, deficit],
                        )
                        self.inserted += deficit
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def start(self) -> None:
        self._thread.start()

    def halt(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        if self.error is not None:
            raise BenchError(f"the job feeder failed: {self.error}")


def _leader_pid(here: Context) -> int | None:
    with here.connect() as conn:
        row = conn.execute(
            "SELECT holder FROM notifyq.leaders WHERE expires_at > now() LIMIT 1"
        ).fetchone()
    if not row:
        return None
    try:
        return int(str(row[0]).split(":")[1])
    except (IndexError, ValueError):
        return None


def _read_runs(folder: Path) -> list[Run]:
    runs = []
    for path in glob.glob(str(folder / "*.runs")):
        for line in Path(path).read_text().splitlines():
            parts = line.split()
            if len(parts) == 5:
                runs.append(Run(parts[0], parts[1], float(parts[2]), float(parts[3]), parts[4]))
    return runs


@dataclass(frozen=True)
class _Cut:
    """The partition run: when its phases began (epoch seconds), whom it cut, and how many jobs
    the feeder inserted."""

    t0: float
    cut: float
    healed: float
    end: float
    host: Host
    pid: int
    leader: int | None
    inserted: int


def _cut_and_heal(
    ctx: Context, lease: float, net: Network, cluster: Cluster, here: Context, hosts: list[Host]
) -> _Cut:
    """A worker on each of ``hosts`` under a steady backlog; the maintenance leader's host (or
    the last) cut for more than a lease, healed, watched, and every job left to finish."""
    workers = cluster.start_workers(hosts, PARTITION_CONCURRENCY, lease)
    feeder = Feeder(here, backlog=20 * len(hosts) * PARTITION_CONCURRENCY)
    cut_host: Host | None = None
    try:
        feeder.start()
        time.sleep(1.0)  # warm up
        t0 = time.time()
        time.sleep(3.0)
        leader = _leader_pid(here)
        by_pid = {w.pid: h for w, h in zip(workers, hosts, strict=True)}
        cut_host = by_pid.get(leader, hosts[-1]) if leader is not None else hosts[-1]
        cut_worker = workers[hosts.index(cut_host)]
        ctx.step(f"partition: host {cut_host.index} cut for {1.6 * lease:g} s (> 1 lease)")
        cut = time.time()
        net.cut(cut_host)
        time.sleep(1.6 * lease)
        net.heal(cut_host)
        healed = time.time()
        ctx.step("partition: healed; watching the recovery")
        time.sleep(2.5 * lease)
        end = time.time()
        feeder.stop()
        for worker in workers:
            worker.check_alive()
        with here.connect() as conn:

            def quiet() -> bool:
                row = conn.execute(
                    "SELECT count(*) FROM notifyq.jobs WHERE status IN ('queued', 'processing')"
                ).fetchone()
                return bool(row and row[0] == 0)

            poll_until(quiet, 60.0 + 2 * lease, "the partition run's jobs to finish")
    finally:
        if cut_host is not None and not cut_host.up:
            net.heal(cut_host)
        feeder.halt()
        ctx.children.stop(*workers)
    assert cut_host is not None  # the try ran to its end, so the host was chosen and cut
    return _Cut(t0, cut, healed, end, cut_host, cut_worker.pid, leader, feeder.inserted)


def _partition(
    ctx: Context, plan: Plan, net: Network, cluster: Cluster, here: Context
) -> dict[str, Any]:
    lease = plan.lease
    hosts = net.hosts[: plan.partition_hosts]
    ctx.step(f"partition: starting {len(hosts)} hosts, lease {lease:g} s")
    with here.connect() as conn:
        conn.execute("TRUNCATE notifyq.jobs")
    for old in cluster.runlog.glob("*.runs"):
        old.unlink()
    cut = _cut_and_heal(ctx, lease, net, cluster, here, hosts)
    t0, healed, end = cut.t0, cut.healed, cut.end
    with here.connect() as conn:
        counts = dict(
            conn.execute(
                sql.SQL("SELECT status, count(*) FROM {} GROUP BY status").format(NOTIFYQ_JOBS)
            ).fetchall()
        )
        rows = conn.execute(
            "SELECT id::text, result->>'r', result->>'w', extract(epoch FROM finished_at)::float8,"
            " claims FROM notifyq.jobs WHERE status = 'completed'"
        ).fetchall()
    finished = [r[3] for r in rows]
    rates = bucket_rates(finished, t0, end, BUCKET_S)
    before = [r for i, r in enumerate(rates) if t0 + (i + 1) * BUCKET_S <= cut.cut]
    during = [
        r
        for i, r in enumerate(rates)
        if t0 + i * BUCKET_S >= cut.cut and t0 + (i + 1) * BUCKET_S <= healed
    ]
    baseline = median(before)
    partitioned_rate = sum(1 for t in finished if cut.cut <= t < healed) / (healed - cut.cut)
    cluster_recovery = recovery_seconds(rates, t0, BUCKET_S, healed, baseline)
    runs = _read_runs(cluster.runlog)
    cut_workers = {r.worker for r in runs if f":{cut.pid}:" in r.worker}
    # The healed host's completions against the other hosts' average, bucket by bucket: a
    # measure of its recovery that the machine's own load (shared cores) moves far less.
    cut_finished = [r[3] for r in rows if r[2] in cut_workers]
    other_finished = [r[3] for r in rows if r[2] not in cut_workers]
    shares = host_shares(
        bucket_rates(cut_finished, t0, end, BUCKET_S),
        bucket_rates(other_finished, t0, end, BUCKET_S),
        len(hosts) - 1,
    )
    recovery = recovery_seconds(shares, t0, BUCKET_S, healed, 1.0)
    judged = judge_runs(
        runs, {r[0]: (r[1], r[2]) for r in rows}, cut_workers, cut.cut, healed, lease
    )
    completed = counts.get("completed", 0)
    lost = cut.inserted - completed
    data = {
        "hosts": len(hosts),
        "concurrency": PARTITION_CONCURRENCY,
        "job_ms": JOB_MS,
        "lease_s": lease,
        "cut_host": cut.host.index,
        "cut_host_led_maintenance": cut.leader == cut.pid if cut.leader else False,
        "cut_s": round(cut.cut - t0, 3),
        "healed_s": round(healed - t0, 3),
        "end_s": round(end - t0, 3),
        "bucket_s": BUCKET_S,
        "rates_per_s": rates,
        "baseline_per_s": baseline,
        "partitioned_per_s": partitioned_rate,
        "min_partitioned_bucket_per_s": min(during) if during else float("nan"),
        "recovery_s": recovery,
        "cluster_recovery_s": cluster_recovery,
        "cut_host_share_per_bucket": shares,
        "after_healing_per_s": sum(1 for t in finished if healed <= t < end) / (end - healed),
        "inserted": cut.inserted,
        "statuses": counts,
        "lost": lost,
        **judged,
    }
    _add_partition_figures(ctx, data)
    ctx.done()
    return data


def _add_partition_figures(ctx: Context, data: dict[str, Any]) -> None:
    """The partition run's figures: nothing lost or run twice by a live worker, the dip while
    cut, and the recovery after healing."""
    lease, baseline = data["lease_s"], data["baseline_per_s"]
    lost, partitioned_rate = data["lost"], data["partitioned_per_s"]
    recovery, cluster_recovery = data["recovery_s"], data["cluster_recovery_s"]
    label = f"{data['hosts']} hosts, one cut {1.6 * lease:g} s (lease {lease:g} s)"
    add = ctx.results.add
    add(
        Figure(
            "multihost.partition.lost", NAME, f"jobs lost, {label}", "jobs", [lost], Target("<=", 0)
        )
    )
    add(
        Figure(
            "multihost.partition.live_double",
            NAME,
            f"jobs run twice by a live worker, {label}",
            "jobs",
            [data["run_twice_by_live_worker"]],
            Target("<=", 0),
        )
    )
    add(
        Figure(
            "multihost.partition.stale_accepted",
            NAME,
            f"stale completions accepted (fence), {label}",
            "jobs",
            [data["stale_completions_accepted"]],
            Target("<=", 0),
        )
    )
    add(
        Figure(
            "multihost.partition.rerun",
            NAME,
            f"jobs run again after their worker lost the lease, {label}",
            "jobs",
            [data["jobs_run_again"]],
            note="at least once: allowed; their stale completions were discarded",
        )
    )
    add(
        Figure(
            "multihost.partition.dip",
            NAME,
            f"throughput while partitioned / before, {label}",
            RATIO,
            [partitioned_rate / baseline if baseline else float("nan")],
            note=f"before: {baseline:,.0f} jobs/s",
        )
    )
    add(
        Figure(
            "multihost.partition.recovery",
            NAME,
            f"healed host back to {RECOVERED_SHARE:.0%} of its share, {label} (≤ 2 leases)",
            "s",
            [recovery],
            Target("<=", 2 * lease),
            note="its completions per 0.5 s against the other hosts' average",
        )
    )
    add(
        Figure(
            "multihost.partition.cluster_recovery",
            NAME,
            f"all hosts' throughput back to {RECOVERED_SHARE:.0%} of before healing, {label}",
            "s",
            [cluster_recovery],
            note="moves with the machine's own load when the cores are shared",
        )
    )
    add(
        Figure(
            "multihost.partition.after",
            NAME,
            f"throughput after healing / before, {label}",
            RATIO,
            [data["after_healing_per_s"] / baseline if baseline else float("nan")],
        )
    )


SCENARIO = Scenario(NAME, run, lambda repeat, s: 2 + len(HOSTS) * repeat)
