"""Peers: other PostgreSQL job queues for Python that ``notifyq bench --peers`` runs next to
notifyq and the strict floor, in the same run, on the same server.

Each peer is a module of this package with a :class:`~notifyq_bench.peers.base.Peer` subclass:
how to install its schema in a scratch database of its own, how to enqueue the bench's no-op
and stamp jobs with its own API, how to start one of its worker processes, and how many of its
jobs are not done yet. The drivers are written from each project's public documentation; the
peers themselves are optional (``pip install -e "./benchmarks[peers]"``), and one that is not
importable is skipped with a line that says how to install it.

Importing this package imports no peer.
"""

from __future__ import annotations

import importlib.util

from notifyq_bench.peers.base import Peer

__all__ = ["INSTALL_HINT", "PEER_NAMES", "Peer", "load", "missing_line"]

#: The peers, by the name of the package that must be importable, in the order they run.
PEER_NAMES = ("pgqueuer", "procrastinate")

INSTALL_HINT = 'pip install -e "./benchmarks[peers]"'


def load(names: tuple[str, ...] = PEER_NAMES) -> tuple[list[Peer], list[str]]:
    """The peers of ``names`` whose package is importable, and the names of those that are
    not."""
    found: list[Peer] = []
    missing: list[str] = []
    for name in names:
        try:
            installed = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # e.g. sys.modules[name] is None
            installed = False
        if not installed:
            missing.append(name)
            continue
        if name == "pgqueuer":
            from notifyq_bench.peers.pgqueuer_peer import PgQueuerPeer

            found.append(PgQueuerPeer())
        elif name == "procrastinate":
            from notifyq_bench.peers.procrastinate_peer import ProcrastinatePeer

            found.append(ProcrastinatePeer())
        else:
            raise ValueError(f"unknown peer {name!r}; choose from {', '.join(PEER_NAMES)}")
    return found, missing


def missing_line(missing: list[str]) -> str:
    """What the bench says about the peers it skips."""
    return f"peers not installed, skipped: {', '.join(missing)}; install them with {INSTALL_HINT}"
