"""The ``horizon`` scenario's arithmetic: the most backlog counts the moment the stream stops.

The tests here need no database; those that do are in tests/test_bench_horizon.py.
"""

from __future__ import annotations

import math
from array import array


def test_the_most_backlog_counts_the_moment_the_stream_stops_too() -> None:
    """Sampled at whole seconds only, the most backlog read lower than the backlog at the end
    (CI saw 9 against 12): the most is taken at every commit and at the stop."""
    from notifyq_bench.scenarios.horizon import _analyse

    # One job a second for 3 s, each started at once; then five commits in the last half
    # second that are still waiting when the stream stops.
    commits = array("d", [0.0, 1.0, 2.0, 3.0, 3.5, 3.6, 3.7, 3.8, 3.9])
    stamps = array("d", [0.1, 1.1, 2.1, 3.1, *(math.nan,) * 5])
    found = _analyse(commits, stamps, stopped=3.95, read_at=4.0)
    assert found["backlog_at_end"] == 5
    assert found["backlog_max"] == 5
    assert max(found["backlog_per_s"]) < 5  # what the old figure read
