"""One loop for read-modify-write patches made safe by ``resourceVersion`` (optimistic concurrency).

Node claims and releases replace the taint list whole, and the heartbeat must never lower a lease label
another writer raised: each builds its patch from the object as last read, conditional on that read's
``resourceVersion``, and on a conflict (409) reads again and rebuilds. This module is that loop, once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from kfp_gpu.cluster.apierrors import Conflict, NotFound, classify

Obj = dict[str, Any]


def patch_conditionally(obj: Obj | None, change: Callable[[Obj], Obj | bool], send: Callable[[Obj], object],
                        reread: Callable[[], Obj | None], *, attempts: int,
                        raise_when_exhausted: bool = False) -> bool:
    """Apply ``change`` to ``obj`` (None: it is gone), re-reading and retrying on conflicts.

    ``change(obj)`` returns the patch body to ``send`` (carrying ``metadata.resourceVersion`` of ``obj``), or a
    bool that ends the loop with that answer (already done, or not ours to change). ``reread()`` returns the
    fresh object, or None when it is gone. Returns True once a patch went through; False when the object
    vanished (404) or every attempt met a conflict.

    Raises:
        ApiException: anything but 404 and 409; the last 409 too when ``raise_when_exhausted``.
    """
    for attempt in range(attempts):
        if obj is None:
            return False
        body = change(obj)
        if isinstance(body, bool):
            return body
        try:
            send(body)
            return True
        except ApiException as exc:
            verdict = classify(exc)
            if isinstance(verdict, NotFound):
                return False
            if not isinstance(verdict, Conflict) or (raise_when_exhausted and attempt == attempts - 1):
                raise
        obj = reread()
    return False
