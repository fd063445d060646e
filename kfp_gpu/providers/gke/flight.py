"""Single flight for identical concurrent reads: callers asking for the same read while it is in flight share
its answer instead of sending it again (a preflight asks for the same node-pool list, region and Cloud Quotas
row once per candidate region and accelerator, all at the same moment).

Only reads that are *in flight* are shared: a caller that starts after the answer arrived sends its own
request, so no answer is older than one round trip at the moment its caller started.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

_lock = threading.Lock()
_inflight: dict[Hashable, Future[Any]] = {}


def shared(key: Hashable, fn: Callable[[], Any]) -> Any:
    """``fn()``, or the answer of the identical call (same ``key``) already in flight.

    Raises: whatever ``fn`` raises (every caller sharing that flight gets the same exception).
    """
    with _lock:
        fut = _inflight.get(key)
        mine = fut is None
        if fut is None:
            fut = _inflight[key] = Future()
    if mine:
        try:
            fut.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to every waiter, re-raised below
            fut.set_exception(exc)
        finally:
            with _lock:
                _inflight.pop(key, None)
    return fut.result()
