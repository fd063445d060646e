"""The google-cloud REST clients GkeProvider talks through, and the credentials they use.

google.cloud / google.auth are imported here, lazily, so ``import kfp_gpu`` never needs them. A plain
``http://`` endpoint (the local stand-in, :mod:`kfp_gpu_rehearsal.sim`) gets the stand-in's OAuth access token from
``$KFP_GPU_SIM_GCP_TOKEN`` (:data:`kfp_gpu.iam.SIM_GCP_TOKEN_ENV`; the rehearsal sets it for the controller process
only), or anonymous credentials without it, which the stand-in refuses (401) as Google does; anything else
resolves Application Default Credentials. Real credentials never travel over plain http.
"""

from __future__ import annotations

import os
from typing import Any

from kfp_gpu import iam
from kfp_gpu.errors import PermissionDenied

KINDS = ("regions", "projects", "reservations", "zone_ops", "igm", "container", "quotas")


def credentials_for(endpoint: str) -> Any:
    """Credentials for ``endpoint``.

    Raises:
        PermissionDenied: no credentials could be found, with the command that fixes it.
    """
    if endpoint.startswith("http://"):
        token = os.environ.get(iam.SIM_GCP_TOKEN_ENV, "").strip()
        if token:
            from google.oauth2.credentials import Credentials

            return Credentials(token=token)  # type: ignore[no-untyped-call,unused-ignore]
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()  # type: ignore[no-untyped-call,unused-ignore]
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        creds, _ = google.auth.default(  # type: ignore[no-untyped-call,unused-ignore]
            scopes=["https://www.googleapis.com/auth/cloud-platform"])
    except DefaultCredentialsError as exc:
        raise PermissionDenied(
            f"no Google Cloud credentials found: {exc}",
            remediation="run `gcloud auth application-default login`, or set "
            "GOOGLE_APPLICATION_CREDENTIALS to a service-account key, or run on GCP with a "
            "workload identity / service account",
        ) from None
    return creds


def build(kind: str, endpoint: str, credentials: Any) -> Any:
    """A REST client of ``kind`` (one of :data:`KINDS`) for ``endpoint`` ("" = the public API), its HTTP
    connection pool sized to the provider's concurrency. Raises: KeyError (unknown kind)."""
    from google.api_core.client_options import ClientOptions

    opts = ClientOptions(api_endpoint=endpoint) if endpoint else None
    if kind == "container":
        from google.cloud import container_v1

        factory: Any = container_v1.ClusterManagerClient
    elif kind == "quotas":
        from google.cloud import cloudquotas_v1

        factory = cloudquotas_v1.CloudQuotasClient
    else:
        from google.cloud import compute_v1

        factory = {
            "regions": compute_v1.RegionsClient, "projects": compute_v1.ProjectsClient,
            "reservations": compute_v1.ReservationsClient, "zone_ops": compute_v1.ZoneOperationsClient,
            "igm": compute_v1.InstanceGroupManagersClient,
        }[kind]
    from kfp_gpu.providers.gke.http_pool import size_pool

    return size_pool(factory(transport="rest", credentials=credentials, client_options=opts))
