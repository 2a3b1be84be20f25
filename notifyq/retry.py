"""Retry policy values that a task carries: :class:`Backoff` (how long a failed attempt waits
before the next) and :class:`CircuitBreaker` (when every worker stops claiming a failing task).

Plain, immutable values: the worker computes delays from them and the store keeps a breaker's
state; nothing here runs a job or touches the database."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from notifyq.errors import TaskError

__all__ = ["Backoff", "CircuitBreaker"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter: attempt n waits between half and all of
    ``min(cap, base * factor ** (n - 1))`` seconds. Half of the delay is fixed, so the wait grows
    with every attempt whatever the random half does, until the cap."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 3600.0

    def __post_init__(self) -> None:
        if self.base < 0 or self.factor < 1 or self.cap < 0:
            raise TaskError("backoff needs base >= 0, factor >= 1 and cap >= 0")

    def ceiling(self, attempt: int) -> float:
        """The most attempt ``attempt`` (1-based) waits before the next one."""
        try:
            raw = float(self.base) * float(self.factor) ** max(0, attempt - 1)
        except OverflowError:
            return float(self.cap)
        return min(float(self.cap), raw) if math.isfinite(raw) else float(self.cap)

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait after failed attempt ``attempt``, jitter included."""
        full = self.ceiling(attempt)
        return full / 2 + rng() * full / 2


@dataclass(frozen=True, slots=True)
class CircuitBreaker:
    """After ``threshold`` consecutive retryable failures of a task, every worker stops claiming
    it for ``cooldown`` seconds; then one probe job runs, and its success closes the breaker.
    The state lives in the database, so all workers agree."""

    threshold: int = 5
    cooldown: float = 30.0

    def __post_init__(self) -> None:
        if self.threshold < 1 or self.cooldown <= 0:
            raise TaskError("a circuit breaker needs threshold >= 1 and cooldown > 0")
