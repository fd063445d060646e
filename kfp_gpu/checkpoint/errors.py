"""Checkpoint errors. They extend the kfp-gpu error tree (:mod:`kfp_gpu.errors`, stdlib only)."""

from __future__ import annotations

from kfp_gpu.errors import KfpGpuError, Scope


class BlobNotFound(KeyError):
    """The key does not exist in the backend."""


class CheckpointError(KfpGpuError):
    """Base of every checkpoint error. Permanent unless a subclass says otherwise."""

    default_scope = Scope.NONE


class CheckpointCorrupt(CheckpointError):
    """A checkpoint has no commit marker, an unreadable marker, or a payload whose sha256 differs."""


class CheckpointNotFound(CheckpointError):
    """No complete checkpoint matches the request (e.g. a step that was never committed)."""


class StorageError(CheckpointError):
    """The storage backend failed (network, throttling, 5xx). Transient: retry after back-off."""

    transient = True


class StorageUnavailable(CheckpointError):
    """The URI's scheme needs an SDK that is not installed (boto3, google-cloud-storage, fsspec)."""
