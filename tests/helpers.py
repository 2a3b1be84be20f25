"""Helpers shared by the tests: waiting on conditions, running workers, reading jobs."""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import psycopg

from notifyq.builtins import worker_registry
from notifyq.settings import Settings
from notifyq.tasks import Registry, make_task
from notifyq.worker import Worker

ROOT = Path(__file__).resolve().parent.parent


def url_with_dbname(url: str, dbname: str) -> str:
    """``url`` pointing at database ``dbname`` instead."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + dbname))


async def wait_until(
    condition: Callable[[], Any], *, timeout: float = 10.0, interval: float = 0.01
) -> Any:
    """Polls ``condition`` (plain or async) until it answers something truthy, and answers
    that; fails the test after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        while True:
            value = condition()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await anyio.sleep(interval)


async def job_row(conn: psycopg.AsyncConnection[Any], job_id: Any) -> dict[str, Any] | None:
    cursor = conn.cursor(row_factory=psycopg.rows.dict_row)
    await cursor.execute("SELECT * FROM notifyq.jobs WHERE id = %s", [job_id])
    return await cursor.fetchone()


async def wait_for_status(
    conn: psycopg.AsyncConnection[Any], job_id: Any, *statuses: str, timeout: float = 10.0
) -> dict[str, Any]:
    async def finished() -> dict[str, Any] | None:
        row = await job_row(conn, job_id)
        return row if row and row["status"] in statuses else None

    result: dict[str, Any] = await wait_until(finished, timeout=timeout)
    return result


async def insert_in_state(
    conn: psycopg.AsyncConnection[Any], task: str = "echo", count: int = 1, **columns: str
) -> list[Any]:
    """Inserts ``count`` jobs of ``task`` in a state only workers reach (finished, processing),
    for a test's setup. An INSERT may only name the task and payload, so the other ``columns``
    (SQL expressions, such as ``status="'failed'"``) are written by an UPDATE, as the engine
    would; a finished status by :func:`end_by_hand`. Answers the ids."""
    cursor = await conn.execute(
        "INSERT INTO notifyq.jobs (task) SELECT %s FROM generate_series(1, %s) RETURNING id",
        [task, count],
    )
    ids = [row[0] for row in await cursor.fetchall()]
    status = columns.pop("status", None)
    if status is not None and status.strip("'") in FINISHED:
        await end_by_hand(conn, ids, status.strip("'"), **columns)
        return ids
    if status is not None:
        columns["status"] = status
    if columns:
        sets = ", ".join(f"{name} = {value}" for name, value in columns.items())
        await conn.execute(f"UPDATE notifyq.jobs SET {sets} WHERE id = ANY(%s)", [ids])
    return ids


#: The statuses of the jobs in notifyq.jobs_done.
FINISHED = ("completed", "failed", "cancelled")


async def end_by_hand(
    conn: psycopg.AsyncConnection[Any], ids: list[Any], status: str, **columns: str
) -> None:
    """Ends live jobs ``ids`` with ``status`` for a test's setup, as the engine would: the other
    ``columns`` (SQL expressions) written in notifyq.jobs, then the rows moved to
    notifyq.jobs_done (notifyq.end_jobs_v1), with nothing else that an end sets off (no
    dependent or group moves on)."""
    if columns:
        sets = ", ".join(f"{name} = {value}" for name, value in columns.items())
        await conn.execute(f"UPDATE ONLY notifyq.jobs SET {sets} WHERE id = ANY(%s)", [ids])
    await conn.execute(
        "SELECT notifyq.end_jobs_v1(%s::uuid[], array_fill(%s::text, ARRAY[%s]))",
        [ids, status, len(ids)],
    )


async def count_by_status(conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
    cursor = await conn.execute("SELECT status, count(*) FROM notifyq.jobs GROUP BY status")
    return {status: count for status, count in await cursor.fetchall()}


def registry(**handlers: Callable[..., Any]) -> Registry:
    """The built-ins plus ``handlers`` registered under their keyword names."""
    extra = Registry([make_task(fn, name) for name, fn in handlers.items()])
    return worker_registry(extra)


@contextlib.asynccontextmanager
async def running_worker(
    settings: Settings, tasks: Registry | None = None, **kwargs: Any
) -> AsyncIterator[Worker]:
    """A worker running in this event loop; stopped gracefully on exit."""
    worker = Worker(settings, tasks, **kwargs)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        try:
            yield worker
        finally:
            worker.stop()


# -- processes ---------------------------------------------------------------------------------


class Process:
    """A ``notifyq`` command running as a child process, its stderr collected in a file.

    ``argv`` replaces ``python -m notifyq ARGS`` with a command of its own (a container's
    ``sh -c "notifyq migrate && exec notifyq serve"``, say; ``args`` then only name it in
    messages). Each process leads a process group of its own, so that ``stop`` also ends
    what a shell started."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        log: Path,
        *,
        argv: list[str] | None = None,
        cwd: Path = ROOT,
    ) -> None:
        self.args = args
        self.log = log
        self._log_file = log.open("wb")
        self.popen = subprocess.Popen(
            argv or [sys.executable, "-m", "notifyq", *args],
            env=env,
            cwd=cwd,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        self._log_file.flush()
        return self.log.read_text(errors="replace")

    def wait_for_output(self, text: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.popen.poll() is not None:
                raise AssertionError(
                    f"notifyq {' '.join(self.args)} exited with {self.popen.returncode} before "
                    f"printing {text!r}:\n{self.output()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} within {timeout}s:\n{self.output()}")
            time.sleep(0.02)

    def signal(self, signum: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signum)

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"notifyq {' '.join(self.args)} still running after {timeout}s:\n{self.output()}"
            ) from None

    def stop(self) -> None:
        """Kills the process and whatever it started (its process group), if still running."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)
        self._log_file.close()


def notifyq_env(db_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFYQ_")}
    env.update(DATABASE_URL=db_url, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


@contextlib.contextmanager
def processes(tmp_path: Path) -> Iterator[Callable[..., Process]]:
    """Starts ``notifyq`` child processes; kills whichever still run at the end."""
    started: list[Process] = []

    def start(
        *args: str,
        env: dict[str, str],
        name: str | None = None,
        argv: list[str] | None = None,
        cwd: Path = ROOT,
    ) -> Process:
        log = tmp_path / f"{name or args[0]}-{len(started)}.log"
        process = Process(list(args), env, log, argv=argv, cwd=cwd)
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            process.stop()
