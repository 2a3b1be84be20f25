"""The ``multihost`` bench scenario's arithmetic: throughput buckets, recovery time, the
judgement of every job's runs. The bench is a distribution of its own (benchmarks/) that CI does
not install: it is imported from this checkout.

The tests here need no database; those that do are in tests/test_bench_multihost.py.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT

if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))


from notifyq_bench import lanrelay
from notifyq_bench.harness import Children
from notifyq_bench.scenarios import SCENARIOS
from notifyq_bench.scenarios.multihost import (
    Run,
    bucket_rates,
    host_shares,
    judge_runs,
    recovery_seconds,
)


def test_the_scenario_is_registered() -> None:
    assert "multihost" in SCENARIOS


def test_bucket_rates_count_events_per_second_and_drop_the_partial_last_bucket() -> None:
    times = [10.0, 10.1, 10.49, 10.5, 11.2, 11.6, 9.9, 12.0]
    assert bucket_rates(times, 10.0, 11.7, 0.5) == [6.0, 2.0, 2.0]
    assert bucket_rates([], 0.0, 1.0, 0.5) == [0.0, 0.0]
    assert bucket_rates([1.0], 2.0, 1.0, 0.5) == []


def test_recovery_is_the_first_run_of_good_buckets_from_the_healing() -> None:
    # Buckets of 1 s from t=0; healed at 3.5; good from the bucket starting at 5.
    rates = [100, 100, 50, 50, 60, 95, 100, 100]
    assert recovery_seconds(rates, 0.0, 1.0, 3.5, 100.0) == pytest.approx(1.5)
    # A lone good bucket does not count: two in a row are needed.
    rates = [100, 50, 50, 95, 40, 95, 96]
    assert recovery_seconds(rates, 0.0, 1.0, 1.0, 100.0) == pytest.approx(4.0)
    # Back at once: the bucket that starts at the healing is good.
    assert recovery_seconds([100, 50, 100, 100], 0.0, 1.0, 2.0, 100.0) == 0.0
    assert math.isnan(recovery_seconds([100, 50, 50], 0.0, 1.0, 1.0, 100.0))


def test_a_hosts_share_is_its_rate_over_the_other_hosts_average() -> None:
    assert host_shares([50, 0, 25, 0, 10], [150, 150, 150, 0, 0], 3) == [1.0, 0.0, 0.5, 0.0, 1.0]


CUT, HEALED, LEASE = 100.0, 108.0, 5.0


def _judge(runs: list[Run], accepted: dict[str, tuple[str | None, str | None]]) -> dict[str, Any]:
    return judge_runs(runs, accepted, {"cut"}, CUT, HEALED, LEASE)


def test_a_job_run_again_after_its_worker_lost_the_lease_is_allowed_and_counted() -> None:
    runs = [
        Run("j1", "cut", 99.99, 100.01, "a"),  # its completion never reached the database
        Run("j1", "live", 106.0, 106.02, "b"),  # rescued after the lease ran out
        Run("j2", "live", 101.0, 101.02, "c"),
    ]
    judged = _judge(runs, {"j1": ("b", "live"), "j2": ("c", "live")})
    assert judged["jobs_run_again"] == 1
    assert judged["extra_runs"] == 1
    assert judged["run_twice_by_live_worker"] == 0
    assert judged["overlapping_valid_runs"] == 0
    assert judged["stale_completions_accepted"] == 0


def test_a_second_run_after_a_live_workers_run_is_run_twice_by_a_live_worker() -> None:
    runs = [Run("j1", "live", 101.0, 101.02, "a"), Run("j1", "other", 102.0, 102.02, "b")]
    judged = _judge(runs, {"j1": ("b", "other")})
    assert judged["run_twice_by_live_worker"] == 1
    assert judged["overlapping_valid_runs"] == 0
    assert judged["examples"]["run_twice_by_live_worker"] == ["j1"]


def test_runs_that_overlap_while_both_leases_hold_are_flagged() -> None:
    # A long run on the cut host, rerun before its lease (cut + 5 s) could have run out.
    runs = [Run("j1", "cut", 99.0, 110.0, "a"), Run("j1", "live", 103.0, 103.1, "b")]
    judged = _judge(runs, {"j1": ("b", "live")})
    assert judged["overlapping_valid_runs"] == 1
    assert judged["run_twice_by_live_worker"] == 1
    # The same rerun after the lease ran out overlaps only a run that lost its lease.
    runs = [Run("j1", "cut", 99.0, 110.0, "a"), Run("j1", "live", 105.5, 105.6, "b")]
    assert _judge(runs, {"j1": ("b", "live")})["overlapping_valid_runs"] == 0


def test_a_kept_result_of_a_run_that_lost_its_lease_is_a_stale_completion_accepted() -> None:
    runs = [Run("j1", "cut", 99.99, 100.01, "a"), Run("j1", "live", 106.0, 106.02, "b")]
    judged = _judge(runs, {"j1": ("a", "cut")})
    assert judged["stale_completions_accepted"] == 1
    assert (
        _judge(runs, {"j1": ("b", "live"), "j9": ("z", "live")})["completed_without_a_recorded_run"]
        == 1
    )


def test_a_run_after_a_live_completion_is_not_a_stale_completion_but_a_double_run() -> None:
    runs = [Run("j1", "live", 109.0, 109.02, "a"), Run("j1", "live", 110.0, 110.02, "b")]
    judged = _judge(runs, {"j1": ("a", "live")})
    assert judged["stale_completions_accepted"] == 0
    assert judged["run_again_after_completion"] == 1
    assert judged["run_twice_by_live_worker"] == 1


def test_lan_delay_defaults_to_a_lans_round_trip_and_rejects_nonsense(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from notifyq_bench import runner

    assert runner.build_parser().parse_args([]).lan_delay == 0.2
    assert runner.build_parser().parse_args(["--lan-delay", "0"]).lan_delay == 0
    for bad in ("-0.1", "nan", "inf"):
        assert runner.main(["--lan-delay", bad, "--scenario", "multihost"]) == runner.EXIT_USAGE
        assert "--lan-delay" in capsys.readouterr().err


@pytest.fixture(scope="module")
def relay_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    why = lanrelay.unavailable()
    if why is not None:
        pytest.skip(f"the delay relay cannot be built here: {why}")
    return lanrelay.build(tmp_path_factory.mktemp("lanrelay"))


class EchoServer:
    """A loopback TCP server: echoes, or (``sink``) reads everything, then answers with the
    byte count and a large payload of its own and half-closes."""

    def __init__(self, reply: bytes = b"") -> None:
        self.reply = reply
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.received = bytearray()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            if not self.reply:
                while data := conn.recv(65536):
                    conn.sendall(data)
                return
            while data := conn.recv(65536):
                self.received += data
            conn.sendall(self.reply)
            conn.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._thread.join(30)
        self.sock.close()


@contextlib.contextmanager
def _relay(binary: Path, tmp_path: Path, server: EchoServer, one_way_ms: float) -> Iterator[int]:
    children = Children(tmp_path)
    try:
        relay = lanrelay.Relay.start(
            children, binary, one_way_ms, ("127.0.0.1", server.port), [("127.0.0.1", 0)]
        )
        yield relay.ports[0]
    finally:
        children.stop_all()
        server.close()


def _recv_all(sock: socket.socket) -> bytes:
    out = bytearray()
    while data := sock.recv(1 << 20):
        out += data
    return bytes(out)


def test_the_relay_forwards_a_large_payload_both_ways_in_order_and_passes_a_half_close(
    relay_binary: Path, tmp_path: Path
) -> None:
    # 6 MiB each way, more than the relay queues per direction (4 MiB).
    up = os.urandom(6 << 20)
    down = os.urandom(6 << 20)
    server = EchoServer(reply=down)
    with _relay(relay_binary, tmp_path, server, 0.1) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sender = threading.Thread(target=sock.sendall, args=(up,))
            sender.start()
            sender.join(30)
            sock.shutdown(socket.SHUT_WR)  # half-close: the answer must still come back
            got = _recv_all(sock)
    assert bytes(server.received) == up
    assert got == down


def test_the_relay_adds_the_delay_and_not_much_more(relay_binary: Path, tmp_path: Path) -> None:
    server = EchoServer()
    samples = []
    with _relay(relay_binary, tmp_path, server, 0.1) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(220):
                t = time.perf_counter()
                sock.sendall(b"x" * 64)
                got = b""
                while len(got) < 64:
                    got += sock.recv(64 - len(got))
                samples.append((time.perf_counter() - t) * 1000)
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(1) == b""  # the echo server's EOF, passed on by the relay
    p50 = sorted(samples[20:])[100]
    assert 0.2 <= p50 <= 2.0, f"p50 {p50:.3f} ms through a relay of 0.1 ms each way"
