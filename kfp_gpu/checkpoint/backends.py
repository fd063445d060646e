"""Storage backends for checkpoints: local paths (and ``file://``), ``s3://``, ``gs://`` and any fsspec URL.

A backend is a flat key -> bytes store rooted at the checkpoint URI. Keys are ``/``-separated and relative
to that root. Cloud SDKs are imported lazily, inside :func:`open_backend`, so ``import kfp_gpu.checkpoint``
needs nothing beyond the standard library.

Endpoints: ``s3://`` honours ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (moto, MinIO); ``gs://``
honours ``STORAGE_EMULATOR_HOST`` (fake-gcs-server, :mod:`kfp_gpu_rehearsal.devcluster.gcs_profile`): google-cloud-storage
sends every call there, and :func:`gcs_client` gives it anonymous credentials and a placeholder project, so no
Google credentials (nor the metadata server) are looked up.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from kfp_gpu.checkpoint.errors import BlobNotFound, StorageError, StorageUnavailable
from kfp_gpu.checkpoint.object_backends import (  # noqa: F401 - re-exported: where callers have always found them
    EMULATOR_ENV,
    EMULATOR_PROJECT,
    FsspecBackend,
    GCSBackend,
    S3Backend,
    _boto3_client,
    emulator_host,
    gcs_client,
)

__all__ = ["EMULATOR_ENV", "EMULATOR_PROJECT", "Backend", "BlobNotFound", "FsspecBackend", "GCSBackend", "LocalBackend",
           "S3Backend", "credentials_hint", "emulator_host", "gcs_client", "open_backend"]


class Backend(Protocol):
    """What :class:`~kfp_gpu.checkpoint.store.CheckpointStore` needs from storage.

    Contract: ``put`` of one key is atomic for readers (object stores: a PUT; local: a same-directory
    rename), ``get`` of a missing key raises :class:`BlobNotFound`, ``list`` returns every key under a
    prefix (recursive, relative to the root), ``rename_prefix`` returns False when the backend has no
    atomic rename (object stores), in which case the commit marker alone is the commit point.
    """

    uri: str

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def list(self, prefix: str = "") -> list[str]: ...

    def delete_prefix(self, prefix: str) -> None: ...

    def delete(self, key: str) -> None: ...

    def rename_prefix(self, src: str, dst: str) -> bool: ...

    def stat(self, key: str) -> tuple[int, float]:
        """(size in bytes, modification time as Unix seconds; 0.0 when unknown). Raises: BlobNotFound."""
        ...

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``key``, read without fetching the rest. Raises: BlobNotFound."""
        ...


class LocalBackend:
    """A directory on a local or mounted (NFS, Filestore, FSx) filesystem. Commits by ``os.rename``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.uri = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/"))

    def put(self, key: str, data: bytes) -> None:
        """Write ``key`` durably: temp file, fsync, rename. Raises: OSError (permissions, disk full)."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)

    def get(self, key: str) -> bytes:
        """Raises: BlobNotFound when the file does not exist; OSError on other I/O failures."""
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise BlobNotFound(key) from None

    def list(self, prefix: str = "") -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        out: list[str] = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                rel = Path(dirpath, name).relative_to(self.root)
                out.append(rel.as_posix())
        return sorted(out)

    def delete_prefix(self, prefix: str) -> None:
        shutil.rmtree(self._path(prefix), ignore_errors=True)

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass

    def rename_prefix(self, src: str, dst: str) -> bool:
        """Atomically rename directory ``src`` to ``dst``; an existing ``dst`` is replaced.

        Raises: OSError when the rename fails.
        """
        src_p, dst_p = self._path(src), self._path(dst)
        trash: Path | None = None
        if dst_p.exists():
            trash = dst_p.with_name(f"{dst_p.name}.trash-{uuid.uuid4().hex[:8]}")
            os.rename(dst_p, trash)
        os.rename(src_p, dst_p)
        _fsync_dir(dst_p.parent)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
        return True

    def stat(self, key: str) -> tuple[int, float]:
        """(size in bytes, modification time as Unix seconds) of ``key``. Raises: BlobNotFound."""
        try:
            st = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            raise BlobNotFound(key) from None
        return st.st_size, st.st_mtime

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``key`` (a seek). Raises: BlobNotFound."""
        try:
            with self._path(key).open("rb") as fh:
                fh.seek(start)
                return fh.read(end - start)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise BlobNotFound(key) from None


def open_backend(uri: str) -> Backend:
    """Return the backend for ``uri``: a path, ``file://``, ``s3://``, ``gs://`` or another fsspec URL.

    Raises:
        StorageUnavailable: the scheme needs an SDK that is not installed.
        StorageError: the SDK failed to build a client (bad credentials file, bad endpoint).
    """
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        path = parsed.path if scheme == "file" else uri
        return LocalBackend(path)
    if scheme == "s3":
        return _guard("boto3", "pip install boto3", lambda: S3Backend(parsed.netloc, parsed.path))
    if scheme == "gs":
        try:
            return GCSBackend(parsed.netloc, parsed.path)
        except ImportError:
            return _guard("gcsfs", "pip install google-cloud-storage (or gcsfs)", lambda: FsspecBackend(uri))
        except Exception as exc:
            raise StorageError(f"cannot open {uri}: {exc}", remediation=_creds_hint(scheme), uri=uri) from exc
    return _guard("fsspec", f"pip install fsspec and the {scheme} implementation", lambda: FsspecBackend(uri))


def _guard(sdk: str, fix: str, build: Callable[[], Backend]) -> Backend:
    try:
        return build()
    except ImportError as exc:
        raise StorageUnavailable(
            f"checkpoint storage needs {sdk}, which is not importable ({exc})", remediation=fix, sdk=sdk
        ) from None
    except (StorageUnavailable, StorageError):
        raise
    except Exception as exc:
        raise StorageError(f"cannot open storage with {sdk}: {exc}", remediation=fix, sdk=sdk) from exc


def _creds_hint(scheme: str) -> str:
    if scheme == "s3":
        return "check AWS credentials (IRSA / AWS_PROFILE) and s3:PutObject/GetObject/ListBucket on the bucket"
    if scheme == "gs":
        return "check Workload Identity / GOOGLE_APPLICATION_CREDENTIALS and roles/storage.objectAdmin"
    return "check that the path exists and is writable by the training pod's user"


def credentials_hint(uri: str) -> str:
    """A remediation line for storage failures on ``uri``."""
    return _creds_hint(urlparse(uri).scheme.lower())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
