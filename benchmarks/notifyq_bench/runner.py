"""The command line of ``notifyq bench`` and the run: scratch databases in, scenarios, table,
JSON and plot out, and everything the bench started stopped and dropped, even on Ctrl-C."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from notifyq._version import __version__
from notifyq.db import redact
from notifyq.settings import DEFAULT_LOCAL_URL
from notifyq_bench.harness import (
    BenchError,
    Children,
    Progress,
    Scratch,
    cpu_busy,
    describe_server,
    sigterm_as_interrupt,
    source_revision,
)
from notifyq_bench.peers import INSTALL_HINT, Peer, load, missing_line
from notifyq_bench.report import Results, matplotlib_missing, plot, text_table
from notifyq_bench.scenarios import SCENARIOS, Context, Sizes

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_MISSED = 3
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    names = ", ".join(SCENARIOS)
    parser = argparse.ArgumentParser(
        prog="notifyq bench",
        description="Measures notifyq against its performance targets, with a strict bare "
        "psycopg loop and a bare FastAPI endpoint as floors (and, with --peers, PgQueuer and "
        "procrastinate next to them). Creates scratch databases on the server and drops them "
        "at the end.",
    )
    parser.add_argument(
        "--scenario",
        default="all",
        help=f"comma-separated scenarios to run: {names} (default: all)",
    )
    parser.add_argument(
        "--repeat", type=int, help="runs of each figure (default 5; 1 with --quick)"
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run (under a minute)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every result here")
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="PATH.png",
        help="plot latency percentiles and throughput against concurrency (needs matplotlib; "
        "adds the concurrency scenario)",
    )
    parser.add_argument(
        "--database-url",
        help="server to create scratch databases on (default: $DATABASE_URL, else "
        f"{DEFAULT_LOCAL_URL})",
    )
    parser.add_argument(
        "--check", action="store_true", help=f"exit {EXIT_MISSED} when a target is missed"
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also run the installed peers (PgQueuer, procrastinate) in the lean, throughput "
        f"and latency scenarios, each on a scratch database of its own ({INSTALL_HINT})",
    )
    parser.add_argument(
        "--lan-delay",
        type=float,
        default=0.2,
        metavar="MS",
        help="round trip added to each multihost host's link, half each way, as a real LAN has "
        "(default 0.2; 0: none): netem when the kernel has it, else the bench's delay relay",
    )
    parser.add_argument(
        "--kill-trials",
        type=int,
        metavar="N",
        help="kill -9 trials of the durable scenario (default 1,000; 3 with --quick)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    return parser


def _scenarios(text: str, plot_wanted: bool) -> list[str]:
    if text.strip() in ("", "all"):
        return list(SCENARIOS)
    wanted = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in SCENARIOS]
    if unknown:
        raise ValueError(
            f"unknown scenario(s): {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}"
        )
    if plot_wanted and "concurrency" not in wanted:
        wanted.append("concurrency")
    return [name for name in SCENARIOS if name in wanted]


def _meta(url: str, args: argparse.Namespace, scenarios: list[str], repeat: int) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "notifyq_version": __version__,
        "notifyq_revision": source_revision(),
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["notifyq bench", *_argv(args)]),
        "scenarios": scenarios,
        "repeat": repeat,
        "quick": args.quick,
        "server": redact(url),
        "connection": describe_server(url),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "tools": {"pgbench": shutil.which("pgbench"), "wrk": shutil.which("wrk")},
    }
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    meta["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as meminfo:
            meta["memory_gb"] = round(int(meminfo.readline().split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            meta["server_version"] = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            for setting in ("synchronous_commit", "fsync", "shared_buffers", "max_wal_size"):
                meta[setting] = conn.execute(f"SHOW {setting}").fetchone()[0]  # type: ignore[index]
    except psycopg.Error:
        pass
    return meta


#: Share of the CPUs that other processes may use before the bench calls the machine noisy.
QUIET_CPU = 0.15


def _check_quiet(results: Results, when: str) -> float | None:
    """Records how busy the machine is with other work (nothing of the bench runs at these
    moments) and notes when that makes the figures unreliable."""
    busy = cpu_busy(1.0)
    results.meta[f"cpu_busy_{when}"] = None if busy is None else round(busy, 3)
    if hasattr(os, "getloadavg"):
        results.meta[f"loadavg_{when}"] = [round(x, 2) for x in os.getloadavg()]
    if busy is not None and busy > QUIET_CPU:
        results.notes.append(
            f"the machine was busy {when} the run: {busy:.0%} of the CPUs in use by other "
            "processes; the figures are noisy, rerun on a quiet machine"
        )
    return busy


def _argv(args: argparse.Namespace) -> list[str]:
    out = []
    if args.scenario != "all":
        out += ["--scenario", args.scenario]
    if args.repeat:
        out += ["--repeat", str(args.repeat)]
    if args.quick:
        out.append("--quick")
    if args.json:
        out += ["--json", str(args.json)]
    if args.plot:
        out += ["--plot", str(args.plot)]
    if args.peers:
        out.append("--peers")
    if args.lan_delay != 0.2:
        out += ["--lan-delay", f"{args.lan_delay:g}"]
    if args.kill_trials is not None:
        out += ["--kill-trials", str(args.kill_trials)]
    return out


def peer_systems(wanted: bool, scenarios: list[str]) -> tuple[list[Peer], str | None]:
    """The peers that ``--peers`` runs (those installed), and a line about those skipped."""
    if not wanted:
        return [], None
    peers, missing = load()
    note = missing_line(missing) if missing else None
    if not {"lean", "throughput", "latency"} & set(scenarios):
        note = "--peers runs with the lean, throughput and latency scenarios only; none of them ran"
    return peers, note


def _refusal(args: argparse.Namespace) -> str | None:
    """Why these options cannot run (a usage error), or None."""
    if args.repeat is not None and args.repeat < 1:
        return "--repeat must be at least 1"
    if args.kill_trials is not None and args.kill_trials < 0:
        return "--kill-trials must be 0 or more"
    if not 0 <= args.lan_delay <= 1000:
        return "--lan-delay must be from 0 to 1000 (ms)"
    if args.plot is not None:
        return matplotlib_missing()
    return None


def _report(results: Results, args: argparse.Namespace) -> None:
    """The figures and notes on stdout; the JSON and the plot where the options asked."""
    if results.figures:
        print(text_table(results.figures))
    for note in results.notes:
        print(f"note: {note}")
    if args.json is not None:
        results.write_json(args.json)
        print(f"results written to {args.json}", file=sys.stderr)
    if args.plot is not None and "concurrency" in results.raw:
        plot(results, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    print(f"bench took {results.meta['seconds']:.0f}s", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:  # `notifyq bench -- --quick`: the separator reaches us as is
        argv.remove("--")
    args = parser.parse_args(argv)
    try:
        scenarios = _scenarios(args.scenario, args.plot is not None)
    except ValueError as exc:
        parser.print_usage(sys.stderr)
        print(f"notifyq bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    refusal = _refusal(args)
    if refusal is not None:
        print(f"notifyq bench: error: {refusal}", file=sys.stderr)
        return EXIT_USAGE
    repeat = args.repeat or (1 if args.quick else 5)
    url = args.database_url or os.environ.get("DATABASE_URL") or DEFAULT_LOCAL_URL
    sizes = Sizes.of(args.quick)
    if args.kill_trials is not None:
        sizes = dataclasses.replace(sizes, kill_trials=args.kill_trials)
    results = Results(meta=_meta(url, args, scenarios, repeat))
    peers, peer_note = peer_systems(args.peers, scenarios)
    if peer_note:
        print(f"notifyq bench: {peer_note}", file=sys.stderr)
        results.notes.append(peer_note)
    results.meta["peers"] = [peer.label() for peer in peers]
    busy = _check_quiet(results, "before")
    total = sum(SCENARIOS[name].steps(repeat, sizes) for name in scenarios)
    progress = Progress(total, enabled=not args.quiet)
    failed: list[str] = []
    interrupted = False
    started = time.monotonic()

    with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="notifyq-bench-") as tmp:
        scratch = Scratch(url)
        children = Children(Path(tmp))
        try:
            stale = scratch.drop_stale()
            if stale:
                results.notes.append(f"dropped scratch databases of earlier runs: {stale}")
            progress.scenario = "setup"
            progress.show("creating the scratch database")
            ctx = Context(
                url=scratch.create(),
                scratch_url=scratch.create,
                repeat=repeat,
                sizes=sizes,
                children=children,
                progress=progress,
                results=results,
                workdir=Path(tmp),
                peers=peers,
                lan_delay_ms=args.lan_delay,
            )
            for name in scenarios:
                progress.scenario = name
                scenario = SCENARIOS[name]
                before = progress.done
                try:
                    scenario.run(ctx)
                except BenchError as exc:
                    failed.append(name)
                    ctx.note(f"{name} failed: {exc}")
                finally:
                    ctx.stop_everything()
                    progress.done = before + scenario.steps(repeat, sizes)
        except KeyboardInterrupt:
            interrupted = True
        except BenchError as exc:
            progress.finish()
            print(f"notifyq bench: error: {exc}", file=sys.stderr)
            failed.append("setup")
        finally:
            children.stop_all()
            progress.finish()
            left = scratch.drop_all()
            results.meta["scratch_databases"] = scratch.names
            if left:
                print(f"notifyq bench: could not drop {', '.join(left)}", file=sys.stderr)

    if busy is not None and not interrupted:
        _check_quiet(results, "after")
    results.meta["seconds"] = round(time.monotonic() - started, 1)
    results.meta["interrupted"] = interrupted
    results.meta["failed"] = failed
    _report(results, args)
    if interrupted:
        print("notifyq bench: interrupted; scratch databases dropped", file=sys.stderr)
        return EXIT_INTERRUPTED
    if failed:
        return EXIT_FAILED
    if args.check and any(f.met is False for f in results.figures):
        return EXIT_MISSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
