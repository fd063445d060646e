"""Karpenter (karpenter.sh/v1) on the Kubernetes API: the run's NodePool, its NodeClaims, placeholder pods, and
one watch (:class:`PoolWatch`, three :class:`kfp_gpu.cluster.listwatch.Watcher` loops) that feeds the pure
decisions of :mod:`kfp_gpu.plan.karpenter`.

The NodePool is cluster-scoped and named after the run (:func:`kfp_gpu.plan.karpenter.nodepool_name`), so a
retried step finds it (409 -> read it) instead of creating a second one. Karpenter provisions only for pending
pods, so the gang's placeholder pods (:func:`create_placeholders`: balloon-labelled, in the balloon
PriorityClass, selecting the run's NodePool and tolerating its taint but *not* the run's claim taint) make it
launch nodes; teardown's balloon sweep deletes any left.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu import fanout
from kfp_gpu.cluster.balloons import PAUSE_IMAGE, PRIORITY_CLASS, ensure_priority_class
from kfp_gpu.cluster.kube import crd_version_served, ignore_404
from kfp_gpu.cluster.listwatch import ERROR, SYNC, Event, Watcher
from kfp_gpu.cluster.nodes import GPU, NodeView, list_nodes
from kfp_gpu.ownership import BALLOON_LABEL, PLACEHOLDER_SET
from kfp_gpu.plan import karpenter as plan

NODE_CLASS_ENV = "KFP_GPU_KARPENTER_NODECLASS"  # "group/Kind/name" overrides the node class detection
TEMPLATE_ENV = "KFP_GPU_KARPENTER_TEMPLATE"  # JSON: node labels and startup taints for every run's NodePool
# (group, version, kind, plural) of the node classes kfp-gpu looks for: AWS's, then the kwok provider's
NODE_CLASSES = (("karpenter.k8s.aws", "v1", "EC2NodeClass", "ec2nodeclasses"),
                ("karpenter.kwok.sh", "v1alpha1", "KWOKNodeClass", "kwoknodeclasses"))
Obj = dict[str, Any]


def crd_served(api: client.ApiClient) -> bool:
    """True when the cluster serves NodePools at karpenter.sh/v1. Raises: ApiException (non-404)."""
    return crd_version_served(api, plan.CRD_NAME, plan.VERSION)


def node_class(api: client.ApiClient) -> dict[str, str]:
    """The ``nodeClassRef`` of the run's NodePool: ``$KFP_GPU_KARPENTER_NODECLASS`` ("group/Kind/name"), else the
    cluster's node class named ``default``, else its only one (EC2NodeClass, then KWOKNodeClass).

    Raises: NotFound naming the fix when there is none or several; ApiException (non-404).
    """
    from kfp_gpu.errors import NotFound

    env = os.environ.get(NODE_CLASS_ENV, "").strip()
    if env.count("/") == 2:
        group, kind, name = env.split("/")
        return {"group": group, "kind": kind, "name": name}
    custom = client.CustomObjectsApi(api)
    for group, version, kind, plural in NODE_CLASSES:
        try:
            items = custom.list_cluster_custom_object(group, version, plural).get("items") or []
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise
        names = sorted(str(i["metadata"]["name"]) for i in items)
        pick = "default" if "default" in names else (names[0] if len(names) == 1 else "")
        if pick:
            return {"group": group, "kind": kind, "name": pick}
        if names:
            raise NotFound(f"several {kind}s ({', '.join(names)}) and none named 'default' for the run's NodePool",
                           remediation=f"set {NODE_CLASS_ENV}={group}/{kind}/<name> in the controller's environment")
    raise NotFound("no Karpenter node class (EC2NodeClass or KWOKNodeClass) in the cluster for the run's NodePool",
                   remediation=f"create one (Karpenter's getting-started EC2NodeClass 'default'), or set "
                   f"{NODE_CLASS_ENV}=<group>/<Kind>/<name> in the controller's environment")


def template_extras() -> dict[str, Any]:
    """The platform admin's additions to every run's NodePool template, from ``$KFP_GPU_KARPENTER_TEMPLATE`` in the
    controller's environment (:func:`kfp_gpu.plan.nodepool_template.template_extras` says what it may hold): the keyword
    arguments ``node_labels`` and ``startup_taints`` of :func:`kfp_gpu.plan.karpenter.nodepool_body`.

    Raises: KfpGpuError (one line naming the variable, the value and the fix) when the value is not valid.
    """
    from kfp_gpu.plan.nodepool_template import template_extras as parse

    return parse(TEMPLATE_ENV, os.environ.get(TEMPLATE_ENV, ""))


def ensure_nodepool(api: client.ApiClient, body: Mapping[str, Any]) -> Obj:
    """Create the NodePool, or read the existing one of that name (a retried step re-attaches).
    Raises: ApiException (non-409)."""
    custom = client.CustomObjectsApi(api)
    try:
        made: Obj = custom.create_cluster_custom_object(plan.GROUP, plan.VERSION, plan.NODEPOOLS, dict(body))
        return made
    except ApiException as exc:
        if exc.status != 409:
            raise
    got: Obj = custom.get_cluster_custom_object(plan.GROUP, plan.VERSION, plan.NODEPOOLS, body["metadata"]["name"])
    return got


def get_nodepool(api: client.ApiClient, name: str) -> Obj | None:
    """The NodePool or None. Raises: ApiException (non-404)."""
    try:
        got: Obj = client.CustomObjectsApi(api).get_cluster_custom_object(plan.GROUP, plan.VERSION, plan.NODEPOOLS,
                                                                           name)
        return got
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def patch_nodepool(api: client.ApiClient, name: str, patch: Mapping[str, Any]) -> Obj:
    """A merge patch (lists such as ``requirements`` are replaced whole). Raises: ApiException."""
    out: Obj = client.CustomObjectsApi(api).patch_cluster_custom_object(plan.GROUP, plan.VERSION, plan.NODEPOOLS,
                                                                         name, dict(patch))
    return out


def list_nodepools(api: client.ApiClient, selector: str) -> list[Obj]:
    """NodePools matching ``selector``; none when the API is not served. Raises: ApiException (non-404)."""
    try:
        got = client.CustomObjectsApi(api).list_cluster_custom_object(plan.GROUP, plan.VERSION, plan.NODEPOOLS,
                                                                      label_selector=selector)
    except ApiException as exc:
        if exc.status == 404:
            return []
        raise
    return list(got.get("items") or [])


def delete_nodepool(api: client.ApiClient, name: str) -> bool:
    """Delete it (Karpenter then terminates its NodeClaims and nodes). False when already gone."""
    return ignore_404(functools.partial(client.CustomObjectsApi(api).delete_cluster_custom_object, plan.GROUP,
                                        plan.VERSION, plan.NODEPOOLS, name))


def list_nodeclaims(api: client.ApiClient, nodepool: str) -> list[Obj]:
    """The NodeClaims of ``nodepool``. Raises: ApiException (non-404)."""
    try:
        got = client.CustomObjectsApi(api).list_cluster_custom_object(
            plan.GROUP, plan.VERSION, plan.NODECLAIMS, label_selector=f"{plan.NODEPOOL_LABEL}={nodepool}")
    except ApiException as exc:
        if exc.status == 404:
            return []
        raise
    return list(got.get("items") or [])


def delete_nodeclaim(api: client.ApiClient, name: str) -> bool:
    return ignore_404(functools.partial(client.CustomObjectsApi(api).delete_cluster_custom_object, plan.GROUP,
                                        plan.VERSION, plan.NODECLAIMS, name))


def release_nodes(api: client.ApiClient, nodepool: str, nodes: Sequence[str], *, timeout_s: float = 120.0) -> list[str]:
    """Give ``nodes`` of ``nodepool`` back: delete the NodeClaim behind each (its ``status.nodeName``; Karpenter's
    termination controller then taints, drains and terminates the instance, https://karpenter.sh/docs/concepts/disruption/
    "Manual Methods") and wait until those NodeClaims are gone, so the NodePool's GPU limit (the gang's GPUs) has room
    for the replacement. Returns the NodeClaims deleted. Raises: ApiException (non-404 listing or deletion)."""
    want = set(nodes)
    claims = [str(c["metadata"]["name"]) for c in list_nodeclaims(api, nodepool)
              if str((c.get("status") or {}).get("nodeName") or "") in want]
    for name in claims:
        delete_nodeclaim(api, name)
    deadline = time.time() + timeout_s
    while claims and time.time() < deadline:
        left = {str(c["metadata"]["name"]) for c in list_nodeclaims(api, nodepool)}
        if not left & set(claims):
            break
        time.sleep(0.2)
    return claims


# ---- placeholders ---------------------------------------------------------------------------------------

def placeholder_names(nodepool: str, step: str, attempt: int, count: int) -> list[str]:
    """Names per (step, candidate attempt): a new candidate gets new pods, because Karpenter reports a pod it
    cannot place only once per pod uid in 5 minutes."""
    base = f"{nodepool[:40]}-{''.join(c if c.isalnum() else '-' for c in step.lower())[:12]}".strip("-")
    return [f"{base}-{attempt}-{i}" for i in range(count)]


def _event_time(event: Mapping[str, Any]) -> float:
    """When an event last happened (lastTimestamp, eventTime or series.lastObservedTime); 0 when unreadable."""
    from datetime import datetime

    for raw in ((event.get("series") or {}).get("lastObservedTime"), event.get("lastTimestamp"),
                event.get("eventTime")):
        if raw:
            try:
                return datetime.fromisoformat(str(raw).replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return 0.0




def create_placeholders(api: client.ApiClient, namespace: str, names: Sequence[str], *, labels: Mapping[str, str],
                        nodepool: str, gpus_per_node: int, tolerations: Sequence[Mapping[str, str]],
                        one_zone: bool = False, selector: Mapping[str, str] | None = None) -> None:
    """One whole-node GPU pod per name, selecting ``nodepool`` (or the node labels ``selector``; existing ones are
    kept). ``one_zone``: the pods
    require each other's zone (pod affinity), so Karpenter launches the whole gang in one zone when the NodePool
    allows several. Raises: ApiException."""
    ensure_priority_class(api)
    core = client.CoreV1Api(api)
    gpus = str(gpus_per_node)
    group = {PLACEHOLDER_SET: str(names[0]).rsplit("-", 1)[0]} if names else {}
    affinity = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": group}, "topologyKey": plan.ZONE_LABEL}]}} if one_zone and names else None

    def create(name: str) -> None:
        pod: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {**labels, **group, BALLOON_LABEL: "true"}},
            "spec": {"priorityClassName": PRIORITY_CLASS, "terminationGracePeriodSeconds": 0,
                     "nodeSelector": dict(selector) if selector else {plan.NODEPOOL_LABEL: nodepool},
                     "tolerations": [dict(t) for t in tolerations],
                     "containers": [{"name": "placeholder", "image": PAUSE_IMAGE,
                                     "resources": {"requests": {GPU: gpus}, "limits": {GPU: gpus}}}]}}
        if affinity is not None:
            pod["spec"]["affinity"] = affinity
        try:
            _ = core.create_namespaced_pod(namespace, pod, _preload_content=False).data  # raw: no model built
        except ApiException as exc:
            if exc.status != 409:
                raise

    fanout.run_all([functools.partial(create, n) for n in names])


# ---- the watch ------------------------------------------------------------------------------------------

class PoolWatch:
    """The run's NodePool as Karpenter works on it: its NodeClaims, its Nodes, and Karpenter's FailedScheduling
    events on the placeholder pods, each kept current by a list/watch loop. ``signals`` collects the evidence
    :func:`kfp_gpu.plan.karpenter.assess` reads: a NodeClaim deleted before it launched (an ICE), Karpenter's
    "no offering" events. A refused watch is kept in ``error``."""

    def __init__(self, api: client.ApiClient, namespace: str, nodepool: str, pods: Sequence[str]) -> None:
        self.nodepool, self.pods = nodepool, set(pods)
        self.claims: dict[str, plan.ClaimView] = {}
        self.nodes: dict[str, Obj] = {}
        self.signals: list[plan.Signal] = []
        self.error: BaseException | None = None
        self._lock = threading.Condition()
        sel = f"{plan.NODEPOOL_LABEL}={nodepool}"
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        self._watchers = [
            Watcher(f"nodeclaims-{nodepool}", custom.list_cluster_custom_object, self._on_claim, plan.GROUP,
                    plan.VERSION, plan.NODECLAIMS, label_selector=sel),
            Watcher(f"nodes-{nodepool}", core.list_node, self._on_node, label_selector=sel),
            Watcher(f"events-{nodepool}", core.list_namespaced_event, self._on_event, namespace,
                    field_selector="reason=FailedScheduling"),
        ]

    def start(self) -> PoolWatch:
        for w in self._watchers:
            w.start()
        return self

    def stop(self) -> None:
        for w in self._watchers:
            w.stop()

    def _refused(self, ev: Event) -> bool:
        if ev.type == ERROR:
            self.error = ev.obj.get("error") or RuntimeError(f"watch {ev.source} refused")
        return ev.type == ERROR

    def _on_claim(self, ev: Event) -> None:
        with self._lock:
            if not self._refused(ev):
                name = str((ev.obj.get("metadata") or {}).get("name", ""))
                old = self.claims.get(name)
                view = plan.read_claim(ev.obj, since=old.since if old else ev.at, launched_before=bool(old and old.launched))
                if ev.type == "DELETED":
                    self.claims.pop(name, None)
                    if not view.launched:
                        self.signals.append(plan.Signal("ice", ev.at, plan.ICE_REASON, f"NodeClaim {name} "
                                                        "was deleted before it launched (insufficient capacity)", name))
                else:
                    self.claims[name] = view
            self._lock.notify_all()

    def _on_node(self, ev: Event) -> None:
        with self._lock:
            if not self._refused(ev):
                name = str((ev.obj.get("metadata") or {}).get("name", ""))
                if ev.type == "DELETED":
                    self.nodes.pop(name, None)
                else:
                    self.nodes[name] = ev.obj
            self._lock.notify_all()

    def _on_event(self, ev: Event) -> None:
        with self._lock:
            if not self._refused(ev) and ev.type != "DELETED":
                involved = ev.obj.get("involvedObject") or {}
                msg = plan.karpenter_scheduling_message(ev.obj)
                if msg and involved.get("name") in self.pods:
                    at = _event_time(ev.obj) if ev.type == SYNC else ev.at  # a listed event may be old
                    self.signals.append(plan.Signal("no-offering", at, plan.short_reason(msg), msg))
            self._lock.notify_all()

    def watch_pods(self, names: Sequence[str]) -> None:
        with self._lock:
            self.pods |= set(names)

    def snapshot(self) -> tuple[list[plan.ClaimView], list[NodeView], list[Obj], list[plan.Signal]]:
        with self._lock:
            return (list(self.claims.values()), [NodeView.of(n) for n in self.nodes.values()],
                    list(self.nodes.values()), list(self.signals))

    def wait(self, timeout_s: float) -> None:
        with self._lock:
            self._lock.wait(timeout=timeout_s)


def wait_gone(api: client.ApiClient, nodepools: Sequence[str], selector: str, deadline: float) -> list[str]:
    """Block until no NodePool matches ``selector`` and no Node of ``nodepools`` is listed, or the deadline.
    Returns what is still there ("node/<name>", "nodepool/<name>"). Raises: ApiException."""
    while True:
        left = [f"nodepool/{p['metadata']['name']}" for p in list_nodepools(api, selector)]
        for name in nodepools:
            nodes, _ = list_nodes(api, f"{plan.NODEPOOL_LABEL}={name}")
            left += [f"node/{n['metadata']['name']}" for n in nodes]
        if not left or time.time() >= deadline:
            return left
        time.sleep(0.5)
