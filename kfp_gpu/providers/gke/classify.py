"""GKE / Compute / Cloud Quotas error -> kfp-gpu error, by an explicit table.

The cloud speaks in three dialects: HTTP errors from the REST transports (``exc.code`` = HTTP
status, ``exc.errors[].reason``, ``exc.reason`` from ErrorInfo), Compute Operation errors
(``error.errors[].code``) and GKE Operation errors (``error`` google.rpc.Status, ``statusMessage``,
``nodepoolConditions[].code``). All three are flattened into a :class:`Fault` (status, tokens,
message, url) and looked up here. No google import happens at module import time.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from kfp_gpu import accelerators, iam
from kfp_gpu.errors import (
    CapacityUnavailable,
    CloudError,
    KfpGpuError,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    RateLimited,
    Scope,
    TransientCloudError,
)
from kfp_gpu.retry import parse_retry_after

log = logging.getLogger(__name__)

# The error -> scope table. Keys are Compute error codes / reasons, GKE condition codes and
# ErrorInfo reasons; the first token of a fault found here decides.
ERROR_SCOPES: dict[str, tuple[type[KfpGpuError], Scope]] = {
    # zone: no stock in this zone, try the next one
    "ZONE_RESOURCE_POOL_EXHAUSTED": (CapacityUnavailable, Scope.ZONE),
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": (CapacityUnavailable, Scope.ZONE),
    "insufficientCapacity": (CapacityUnavailable, Scope.ZONE),
    "GCE_STOCKOUT": (CapacityUnavailable, Scope.ZONE),
    "resource_availability": (CapacityUnavailable, Scope.ZONE),
    # region: a regional quota metric is exhausted (GPUS_ALL_REGIONS is promoted to provider below)
    "QUOTA_EXCEEDED": (QuotaExceeded, Scope.REGION),
    "quotaExceeded": (QuotaExceeded, Scope.REGION),
    "GCE_QUOTA_EXCEEDED": (QuotaExceeded, Scope.REGION),
    # provider: the project-wide GPU quota
    f"QUOTA_EXCEEDED:{accelerators.GCP_ALL_REGIONS_METRIC}": (QuotaExceeded, Scope.PROVIDER),
    # transient: back off and retry the same call
    "rateLimitExceeded": (RateLimited, Scope.NONE),
    "userRateLimitExceeded": (RateLimited, Scope.NONE),
    "RATE_LIMIT_EXCEEDED": (RateLimited, Scope.NONE),
    "RESOURCE_OPERATION_RATE_EXCEEDED": (RateLimited, Scope.NONE),
    "backendError": (TransientCloudError, Scope.NONE),
    "BACKEND_ERROR": (TransientCloudError, Scope.NONE),
    # Compute 400 while another operation changes the instance group ("The resource '...' is not ready")
    "resourceNotReady": (TransientCloudError, Scope.NONE),
}

# HTTP status -> (error, scope) when no token matched.
HTTP_SCOPES: dict[int, tuple[type[KfpGpuError], Scope]] = {
    401: (PermissionDenied, Scope.PROVIDER),
    403: (PermissionDenied, Scope.PROVIDER),
    404: (NotFound, Scope.ZONE),
    429: (RateLimited, Scope.NONE),
    500: (TransientCloudError, Scope.NONE),
    502: (TransientCloudError, Scope.NONE),
    503: (TransientCloudError, Scope.NONE),
    504: (TransientCloudError, Scope.NONE),
}

# Message patterns for faults that carry no code (GKE's "incompatible operation" is a 400).
MESSAGE_SCOPES: tuple[tuple[re.Pattern[str], type[KfpGpuError], Scope], ...] = (
    (re.compile(r"incompatible operation|currently operating on|try again once it is done|"
                r"The resource '[^']+' is not ready", re.I),
     TransientCloudError, Scope.NONE),
    (re.compile(r"does not have enough resources available", re.I), CapacityUnavailable, Scope.ZONE),
    (re.compile(r"insufficient (regional )?quota|quota '[A-Z0-9_]+' exceeded", re.I), QuotaExceeded, Scope.REGION),
)

_METRIC_RE = re.compile(r"Quota '([A-Za-z0-9_.\- ()]+?)' exceeded|resource \"([A-Z0-9_]+)\"")
# "Required 'compute.x.y' permission for '...'" (Compute, GKE), "Permission 'x.y.z' denied on resource" (newer APIs)
_PERMISSION_RE = re.compile(r"Required ['\"]([a-z]+\.[A-Za-z]+\.[A-Za-z]+)['\"] permission|"
                            r"Permission ['\"]([a-z]+\.[A-Za-z]+\.[A-Za-z]+)['\"] denied")
_STAND_IN_401 = ("; against the local stand-in ({endpoint}) set {env} to its controller token (docs/sim.md, "
                 "\"Credentials and IAM\"): it refuses anonymous and unknown tokens (HTTP 401) as Google does")
_URL_RE = re.compile(r"\b(GET|POST|DELETE|PATCH) (https?://\S+?):? ")


@dataclass
class Fault:
    """A cloud error flattened to what classification needs."""

    message: str
    status: int = 0  # HTTP status, 0 for operation errors
    tokens: list[str] = field(default_factory=list)
    metric: str = ""
    method: str = ""
    url: str = ""


def fault_from_exception(exc: BaseException) -> Fault:
    """Flatten a google.api_core / google.auth / requests exception."""
    message = str(getattr(exc, "message", "") or exc)
    status = getattr(exc, "code", 0)
    status = status if isinstance(status, int) else 0
    tokens: list[str] = []
    metric = ""
    for e in getattr(exc, "errors", None) or []:
        if isinstance(e, dict):
            tokens += [str(e.get("reason", "")), str(e.get("code", ""))]
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason:
        tokens.append(reason)
    meta = getattr(exc, "metadata", None)
    if isinstance(meta, dict):
        metric = str(meta.get("metric", "") or meta.get("quota_metric", ""))
    text = str(exc)
    m = _URL_RE.search(text)
    method, url = (m.group(1), m.group(2)) if m else ("", "")
    return Fault(message, status, [t for t in tokens if t], metric or metric_in(message), method, url)


def fault_from_gke_operation(op: Any) -> Fault | None:
    """Flatten a container_v1.Operation, or None when it carries no error."""
    err = getattr(op, "error", None)
    code = int(getattr(err, "code", 0) or 0) if err is not None else 0
    conditions = list(getattr(op, "nodepool_conditions", []) or []) + list(getattr(op, "cluster_conditions", []) or [])
    status_message = str(getattr(op, "status_message", "") or "")
    if not code and not conditions and not status_message:
        return None
    message = (getattr(err, "message", "") if err is not None else "") or status_message
    tokens = [_enum_name(c.code) for c in conditions]
    tokens += [t for t in re.findall(r"\b[A-Z][A-Z_]{5,}\b", f"{message} {status_message}") if t in ERROR_SCOPES]
    return Fault(str(message), 0, [t for t in tokens if t and t != "UNKNOWN"], metric_in(str(message)))


def fault_from_compute_operation(op: Any) -> Fault | None:
    """Flatten a compute_v1.Operation, or None when it carries no error."""
    errors = list(getattr(getattr(op, "error", None), "errors", []) or [])
    if not errors:
        return None
    tokens = [str(e.code) for e in errors]
    metric = ""
    for e in errors:
        for d in getattr(e, "error_details", []) or []:
            qi = getattr(d, "quota_info", None)
            name = str(getattr(qi, "metric_name", "") or "") if qi is not None else ""
            if name:
                metric = name.rsplit("/", 1)[-1].upper()
    message = "; ".join(f"{e.code}: {e.message}" for e in errors)
    return Fault(message, int(getattr(op, "http_error_status_code", 0) or 0), tokens,
                 metric or metric_in(message))


def classify_fault(f: Fault, *, zone: str = "", region: str = "", permission: str = "") -> KfpGpuError:
    """The classified kfp-gpu error for ``f`` (never raises)."""
    where = {"zone": zone, "region": region}
    for token in f.tokens:
        key = token
        if token in ("QUOTA_EXCEEDED", "quotaExceeded", "GCE_QUOTA_EXCEEDED") and (
            f.metric == accelerators.GCP_ALL_REGIONS_METRIC or accelerators.GCP_ALL_REGIONS_METRIC in f.message
        ):
            key = f"QUOTA_EXCEEDED:{accelerators.GCP_ALL_REGIONS_METRIC}"
        if key in ERROR_SCOPES:
            cls, scope = ERROR_SCOPES[key]
            return _build(cls, scope, f, token, where, permission)
    for rx, cls, scope in MESSAGE_SCOPES:
        if rx.search(f.message):
            if cls is QuotaExceeded and accelerators.GCP_ALL_REGIONS_METRIC in f.message:
                scope = Scope.PROVIDER
            return _build(cls, scope, f, rx.pattern, where, permission)
    if f.status in HTTP_SCOPES:
        cls, scope = HTTP_SCOPES[f.status]
        if cls is NotFound and "/regions/" in f.url + f.message:
            scope = Scope.REGION
        return _build(cls, scope, f, f"HTTP {f.status}", where, permission)
    narrowest = Scope.ZONE if zone else (Scope.REGION if region else Scope.PROVIDER)
    log.warning("unclassified GKE/Compute error (scope %s): %s", narrowest.value, f.message)
    return CloudError(
        f"unrecognised cloud error: {f.message}", scope=narrowest,
        remediation="see the verbatim cloud message; report it so the error table can learn it",
        status=f.status, tokens=f.tokens, zone=where["zone"], region=where["region"],
    )


def classify_exception(exc: BaseException, *, zone: str = "", region: str = "", endpoint: str = "") -> Exception:
    """A raw google.api_core / google.auth / requests exception as a KfpGpuError (never raises).

    A ``Retry-After`` header of the REST response (``exc.response``) becomes the ``retry_after_s`` field.
    """
    if isinstance(exc, KfpGpuError):
        return exc
    from google.auth.exceptions import DefaultCredentialsError, RefreshError, TransportError

    if isinstance(exc, (DefaultCredentialsError, RefreshError)):  # a 401 makes google-auth refresh: this
        fix = "run `gcloud auth application-default login` or fix GOOGLE_APPLICATION_CREDENTIALS"
        if endpoint.startswith("http://"):
            fix += _STAND_IN_401.format(endpoint=endpoint, env=iam.SIM_GCP_TOKEN_ENV)
        return PermissionDenied(f"Google Cloud credentials are missing or expired: {exc}", remediation=fix)
    if isinstance(exc, (TransportError, ConnectionError, TimeoutError)) or type(exc).__module__.startswith("requests"):
        return TransientCloudError(f"cannot reach {endpoint or 'the Google APIs'}: {exc}",
                                   remediation="retry; check network/endpoint")
    err = classify_fault(fault_from_exception(exc), zone=zone, region=region)
    if isinstance(err, PermissionDenied) and err.fields.get("status") == 401 and endpoint.startswith("http://"):
        err = PermissionDenied(err.message, scope=err.scope, **err.fields, remediation=err.remediation +
                               _STAND_IN_401.format(endpoint=endpoint, env=iam.SIM_GCP_TOKEN_ENV))
    headers = getattr(getattr(exc, "response", None), "headers", None)  # requests.Response of the REST call
    wait = parse_retry_after(headers.get("Retry-After") if headers is not None else None)
    if wait is not None:
        err.fields["retry_after_s"] = wait
    return err


def permission_for(method: str, url: str, message: str = "") -> str:
    """The IAM permission a refused call needed: named by Google's message, else :data:`kfp_gpu.iam.GCP_CALLS`."""
    m = _PERMISSION_RE.search(message)
    if m:
        return m.group(1) or m.group(2)
    return iam.gcp_permission(method, url) if method and url else ""


def _build(
    cls: type[KfpGpuError], scope: Scope, f: Fault, code: str, where: dict[str, str], permission: str,
) -> KfpGpuError:
    loc = where["zone"] or where["region"] or "the project"
    if cls is CapacityUnavailable:
        return CapacityUnavailable(
            f"GCE stockout in {loc} ({code}): {f.message}", scope=scope, code=code,
            remediation="fail over to another zone, use a reservation, or retry later", zone=where["zone"], region=where["region"],
        )
    if cls is QuotaExceeded:
        metric = f.metric or "the GPU quota"
        wide = "all regions" if scope is Scope.PROVIDER else (where["region"] or "this region")
        return QuotaExceeded(
            f"quota {metric} exceeded in {wide}: {f.message}", scope=scope, code=code, metric=metric,
            remediation=f"request more {metric} quota (kfp-gpu quota request / Cloud Console > IAM & Admin > "
            "Quotas; typical lead time 1-3 business days) or choose a region with free quota",
            zone=where["zone"], region=where["region"],
        )
    if cls is PermissionDenied:
        perm = permission or permission_for(f.method, f.url, f.message)
        text = " ".join(f.message.split())  # one line
        if f.status == 401:
            return PermissionDenied(f"GCP refused the credentials (HTTP 401): {text}", scope=scope, status=f.status,
                                    remediation="refresh credentials: gcloud auth application-default login (or "
                                    "set GOOGLE_APPLICATION_CREDENTIALS)", permission=perm)
        fix = iam.gcp_fix(perm) if perm else \
            "grant the caller the missing IAM permission named in the message (docs/rbac-iam.md)"
        what = f"missing IAM permission {perm}" if perm else "permission denied"
        return PermissionDenied(f"GCP denied the call, {what} (HTTP {f.status}): {text}", scope=scope,
                                remediation=fix, permission=perm, status=f.status)
    if cls is NotFound:
        return NotFound(f"not found: {f.message}", scope=scope, status=f.status,
                        remediation="check project, region/location, cluster and node pool names", zone=where["zone"], region=where["region"])
    if cls is RateLimited:
        return RateLimited(f"GCP API rate limit ({code}): {f.message}", code=code,
                           remediation="retry with back-off; lower request concurrency", zone=where["zone"], region=where["region"])
    return cls(f"transient GCP error ({code}): {f.message}", scope=scope, code=code,
               remediation="retry with back-off", zone=where["zone"], region=where["region"])


def metric_in(message: str) -> str:
    """The quota metric a Google error message names ('' if none)."""
    m = _METRIC_RE.search(message)
    return (m.group(1) or m.group(2) or "") if m else ""


def _enum_name(value: Any) -> str:
    return str(getattr(value, "name", value))
