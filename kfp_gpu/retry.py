"""The one retry loop for cloud calls: jittered exponential back-off that honours Retry-After, bounded.

Used by the providers (reads and idempotent mutations, see ``GkeProvider``) and by the steps (through
:func:`retry_transient`). The delay formula is :class:`kfp_gpu.plan.backoff.Backoff`
(full jitter); a ``retry_after_s`` field on the error (set by a provider from the ``Retry-After``
header of a 429/403 rate-limit answer) is a floor: the loop never retries before the server said so.
Clock, sleep and RNG are injectable, so the loop is tested in virtual time.
"""

from __future__ import annotations

import email.utils
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kfp_gpu.errors import KfpGpuError, is_transient
from kfp_gpu.plan.backoff import Backoff

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds of one retried call.

    Attributes:
        attempts: calls in total (1 = no retry).
        budget_s: the loop never sleeps past this many seconds after the first call started.
        base_s, cap_s: back-off ceiling ``min(cap_s, base_s * 2**attempt)``; the delay is uniform below it.
    """

    attempts: int = 8
    budget_s: float = 60.0
    base_s: float = 0.2
    cap_s: float = 10.0


def retry_after_s(exc: BaseException) -> float | None:
    """The server's ``Retry-After`` (seconds) carried by a classified error, else None."""
    fields = exc.fields if isinstance(exc, KfpGpuError) else {}
    value = fields.get("retry_after_s")
    return float(value) if isinstance(value, (int, float)) else None


def parse_retry_after(header: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds: delay-seconds (decimals accepted) or an HTTP-date; None when absent/bad."""
    if not header:
        return None
    try:
        return max(0.0, float(header))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(header).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def call(
    fn: Callable[[], T],
    *,
    policy: RetryPolicy | None = None,
    retryable: Callable[[BaseException], bool] = is_transient,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    what: str = "",
) -> T:
    """Call ``fn`` until it succeeds; retry ``retryable`` errors, never before their Retry-After.

    Raises:
        BaseException: a non-retryable error at once; the last retryable error once ``policy.attempts``
        calls were made or the next wait would pass ``policy.budget_s``, its message saying so.
    """
    pol = policy or RetryPolicy()
    backoff = Backoff(base=pol.base_s, cap=pol.cap_s, rng=rng or random.Random())
    start = clock()
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            if not retryable(exc):
                raise
            hint = retry_after_s(exc)
            wait = backoff.delay(attempt) if hint is None else hint + backoff.rng.uniform(0.0, pol.base_s)
            attempt += 1
            spent = clock() - start
            if attempt >= pol.attempts or spent + wait > pol.budget_s:
                _gave_up(exc, attempt, spent)
                raise
            log.debug("retry %s in %.3fs after %s", what or getattr(fn, "__name__", "call"), wait, exc)
            sleep(wait)


def _gave_up(exc: Exception, attempts: int, spent: float) -> None:
    """Say in a classified error's message that retrying it was given up (once, for nested loops)."""
    if isinstance(exc, KfpGpuError) and "attempts" not in exc.fields:
        exc.message = f"{exc.message} (gave up after {attempts} attempts in {spent:.1f}s)"
        exc.fields["attempts"] = attempts
        exc.args = (str(exc),)


def retry_transient(fn: Callable[[], object], errors: list[str], what: str, attempts: int = 30) -> bool:
    """Call ``fn`` until it succeeds, retrying errors the provider classified as transient (429, 5xx, GKE's
    "operation in progress") with capped, jittered back-off that honours Retry-After. A permanent error, or
    running out of attempts, is appended to ``errors`` as ``"<what>: <message>"`` and returns False: for the
    code that must not give up early and reports instead of raising (rollback, recovery, teardown)."""
    policy = RetryPolicy(attempts=attempts, budget_s=attempts * 2.0, base_s=0.05, cap_s=1.0)
    try:
        call(fn, policy=policy, what=what)
        return True
    except KfpGpuError as exc:
        if is_transient(exc):
            errors.append(f"{what}: still failing after retries: {exc.message}")
        else:
            errors.append(f"{what}: {exc.message}")
        return False
