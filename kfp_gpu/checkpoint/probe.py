"""Preflight writability probe for a checkpoint URI."""

from __future__ import annotations

import time
import uuid

from kfp_gpu.checkpoint.backends import credentials_hint, open_backend
from kfp_gpu.checkpoint.errors import CheckpointError


def probe_writable(uri: str) -> tuple[bool, str]:
    """Preflight check: write, read back and delete a small object under ``uri``.

    Returns ``(ok, reason)``; never raises for storage problems, so preflight can report them.
    """
    key = f".kfp-gpu-probe-{uuid.uuid4().hex[:12]}"
    data = f"kfp-gpu writability probe {time.time()}".encode()
    target = f"{uri.rstrip('/')}/{key}"
    try:
        backend = open_backend(uri)
    except CheckpointError as exc:
        return False, str(exc)
    try:
        backend.put(key, data)
        back = backend.get(key)
    except Exception as exc:
        return False, f"cannot write {target}: {type(exc).__name__}: {exc}\n  fix: {credentials_hint(uri)}"
    try:
        backend.delete(key)
    except Exception as exc:
        return False, f"wrote {target} but cannot delete it ({type(exc).__name__}: {exc}); prune() will fail"
    if back != data:
        return False, f"wrote {target} but read back different bytes"
    return True, f"wrote, read back and deleted {target}"
