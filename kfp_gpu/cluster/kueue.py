"""The read side of Kueue (``kueue.x-k8s.io/v1beta2``, served by Kueue v0.17): LocalQueues, ClusterQueues,
ResourceFlavors and AdmissionChecks. I/O only; the decisions are in :mod:`kfp_gpu.plan.kueue`.

Calls (all reads): localqueues list (namespaced); clusterqueues get, resourceflavors list, admissionchecks get
(cluster-scoped); the ``clusterqueues.kueue.x-k8s.io`` CustomResourceDefinition get, only to tell "Kueue not
installed" from "installed without v1beta2".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from kfp_gpu.errors import CrdMissing, InvalidSpec
from kfp_gpu.plan.kueue import (
    GPU,
    GROUP,
    PROVISIONING_CONTROLLER,
    QUEUE_LABEL,
    VERSION,
    FlavorQuota,
    LocalQueueRef,
    QueueSetup,
    choose_local_queue,
)

__all__ = ["CRD", "GROUP", "QUEUE_LABEL", "VERSION", "LocalQueueRef", "QueueSetup", "list_local_queues",
           "pick_local_queue", "read_queue_setup", "resolve_local_queue"]

CRD = "clusterqueues.kueue.x-k8s.io"


def list_local_queues(api: client.ApiClient, namespace: str) -> list[LocalQueueRef] | None:
    """The namespace's LocalQueues; None when Kueue is not installed (no ClusterQueue CRD).

    Raises:
        CrdMissing: Kueue is installed but does not serve ``kueue.x-k8s.io/v1beta2`` (older than the versions
            kfp-gpu reads).
        ApiException: any other API failure (e.g. 403 when the caller may not list LocalQueues).
    """
    custom = client.CustomObjectsApi(api)
    try:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "localqueues").get("items", [])
    except ApiException as exc:
        if exc.status != 404:
            raise
        try:
            raw = client.ApiextensionsV1Api(api).read_custom_resource_definition(CRD, _preload_content=False)
        except ApiException as exc2:
            if exc2.status == 404:
                return None
            raise
        versions = (json.loads(raw.data or b"{}").get("spec") or {}).get("versions") or []
        served = [str(v.get("name")) for v in versions if v.get("served")]
        raise CrdMissing(f"Kueue in this cluster serves {GROUP} {', '.join(served) or 'no version'}, not {VERSION}",
                         remediation=f"upgrade Kueue to a release that serves {GROUP}/{VERSION} (v0.17 does)",
                         crd=CRD) from None
    return [LocalQueueRef(str(q["metadata"]["name"]), str((q.get("spec") or {}).get("clusterQueue", "")))
            for q in items]


def resolve_local_queue(api: client.ApiClient, namespace: str, wanted: str) -> LocalQueueRef | None:
    """The LocalQueue a job in ``namespace`` is submitted to (label :data:`QUEUE_LABEL` = its name).

    ``wanted`` is ``target.queue`` ("" = auto-detect: the only LocalQueue, or the one named ``default``). None when
    Kueue is not installed, or ``wanted`` is "" and the namespace has no LocalQueue (Kueue does not gate the job).

    Raises:
        InvalidSpec: ``wanted`` names no LocalQueue of the namespace (field target.queue, the value, the queues
            there) or Kueue is not installed; or ``wanted`` is "" and the namespace has several LocalQueues, none named ``default``.
        CrdMissing: Kueue is installed but does not serve ``kueue.x-k8s.io/v1beta2``.
        ApiException: the list failed (e.g. 403).
    """
    return pick_local_queue(namespace, wanted, list_local_queues(api, namespace))


def pick_local_queue(namespace: str, wanted: str, queues: list[LocalQueueRef] | None) -> LocalQueueRef | None:
    """:func:`resolve_local_queue` on already listed queues (None = Kueue not installed).

    Raises:
        InvalidSpec: as :func:`resolve_local_queue`.
    """
    if queues is None:
        if wanted:
            raise InvalidSpec("target.queue", wanted, f"Kueue is not installed in this cluster (no CRD {CRD})",
                              remediation="leave target.queue empty, or install Kueue and create the LocalQueue")
        return None
    return choose_local_queue(namespace, wanted, queues)


def read_queue_setup(api: client.ApiClient, lq: LocalQueueRef) -> QueueSetup:
    """The ClusterQueue behind ``lq``: its ``nvidia.com/gpu`` flavors (quota, reservation, limits, node labels of
    their ResourceFlavors), cohort, ProvisioningRequest AdmissionChecks and Active condition.

    Raises:
        ApiException: a read failed (a missing ClusterQueue is ``found=False``, a missing ResourceFlavor has
            ``node_labels=None``, a missing AdmissionCheck is skipped).
    """
    custom = client.CustomObjectsApi(api)
    try:
        cq: dict[str, Any] = custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", lq.cluster_queue)
    except ApiException as exc:
        if exc.status == 404:
            return QueueSetup(lq, found=False)
        raise
    spec, status = cq.get("spec") or {}, cq.get("status") or {}
    groups = [g for g in spec.get("resourceGroups") or [] if GPU in (g.get("coveredResources") or [])]
    reserved = _usage(status.get("flavorsReservation") or status.get("flavorsUsage") or [])
    labels: dict[str, Mapping[str, str]] = {}
    if groups:
        rfs = custom.list_cluster_custom_object(GROUP, VERSION, "resourceflavors").get("items", [])
        labels = {str(rf["metadata"]["name"]): dict((rf.get("spec") or {}).get("nodeLabels") or {}) for rf in rfs}
    flavors = []
    for g in groups:
        for f in g.get("flavors") or []:
            for r in f.get("resources") or []:
                if r.get("name") == GPU:
                    name = str(f["name"])
                    flavors.append(FlavorQuota(name, _qty(r.get("nominalQuota", 0)), reserved.get(name, 0.0),
                                               _opt(r.get("borrowingLimit")), _opt(r.get("lendingLimit")),
                                               labels.get(name)))
    checks = []
    for rule in (spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or []:
        try:
            ac = custom.get_cluster_custom_object(GROUP, VERSION, "admissionchecks", rule["name"])
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise
        if (ac.get("spec") or {}).get("controllerName") == PROVISIONING_CONTROLLER:
            checks.append((str(rule["name"]), tuple(str(x) for x in rule.get("onFlavors") or ())))
    inactive = next((str(c.get("message") or c.get("reason") or "Active=False")
                     for c in status.get("conditions") or [] if c.get("type") == "Active" and c.get("status") == "False"),
                    "")
    return QueueSetup(lq, True, str(spec.get("cohortName") or ""), bool(groups), tuple(flavors), tuple(checks),
                      inactive)


def _usage(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {str(f["name"]): _qty(r.get("total", 0)) for f in rows for r in f.get("resources") or []
            if r.get("name") == GPU}


def _qty(value: Any) -> float:
    return float(parse_quantity(str(value)))


def _opt(value: Any) -> float | None:
    return None if value is None else _qty(value)
