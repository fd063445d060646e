"""Server-side apply of plain objects (dicts) through the kubernetes Python client, for ``kfp-gpu install`` and
``kfp-gpu tenant``: where each kind lives, one apply / delete / get, waiting for CRDs, and API refusals turned into
one-line :class:`~kfp_gpu.errors.KfpGpuError` naming the object and the fix.

Raw ``PATCH`` with ``application/apply-patch+yaml`` (field manager ``kfp-gpu``, ``force``), as
``kfp_gpu_rehearsal/devcluster/crds.py`` does: no kubectl, no discovery round trips.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu.errors import KfpGpuError, NotFound, PermissionDenied
from kfp_gpu.gang import api as gang

Obj = dict[str, Any]
FIELD_MANAGER = "kfp-gpu"
ESTABLISH_TIMEOUT_S = 60.0
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
ADMIN_FIX = ("run it with cluster-admin credentials (kfp-gpu install and kfp-gpu tenant write CRDs, ClusterRoles, "
             "RoleBindings and admission policies)")

# kind -> (plural, namespaced); the group/version comes from the object's apiVersion
RESOURCES: dict[str, tuple[str, bool]] = {
    "Namespace": ("namespaces", False), "ServiceAccount": ("serviceaccounts", True),
    "Service": ("services", True), "Deployment": ("deployments", True),
    "CustomResourceDefinition": ("customresourcedefinitions", False),
    "ClusterRole": ("clusterroles", False), "ClusterRoleBinding": ("clusterrolebindings", False),
    "Role": ("roles", True), "RoleBinding": ("rolebindings", True),
    "ValidatingAdmissionPolicy": ("validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": ("validatingadmissionpolicybindings", False),
    gang.KIND: (gang.PLURAL, True), gang.POLICY_KIND: (gang.POLICY_PLURAL, False),
    "Topology": ("topologies", False),  # Kueue's (kfp-gpu install --kueue-topology)
}


def resource(obj: Obj) -> tuple[str, bool]:
    """(plural, namespaced) of ``obj``'s kind. Raises: KfpGpuError for a kind this module does not know."""
    try:
        return RESOURCES[obj["kind"]]
    except KeyError:
        raise KfpGpuError(f"kfp_gpu/kubeapply.py does not know where kind {obj['kind']} lives",
                          remediation="add it to kfp_gpu.kubeapply.RESOURCES") from None


def describe(obj: Obj) -> str:
    """``kind/name`` (`` -n namespace`` for namespaced objects), as kubectl names objects."""
    meta = obj["metadata"]
    ns = f" -n {meta['namespace']}" if meta.get("namespace") and resource(obj)[1] else ""
    return f"{obj['kind'].lower()}/{meta['name']}{ns}"


def path(obj: Obj) -> str:
    """The URL path of ``obj`` (by kind, apiVersion, namespace and name)."""
    plural, namespaced = resource(obj)
    api_version = obj["apiVersion"]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    meta = obj["metadata"]
    if namespaced:
        base += f"/namespaces/{quote(meta['namespace'])}"
    return f"{base}/{plural}/{quote(meta['name'])}"


def request(api: client.ApiClient, method: str, url: str, *, query: list[tuple[str, str]] | None = None,
            body: Any = None, content_type: str = "application/json") -> Obj:
    """One API call returning the decoded JSON body. Raises: ApiException."""
    resp = api.call_api(url, method, {}, query or [], {"Accept": "application/json", "Content-Type": content_type},
                        body=body, auth_settings=["BearerToken"], _preload_content=False,
                        _return_http_data_only=True, _request_timeout=30)
    data = resp.data
    return dict(json.loads(data)) if data else {}


def apply(api: client.ApiClient, obj: Obj) -> str:
    """Server-side apply ``obj`` (field manager ``kfp-gpu``, force); the line kubectl would print.
    Raises: KfpGpuError (see :func:`refusal`)."""
    with refusal(describe(obj), "apply"):
        request(api, "PATCH", path(obj), query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
                body=obj, content_type="application/apply-patch+yaml")
    return f"{describe(obj)} serverside-applied"


def delete(api: client.ApiClient, obj: Obj) -> str:
    """Delete ``obj`` (gone already is fine); the line kubectl would print. Raises: KfpGpuError."""
    with refusal(describe(obj), "delete"):
        gone = ignore_404(lambda: request(api, "DELETE", path(obj)))
    return f"{describe(obj)} {'deleted' if gone else 'not found'}"


def ignore_404(fn: Callable[[], Any]) -> bool:
    """Call ``fn``; False when it answered 404, True otherwise. Raises: any other ApiException."""
    try:
        fn()
    except ApiException as exc:
        if exc.status != 404:
            raise
        return False
    return True


def crd_exists(api: client.ApiClient, name: str) -> bool:
    """Raises: KfpGpuError when the CRD cannot be read (401/403...)."""
    with refusal(f"customresourcedefinition/{name}", "read"):
        return ignore_404(lambda: request(api, "GET", f"{CRD_PATH}/{name}"))


def wait_established(api: client.ApiClient, crds: Iterable[str], timeout_s: float = ESTABLISH_TIMEOUT_S) -> None:
    """Wait until every CRD in ``crds`` is Established. Raises: KfpGpuError naming the CRD after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    for name in crds:
        while True:
            crd = request(api, "GET", f"{CRD_PATH}/{name}")
            conds = {c.get("type"): c for c in (crd.get("status") or {}).get("conditions") or []}
            if (conds.get("Established") or {}).get("status") == "True":
                break
            if time.monotonic() > deadline:
                why = (conds.get("NamesAccepted") or {}).get("message") or "no Established condition yet"
                raise KfpGpuError(f"CRD {name} is not Established after {timeout_s:.0f}s: {why}",
                                  remediation=f"kubectl describe crd {name}")
            time.sleep(0.2)


@contextmanager
def refusal(what: str, verb: str) -> Iterator[None]:
    """Turn an API refusal while ``verb``-ing ``what`` (e.g. ``role/kfp-gpu -n ml-team``) into one KfpGpuError
    naming it, the answer and the fix: PermissionDenied (401/403), NotFound (404: the kfp-gpu API is missing),
    KfpGpuError (anything else)."""
    try:
        yield
    except ApiException as exc:
        text = message(exc)
        if exc.status in (401, 403):
            raise PermissionDenied(f"the Kubernetes API refused to {verb} {what}: {text}",
                                   remediation=ADMIN_FIX) from None
        if exc.status == 404:
            raise NotFound(f"cannot {verb} {what}: {text}",
                           remediation="run `kfp-gpu install` first (it installs the kfp-gpu API)") from None
        raise KfpGpuError(f"the Kubernetes API answered {exc.status} to {verb} {what}: {text}",
                          remediation="correct what the message names and run the command again") from None


def message(exc: ApiException) -> str:
    """The API server's message of ``exc`` (its reason when the body has none)."""
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)
