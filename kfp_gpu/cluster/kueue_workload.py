"""Kueue Workloads (kueue.x-k8s.io) of the train step's job: the watch, the version served, and fact extraction.

Kueue makes one Workload per job it manages, named ``<kind>-<job>-<hash>`` (``pytorchjob-...``, ``trainjob-...``),
owned by the job (a controller owner reference) and labelled ``kueue.x-k8s.io/job-uid=<job uid>``. The train step finds its job's Workload by
either, on the one list/watch loop (:mod:`kfp_gpu.cluster.listwatch`) over the namespace's Workloads, and turns
it into a :class:`kfp_gpu.plan.admission.WorkloadFact`; the decisions are in :mod:`kfp_gpu.plan.admission`.
Reading Workloads needs ``get``/``list``/``watch`` on ``workloads.kueue.x-k8s.io`` in the namespace.
"""

from __future__ import annotations

import json
import queue
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from kfp_gpu.cluster.listwatch import Event, Watcher
from kfp_gpu.plan.admission import ADMITTED, EVICTED, FINISHED, QUOTA_RESERVED, WorkloadFact
from kfp_gpu.plan.kueue import GROUP, VERSION

PLURAL = "workloads"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def watcher(api: client.ApiClient, sink: queue.Queue[Event], namespace: str) -> Watcher:
    """A list/watch loop over the namespace's Workloads (``kueue.x-k8s.io/v1beta2``), events tagged ``workload``."""
    return Watcher("workload", client.CustomObjectsApi(api).list_namespaced_custom_object, sink.put, GROUP,
                   VERSION, namespace, PLURAL)


def owner_uid(obj: Mapping[str, Any]) -> str:
    """The uid of the job a Workload belongs to: its controller owner reference, else the job-uid label."""
    meta = obj.get("metadata") or {}
    refs = meta.get("ownerReferences") or []
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    if ref is not None and ref.get("uid"):
        return str(ref["uid"])
    return str((meta.get("labels") or {}).get(JOB_UID_LABEL, ""))


def workload_fact(obj: Mapping[str, Any], at: float, *, deleted: bool = False) -> WorkloadFact:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    cond = {str(c.get("type")): c for c in status.get("conditions") or []}

    def true(kind: str) -> bool:
        return str((cond.get(kind) or {}).get("status")) == "True"

    pending = ""
    reserved = cond.get(QUOTA_RESERVED) or {}
    if not true(QUOTA_RESERVED):
        pending = str(reserved.get("message") or reserved.get("reason") or "")
    elif not true(ADMITTED):
        checks = [f"{c.get('name')}: {c.get('state')}" + (f" ({c['message']})" if c.get("message") else "")
                  for c in status.get("admissionChecks") or []]
        pending = "; ".join(checks)
    evicted = cond.get(EVICTED) or {}
    inactive = (obj.get("spec") or {}).get("active") is False
    return WorkloadFact(
        name=str(meta.get("name", "")), at=at, owner_uid=owner_uid(obj), quota_reserved=true(QUOTA_RESERVED),
        admitted=true(ADMITTED),
        evicted=str(evicted.get("reason") or EVICTED) if true(EVICTED) else ("InactiveWorkload" if inactive else ""),
        evicted_message=str(evicted.get("message") or "") if true(EVICTED) else "",
        pending=pending, cluster_queue=str((status.get("admission") or {}).get("clusterQueue") or ""),
        finished=true(FINISHED), deleted=deleted or bool(meta.get("deletionTimestamp")),
    )


def for_job(api: client.ApiClient, namespace: str, job_uid: str) -> list[dict[str, Any]]:
    """The Workloads in ``namespace`` that belong to the job with ``job_uid``. Raises: ApiException."""
    resp = client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                                      _preload_content=False)
    items: list[dict[str, Any]] = json.loads(resp.data).get("items") or []
    return [w for w in items if owner_uid(w) == job_uid]
