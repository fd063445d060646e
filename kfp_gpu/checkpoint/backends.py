"""Storage backends for checkpoints: local paths (and ``file://``), ``s3://``, ``gs://`` and any fsspec URL.

A backend is a flat key -> bytes store rooted at the checkpoint URI. Keys are ``/``-separated and relative
to that root. Cloud SDKs are imported lazily, inside :func:`open_backend`, so ``import kfp_gpu.checkpoint``
needs nothing beyond the standard library.

Endpoints: ``s3://`` honours ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (moto, MinIO); ``gs://``
honours ``STORAGE_EMULATOR_HOST`` (fake-gcs-server, :mod:`kfp_gpu.devcluster.gcs_profile`): google-cloud-storage
sends every call there, and :func:`gcs_client` gives it anonymous credentials and a placeholder project, so no
Google credentials (nor the metadata server) are looked up.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from kfp_gpu.checkpoint.errors import StorageError, StorageUnavailable

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
EMULATOR_PROJECT = "kfp-gpu-local"  # fake-gcs-server accepts any project id


class BlobNotFound(KeyError):
    """The key does not exist in the backend."""


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


class S3Backend:
    """An ``s3://bucket/prefix`` location through boto3. The marker object is the commit point."""

    def __init__(self, bucket: str, prefix: str, client: Any = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self._client = client if client is not None else _boto3_client()

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> None:
        """``metadata`` becomes the object's user metadata (``x-amz-meta-*``)."""
        extra = {"Metadata": dict(metadata)} if metadata else {}
        self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **extra)

    def get(self, key: str) -> bytes:
        """Raises: BlobNotFound for a missing key; botocore errors otherwise."""
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            if _s3_code(exc) in ("NoSuchKey", "404", "NotFound"):
                raise BlobNotFound(key) from None
            raise
        body: bytes = resp["Body"].read()
        return body

    def _iter_keys(self, prefix: str) -> Iterator[str]:
        full = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        strip = len(f"{self.prefix}/") if self.prefix else 0
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
            for obj in page.get("Contents", []):
                yield str(obj["Key"])[strip:]

    def list(self, prefix: str = "") -> list[str]:
        return sorted(self._iter_keys(prefix))

    def delete_prefix(self, prefix: str) -> None:
        keys = list(self._iter_keys(prefix.rstrip("/") + "/"))
        for i in range(0, len(keys), 1000):
            batch = [{"Key": self._key(k)} for k in keys[i : i + 1000]]
            self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

    def delete(self, key: str) -> None:
        self._client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def rename_prefix(self, src: str, dst: str) -> bool:
        return False


class GCSBackend:
    """A ``gs://bucket/prefix`` location through google-cloud-storage. The marker object is the commit point."""

    def __init__(self, bucket: str, prefix: str, client: Any = None, *, timeout: float | tuple[float, float] = 60.0,
                 retry: bool = True) -> None:
        """``timeout`` (seconds, or (connect, read)) bounds each request; ``retry=False`` makes one attempt
        (the preflight probe), else the SDK's default retries apply."""
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"gs://{bucket}/{self.prefix}".rstrip("/")
        self._bucket = (client if client is not None else gcs_client()).bucket(bucket)
        self._kw: dict[str, Any] = {"timeout": timeout, **({} if retry else {"retry": None})}

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> None:
        """``metadata`` becomes the object's custom metadata."""
        blob = self._bucket.blob(self._key(key))
        if metadata:
            blob.metadata = dict(metadata)
        blob.upload_from_string(data, content_type="application/octet-stream", **self._kw)

    def get(self, key: str) -> bytes:
        """Raises: BlobNotFound for a missing object; google.api_core errors otherwise."""
        try:
            data: bytes = self._bucket.blob(self._key(key)).download_as_bytes(**self._kw)
        except Exception as exc:
            if type(exc).__name__ == "NotFound" or getattr(exc, "code", None) == 404:
                raise BlobNotFound(key) from None
            raise
        return data

    def list(self, prefix: str = "") -> list[str]:
        full = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        strip = len(f"{self.prefix}/") if self.prefix else 0
        return sorted(str(b.name)[strip:] for b in self._bucket.list_blobs(prefix=full, **self._kw))

    def delete_prefix(self, prefix: str) -> None:
        for key in self.list(prefix.rstrip("/") + "/"):
            self.delete(key)

    def delete(self, key: str) -> None:
        try:
            self._bucket.blob(self._key(key)).delete(**self._kw)
        except Exception as exc:
            if type(exc).__name__ != "NotFound":
                raise

    def rename_prefix(self, src: str, dst: str) -> bool:
        return False


class FsspecBackend:
    """Any fsspec URL (``gs://`` via gcsfs when google-cloud-storage is missing, ``memory://`` in tests)."""

    def __init__(self, uri: str) -> None:
        import fsspec  # lazy: optional dependency

        self.uri = uri.rstrip("/")
        self._fs, root = fsspec.core.url_to_fs(self.uri)
        self._root = str(root).rstrip("/")

    def _key(self, key: str) -> str:
        return f"{self._root}/{key}"

    def put(self, key: str, data: bytes) -> None:
        self._fs.pipe_file(self._key(key), data)

    def get(self, key: str) -> bytes:
        """Raises: BlobNotFound for a missing key; filesystem errors otherwise."""
        try:
            data: bytes = self._fs.cat_file(self._key(key))
        except FileNotFoundError:
            raise BlobNotFound(key) from None
        return data

    def list(self, prefix: str = "") -> list[str]:
        base = self._key(prefix).rstrip("/") if prefix else self._root
        try:
            found = self._fs.find(base)
        except FileNotFoundError:
            return []
        strip = len(self._root.lstrip("/")) + 1
        return sorted(str(p).lstrip("/")[strip:] for p in found)

    def delete_prefix(self, prefix: str) -> None:
        path = self._key(prefix.rstrip("/"))
        if self._fs.exists(path):
            self._fs.rm(path, recursive=True)

    def delete(self, key: str) -> None:
        try:
            self._fs.rm_file(self._key(key))
        except FileNotFoundError:
            pass

    def rename_prefix(self, src: str, dst: str) -> bool:
        return False


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


def _boto3_client(config: Any = None) -> Any:
    import boto3  # lazy: optional dependency

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
    return boto3.client("s3", endpoint_url=endpoint, config=config)


def emulator_host(environ: Mapping[str, str] | None = None) -> str | None:
    """The GCS emulator URL from ``STORAGE_EMULATOR_HOST`` (None when unset or blank)."""
    env = os.environ if environ is None else environ
    return (env.get(EMULATOR_ENV) or "").strip() or None


def gcs_client() -> Any:
    """A ``google.cloud.storage.Client``. With ``STORAGE_EMULATOR_HOST`` set: pointed at the emulator with
    anonymous credentials and the project ``$GOOGLE_CLOUD_PROJECT`` (else :data:`EMULATOR_PROJECT`); otherwise
    Application Default Credentials (Workload Identity, ``GOOGLE_APPLICATION_CREDENTIALS``).

    Raises: ImportError (google-cloud-storage missing); google.auth errors (no credentials outside the emulator).
    """
    import importlib

    storage = importlib.import_module("google.cloud.storage")  # lazy: optional dependency
    if emulator_host() is None:
        return storage.Client()
    anonymous = importlib.import_module("google.auth.credentials").AnonymousCredentials
    project = os.environ.get("GOOGLE_CLOUD_PROJECT") or EMULATOR_PROJECT
    return storage.Client(project=project, credentials=anonymous())


def _s3_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


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
