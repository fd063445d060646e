"""Polling helper for integration tests (one copy for every test directory)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(what: str, fn: Callable[[], Any], timeout: float = 60.0, every: float = 0.2) -> Any:
    """Call ``fn`` until it returns something truthy; fail with ``what`` and the last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last={last!r}")
