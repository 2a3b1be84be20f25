"""Percentiles and medians, without numpy."""

from __future__ import annotations

from collections.abc import Sequence


def percentiles(values: Sequence[float], points: Sequence[float] = (50, 95, 99)) -> list[float]:
    """Linear-interpolated percentiles (numpy's default method); NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return [float("nan")] * len(points)
    out = []
    for p in points:
        rank = (len(ordered) - 1) * p / 100
        low = int(rank)
        high = min(low + 1, len(ordered) - 1)
        out.append(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))
    return out


def median(values: Sequence[float]) -> float:
    return percentiles(values, (50,))[0]
