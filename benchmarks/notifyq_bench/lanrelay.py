"""The delay relay of the ``multihost`` scenario, for kernels without netem: ``lanrelay.c`` (next
to this file), compiled at run time with the machine's C compiler into the bench's work folder,
then run as a child process that listens on one port per host and forwards every connection to
the bench's PostgreSQL, holding each chunk of bytes for a fixed one-way delay in each direction.

In C because the delay is sub-millisecond: epoll's timeout is in milliseconds, so Python's event
loops cannot time it; the relay waits on a timerfd armed for the earliest due chunk instead.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from notifyq_bench.harness import BenchError, Child, Children, child_env

SOURCE = Path(__file__).with_name("lanrelay.c")


def compiler() -> str | None:
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    return None


def build(workdir: Path) -> Path:
    """Compiles the relay into ``workdir``; :class:`BenchError` if there is no compiler or the
    build fails (see :func:`unavailable`)."""
    cc = compiler()
    if cc is None:
        raise BenchError("no C compiler (cc, gcc or clang) to build the delay relay")
    binary = workdir / "lanrelay"
    result = subprocess.run(
        [cc, "-O2", "-o", str(binary), str(SOURCE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise BenchError(f"the delay relay did not compile: {result.stderr.strip()[-500:]}")
    return binary


def unavailable() -> str | None:
    """Why the relay cannot be built here, or None."""
    if compiler() is None:
        return "no C compiler (cc, gcc or clang) to build the delay relay"
    if not SOURCE.is_file():
        return f"the relay's source {SOURCE.name} is missing from the bench package"
    return None


class Relay:
    """A running relay: :attr:`ports` in the order of the ``listen`` addresses it was given."""

    def __init__(self, child: Child, ports: list[int]) -> None:
        self.child = child
        self.ports = ports

    @classmethod
    def start(
        cls,
        children: Children,
        binary: Path,
        one_way_ms: float,
        target: tuple[str, int],
        listen: list[tuple[str, int]],
        name: str = "lanrelay",
    ) -> Relay:
        argv = [
            str(binary),
            f"{one_way_ms * 1000:.3f}",
            target[0],
            str(target[1]),
            *(f"{address}:{port}" for address, port in listen),
        ]
        child = children.start(name, argv, child_env())
        child.wait_for(r"lanrelay ready[ \d]*\n", timeout=10)
        match = re.search(r"lanrelay ready([ \d]*)\n", child.log_path.read_text())
        ports = [int(p) for p in match.group(1).split()] if match else []
        if len(ports) != len(listen):
            children.stop(child)
            raise BenchError(f"the delay relay did not say its ports: {child.log_tail()}")
        return cls(child, ports)

    def stop(self, children: Children) -> None:
        children.stop(self.child)
