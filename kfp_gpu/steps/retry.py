"""Retrying one cloud call on transient errors, for the steps that must not give up early (rollback, teardown).

The loop itself is :func:`kfp_gpu.retry.call` (shared with the providers); this wrapper keeps the
steps' report-style interface: errors are collected, not raised.
"""

from __future__ import annotations

from collections.abc import Callable

from kfp_gpu import retry
from kfp_gpu.errors import KfpGpuError, is_transient


def retry_transient(fn: Callable[[], object], errors: list[str], what: str, attempts: int = 30) -> bool:
    """Call ``fn`` until it succeeds, retrying errors the provider classified as transient (429, 5xx, GKE's
    "operation in progress") with capped, jittered back-off that honours Retry-After. A permanent error, or
    running out of attempts, is appended to ``errors`` as ``"<what>: <message>"`` and returns False."""
    policy = retry.RetryPolicy(attempts=attempts, budget_s=attempts * 2.0, base_s=0.05, cap_s=1.0)
    try:
        retry.call(fn, policy=policy, what=what)
        return True
    except KfpGpuError as exc:
        if is_transient(exc):
            errors.append(f"{what}: still failing after retries: {exc.message}")
        else:
            errors.append(f"{what}: {exc.message}")
        return False
