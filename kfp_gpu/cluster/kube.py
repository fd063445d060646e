"""Kubernetes client loading. One place decides how a step reaches its cluster, and checks that it does.

A missing, empty or broken kubeconfig, or an API server that does not answer, is a one-line
:class:`~kfp_gpu.errors.KfpGpuError` naming the file or server and the fix, never a traceback from deep inside
the kubernetes client. With a target, :func:`kfp_gpu.cluster.identity.verify` then refuses credentials that
reach another cluster than ``target.cluster``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

from kfp_gpu.cluster.apierrors import Transient, classify
from kfp_gpu.errors import (
    ClusterUnreachable,
    KubeconfigInvalid,
    NoKubeCredentials,
    PermissionDenied,
)
from kfp_gpu.spec import Target, TargetKind

PROBE_TIMEOUT_S = 5.0
KUBECONFIG_FIX = ("point KUBECONFIG at a valid kubeconfig (GKE: gcloud container clusters get-credentials CLUSTER; "
                  "EKS: aws eks update-kubeconfig --name CLUSTER; local: make cluster-up writes "
                  "~/.cache/kfp-gpu/cluster/kubeconfig)")


@dataclass(frozen=True)
class Source:
    """Where the credentials came from: a kubeconfig (with its active context's cluster name) or the pod."""

    kubeconfig: str = ""  # path(s) as in $KUBECONFIG; "" in a pod
    context: str = ""
    context_cluster: str = ""  # the kubeconfig's cluster *name* for that context (gke_..., arn:aws:eks:...)
    server: str = ""
    in_pod: bool = False

    def describe(self) -> str:
        if self.in_pod:
            return f"in-cluster service account ({self.server})"
        return f"{self.server} (kubeconfig {self.kubeconfig}, context {self.context or '?'})"


def api_client(target: Target | None = None, *, check: bool = True) -> client.ApiClient:
    """An ApiClient for ``target``, checked to answer (and, with a target, to be the cluster it names).

    In order: $KUBECONFIG (``target.kube_context`` or its current context), ~/.kube/config, in-cluster config
    inside a pod, the local dev cluster's kubeconfig for ``local`` targets, and for GKE targets outside any
    cluster (Vertex AI Pipelines) the cluster endpoint from google-cloud-container plus an access token.

    Raises:
        KubeconfigInvalid: $KUBECONFIG names no file, or the file is empty, unparsable or lacks the context.
        ClusterUnreachable: the API server does not answer (``check``).
        NoKubeCredentials: no kubeconfig and not in a pod.
        PermissionDenied: the API server rejects the credentials (``check``).
        WrongCluster: the credentials reach another cluster than ``target.cluster`` (``check``).
    """
    cfg = client.Configuration()
    source = load(target, cfg)
    if source is None:  # GKE from outside any cluster: the endpoint was looked up by the cluster's name
        assert target is not None
        from kfp_gpu.submit.gke_access import gke_api_client

        api: client.ApiClient = gke_api_client(target.project, target.region, target.cluster)
        return api
    cfg.connection_pool_maxsize = 64  # concurrent resizes and watches share one pool
    api = client.ApiClient(cfg)
    if check:
        probe(api, source)
        if target is not None:
            from kfp_gpu.cluster.identity import verify

            verify(api, target, kube_cluster=source.context_cluster, in_pod=source.in_pod)
    return api


def load(target: Target | None, cfg: client.Configuration) -> Source | None:
    """Fill ``cfg`` from the first credentials found (see :func:`api_client`); None means "ask GKE".

    Raises:
        KubeconfigInvalid: see :func:`api_client`.
        NoKubeCredentials: no kubeconfig and not in a pod.
        PermissionDenied: the pod's own credentials are unusable.
    """
    context = (target.kube_context if target else "") or None
    env = os.environ.get("KUBECONFIG", "")
    if env:
        paths = [os.path.expanduser(p) for p in env.split(os.pathsep) if p]
        if not any(os.path.exists(p) for p in paths):
            raise KubeconfigInvalid(f"kubeconfig {env} (from $KUBECONFIG) does not exist", remediation=KUBECONFIG_FIX,
                                    kubeconfig=env)
        return _from_kubeconfig(env, context, cfg)
    default = os.path.expanduser("~/.kube/config")
    if os.path.exists(default):
        return _from_kubeconfig(default, context, cfg)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=cfg)
        except ConfigException as exc:
            raise PermissionDenied(f"in-cluster credentials are unusable: {_one_line(exc)}",
                                   remediation="run it with its ServiceAccount (the controller's "
                                   "kfp-gpu-controller, a tenant's kfp-gpu: docs/rbac-iam.md), which mounts a "
                                   "token") from None
        return Source(server=str(cfg.host), in_pod=True)
    if target is not None and target.kind is TargetKind.LOCAL:
        from kfp_gpu.rehearsal_seam import local_kubeconfig

        if local_kubeconfig().exists():
            return _from_kubeconfig(str(local_kubeconfig()), context, cfg)
    if target is not None and target.kind is TargetKind.GKE:
        return None
    raise NoKubeCredentials(
        f"no Kubernetes credentials: $KUBECONFIG is not set, {default} does not exist and this is not a pod",
        remediation="set KUBECONFIG (make cluster-up writes ~/.cache/kfp-gpu/cluster/kubeconfig), "
        "or run inside the cluster with the kfp-gpu service account",
    )


def _from_kubeconfig(path: str, context: str | None, cfg: client.Configuration) -> Source:
    """Raises: KubeconfigInvalid."""
    try:
        merged = KubeConfigMerger(path).config
        if merged is None:
            raise ConfigException("no configuration found")
        active = KubeConfigLoader(config_dict=merged, active_context=context).current_context
        name, cluster = str(active["name"]), str(active["context"]["cluster"])
        config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
    except (ConfigException, yaml.YAMLError, OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        what = f"context {context!r} of kubeconfig {path}" if context else f"kubeconfig {path}"
        raise KubeconfigInvalid(
            f"{what} is not usable: {_one_line(exc)}",
            remediation=KUBECONFIG_FIX if not context else
            f"set target.kube_context to one of the kubeconfig's contexts, or fix it: {KUBECONFIG_FIX}",
            kubeconfig=path,
        ) from None
    return Source(kubeconfig=path, context=name, context_cluster=cluster, server=str(cfg.host))


def probe(api: client.ApiClient, source: Source) -> None:
    """One cheap request (GET /version) so a dead or wrong endpoint fails here, in one line.

    Raises:
        ClusterUnreachable: connection refused, DNS, TLS or timeout.
        PermissionDenied: the API server rejects the credentials (401).
    """
    try:
        client.VersionApi(api).get_code(_request_timeout=PROBE_TIMEOUT_S)
    except ApiException as exc:
        if exc.status == 401:
            raise PermissionDenied(
                f"the Kubernetes API server {source.describe()} rejected the credentials (401 Unauthorized)",
                remediation="refresh the kubeconfig's credentials (gcloud container clusters get-credentials / "
                "aws eks update-kubeconfig) or the service account token") from None
        verdict = classify(exc)
        if isinstance(verdict, Transient) and verdict.status != 429:  # no answer or 5xx (a throttled one answers)
            raise unreachable(source, exc) from None
    except Exception as exc:  # urllib3 MaxRetryError, SSLError, socket errors: the server does not answer
        raise unreachable(source, exc) from None


def unreachable(source: Source, exc: BaseException) -> ClusterUnreachable:
    """The one-line error for an API server that did not answer."""
    return ClusterUnreachable(
        f"the Kubernetes API server {source.describe()} is unreachable: {_reason(exc)}",
        remediation="start the cluster (local: make cluster-up) or point KUBECONFIG / target.kube_context at a "
        "running cluster; check the network path (VPN, authorized networks) to the API server",
        server=source.server,
    )


def _reason(exc: BaseException) -> str:
    text = _one_line(getattr(exc, "reason", None) or exc)
    m = re.search(r"\[Errno -?\d+\][^'\")]*|certificate verify failed[^'\")]*|timed out|Name or service not known", text)
    return (m.group(0).strip() if m else text)[:160]


def _one_line(exc: object) -> str:
    return " ".join(str(exc).split())


def crd_version_served(api: client.ApiClient, crd: str, version: str) -> bool:
    """True when the CustomResourceDefinition ``crd`` exists and serves ``version``. Raises: ApiException (non-404)."""
    try:
        obj = client.ApiextensionsV1Api(api).read_custom_resource_definition(crd)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return any(v.name == version and v.served for v in obj.spec.versions or [])


def ignore_404(fn: Callable[[], Any]) -> bool:
    """Call ``fn`` (a delete, usually); False when the object was already gone (404), True when it ran.

    Raises: ApiException other than 404.
    """
    try:
        fn()
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


def get_custom(api: client.ApiClient, group: str, version: str, namespace: str, plural: str,
               name: str) -> dict[str, Any] | None:
    """A namespaced custom object as JSON, or None when it does not exist. Raises: ApiException (non-404)."""
    try:
        obj: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
            group, version, namespace, plural, name)
        return obj
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
