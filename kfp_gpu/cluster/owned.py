"""The objects a run owns, of every kind, as the API server's JSON: list, label patch, delete.

One place knows where each kind lives (ledger ConfigMaps, balloon pods, claimed Nodes, PyTorchJobs, run
Leases), so the heartbeat (which extends their lease label) and the janitor (which sweeps them, in one
namespace or all of them) walk the same table. Objects travel as plain dicts (no model deserialisation).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu.cluster import pytorchjob, trainjob
from kfp_gpu.ownership import (
    BALLOON_LABEL,
    LABEL_RUN_ID,
    LEASE_NAMESPACE_ANNOTATION,
    LEDGER_LABEL,
    RUN_LEASE_LABEL,
    label_safe,
)

Obj = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class Kind:
    name: str  # as reports print it: "configmap", "pod", "node-claim", "pytorchjob", "lease"
    prefix: str  # "/api/v1" or "/apis/<group>/<version>"
    plural: str
    namespaced: bool
    selector: str  # what marks it as ours, besides the run-id label

    def path(self, namespace: str | None, name: str = "") -> str:
        base = f"{self.prefix}/namespaces/{namespace}/{self.plural}" if self.namespaced and namespace else \
            f"{self.prefix}/{self.plural}"
        return f"{base}/{quote(name)}" if name else base


LEDGER = Kind("configmap", "/api/v1", "configmaps", True, f"{LEDGER_LABEL}=true")
BALLOON = Kind("pod", "/api/v1", "pods", True, f"{BALLOON_LABEL}=true")
NODE = Kind("node-claim", "/api/v1", "nodes", False, LABEL_RUN_ID)
JOB = Kind("pytorchjob", f"/apis/{pytorchjob.GROUP}/{pytorchjob.VERSION}", pytorchjob.PLURAL, True, LABEL_RUN_ID)
TRAINJOB = Kind("trainjob", f"/apis/{trainjob.RESOURCE.api_version}", trainjob.RESOURCE.plural, True, LABEL_RUN_ID)
JOBS = (JOB, TRAINJOB)  # every job kind (kfp_gpu.jobkinds): the janitor sweeps each
LEASE = Kind("lease", "/apis/coordination.k8s.io/v1", "leases", True, f"{RUN_LEASE_LABEL}=true")
PROVREQ = Kind("provisioningrequest", "/apis/autoscaling.x-k8s.io/v1", "provisioningrequests", True, LABEL_RUN_ID)
PODTEMPLATE = Kind("podtemplate", "/api/v1", "podtemplates", True, LABEL_RUN_ID)
NODEPOOL = Kind("nodepool", "/apis/karpenter.sh/v1", "nodepools", False, LABEL_RUN_ID)  # the karpenter backend's
COMPUTECLASS = Kind("computeclass", "/apis/cloud.google.com/v1", "computeclasses", False, LABEL_RUN_ID)  # compute-class
CLUSTER_SCOPED = (NODEPOOL, COMPUTECLASS)  # a backend's cluster-scoped objects, tied to a namespace by annotation
LABELLED = (LEDGER, BALLOON, NODE, *JOBS)  # kinds whose kfp-gpu.io/lease-expires label is a lease


def request(api: client.ApiClient, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
            body: Any = None, content_type: str = "application/json", timeout_s: float = 30.0) -> Obj:
    """One raw API call returning the decoded JSON body; a call hanging longer than ``timeout_s`` fails
    (a heartbeat must not stall on one request). Raises: ApiException; urllib3 errors when unreachable."""
    resp = api.call_api(path, method, {}, query or [], {"Accept": "application/json", "Content-Type": content_type},
                        body=body, auth_settings=["BearerToken"], _preload_content=False,
                        _return_http_data_only=True, _request_timeout=timeout_s)
    data = resp.data
    return dict(json.loads(data)) if data else {}


def run_selector(kind: Kind, run_id: str | None) -> str:
    sel = kind.selector
    if run_id is not None:
        sel += f",{LABEL_RUN_ID}={label_safe(run_id)}"
    return sel


def list_objects(api: client.ApiClient, kind: Kind, namespace: str | None, selector: str) -> list[Obj]:
    """Objects of ``kind`` matching ``selector`` in ``namespace`` (every namespace when None). A kind whose
    CRD is not installed lists as empty. Raises: ApiException (other than 404)."""
    try:
        data = request(api, "GET", kind.path(namespace), query=[("labelSelector", selector)])
    except ApiException as exc:
        if exc.status == 404:
            return []
        raise
    return list(data.get("items") or [])


def meta(obj: Obj) -> Obj:
    return dict(obj.get("metadata") or {})


def labels(obj: Obj) -> dict[str, str]:
    return dict(meta(obj).get("labels") or {})


def ident(kind: Kind, obj: Obj) -> str:
    """``kind/ns/name`` (``kind/name`` for cluster-scoped kinds), as reports print it."""
    m = meta(obj)
    return f"{kind.name}/{m.get('namespace')}/{m.get('name')}" if kind.namespaced else f"{kind.name}/{m.get('name')}"


def delete(api: client.ApiClient, kind: Kind, obj: Obj) -> bool:
    """Delete ``obj`` (pods with no grace period, jobs in the foreground). False when it was already gone.

    Raises: ApiException (other than 404).
    """
    m = meta(obj)
    body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
    if kind is BALLOON:
        body["gracePeriodSeconds"] = 0
    if kind in JOBS:
        body["propagationPolicy"] = "Foreground"
    try:
        request(api, "DELETE", kind.path(m.get("namespace"), str(m.get("name", ""))), body=body)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


def node_namespace(obj: Obj) -> str:
    """The namespace whose run leases a claimed Node answers to ("" when no heartbeat recorded it for the
    run that claims it now: a stale value left by an earlier run does not count)."""
    ns, _, run = str((meta(obj).get("annotations") or {}).get(LEASE_NAMESPACE_ANNOTATION, "")).partition("/")
    return ns if run and run == labels(obj).get(LABEL_RUN_ID) else ""


def run_objects(api: client.ApiClient, namespace: str | None, run_id: str | None,
                kinds: tuple[Kind, ...] = LABELLED) -> Iterator[tuple[Kind, Obj]]:
    """Every object of ``kinds`` owned by ``run_id`` (every run when None). Raises: ApiException."""
    for kind in kinds:
        for obj in list_objects(api, kind, namespace if kind.namespaced else None, run_selector(kind, run_id)):
            yield kind, obj
