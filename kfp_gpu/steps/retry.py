"""Retrying one cloud call on transient errors, for the steps that must not give up early (rollback, teardown)."""

from __future__ import annotations

import time
from collections.abc import Callable

from kfp_gpu.errors import KfpGpuError, is_transient


def retry_transient(fn: Callable[[], object], errors: list[str], what: str, attempts: int = 30) -> bool:
    """Call ``fn`` until it succeeds, retrying errors the provider classified as transient (429, 5xx, GKE's
    "operation in progress") with capped back-off. A permanent error, or running out of attempts, is
    appended to ``errors`` as ``"<what>: <message>"`` and returns False."""
    for attempt in range(attempts):
        try:
            fn()
            return True
        except KfpGpuError as exc:
            if not is_transient(exc):
                errors.append(f"{what}: {exc.message}")
                return False
            time.sleep(min(1.0, 0.05 * 2 ** attempt))
    errors.append(f"{what}: still failing after {attempts} attempts")
    return False
