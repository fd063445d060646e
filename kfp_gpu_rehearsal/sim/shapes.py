"""JSON shapes of the real Google APIs (camelCase, as the google-cloud-* REST transports expect).

Only builders live here: no state, no I/O. int64/uint64 fields are rendered as JSON strings, the
way Google's REST frontends send them.
"""

from __future__ import annotations

import datetime
import itertools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kfp_gpu_rehearsal.sim.scenario import PoolSpec

COMPUTE = "https://www.googleapis.com/compute/v1"
CONTAINER = "https://container.googleapis.com/v1"
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"

# HTTP status -> (google.rpc canonical status name, numeric google.rpc.Code, Compute errors[].reason)
_STATUS: dict[int, tuple[str, int, str]] = {
    400: ("INVALID_ARGUMENT", 3, "invalid"),
    401: ("UNAUTHENTICATED", 16, "authError"),
    403: ("PERMISSION_DENIED", 7, "forbidden"),
    404: ("NOT_FOUND", 5, "notFound"),
    409: ("ALREADY_EXISTS", 6, "alreadyExists"),
    412: ("FAILED_PRECONDITION", 9, "conditionNotMet"),
    429: ("RESOURCE_EXHAUSTED", 8, "rateLimitExceeded"),
    500: ("INTERNAL", 13, "backendError"),
    503: ("UNAVAILABLE", 14, "backendError"),
}
_DEFAULT_MESSAGES = {
    401: "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or "
    "other valid authentication credential.",
    403: "The caller does not have permission",
    429: "Rate Limit Exceeded",
    500: "Internal error. Please try again or contact Google Support.",
    503: "The service is currently unavailable.",
}
_ids = itertools.count(1_000_000_000_001)


class SimHttpError(Exception):
    """An HTTP error response with a Google-shaped JSON body."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {body.get('error', {}).get('message', '')}")
        self.status = status
        self.body = body
        self.headers: dict[str, str] = {}  # extra response headers (Retry-After)


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def next_id() -> str:
    return str(next(_ids))


def http_error(
    status: int,
    message: str = "",
    *,
    reason: str = "",
    domain: str = "",
    metadata: dict[str, str] | None = None,
) -> SimHttpError:
    """An error in the union of the Compute (``errors[]``) and google.rpc.Status (``details``) shapes.

    ``reason`` is both the Compute ``errors[].reason`` and the ErrorInfo reason, so clients see it
    as ``exc.errors[0]["reason"]`` and ``exc.reason``.
    """
    name, _code, default_reason = _STATUS.get(status, ("UNKNOWN", 2, "unknown"))
    message = message or _DEFAULT_MESSAGES.get(status, name)
    reason = reason or default_reason
    domain = domain or ("usageLimits" if status in (403, 429) and "uota" in reason + message else "global")
    body = {
        "error": {
            "code": status,
            "message": message,
            "status": name,
            "errors": [{"message": message, "domain": domain, "reason": reason}],
            "details": [{
                "@type": ERROR_INFO, "reason": reason.upper() if reason.islower() else reason,
                "domain": "googleapis.com", "metadata": dict(metadata or {}),
            }],
        }
    }
    return SimHttpError(status, body)


def rpc_code(status: int) -> int:
    return _STATUS.get(status, ("UNKNOWN", 2, ""))[1]


def compute_not_found(path: str) -> SimHttpError:
    return http_error(404, f"The resource '{path}' was not found", reason="notFound")


def container_not_found(path: str) -> SimHttpError:
    return http_error(404, f"Not found: {path}.", reason="notFound")


def quota_exceeded(metric: str, region: str, limit: float, usage: float, requested: float) -> SimHttpError:
    """GKE/Compute synchronous quota refusal (HTTP 403, reason QUOTA_EXCEEDED)."""
    loc = "all regions" if region == "global" else f"region {region}"
    msg = (
        f"Insufficient quota to satisfy the request: Quota '{metric}' exceeded. Limit: {limit:.1f} in {loc}. "
        f"Request requires '{requested:.1f}' and is short '{max(0.0, usage + requested - limit):.1f}'. "
        f"(QUOTA_EXCEEDED)"
    )
    return http_error(403, msg, reason="QUOTA_EXCEEDED", domain="usageLimits",
                      metadata={"metric": metric, "region": region, "limit": f"{limit:g}"})


def quota_error_item(metric: str, region: str, limit: float) -> dict[str, Any]:
    """A Compute Operation ``error.errors[]`` item for a quota refusal."""
    loc = "all regions" if region == "global" else f"region {region}"
    return {
        "code": "QUOTA_EXCEEDED",
        "message": f"Quota '{metric}' exceeded.  Limit: {limit:.1f} in {loc}.",
        "errorDetails": [{"quotaInfo": {
            "metricName": f"compute.googleapis.com/{metric.lower()}", "limitName": f"{metric}-per-project-region",
            "dimensions": {} if region == "global" else {"region": region}, "limit": limit,
        }}],
    }


def stockout_item(zone: str, project: str, with_details: bool) -> dict[str, Any]:
    code = "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" if with_details else "ZONE_RESOURCE_POOL_EXHAUSTED"
    msg = (
        f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to fulfill "
        "the request.  Try a different zone, or try again later."
    )
    item: dict[str, Any] = {"code": code, "message": msg}
    if with_details:
        item["errorDetails"] = [{"errorInfo": {
            "reason": "resource_availability", "domain": "compute.googleapis.com",
            "metadata": {"zone": zone, "vmType": "accelerator-optimized"},
        }}]
    return item


def compute_operation(
    project: str, zone: str, op_type: str, target: str, *, error_items: list[dict[str, Any]] | None = None,
    http_status: int = 0,
) -> dict[str, Any]:
    name = f"operation-{next_id()}-{op_type}"
    now = now_rfc3339()
    op: dict[str, Any] = {
        "kind": "compute#operation", "id": next_id(), "name": name, "operationType": op_type,
        "zone": f"{COMPUTE}/projects/{project}/zones/{zone}", "targetLink": target, "targetId": next_id(),
        "status": "DONE", "progress": 100, "user": "sim@kfp-gpu.local",
        "insertTime": now, "startTime": now, "endTime": now,
        "selfLink": f"{COMPUTE}/projects/{project}/zones/{zone}/operations/{name}",
    }
    if error_items:
        op["error"] = {"errors": error_items}
        op["httpErrorStatusCode"] = http_status or 503
        op["httpErrorMessage"] = {403: "FORBIDDEN", 409: "CONFLICT"}.get(http_status, "SERVICE UNAVAILABLE")
    return op


def container_operation(project: str, location: str, op_type: str, target: str) -> dict[str, Any]:
    name = f"operation-{next_id()}-sim"
    return {
        "name": name, "zone": location, "location": location, "operationType": op_type,
        "status": "RUNNING", "startTime": now_rfc3339(), "progress": {},
        "selfLink": f"{CONTAINER}/projects/{project}/locations/{location}/operations/{name}",
        "targetLink": target,
    }


def fail_container_operation(op: dict[str, Any], http_status: int, items: list[dict[str, Any]]) -> None:
    """Mark a GKE Operation DONE with a google.rpc.Status error, statusMessage and nodepoolConditions.

    The Compute-style detail is carried three ways: ``error.details[]`` ErrorInfo (reason = the Compute
    code), ``statusMessage`` (verbatim Compute message) and ``nodepoolConditions[].code``
    (GCE_STOCKOUT / GCE_QUOTA_EXCEEDED). ``errors`` repeats the Compute items for humans.
    """
    first = items[0]
    code = str(first["code"])
    exhausted = code == "QUOTA_EXCEEDED" or code.startswith("ZONE_RESOURCE_POOL_EXHAUSTED")
    canonical = "RESOURCE_EXHAUSTED" if exhausted else _STATUS.get(http_status, ("UNKNOWN", 2, ""))[0]
    cond_code = "GCE_QUOTA_EXCEEDED" if code == "QUOTA_EXCEEDED" else (
        "GCE_STOCKOUT" if code.startswith("ZONE_RESOURCE_POOL_EXHAUSTED") else "UNKNOWN")
    message = f"{code}: {first['message']}"
    op.update({
        "status": "DONE", "endTime": now_rfc3339(), "statusMessage": message,
        "error": {
            "code": 8 if exhausted else rpc_code(http_status), "message": message,
            "details": [{"@type": ERROR_INFO, "reason": code, "domain": "compute.googleapis.com",
                         "metadata": {k: str(v) for k, v in first.get("metadata", {}).items()}}],
        },
        "nodepoolConditions": [{"code": cond_code, "message": message, "canonicalCode": canonical}],
        "errors": items,
    })


def finish_container_operation(op: dict[str, Any]) -> None:
    op.update({"status": "DONE", "endTime": now_rfc3339()})


def quota_row(metric: str, limit: float, usage: float) -> dict[str, Any]:
    return {"metric": metric, "limit": float(limit), "usage": float(usage)}


def operation_in_progress(op_name: str, pool: str) -> SimHttpError:
    """GKE's refusal of a second mutation of a node pool while an operation runs on it."""
    err = http_error(
        400, f"Operation {op_name} is currently operating on node pool {pool}. "
        "Please wait and try again once it is done.", reason="conditionNotMet")
    err.body["error"]["status"] = "FAILED_PRECONDITION"
    return err


def autoscaling_json(spec: PoolSpec) -> dict[str, Any]:
    """nodePools.get ``autoscaling``: empty when disabled, per-zone or total limits when enabled."""
    a = spec.autoscaling
    if not a.enabled:
        return {}
    if a.total:
        return {"enabled": True, "totalMinNodeCount": a.min_nodes, "totalMaxNodeCount": a.max_nodes,
                "locationPolicy": "ANY"}
    return {"enabled": True, "minNodeCount": a.min_nodes, "maxNodeCount": a.max_nodes,
            "locationPolicy": "BALANCED"}
