"""Snooze refuses a bad delay.

The tests here need no database; those that do are in tests/test_workflows.py.
"""

from __future__ import annotations

import pytest

from notifyq import Snooze


def test_snooze_refuses_a_bad_delay() -> None:
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="seconds"):
            Snooze(bad)
    with pytest.raises(TypeError):
        Snooze("5")  # type: ignore[arg-type]
