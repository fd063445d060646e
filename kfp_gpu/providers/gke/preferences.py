"""Cloud Quotas QuotaPreferences as the API accepts them: one per (quota id, dimensions), updated in place.

Rules (Cloud Quotas v1, https://cloud.google.com/docs/quotas/reference/rest/v1/projects.locations.quotaPreferences):

- "There is only one QuotaPreference resource for a quota value targeting a unique set of dimensions":
  the preference id is derived from (quota id, dimensions) only, never from the value, and a new value
  patches the existing preference (``.../quotaPreferences/patch``, with its ``etag`` and an update mask).
- ``contactEmail`` is required when requesting an increase (the field's reference text); it is input
  only, so every increase carries it again.
- A create that meets an existing preference answers 409 ALREADY_EXISTS; it is resolved by reading the
  existing preference (by id, else by listing for the same quota id and dimensions) and patching it.
- A patch whose ``etag`` is stale answers ABORTED; the attempt is retried from a fresh read.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any, NoReturn

from kfp_gpu import retry as retry_mod
from kfp_gpu.errors import InvalidSpec, KfpGpuError, NotFound, PermissionDenied, TransientCloudError

if TYPE_CHECKING:
    from kfp_gpu.providers.gke.provider import GkeProvider

CONTACT_EMAIL_ENV = "KFP_GPU_QUOTA_CONTACT_EMAIL"
SERVICE = "compute.googleapis.com"
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_MASK = ["quota_config.preferred_value", "justification", "contact_email"]


def check_contact_email(email: str) -> str:
    """The contact email an increase request must carry.

    Raises:
        InvalidSpec: empty or not an email address, naming ``contact_email`` and how to set it.
    """
    fix = f"pass --contact-email you@example.com to `kfp-gpu quota request`/`plan --file`, or set {CONTACT_EMAIL_ENV}"
    if not email:
        raise InvalidSpec("contact_email", email, "Cloud Quotas requires a contact email for a quota increase",
                          remediation=fix)
    if not _EMAIL.match(email):
        raise InvalidSpec("contact_email", email, "is not an email address", remediation=fix)
    return email


def preference_id(quota_id: str, dims: dict[str, str]) -> str:
    """The one preference id for (quota id, dimensions): lowercase, [a-z0-9-], at most 63 characters."""
    raw = "-".join(["kfpgpu", quota_id, *(dims[k] for k in sorted(dims))])
    pid = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    if len(pid) > 63:
        pid = pid[:54].rstrip("-") + "-" + hashlib.sha256(raw.encode()).hexdigest()[:8]
    return pid


def upsert(p: GkeProvider, quota_id: str, dims: dict[str, str], value: int, justification: str, email: str,
           *, region: str) -> str:
    """Make the preference for (quota id, dims) ask for ``value``; returns its resource name.

    Idempotent: the same value again writes nothing; a new value patches the same preference.

    Raises: InvalidSpec (contact email), PermissionDenied (needs cloudquotas.quotas.update), CloudError.
    """
    check_contact_email(email)
    parent = f"projects/{p.project}/locations/global"
    name = f"{parent}/quotaPreferences/{preference_id(quota_id, dims)}"

    def attempt() -> str:
        existing = _read(p, name, region) or _find(p, parent, quota_id, dims, region)
        if existing is None:
            created = _create(p, parent, name, quota_id, dims, value, justification, email, region)
            if created is not None:
                return created
            existing = _read(p, name, region) or _find(p, parent, quota_id, dims, region)
            if existing is None:  # a 409 for a preference nobody can read yet: read again
                raise TransientCloudError(f"QuotaPreference {name} exists but cannot be read yet")
        if int(existing.quota_config.preferred_value) == value:
            return str(existing.name)
        return _patch(p, existing, value, justification, email, region)

    return retry_mod.call(attempt, policy=p.retry, what=f"quotaPreferences upsert {name}")


def _read(p: GkeProvider, name: str, region: str) -> Any:
    try:
        return p._call("quotas", "get_quota_preference", at_region=region, once=True, name=name)
    except NotFound:
        return None


def _find(p: GkeProvider, parent: str, quota_id: str, dims: dict[str, str], region: str) -> Any:
    """A preference for the same quota and dimensions under another id (made in the console, say)."""
    pager = p._call("quotas", "list_quota_preferences", at_region=region, once=True, parent=parent)
    for pref in pager:
        if pref.service == SERVICE and pref.quota_id == quota_id and dict(pref.dimensions) == dims:
            return pref
    return None


def _raise(p: GkeProvider, exc: Exception, region: str) -> NoReturn:
    err = p.classify(exc, region=region)
    if isinstance(err, PermissionDenied) and not err.fields.get("permission"):
        err.fields["permission"] = "cloudquotas.quotas.update"
    raise err from exc


def _create(p: GkeProvider, parent: str, name: str, quota_id: str, dims: dict[str, str], value: int,
            justification: str, email: str, region: str) -> str | None:
    """The created preference's name; None when it already exists (409)."""
    from google.cloud import cloudquotas_v1

    pref = cloudquotas_v1.QuotaPreference(
        service=SERVICE, quota_id=quota_id, dimensions=dims, justification=justification, contact_email=email,
        quota_config=cloudquotas_v1.QuotaConfig(preferred_value=value))
    try:
        made = p.client("quotas").create_quota_preference(
            parent=parent, quota_preference=pref, quota_preference_id=name.rsplit("/", 1)[1],
            retry=None, timeout=p.timeout)
    except KfpGpuError:
        raise
    except Exception as exc:  # noqa: BLE001 - classified below
        if getattr(exc, "code", 0) == 409:
            return None
        _raise(p, exc, region)
    return str(made.name)


def _patch(p: GkeProvider, existing: Any, value: int, justification: str, email: str, region: str) -> str:
    from google.cloud import cloudquotas_v1
    from google.protobuf import field_mask_pb2

    pref = cloudquotas_v1.QuotaPreference(
        name=existing.name, etag=existing.etag, justification=justification, contact_email=email,
        quota_config=cloudquotas_v1.QuotaConfig(preferred_value=value))
    try:
        done = p.client("quotas").update_quota_preference(
            quota_preference=pref, update_mask=field_mask_pb2.FieldMask(paths=_MASK),
            retry=None, timeout=p.timeout)
    except Exception as exc:  # noqa: BLE001 - classified below
        if getattr(exc, "code", 0) == 409:  # ABORTED: the etag moved; the loop re-reads and patches again
            raise TransientCloudError(f"QuotaPreference {existing.name} changed meanwhile (etag): {exc}") from exc
        _raise(p, exc, region)
    return str(done.name)
