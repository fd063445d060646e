"""Preflight writability probe for a checkpoint URI: write a small labelled object, read it back, delete it.

:func:`probe` answers with a :class:`ProbeResult` whose ``status`` is

- ``ok``: the object was written, read back byte-identical and deleted (proven, and only then);
- ``denied``: the store refused (HTTP 403); the reason names the bucket and the permission the phase needs
  (``storage.objects.create`` / ``.get`` / ``.delete`` for gs://, ``s3:PutObject`` / ``GetObject`` / ``DeleteObject``);
  or it rejected the credentials themselves (HTTP 401, ``InvalidAccessKeyId``, ``SignatureDoesNotMatch``...);
- ``missing``: the bucket does not exist (404 / ``NoSuchBucket``);
- ``failed``: the store answered wrongly (read back other bytes, the object vanished, a local path not writable);
- ``unknown``: the store could not be asked (unreachable endpoint, no credentials, timeouts, 5xx, an SDK missing).

The object is ``<uri>/.kfp-gpu-probe-<run id>`` (one per run: a retried preflight overwrites it) with the metadata
``kfp-gpu-run-id``, ``kfp-gpu-step: preflight`` and ``kfp-gpu-lease-expires`` (an hour on), so one left behind by a
crash between write and delete names its owner. Object-store requests are bounded (5 s connect, 20 s read) and made
once, without the SDKs' retries: a probe answers within seconds.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlparse

from kfp_gpu.checkpoint.backends import Backend, BlobNotFound, credentials_hint, open_backend
from kfp_gpu.checkpoint.errors import CheckpointError, StorageUnavailable

OK, DENIED, MISSING, FAILED, UNKNOWN = "ok", "denied", "missing", "failed", "unknown"
TIMEOUT = (5.0, 20.0)
PERMISSIONS = {
    "gs": {"write": "storage.objects.create", "read": "storage.objects.get", "delete": "storage.objects.delete"},
    "s3": {"write": "s3:PutObject", "read": "s3:GetObject", "delete": "s3:DeleteObject"},
}
REJECTED_CREDENTIALS = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken")
ROLE_HINT = {
    "gs": "grant the step's and the training pods' identity roles/storage.objectUser (or objectAdmin) on gs://{b}",
    "s3": "allow s3:PutObject, s3:GetObject, s3:DeleteObject and s3:ListBucket on arn:aws:s3:::{b} to the role",
}


@dataclass(frozen=True)
class ProbeResult:
    status: str
    reason: str
    remediation: str = ""

    @property
    def ok(self) -> bool:
        return self.status == OK


def probe_key(run_id: str = "") -> str:
    """The probe object's key under the checkpoint URI (deterministic per run id, random without one)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "-", run_id)[:63].strip("-.")
    return f".kfp-gpu-probe-{safe or uuid.uuid4().hex[:12]}"


def probe_metadata(run_id: str, now: float) -> dict[str, str]:
    """The probe object's ownership metadata (header-safe keys: S3 sends them as ``x-amz-meta-*``)."""
    expires = datetime.fromtimestamp(now, timezone.utc) + timedelta(hours=1)
    return {"kfp-gpu-run-id": run_id or "unknown", "kfp-gpu-step": "preflight",
            "kfp-gpu-lease-expires": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a google.api_core / botocore error, or None (a connection error, a local error)."""
    code = getattr(exc, "code", None)
    if isinstance(code, int) and 100 <= code < 600:
        return code
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    return None


def _s3_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, Mapping) else ""


def classify(uri: str, phase: str, exc: BaseException) -> ProbeResult:
    """The verdict for ``exc`` raised by the ``phase`` (write, read, delete) of the probe on ``uri``: pure."""
    parsed = urlparse(uri)
    scheme, bucket = parsed.scheme.lower(), parsed.netloc
    status, code = http_status(exc), _s3_code(exc)
    what = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}".rstrip(": ")
    if scheme in PERMISSIONS and (status == 401 or code in REJECTED_CREDENTIALS):
        return ProbeResult(DENIED, f"{scheme}://{bucket}: the store rejected the credentials at the {phase} of the "
                                   f"probe object ({what})", credentials_hint(uri))
    if scheme in PERMISSIONS and (status == 403 or code in ("AccessDenied", "AllAccessDisabled")):
        perm = PERMISSIONS[scheme][phase]
        return ProbeResult(DENIED, f"{scheme}://{bucket}: {phase} of the probe object denied, missing permission "
                                   f"{perm} ({what})", ROLE_HINT[scheme].format(b=bucket))
    if scheme in PERMISSIONS and phase == "write" and (status == 404 or code == "NoSuchBucket"):
        return ProbeResult(MISSING, f"{scheme}://{bucket}: the bucket does not exist ({what})",
                           f"create the bucket {bucket} or change checkpoint_uri")
    if isinstance(exc, OSError) and scheme in ("", "file"):
        return ProbeResult(FAILED, f"cannot write {uri}: {type(exc).__name__}: {exc.strerror or exc}",
                           "fix the directory permissions or change checkpoint_uri")
    return ProbeResult(UNKNOWN, f"{uri}: could not {phase} the probe object ({what})", credentials_hint(uri))


def probe(uri: str, *, run_id: str = "", backend: Backend | None = None, now: float | None = None) -> ProbeResult:
    """Write a small object with the run's metadata under ``uri``, read it back, delete it. Never raises.

    ``backend`` replaces the one built from ``uri`` (tests); object stores get bounded, single-attempt requests.
    """
    key = probe_key(run_id)
    now = time.time() if now is None else now
    data = f"kfp-gpu writability probe run={run_id or '-'} at={now:.3f} nonce={uuid.uuid4().hex}".encode()
    target = f"{uri.rstrip('/')}/{key}"
    try:
        store = backend if backend is not None else _open(uri)
    except CheckpointError as exc:
        return ProbeResult(UNKNOWN, f"{uri}: {exc.message}", exc.remediation)
    except Exception as exc:  # noqa: BLE001 - a probe reports, it never raises
        return classify(uri, "write", exc)
    phase = "write"
    try:
        if _takes_metadata(store):
            store.put(key, data, metadata=probe_metadata(run_id, now))  # type: ignore[call-arg]
        else:
            store.put(key, data)
        phase = "read"
        back = store.get(key)
        phase = "delete"
        store.delete(key)
    except BlobNotFound:
        return ProbeResult(FAILED, f"wrote {target} but reading it back found nothing", credentials_hint(uri))
    except Exception as exc:  # noqa: BLE001
        return classify(uri, phase, exc)
    if back != data:
        return ProbeResult(FAILED, f"wrote {target} but read back different bytes", credentials_hint(uri))
    return ProbeResult(OK, f"wrote, read back and deleted {target}")


def _takes_metadata(store: Any) -> bool:
    from kfp_gpu.checkpoint.backends import GCSBackend, S3Backend

    return isinstance(store, (GCSBackend, S3Backend))


def _open(uri: str) -> Backend:
    """The backend for ``uri`` with bounded, single-attempt requests for object stores.

    Raises: CheckpointError (SDK missing, client cannot be built); SDK errors.
    """
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme == "gs":
        from kfp_gpu.checkpoint.backends import GCSBackend

        try:
            return GCSBackend(parsed.netloc, parsed.path, timeout=TIMEOUT, retry=False)
        except ImportError:
            raise StorageUnavailable("checkpoint storage needs google-cloud-storage, which is not importable",
                                     remediation="pip install google-cloud-storage", sdk="google-cloud-storage") from None
    if scheme == "s3":
        from kfp_gpu.checkpoint.object_backends import S3Backend, _boto3_client

        try:
            from botocore.config import Config
        except ImportError:
            raise StorageUnavailable("checkpoint storage needs boto3, which is not importable",
                                     remediation="pip install boto3", sdk="boto3") from None
        config = Config(connect_timeout=TIMEOUT[0], read_timeout=TIMEOUT[1], retries={"max_attempts": 1})
        return S3Backend(parsed.netloc, parsed.path, client=_boto3_client(config))
    return open_backend(uri)


def probe_writable(uri: str, run_id: str = "") -> tuple[bool, str]:
    """:func:`probe` as ``(ok, reason)``; a remediation is appended as ``fix: ...``. Never raises."""
    res = probe(uri, run_id=run_id)
    return res.ok, res.reason + (f"\n  fix: {res.remediation}" if res.remediation and not res.ok else "")
