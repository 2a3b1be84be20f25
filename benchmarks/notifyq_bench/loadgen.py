"""Load generators that run in their own process, so that they do not share an event loop or a
GIL with what they measure. Each prints one JSON object on stdout.

``http``: a minimal HTTP/1.1 keep-alive client on asyncio streams (far cheaper per request than
a full client library). ``--connections N`` sends requests back to back on N connections (the
maximum rate); ``--rate R`` sends R requests per second on a fixed schedule (open loop) and
times each one from its scheduled start, so a slow server cannot hide queueing delay.

``inserts``: N threads, each doing single-row INSERTs (one transaction each) for a fixed time;
the fallback for ``insert-trigger`` when pgbench is not installed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import anyio

from notifyq_bench.stats import percentiles

#: Most connections the paced mode opens.
MAX_PACED_CONNECTIONS = 256


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, host: str, port: int) -> _Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def request(self, raw: bytes) -> int:
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                raise RuntimeError("chunked responses are not supported by this load generator")
        if length:
            await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        self.writer.close()


def _request_bytes(host: str, port: int, path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def closed_loop(
    host: str, port: int, path: str, body: bytes, connections: int, seconds: float, warmup: float
) -> dict[str, Any]:
    """Requests back to back on ``connections`` connections; counts those that finish inside
    the measured window (after ``warmup``)."""
    raw = _request_bytes(host, port, path, body)
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    conns = [await _Connection.open(host, port) for _ in range(connections)]
    start = time.perf_counter() + warmup
    end = start + seconds

    everything = 0

    async def drive(conn: _Connection) -> None:
        nonlocal everything
        while True:
            sent = time.perf_counter()
            if sent >= end:
                return
            status = await conn.request(raw)
            everything += 1
            done = time.perf_counter()
            if sent >= start and done <= end:
                statuses[status] += 1
                latencies.append((done - sent) * 1000)

    try:
        await asyncio.gather(*(drive(conn) for conn in conns))
    finally:
        for conn in conns:
            conn.close()
    result = _summary(statuses, latencies, seconds)
    result["all_requests"] = everything
    return result


async def paced(
    host: str, port: int, path: str, body: bytes, rate: float, seconds: float, warmup: float
) -> dict[str, Any]:
    """``rate`` requests per second on a fixed schedule; latency from each scheduled start."""
    raw = _request_bytes(host, port, path, body)
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    idle: list[_Connection] = [await _Connection.open(host, port) for _ in range(8)]
    opened = len(idle)
    measured_from = time.perf_counter() + warmup
    total = int((warmup + seconds) * rate)
    t0 = time.perf_counter() + 0.05
    pending: set[asyncio.Task[None]] = set()
    late = 0

    async def one(scheduled: float) -> None:
        nonlocal opened
        if idle:
            conn = idle.pop()
        else:
            opened += 1
            conn = await _Connection.open(host, port)
        status = await conn.request(raw)
        done = time.perf_counter()
        idle.append(conn)
        if scheduled >= measured_from:
            statuses[status] += 1
            latencies.append((done - scheduled) * 1000)

    for i in range(total):
        scheduled = t0 + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -0.001:
            late += 1
        if opened >= MAX_PACED_CONNECTIONS and not idle:
            raise RuntimeError(f"more than {MAX_PACED_CONNECTIONS} requests in flight")
        task = asyncio.ensure_future(one(scheduled))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending)
    for conn in idle:
        conn.close()
    result = _summary(statuses, latencies, seconds)
    result["connections"] = opened
    result["late_sends"] = late
    result["all_requests"] = total
    return result


def _summary(statuses: Counter[int], latencies: list[float], seconds: float) -> dict[str, Any]:
    ok = sum(n for status, n in statuses.items() if 200 <= status < 300)
    p50, p95, p99 = percentiles(latencies)
    return {
        "requests": sum(statuses.values()),
        "ok": ok,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "seconds": seconds,
        "rate": ok / seconds,
        "p50_ms": p50,
        "p95_ms": p95,
        "p99_ms": p99,
        "max_ms": max(latencies) if latencies else float("nan"),
    }


def insert_clients(conninfo: str, statement: str, clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` threads each running ``statement`` in its own transaction for ``seconds``."""
    import psycopg

    counts = [0] * clients
    errors: list[str] = []
    gate = threading.Barrier(clients + 1)
    end = [0.0]

    def client(index: int) -> None:
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                gate.wait()
                while time.perf_counter() < end[0]:
                    conn.execute(statement, prepare=True)
                    counts[index] += 1
        except Exception as exc:  # reported in the output, the others keep going
            errors.append(f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(threading.BrokenBarrierError):
                gate.abort()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    end[0] = time.perf_counter() + seconds + 0.05
    gate.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    return {
        "inserts": sum(counts),
        "seconds": elapsed,
        "rate": sum(counts) / elapsed,
        "errors": errors,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m notifyq_bench.loadgen")
    commands = parser.add_subparsers(dest="command", required=True)
    http = commands.add_parser("http")
    http.add_argument("--host", default="127.0.0.1")
    http.add_argument("--port", type=int, required=True)
    http.add_argument("--path", default="/jobs")
    http.add_argument("--body", required=True)
    http.add_argument("--seconds", type=float, required=True)
    http.add_argument("--warmup", type=float, default=0.5)
    mode = http.add_mutually_exclusive_group(required=True)
    mode.add_argument("--connections", type=int)
    mode.add_argument("--rate", type=float)
    inserts = commands.add_parser("inserts")
    inserts.add_argument("conninfo")
    inserts.add_argument("--statement", required=True)
    inserts.add_argument("--clients", type=int, default=8)
    inserts.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)

    if args.command == "inserts":
        result = insert_clients(args.conninfo, args.statement, args.clients, args.seconds)
    else:
        body = args.body.encode()

        async def drive() -> dict[str, Any]:
            if args.connections:
                return await closed_loop(
                    args.host,
                    args.port,
                    args.path,
                    body,
                    args.connections,
                    args.seconds,
                    args.warmup,
                )
            return await paced(
                args.host, args.port, args.path, body, args.rate, args.seconds, args.warmup
            )

        uvloop = importlib.util.find_spec("uvloop") is not None
        result = anyio.run(drive, backend_options={"use_uvloop": uvloop})
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
