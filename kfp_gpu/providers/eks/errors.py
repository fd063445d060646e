"""AWS error -> kfp-gpu error table for the EKS provider.

The table is explicit and module-level so it can be read, reviewed and tested row by row.
Lookup order: the AWS error code (exact, then prefix such as ``AccessDenied*``), then the HTTP
status (429/503 transient). Anything unrecognised becomes a ``CloudError`` scoped to the narrowest
placement we know (zone, else region), carrying the verbatim AWS message, and is logged.
botocore is imported lazily (only to recognise its non-HTTP exceptions by class name).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from kfp_gpu import iam
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

log = logging.getLogger(__name__)

# code -> (error class, scope, remediation)
ERROR_TABLE: dict[str, tuple[type[KfpGpuError], Scope, str]] = {
    # zone: the AZ has no stock for this instance type right now
    "InsufficientInstanceCapacity": (
        CapacityUnavailable, Scope.ZONE,
        "fail over to another AZ, retry later, or buy a Capacity Block / capacity reservation",
    ),
    "UnfulfillableCapacity": (
        CapacityUnavailable, Scope.ZONE, "fail over to another AZ or use a capacity reservation",
    ),
    "InsufficientCapacity": (CapacityUnavailable, Scope.ZONE, "fail over to another AZ or retry later"),
    # region: account quotas are regional
    "VcpuLimitExceeded": (
        QuotaExceeded, Scope.REGION,
        "raise the EC2 vCPU quota (Service Quotas > Amazon EC2) or run `kfp-gpu quota request`",
    ),
    "MaxSpotInstanceCountExceeded": (
        QuotaExceeded, Scope.REGION,
        "raise the Spot vCPU quota (L-7212CCBC for P, L-3819A6DF for G) or use on-demand capacity",
    ),
    "InstanceLimitExceeded": (QuotaExceeded, Scope.REGION, "raise the EC2 instance quota for this region"),
    # provider: credentials / IAM
    "UnauthorizedOperation": (PermissionDenied, Scope.PROVIDER, ""),
    "AuthFailure": (PermissionDenied, Scope.PROVIDER, "check AWS credentials (aws sts get-caller-identity)"),
    "AccessDenied": (PermissionDenied, Scope.PROVIDER, ""),
    "AccessDeniedException": (PermissionDenied, Scope.PROVIDER, ""),
    "UnrecognizedClientException": (PermissionDenied, Scope.PROVIDER, "the AWS access key is not valid"),
    "InvalidClientTokenId": (PermissionDenied, Scope.PROVIDER, "the AWS access key is not valid"),
    "ExpiredToken": (PermissionDenied, Scope.PROVIDER, "refresh the AWS session credentials"),
    "ExpiredTokenException": (PermissionDenied, Scope.PROVIDER, "refresh the AWS session credentials"),
    "SignatureDoesNotMatch": (PermissionDenied, Scope.PROVIDER, "check the AWS secret key"),
    # transient: back off and retry, nothing blocked
    "RequestLimitExceeded": (RateLimited, Scope.NONE, "retry with back-off"),
    "Throttling": (RateLimited, Scope.NONE, "retry with back-off"),
    "ThrottlingException": (RateLimited, Scope.NONE, "retry with back-off"),
    "TooManyRequestsException": (RateLimited, Scope.NONE, "retry with back-off"),
    "ServiceUnavailable": (TransientCloudError, Scope.NONE, "retry with back-off"),
    "ServiceUnavailableException": (TransientCloudError, Scope.NONE, "retry with back-off"),
    "InternalError": (TransientCloudError, Scope.NONE, "retry with back-off"),
    # EKS: the node group is busy with another update (UPDATING): wait for it, then retry
    "ResourceInUseException": (TransientCloudError, Scope.NONE, "retry once the node group's update finished"),
    # not found
    "ResourceNotFoundException": (NotFound, Scope.ZONE, "check the EKS cluster and node group names and region"),
    "NoSuchResourceException": (NotFound, Scope.REGION, "check the Service Quotas quota code and region"),
    "InvalidCapacityReservationId.NotFound": (NotFound, Scope.ZONE, "the capacity reservation is gone"),
    "InvalidSubnetID.NotFound": (NotFound, Scope.ZONE, "the node group's subnets are gone"),
}

HTTP_TABLE: dict[int, tuple[type[KfpGpuError], Scope, str]] = {
    429: (RateLimited, Scope.NONE, "retry with back-off"),
    503: (TransientCloudError, Scope.NONE, "retry with back-off"),
}

_PREFIXES: tuple[str, ...] = ("AccessDenied",)

# botocore exceptions raised before/without an HTTP response, by class name
_CREDENTIAL_ERRORS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                      "NoAuthTokenError", "UnauthorizedSSOTokenError", "SSOTokenLoadError"}
_NETWORK_ERRORS = {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                   "ConnectionClosedError", "ProxyConnectionError"}


def lookup(code: str, status: int | None = None) -> tuple[type[KfpGpuError], Scope, str] | None:
    """The table row for an AWS error code (exact, then prefix), else for the HTTP status."""
    if code in ERROR_TABLE:
        return ERROR_TABLE[code]
    for prefix in _PREFIXES:
        if code.startswith(prefix):
            return ERROR_TABLE[prefix]
    if status is not None and status in HTTP_TABLE:
        return HTTP_TABLE[status]
    return None


_ACTION_RE = re.compile(r"not authorized to perform: ([a-z0-9-]+:[A-Za-z0-9]+)")


def iam_action(exc: BaseException, service_prefix: str = "") -> str:
    """``eks:UpdateNodegroupConfig`` style IAM action for a failed botocore call, when known."""
    op = str(getattr(exc, "operation_name", "") or "")
    return f"{service_prefix}:{op}" if service_prefix and op else op


def classify(
    exc: BaseException, *, zone: str = "", region: str = "", action: str = "", what: str = "",
) -> KfpGpuError:
    """Map a botocore/boto3 exception to a KfpGpuError (see the module docstring)."""
    if isinstance(exc, KfpGpuError):
        return exc
    name = type(exc).__name__
    ctx: dict[str, Any] = {"zone": zone, "region": region, "action": action}
    if name in _CREDENTIAL_ERRORS:
        return PermissionDenied(
            f"no usable AWS credentials ({name}: {exc})",
            remediation="configure credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
            "or an IRSA/instance role) and check with `aws sts get-caller-identity`",
            credentials_missing=True, **ctx,
        )
    if name in _NETWORK_ERRORS:
        return TransientCloudError(f"AWS endpoint unreachable ({name}: {exc})", remediation="retry", **ctx)
    response: dict[str, Any] = getattr(exc, "response", None) or {}
    err = response.get("Error", {}) or {}
    code = str(err.get("Code", "") or "")
    message = str(err.get("Message", "") or exc)
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    row = lookup(code, int(status) if status is not None else None)
    prefix = f"{what}: " if what else ""
    if row is None:
        log.warning("unclassified AWS error %s (HTTP %s) during %s: %s", code or name, status, action, message)
        return CloudError(
            f"{prefix}AWS {code or name}: {message}",
            remediation="see the AWS message; report it if kfp-gpu should classify this error",
            scope=Scope.ZONE if zone else Scope.REGION, code=code, http_status=status, **ctx,
        )
    cls, scope, remediation = row
    if cls is PermissionDenied and not remediation:
        named = _ACTION_RE.search(message)  # AWS names the refused action (an implied one, say ec2:CreateTags)
        action = named.group(1) if named else action
        ctx["action"] = action
        remediation = iam.aws_fix(action) if action else "grant the missing IAM permission named in the message"
    if cls is NotFound and scope is Scope.ZONE and not zone:
        scope = Scope.REGION
    suffix = f" (needs IAM action {action})" if cls is PermissionDenied and action else ""
    return cls(
        f"{prefix}AWS {code or status}: {message}{suffix}", remediation=remediation, scope=scope, code=code,
        http_status=status, **ctx,
    )
