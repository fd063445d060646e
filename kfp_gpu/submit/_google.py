"""Google API error classification shared by the Vertex and GKE-access modules (lazy SDK imports)."""

from __future__ import annotations

from kfp_gpu.errors import (
    CloudError,
    KfpGpuError,
    NotFound,
    PermissionDenied,
    RateLimited,
    TransientCloudError,
)

VERTEX_IAM_FIX = (
    "grant the submitting identity roles/aiplatform.user and roles/iam.serviceAccountUser on the run's "
    "service account (see docs/vertex.md)"
)
GKE_IAM_FIX = (
    "grant the component's service account roles/container.clusterViewer (container.clusters.get) "
    "plus Kubernetes RBAC in the cluster (see docs/vertex.md)"
)


def classify_google(exc: BaseException, what: str, iam_fix: str) -> KfpGpuError:
    """Map google.api_core / google.auth / transport errors to KfpGpuErrors with a fix (returned). Raises: nothing."""
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as aexc

    detail = str(getattr(exc, "message", None) or exc).splitlines()
    msg = f"{what} failed: {detail[0] if detail else type(exc).__name__}"[:400]
    if isinstance(exc, aexc.DefaultCredentialsError):
        return PermissionDenied(f"no Google credentials for {what}",
                                remediation="run `gcloud auth application-default login` or use Workload "
                                            "Identity; see docs/vertex.md")
    if isinstance(exc, aexc.RefreshError):
        return PermissionDenied(msg, remediation="the credentials could not mint a token; re-authenticate")
    if isinstance(exc, (gexc.Unauthenticated, gexc.Forbidden, gexc.PermissionDenied)):
        return PermissionDenied(msg, remediation=iam_fix)
    if isinstance(exc, gexc.NotFound):
        return NotFound(msg, remediation="check project, location and name, and that the API is enabled")
    if isinstance(exc, (gexc.TooManyRequests, gexc.ResourceExhausted)):
        return RateLimited(msg, remediation="retry later or raise the API's request quota")
    if isinstance(exc, (gexc.ServerError, gexc.ServiceUnavailable, gexc.RetryError, ConnectionError)):
        return TransientCloudError(msg, remediation="retry; check network access to the endpoint")
    if type(exc).__module__.startswith(("requests", "urllib3")):
        return TransientCloudError(msg, remediation="check the api endpoint / network path and retry")
    return CloudError(msg, remediation="read the API message above")
