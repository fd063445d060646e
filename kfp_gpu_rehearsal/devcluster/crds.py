"""Server-side apply of the objects the dev cluster needs before the
Training Operator starts: the PyTorchJob CRD, the ``kubeflow`` namespace, the
webhook cert Secret and the ValidatingWebhookConfiguration (pointing at the
out-of-cluster operator on 127.0.0.1).  No kubectl: raw ``PATCH`` with
``application/apply-patch+yaml`` through the kubernetes Python client.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from .procs import BootError

_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRD is 600 kB; libyaml is 20x faster

FIELD_MANAGER = "kfp-gpu-devcluster"
OPERATOR_NAMESPACE = "kubeflow"
WEBHOOK_SECRET = "training-operator-webhook-cert"
WEBHOOK_CONFIG = "validator.training-operator.kubeflow.org"  # name the operator's cert rotator injects into
PYTORCHJOB_CRD = "pytorchjobs.kubeflow.org"

# (apiVersion, kind) -> (URL prefix, plural, namespaced)
_RESOURCES: dict[tuple[str, str], tuple[str, str, bool]] = {
    ("v1", "Namespace"): ("/api/v1", "namespaces", False),
    ("v1", "Secret"): ("/api/v1", "secrets", True),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): (
        "/apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"): (
        "/apis/admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", False),
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"): (
        "/apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", False),
}


def api_client(kubeconfig: Path) -> client.ApiClient:
    """A client for ``kubeconfig`` whose connection pool fits the callers' concurrency (the default is
    cpu_count * 5, i.e. 10 here, and concurrent callers logged "Connection pool is full").
    Raises: kubernetes.config.ConfigException."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = 64  # as kfp_gpu.cluster.kube.api_client
    return client.ApiClient(cfg)


def apply(api: client.ApiClient, obj: dict[str, Any]) -> Any:
    """Server-side apply ``obj`` (force, field manager ``kfp-gpu-devcluster``)."""
    key = (obj["apiVersion"], obj["kind"])
    if key not in _RESOURCES:
        raise ValueError(f"apply: unsupported resource {key}")
    prefix, plural, namespaced = _RESOURCES[key]
    meta = obj["metadata"]
    path = prefix
    if namespaced:
        path += f"/namespaces/{meta.get('namespace', 'default')}"
    path += f"/{plural}/{meta['name']}"
    return api.call_api(
        path, "PATCH",
        query_params=[("fieldManager", FIELD_MANAGER), ("force", "true")],
        header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
        body=obj, auth_settings=["BearerToken"], response_type="object", _return_http_data_only=True,
    )


def wait_established(api: client.ApiClient, name: str, timeout: float = 60.0) -> None:
    ext = client.ApiextensionsV1Api(api)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition(name)
        conds = {c.type: c.status for c in (crd.status.conditions or [])}
        if conds.get("Established") == "True":
            return
        time.sleep(0.2)
    raise BootError(f"CRD {name} not Established after {timeout:.0f}s")


def _b64(p: Path) -> str:
    return base64.b64encode(p.read_bytes()).decode()


def webhook_objects(webhook_manifest: Path, pki: Path, port: int) -> list[dict[str, Any]]:
    """Namespace, cert Secret and a webhook configuration for the PyTorchJob webhook only.

    The upstream configuration targets an in-cluster Service; here the operator runs as a
    local process, so ``clientConfig`` becomes ``url: https://127.0.0.1:<port><path>``.
    """
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}}
    secret = {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": WEBHOOK_SECRET, "namespace": OPERATOR_NAMESPACE},
        "data": {
            "ca.crt": _b64(pki / "webhook-ca.crt"), "ca.key": _b64(pki / "webhook-ca.key"),
            "tls.crt": _b64(pki / "webhook.crt"), "tls.key": _b64(pki / "webhook.key"),
        },
    }
    upstream = [d for d in yaml.safe_load_all(webhook_manifest.read_text()) if d]
    hooks = [h for d in upstream for h in d.get("webhooks", []) if "pytorchjob" in h["name"]]
    if not hooks:
        raise BootError(f"no PyTorchJob webhook found in {webhook_manifest}")
    for h in hooks:
        path = h["clientConfig"]["service"]["path"]
        h["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": _b64(pki / "webhook-ca.crt")}
        h["timeoutSeconds"] = 10
    vwc = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIG}, "webhooks": hooks,
    }
    return [ns, secret, vwc]


def install_provreq(api: client.ApiClient) -> None:
    """Apply the ProvisioningRequest CRD (``autoscaling.x-k8s.io/v1``, :mod:`.provreq_crd`); wait Established.

    Raises: BootError when the CRD cannot be generated or does not turn Established.
    """
    from .autoscaler import AutoscalerError
    from .provreq_crd import CRD_NAME, CrdError, load

    try:
        crd = load()
    except (CrdError, AutoscalerError) as e:
        raise BootError(f"ProvisioningRequest CRD: {e}") from e
    apply(api, crd)
    wait_established(api, CRD_NAME)


def install(api: client.ApiClient, share: Path, pki: Path, webhook_port: int) -> None:
    """Apply CRDs + webhook plumbing; wait for the CRD to be Established."""
    crd_file = share / "manifests/base/crds/kubeflow.org_pytorchjobs.yaml"
    hook_file = share / "manifests/base/webhook/manifests.yaml"
    for f in (crd_file, hook_file):
        if not f.exists():
            raise BootError(f"missing {f}; run `python -m kfp_gpu_rehearsal.devcluster build` first")
    crd = yaml.load(crd_file.read_text(), Loader=_LOADER)  # noqa: S506 - safe loader
    apply(api, crd)
    for obj in webhook_objects(hook_file, pki, webhook_port):
        apply(api, obj)
    wait_established(api, PYTORCHJOB_CRD)


def delete_webhooks(kubeconfig: Path, configs: list[tuple[str, str]]) -> list[str]:
    """Delete webhook configurations given as (kind, name), kind ``MutatingWebhookConfiguration`` or
    ``ValidatingWebhookConfiguration``; the names deleted (one already gone is skipped).

    Raises: kubernetes ApiException other than 404.
    """
    from kubernetes.client import ApiException

    api = api_client(kubeconfig)
    adm = client.AdmissionregistrationV1Api(api)
    gone = []
    try:
        for kind, name in configs:
            delete = (adm.delete_mutating_webhook_configuration if kind.startswith("Mutating")
                      else adm.delete_validating_webhook_configuration)
            try:
                delete(name)
                gone.append(name)
            except ApiException as e:
                if e.status != 404:
                    raise
    finally:
        api.close()
    return gone
