"""Exponential back-off with full jitter (AWS architecture blog style), in virtual time.

``delay = uniform(0, min(cap, base * factor**attempt))``. The one retry loop built on it is
:func:`kfp_gpu.retry.call` (Retry-After aware, bounded); :class:`VirtualClock` lets tests of it run in
virtual time with no real sleeping.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class VirtualClock:
    """A clock whose ``sleep`` just advances ``now``. Records every sleep."""

    now: float = 0.0
    sleeps: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += max(0.0, seconds)


@dataclass
class Backoff:
    base: float = 1.0
    factor: float = 2.0
    cap: float = 60.0
    rng: random.Random = field(default_factory=random.Random)

    def ceiling(self, attempt: int) -> float:
        """Upper bound of the delay after failed attempt number ``attempt`` (0-based)."""
        return min(self.cap, self.base * self.factor ** max(0, attempt))

    def delay(self, attempt: int) -> float:
        return self.rng.uniform(0.0, self.ceiling(attempt))
