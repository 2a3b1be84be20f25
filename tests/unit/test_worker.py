"""The worker's retry backoff: it grows with every attempt despite jitter, within its bounds.

The tests here need no database; those that do are in tests/test_worker.py.
"""

from __future__ import annotations

import pytest

from notifyq.retry import Backoff


def test_backoff_grows_with_every_attempt_despite_jitter() -> None:
    backoff = Backoff(base=1, factor=2, cap=3600)
    lowest = [backoff.delay(n, rng=lambda: 0.0) for n in range(1, 12)]
    highest = [backoff.delay(n, rng=lambda: 1.0) for n in range(1, 12)]
    assert lowest[:3] == [0.5, 1.0, 2.0]
    assert highest[:3] == [1.0, 2.0, 4.0]
    # The worst draw of attempt n+1 is never shorter than the best draw of attempt n.
    assert all(highest[n] <= lowest[n + 1] for n in range(len(lowest) - 1))
    assert backoff.delay(100, rng=lambda: 1.0) == 3600
    assert backoff.delay(10_000, rng=lambda: 0.5) <= 3600


@pytest.mark.parametrize("attempt", [1, 2, 5])
def test_backoff_stays_within_its_bounds(attempt: int) -> None:
    backoff = Backoff(base=0.5, factor=3, cap=10)
    ceiling = min(10, 0.5 * 3 ** (attempt - 1))
    for _ in range(200):
        assert ceiling / 2 <= backoff.delay(attempt) <= ceiling
