"""What the kernel says about a process, by pid: whether it is alive (a zombie is not), when it
started (to tell a reused pid apart), and reaping a postmaster reparented to us. Reads ``/proc``
where there is one."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state first); None without /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def start_marker(pid: int) -> str | None:
    """When ``pid`` started, in clock ticks since boot; None where that cannot be read."""
    fields = _proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a running process, of any user."""
    if pid <= 0:
        return False  # kill(0) would mean our whole process group
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    # A zombie still answers kill(pid, 0).
    fields = _proc_stat(pid)
    return not (fields and fields[0] in ("Z", "X"))


def reap_if_ours(pid: int) -> None:
    """Reaps ``pid`` if it is our child: a postmaster is reparented to us when we are PID 1 in a
    container or a subreaper, and would stay a zombie. Never reaps other children of ours, whose
    owners (subprocess, asyncio) wait for them."""
    fields = _proc_stat(pid)
    if fields and len(fields) > 1 and fields[1] == str(os.getpid()):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
