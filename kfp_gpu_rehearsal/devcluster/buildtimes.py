"""How long each cold Go build took last time, so each build line can show an estimate.

A cold build is one that had to make the binary (it was not in the cache). Durations are kept per binary (name and
version, the cache file name) in ``<cache>/build/durations.json``; a build line reads ``building X (last cold build
344s)`` or ``(no cold build recorded yet)``. Writes are atomic (temporary file, rename) and serialized within a
process (builds run in threads).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from .versions import cache_dir

_LOCK = threading.Lock()


def path() -> Path:
    return cache_dir() / "build" / "durations.json"


def _read() -> dict[str, float]:
    try:
        data = json.loads(path().read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def last(key: str) -> float | None:
    """Seconds of the last cold build of ``key``; None when none was recorded."""
    return _read().get(key)


def record(key: str, seconds: float) -> None:
    with _LOCK:
        data = _read()
        data[key] = round(seconds, 1)
        p = path()
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f"{p.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, p)


def note(key: str) -> str:
    """`` (last cold build 344s)`` or `` (no cold build recorded yet)``, for a build line."""
    s = last(key)
    return " (no cold build recorded yet)" if s is None else f" (last cold build {s:.0f}s)"
