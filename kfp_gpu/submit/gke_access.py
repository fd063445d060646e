"""Reach a GKE cluster's Kubernetes API from a component that runs *outside* it (e.g. on Vertex AI
Pipelines, where there is no in-cluster config and no kubeconfig).

``gke_api_client(project, location, cluster)`` asks the GKE API (``clusters.get``) for the control
plane endpoint and CA certificate, mints an OAuth access token from google-auth credentials
(Application Default Credentials / Workload Identity by default), and returns a
``kubernetes.client.ApiClient`` that refreshes the token before it expires. Needs
``container.clusters.get`` (roles/container.clusterViewer) plus Kubernetes RBAC; see docs/vertex.md.
"""

from __future__ import annotations

import base64
import binascii
import os
import tempfile
from typing import Any, Literal

from kfp_gpu.errors import InvalidSpec, KfpGpuError, NotFound
from kfp_gpu.submit._google import GKE_IAM_FIX, classify_google

Endpoint = Literal["public", "private", "dns"]
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)


def _credentials(credentials: Any) -> Any:
    if credentials is not None:
        return credentials
    import google.auth

    creds, _ = google.auth.default(scopes=list(SCOPES))
    return creds


def _write_ca(pem: bytes, cluster: str) -> str:
    fd, path = tempfile.mkstemp(prefix=f"kfp-gpu-{cluster}-ca-", suffix=".crt")
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    os.chmod(path, 0o600)
    return path


def gke_configuration(
    project: str,
    location: str,
    cluster: str,
    *,
    credentials: Any = None,
    endpoint: Endpoint = "public",
    container_api_endpoint: str | None = None,
) -> Any:
    """A ``kubernetes.client.Configuration`` for the cluster's control plane.

    Args:
        project, location, cluster: the GKE cluster (location = region or zone).
        credentials: google-auth credentials; None = Application Default Credentials. Anonymous
            credentials yield a configuration without an Authorization header.
        endpoint: "public" (``cluster.endpoint``), "private" (private endpoint IP) or "dns" (the
            DNS-based control plane endpoint, served with a publicly trusted certificate).
        container_api_endpoint: override of container.googleapis.com; ``http://`` selects REST (stand-ins).

    Raises:
        InvalidSpec: empty names or an unknown ``endpoint``.
        NotFound: the cluster does not exist or has no endpoint of the requested kind.
        PermissionDenied: no credentials / no container.clusters.get.
        RateLimited, TransientCloudError, CloudError: other API failures.
    """
    for field, value in (("project", project), ("location", location), ("cluster", cluster)):
        if not value:
            raise InvalidSpec(field, value, "is required to reach the GKE cluster")
    if endpoint not in ("public", "private", "dns"):
        raise InvalidSpec("endpoint", endpoint, "allowed: 'public', 'private', 'dns'")
    name = f"projects/{project}/locations/{location}/clusters/{cluster}"
    what = f"GKE clusters.get {name}"
    try:
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import container_v1
        from kubernetes import client as k8s

        creds = _credentials(credentials)
        kw: dict[str, Any] = {"credentials": creds}
        if container_api_endpoint:
            kw["client_options"] = ClientOptions(api_endpoint=container_api_endpoint)
            if container_api_endpoint.startswith("http://"):
                kw["transport"] = "rest"
        got = container_v1.ClusterManagerClient(**kw).get_cluster(name=name)
        if endpoint == "public":
            host = got.endpoint
        elif endpoint == "private":
            host = got.private_cluster_config.private_endpoint
        else:
            host = got.control_plane_endpoints_config.dns_endpoint_config.endpoint
        if not host:
            raise NotFound(f"GKE cluster {name} has no {endpoint} control-plane endpoint",
                           remediation="pick another endpoint kind (public, private, dns) or enable it on the cluster")
        cfg = k8s.Configuration()
        cfg.host = f"https://{host}"
        if endpoint != "dns":
            try:
                pem = base64.b64decode(got.master_auth.cluster_ca_certificate, validate=True)
            except (binascii.Error, ValueError):
                pem = b""
            if not pem:
                raise NotFound(f"GKE cluster {name} returned no cluster CA certificate",
                               remediation="check the cluster is RUNNING; retry")
            cfg.ssl_ca_cert = _write_ca(pem, cluster)
        if not isinstance(creds, AnonymousCredentials):
            _attach_token(cfg, creds)
        return cfg
    except KfpGpuError:
        raise
    except Exception as exc:  # noqa: BLE001 - classified below, never escapes raw
        raise classify_google(exc, what, GKE_IAM_FIX) from None


def _attach_token(cfg: Any, creds: Any) -> None:
    """Bearer token from ``creds``, refreshed by the kubernetes client before each request if stale."""
    import google.auth.transport.requests

    def refresh(conf: Any) -> None:
        if not creds.valid:
            creds.refresh(google.auth.transport.requests.Request())
        conf.api_key["authorization"] = creds.token

    cfg.api_key_prefix["authorization"] = "Bearer"
    refresh(cfg)
    cfg.refresh_api_key_hook = refresh


def gke_api_client(project: str, location: str, cluster: str, **kwargs: Any) -> Any:
    """``kubernetes.client.ApiClient`` for the cluster; keyword arguments as :func:`gke_configuration`.

    Raises: the same as :func:`gke_configuration`.
    """
    from kubernetes import client as k8s

    return k8s.ApiClient(gke_configuration(project, location, cluster, **kwargs))
