"""The checkpoint store's layout on storage: names, the ``COMMITTED`` marker, and the records read from it.

Contract: pure (no I/O). A checkpoint of step N lives under ``step-N`` (nine digits at least), an attempt under
``step-N.tmp-<hex nonce>`` (:func:`attempt_name`, :data:`NAME_RE`); payload names are relative ``/``-separated
paths (:func:`check_name`). The marker (:func:`marker`, format :data:`FORMAT_VERSION`) lists every payload file's
sha256 and size, the commit time, the writer and ``meta``; :func:`parse_marker` turns it back into a
:class:`Checkpoint` or raises CheckpointCorrupt. :mod:`kfp_gpu.checkpoint.store` does the reads and writes.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kfp_gpu.checkpoint.errors import CheckpointCorrupt

__all__ = ["FORMAT_VERSION", "MARKER", "NAME_RE", "RANK_DONE_RE", "Checkpoint", "Incomplete", "attempt_name",
           "check_name", "marker", "parse_marker"]

MARKER = "COMMITTED"
FORMAT_VERSION = 1
NAME_RE = re.compile(r"^step-(\d{9,})(?:\.tmp-([0-9a-f]+))?$")
RANK_DONE_RE = re.compile(r"^rank-\d+\.done$")  # kfp_gpu.checkpoint.sharded's per-rank manifests


@dataclass(frozen=True)
class Checkpoint:
    """One committed checkpoint, as described by its marker.

    Attributes:
        step: the training step the checkpoint holds (the last *completed* step).
        name: the directory / prefix name under the store root, e.g. ``step-000000120``.
        uri: the full URI of that directory / prefix.
        files: payload file name -> sha256 hex digest.
        sizes: payload file name -> size in bytes.
        created: commit time (Unix seconds, from the marker).
        meta: the JSON-serialisable ``meta`` given to :meth:`CheckpointStore.save`.
    """

    step: int
    name: str
    uri: str
    files: Mapping[str, str]
    sizes: Mapping[str, int]
    created: float
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Incomplete:
    """An attempt prefix that is not (yet) a usable checkpoint, and why."""

    step: int
    name: str
    reason: str


def attempt_name(step: int, nonce: str | None = None) -> str:
    """The prefix of a fresh save attempt for ``step``: ``step-N.tmp-<nonce>`` (8 random hex digits by default).

    Raises: ValueError for a negative step or a nonce that is not lowercase hex.
    """
    nonce = uuid.uuid4().hex[:8] if nonce is None else nonce
    if step < 0 or not re.fullmatch(r"[0-9a-f]+", nonce):
        raise ValueError(f"bad attempt step/nonce {step!r}/{nonce!r}: need step >= 0 and a lowercase hex nonce")
    return f"step-{step:09d}.tmp-{nonce}"


def marker(step: int, files: Mapping[str, tuple[str, int]], meta: Mapping[str, Any], now: float,
           ranks: int | None = None) -> bytes:
    """The ``COMMITTED`` marker of ``step``: ``files`` maps payload name -> (sha256, size); written last."""
    doc: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "step": step,
        "files": {n: {"sha256": d, "size": z} for n, (d, z) in sorted(files.items())},
        "time": now,
        "time_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "writer": {"host": socket.gethostname(), "pid": os.getpid()},
        "meta": dict(meta),
    }
    if ranks is not None:
        doc["ranks"] = ranks
    return json.dumps(doc, sort_keys=True, indent=1).encode()


def parse_marker(root: str, name: str, step: int, raw: bytes) -> Checkpoint:
    """The Checkpoint a ``COMMITTED`` marker under ``root``/``name`` describes.

    Raises: CheckpointCorrupt when the marker does not parse or names another step.
    """
    try:
        doc = json.loads(raw.decode())
        files = {str(k): str(v["sha256"]) for k, v in dict(doc["files"]).items()}
        sizes = {str(k): int(v["size"]) for k, v in dict(doc["files"]).items()}
        marker_step = int(doc["step"])
        created = float(doc["time"])
        meta = dict(doc.get("meta") or {})
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise CheckpointCorrupt(f"unreadable COMMITTED marker ({type(exc).__name__}: {exc})") from None
    if marker_step != step:
        raise CheckpointCorrupt(f"COMMITTED marker names step {marker_step}, directory says {step}")
    return Checkpoint(step, name, f"{root}/{name}", files, sizes, created, meta)


def check_name(name: str) -> None:
    """Raises ValueError for a payload file name that is absolute, escapes the prefix or is reserved."""
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"bad payload file name {name!r}: use relative '/'-separated names")
    if name == MARKER or parts[-1].startswith("."):
        raise ValueError(f"payload file name {name!r} is reserved")
