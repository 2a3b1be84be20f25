"""What the commands print: progress lines on stderr, and the tables of queues, jobs and
tasks on stdout (colored only on a terminal that wants color)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from notifyq.models import Job


def say(message: str) -> None:
    """One line on stderr, at once: progress and notes, which stdout's readers do not parse."""
    print(message, file=sys.stderr, flush=True)


def progress(line: str) -> None:
    """A step of a longer operation (migrating, starting a server), said as notifyq's."""
    say(f"notifyq: {line}")


def use_color() -> bool:
    """Whether stdout is a terminal that wants color (https://no-color.org)."""
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def duration(seconds: float) -> str:
    """``seconds`` in the largest whole unit: 7d, 1.5h, 90s."""
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def queue_table(rows: Sequence[Mapping[str, Any]], *, color: bool) -> list[str]:
    """The lines of ``notifyq stats`` for the rows of the store's queue_stats."""

    def paint(text: str, code: str, on: bool) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if color and on else text

    if not rows:
        return ["no queues yet: enqueue a job (notifyq enqueue hello_world)"]
    header = (
        f"{'QUEUE':16} {'DUE':>7} {'QUEUED':>7} {'RUNNING':>7} {'COMPLETED':>10} "
        f"{'FAILED':>7} {'CANCELLED':>9} {'WAIT':>7} {'DONE/MIN':>8}  STATE"
    )
    lines = [paint(header, "1", True)]
    for row in rows:
        wait = row["oldest_due_seconds"]
        completed = f"{'~' if row['completed_estimated'] else ''}{row['completed']}"
        state = paint("paused" if row["paused"] else "active", "33", row["paused"])
        if row.get("rate_limit"):
            state += f", {row['rate_limit']:g}/s"
        if row.get("max_depth"):
            state += f", max {row['max_depth']}"
        if row.get("notify") is False:
            state += ", polled"
        failed = paint(f"{row['failed']:>7}", "31", row["failed"] > 0)
        waited = f"{wait:>6.1f}s" if wait is not None else "      -"
        waited = paint(waited, "33", (wait or 0) > 5)
        lines.append(
            f"{row['queue'][:16]:16} {row['due']:>7} {row['queued']:>7} "
            f"{row['processing']:>7} {completed:>10} {failed} {row['cancelled']:>9} "
            f"{waited} {row['completed_last_minute']:>8}  {state}"
        )
    return lines


def jobs_table(jobs: Sequence[Job]) -> list[str]:
    """The lines of ``notifyq jobs``: one job a line, its error's first line shortened."""
    header = f"{'JOB ID':36}  {'STATUS':10}  {'TASK':16}  {'QUEUE':10}  TRIES"
    lines = [f"{header}  {'CREATED':19}  ERROR"]
    for job in jobs:
        error = (job.last_error or "").splitlines()[0][:50] if job.last_error else ""
        lines.append(
            f"{job.id!s:36}  {job.status.value:10}  {job.task[:16]:16}  {job.queue[:10]:10}  "
            f"{job.attempt_count:>2}/{job.max_attempts:<2}  "
            f"{job.created_at:%Y-%m-%d %H:%M:%S}  {error}"
        )
    return lines


def fair_table(
    weights: Sequence[Mapping[str, Any]], keys: Sequence[Mapping[str, Any]]
) -> list[str]:
    """The lines of ``notifyq fair list``: the weights set, then the busiest keys."""
    lines = [f"{'KEY':32}  WEIGHT"]
    lines += [f"{row['fair_key'][:32]:32}  {row['weight']:g}" for row in weights]
    if not weights:
        lines.append("(no weight set: every key weighs 1; notifyq fair set KEY WEIGHT)")
    lines += ["", f"{'QUEUE':16}  {'KEY':32}  {'QUEUED':>8}  {'RUNNING':>8}  WEIGHT"]
    lines += [
        f"{row['queue'][:16]:16}  {row['fair_key'][:32]:32}  {row['queued']:>8}  "
        f"{row['running']:>8}  {row['weight']:g}"
        for row in keys
    ]
    if not keys:
        lines.append("(no job with a fair_key is queued or running)")
    return lines


def tasks_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The lines of ``notifyq tasks`` for the rows of the store's list_tasks."""
    if not rows:
        return ["no tasks registered yet: start a worker (notifyq worker --import yourmodule)"]
    lines = [f"{'TASK':24}  {'QUEUE':10}  TRIES  TIMEOUT  LIMITS               BREAKER"]
    for row in rows:
        options = row["options"] or {}
        limits = ", ".join(
            part
            for part in (
                f"{row['max_concurrency']} at once" if row["max_concurrency"] else "",
                f"{row['rate_limit']:g}/s" if row["rate_limit"] else "",
                f"{options['key_concurrency']} a key" if options.get("key_concurrency") else "",
                f"cron {options['cron']}" if options.get("cron") else "",
            )
            if part
        )
        timeout = f"{options['timeout']:g}s" if options.get("timeout") else "-"
        lines.append(
            f"{row['name'][:24]:24}  {(options.get('queue') or '-')[:10]:10}  "
            f"{row['max_attempts'] or '-'!s:>5}  {timeout:>7}  {limits or '-':19}  "
            f"{row['breaker_state']}"
        )
    return lines
