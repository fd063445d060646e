"""What every checkpoint-format reader shares: the listing it reads, what it reports, and cheap metadata reads.

A reader looks at one listing of the store root (every key, recursive) and returns *candidates*: checkpoints
that look complete from the listing alone, each with a ``check`` that makes the format's small reads (a JSON
file, a zip directory) and returns None when the checkpoint is complete or the missing piece when it is not.
Candidates are checked newest first, so an old checkpoint is never read once a newer one passed. *Partials*
are checkpoints the listing alone shows to be incomplete. Readers only list and read small objects; none
imports torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kfp_gpu.checkpoint.backends import (
    Backend,
    BlobNotFound,
)

Check = Callable[[], "str | None"]  # None = complete; else the missing piece, e.g. "no .metadata"


@dataclass(frozen=True)
class Candidate:
    """A checkpoint of one format that looks complete from the listing; ``check()`` confirms it.

    ``name`` is its key under the store root (a directory prefix, or a file for Lightning); ``meta`` what
    the format records cheaply (e.g. the loss); ``created`` commit / modification time (Unix s, 0 = unknown).
    """

    format: str
    step: int
    name: str
    created: float
    check: Check
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Partial:
    """A checkpoint the listing shows to be incomplete: ``missing`` names the absent piece."""

    format: str
    step: int
    name: str
    missing: str


@dataclass
class Listing:
    """One listing of the store root, shared by every reader. ``claimed`` holds directory prefixes an earlier
    reader took (a DCP directory inside a Hugging Face checkpoint belongs to that checkpoint)."""

    backend: Backend
    keys: list[str]
    claimed: set[str] = field(default_factory=set)

    def free(self, key: str) -> bool:
        """True when no earlier reader claimed a directory holding ``key``."""
        parts = key.split("/")
        return not any("/".join(parts[:i]) in self.claimed for i in range(1, len(parts)))

    def dirs(self) -> dict[str, set[str]]:
        """Directory -> the names of the files directly in it (unclaimed keys only); the root is ``""``."""
        out: dict[str, set[str]] = {}
        for key in self.keys:
            if self.free(key):
                head, _, tail = key.rpartition("/")
                out.setdefault(head, set()).add(tail)
        return out

    def under(self, prefix: str) -> list[str]:
        """Keys below directory ``prefix``, relative to it."""
        cut = len(prefix) + 1
        return [k[cut:] for k in self.keys if k.startswith(prefix + "/")]


class Reader(Protocol):
    """One checkpoint format. ``NAME`` is what :class:`~kfp_gpu.checkpoint.resume.Resume` reports as format."""

    NAME: str

    def scan(self, listing: Listing) -> tuple[list[Candidate], list[Partial]]: ...


def read_small(backend: Backend, key: str) -> bytes | None:
    """The object ``key``, or None when it is gone. Raises: whatever the backend raises on other failures."""
    try:
        return backend.get(key)
    except BlobNotFound:
        return None


_STEP_IN_NAME = re.compile(r"(\d+)(?!.*\d)")


def trailing_step(name: str) -> int | None:
    """The last run of digits in a directory's own name (``step_120``, ``global_step120`` -> 120), or None."""
    m = _STEP_IN_NAME.search(name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def modified(backend: Backend, key: str) -> float:
    """Best-effort modification time of ``key`` (Unix s), 0.0 when the backend cannot say. Never raises."""
    try:
        return float(backend.stat(key)[1])
    except Exception:  # noqa: BLE001 - a time is nice to have, never a reason to fail
        return 0.0


def read_range(backend: Backend, key: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of object ``key`` (the backend's ranged read: seek, HTTP Range).

    Raises: BlobNotFound; the backend's own errors.
    """
    try:
        return backend.read_range(key, start, end)
    except BlobNotFound:
        raise
    except Exception as exc:
        if _missing(exc):
            raise BlobNotFound(key) from None
        raise


def size_of(backend: Backend, key: str) -> int:
    """Size of object ``key`` in bytes. Raises: BlobNotFound; the backend's own errors."""
    try:
        return int(backend.stat(key)[0])
    except BlobNotFound:
        raise
    except Exception as exc:
        if _missing(exc):
            raise BlobNotFound(key) from None
        raise


def _missing(exc: BaseException) -> bool:
    """True for an SDK's "no such object" (botocore ClientError 404 / NoSuchKey, google NotFound)."""
    response = getattr(exc, "response", None)
    code = str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""
    return code in ("404", "NoSuchKey", "NotFound") or type(exc).__name__ == "NotFound" \
        or getattr(exc, "code", None) == 404
