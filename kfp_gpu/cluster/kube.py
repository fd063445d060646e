"""Kubernetes client loading. One place decides how a step reaches its cluster."""

from __future__ import annotations

import os

from kubernetes import client, config

from kfp_gpu.errors import PermissionDenied
from kfp_gpu.spec import Target, TargetKind


def api_client(target: Target | None = None) -> client.ApiClient:
    """An ApiClient for ``target``.

    In order: ``target.kube_context`` in $KUBECONFIG / ~/.kube/config (the local dev cluster's kubeconfig for
    ``local`` targets), in-cluster config inside a pod, and for GKE targets outside any cluster (Vertex AI
    Pipelines) the cluster endpoint from google-cloud-container plus an access token.

    Raises:
        PermissionDenied: no way to reach the cluster (or the GKE lookup was denied).
    """
    context = (target.kube_context if target else "") or None
    kubeconfig = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if not os.path.exists(kubeconfig) and target is not None and target.kind is TargetKind.LOCAL:
        from kfp_gpu.devcluster.boot import kubeconfig_path

        kubeconfig = str(kubeconfig_path())
    cfg = client.Configuration()
    if os.path.exists(kubeconfig):
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    elif target is not None and target.kind is TargetKind.GKE:
        # Launched outside the cluster (e.g. by Vertex AI Pipelines): reach GKE through
        # google-cloud-container get_cluster + the service account's token (docs/vertex.md lists the IAM).
        from kfp_gpu.submit.gke_access import gke_api_client

        api: client.ApiClient = gke_api_client(target.project, target.region, target.cluster)
        return api
    else:
        raise PermissionDenied(
            f"no Kubernetes credentials: {kubeconfig} does not exist and this is not a pod",
            remediation="set KUBECONFIG (make cluster-up writes ~/.cache/kfp-gpu/cluster/kubeconfig), "
            "or run inside the cluster with the kfp-gpu service account",
        )
    cfg.connection_pool_maxsize = 64  # concurrent resizes and watches share one pool
    return client.ApiClient(cfg)
