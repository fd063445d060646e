"""Object-store backends for checkpoints: ``s3://`` (boto3), ``gs://`` (google-cloud-storage) and any fsspec URL.

They implement :class:`kfp_gpu.checkpoint.backends.Backend`; :func:`kfp_gpu.checkpoint.backends.open_backend` picks
one. The SDKs are imported lazily, when a backend is built.

Endpoints: ``s3://`` honours ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (moto, MinIO); ``gs://``
honours ``STORAGE_EMULATOR_HOST`` (fake-gcs-server, :mod:`kfp_gpu_rehearsal.devcluster.gcs_profile`): google-cloud-storage
sends every call there, and :func:`gcs_client` gives it anonymous credentials and a placeholder project, so no
Google credentials (nor the metadata server) are looked up.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from kfp_gpu.checkpoint.errors import BlobNotFound

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
EMULATOR_PROJECT = "kfp-gpu-local"  # fake-gcs-server accepts any project id


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

    def stat(self, key: str) -> tuple[int, float]:
        """(size in bytes, modification time as Unix seconds) of ``key``. Raises: BlobNotFound; botocore errors."""
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            if _s3_code(exc) in ("NoSuchKey", "404", "NotFound"):
                raise BlobNotFound(key) from None
            raise
        return int(head["ContentLength"]), float(head["LastModified"].timestamp())

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``key`` (an HTTP Range GET). Raises: BlobNotFound; botocore errors."""
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=self._key(key), Range=f"bytes={start}-{end - 1}")
        except Exception as exc:
            if _s3_code(exc) in ("NoSuchKey", "404", "NotFound", "InvalidRange"):
                raise BlobNotFound(key) from None
            raise
        body: bytes = resp["Body"].read()
        return body


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

    def stat(self, key: str) -> tuple[int, float]:
        """(size in bytes, modification time as Unix seconds) of ``key``. Raises: BlobNotFound; google errors."""
        blob = self._bucket.get_blob(self._key(key), **self._kw)
        if blob is None:
            raise BlobNotFound(key)
        return int(blob.size or 0), float(blob.updated.timestamp()) if blob.updated else 0.0

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``key`` (a ranged download). Raises: BlobNotFound; google errors."""
        try:
            data: bytes = self._bucket.blob(self._key(key)).download_as_bytes(start=start, end=end - 1, **self._kw)
        except Exception as exc:
            if type(exc).__name__ == "NotFound" or getattr(exc, "code", None) == 404:
                raise BlobNotFound(key) from None
            raise
        return data


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

    def stat(self, key: str) -> tuple[int, float]:
        """(size in bytes, modification time as Unix seconds, 0.0 when the filesystem has none) of ``key``.
        Raises: BlobNotFound; filesystem errors."""
        try:
            info = self._fs.info(self._key(key))
        except FileNotFoundError:
            raise BlobNotFound(key) from None
        when = info.get("mtime") or info.get("LastModified") or info.get("updated") or info.get("created")
        return int(info.get("size") or 0), when.timestamp() if isinstance(when, datetime) else float(when or 0.0)

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``key``. Raises: BlobNotFound; filesystem errors."""
        try:
            part: bytes = self._fs.cat_file(self._key(key), start=start, end=end)
        except FileNotFoundError:
            raise BlobNotFound(key) from None
        return part


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
