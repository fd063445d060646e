"""Which ProvisioningRequests a stand-in serves, and what they ask for (pure: JSON in, decision out).

A request is this stand-in's when its class is ``queued-provisioning.gke.io``, its PodTemplate selects one of the
stand-in's queued pools (``nodeSelector`` ``cloud.google.com/gke-nodepool``, or a required node affinity ``In`` over
pool names), and, when the template selects ``kfp-gpu.io/sim-cluster``, that value is the stand-in's cluster. Any
other request is left to whoever serves it (another stand-in in a concurrent test, the cluster-autoscaler).
"""

from __future__ import annotations

from typing import Any

from kfp_gpu_rehearsal.sim.dws import (
    CLASS,
    MAX_RUN_KEY,
    MAX_RUN_S,
    POOL_LABEL,
    SIM_CLUSTER_LABEL,
    Demand,
    Refusal,
)
from kfp_gpu_rehearsal.sim.scenario import Scenario


def _selected(pod_spec: dict[str, Any], key: str) -> list[str] | None:
    """Values ``key`` is pinned to by the pod spec (nodeSelector, or the required affinity's ``In``); None = free."""
    sel = (pod_spec.get("nodeSelector") or {}).get(key)
    if sel is not None:
        return [str(sel)]
    req = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    values: list[str] = []
    pinned = False
    for term in req.get("nodeSelectorTerms") or []:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") == key and expr.get("operator") == "In":
                pinned = True
                values += [str(v) for v in expr.get("values") or []]
    return values if pinned else None


def template_pools(pod_spec: dict[str, Any]) -> list[str] | None:
    """Pool names a PodTemplate's pod spec selects; None when it does not pin the pool."""
    return _selected(pod_spec, POOL_LABEL)


def demand(request: dict[str, Any], templates: dict[str, dict[str, Any] | None], sc: Scenario) -> Demand | Refusal | None:
    """What ``request`` asks of this stand-in, a :class:`Refusal` GKE would answer with ``Failed``, or None when it
    is not this stand-in's to serve. ``templates`` maps each referenced PodTemplate name to its object (None: absent).
    """
    spec = request.get("spec") or {}
    if spec.get("provisioningClassName") != CLASS:
        return None
    pod_sets = spec.get("podSets") or []
    mine: list[tuple[str, int]] = []
    for ps in pod_sets:
        tmpl = templates.get(str((ps.get("podTemplateRef") or {}).get("name", "")))
        if tmpl is None:
            continue
        pod_spec = (tmpl.get("template") or {}).get("spec") or {}
        clusters = _selected(pod_spec, SIM_CLUSTER_LABEL)
        if clusters is not None and sc.cluster not in clusters:
            return None
        queued = [p for p in template_pools(pod_spec) or [] if any(
            q.name == p and q.queued_provisioning for q in sc.pools)]
        if queued:
            mine.append((queued[0], int(ps.get("count") or 0)))
    if not mine:
        return None
    pool = mine[0][0]
    if len(pod_sets) != 1 or len(mine) != 1:  # GKE: one podSet per queued request
        return Refusal("InvalidArgument", f"a {CLASS} request takes exactly one podSet, got {len(pod_sets)}", pool)
    count = mine[0][1]
    max_nodes = sc.pool(pool).max_nodes
    if count > max_nodes:
        return Refusal("InvalidArgument", f"podSets[0].count {count} exceeds node pool {pool}'s maximum of "
                       f"{max_nodes} nodes", pool)
    raw = (spec.get("parameters") or {}).get(MAX_RUN_KEY)
    if raw is None:
        return Demand(pool, count, float(MAX_RUN_S))
    try:
        max_run = int(str(raw))
    except ValueError:
        max_run = -1
    if not 0 < max_run <= MAX_RUN_S:
        return Refusal("InvalidArgument", f"parameters.{MAX_RUN_KEY} {raw!r} must be whole seconds in "
                       f"1..{MAX_RUN_S} (7 days)", pool)
    return Demand(pool, count, float(max_run))


def consumer(pod: dict[str, Any]) -> tuple[str, str] | None:
    """``(namespace, request name)`` a pod consumes: both annotations, GKE's class (None otherwise)."""
    from kfp_gpu_rehearsal.sim.dws import CLASS_ANNOTATION, CONSUME_ANNOTATION

    meta = pod.get("metadata") or {}
    notes = meta.get("annotations") or {}
    name = notes.get(CONSUME_ANNOTATION)
    if not name or notes.get(CLASS_ANNOTATION) != CLASS:
        return None
    return str(meta.get("namespace", "")), str(name)


def active_node(pod: dict[str, Any]) -> str:
    """The node a pod holds: bound, not terminal, not being deleted ("" otherwise)."""
    status, meta = pod.get("status") or {}, pod.get("metadata") or {}
    if status.get("phase") in ("Succeeded", "Failed") or meta.get("deletionTimestamp"):
        return ""
    return str((pod.get("spec") or {}).get("nodeName") or "")
