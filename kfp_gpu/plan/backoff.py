"""Exponential back-off with full jitter (AWS architecture blog style), in virtual time.

``delay = uniform(0, min(cap, base * factor**attempt))``. Only transient errors
(:func:`kfp_gpu.errors.is_transient`, or a custom predicate) are retried, and a retry is never
scheduled past the deadline: if the next sleep would end after it, the last error is raised.
Clock, sleep and RNG are injected, so tests run in virtual time with no real sleeping.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from kfp_gpu.errors import is_transient

T = TypeVar("T")


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


def retry(
    fn: Callable[[], T],
    *,
    deadline: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    backoff: Backoff | None = None,
    retryable: Callable[[BaseException], bool] = is_transient,
    max_attempts: int | None = None,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
) -> T:
    """Call ``fn`` until it succeeds, retrying only ``retryable`` errors with jittered back-off.

    ``deadline`` is absolute, in ``clock()`` units.

    Raises:
        BaseException: the first non-retryable error at once, or the last retryable error when the
        next retry would start after ``deadline`` or ``max_attempts`` is reached.
    """
    bo = backoff or Backoff()
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            if not retryable(exc):
                raise
            if max_attempts is not None and attempt + 1 >= max_attempts:
                raise
            wait = bo.delay(attempt)
            if clock() + wait >= deadline:
                raise
            if on_retry is not None:
                on_retry(attempt, exc, wait)
            sleep(wait)
            attempt += 1
