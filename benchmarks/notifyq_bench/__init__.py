"""notifyq-bench, ``notifyq bench``: measures notifyq against the targets of its performance
issue. A distribution of its own, so that the notifyq wheel carries no benchmark code; notifyq's
command line delegates ``notifyq bench`` here when this package is importable.

The scenarios (``latency``, ``throughput``, ``api``, ``batch``, ``insert-trigger``,
``bulk-insert``, ``history``, ``memory``, ``concurrency``, ``workflow`` and ``multihost``) run
against scratch databases that the bench creates on the server it is given and drops at the
end. Each figure is measured ``--repeat`` times and reported as median [min-max] next to its
target and, where there is one, next to a floor measured in the same run: a strict bare psycopg
loop for the worker and a bare FastAPI endpoint for the API; with ``--peers``, PgQueuer and
procrastinate too, when installed (:mod:`notifyq_bench.peers`).

Importing this package does nothing; :func:`main` is the entry point (``python -m notifyq_bench``
or ``notifyq bench``). The handlers that the bench's workers run live in
:mod:`notifyq_bench.tasks`.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the bench with command-line arguments ``argv`` (everything after ``notifyq bench``)
    and answers the exit code."""
    from notifyq_bench.runner import main as run

    return run(argv)
