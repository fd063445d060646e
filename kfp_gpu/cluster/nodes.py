"""GPU nodes as the cluster sees them: readiness, pool membership, run claims, and a Node watch.

A run *claims* the Ready nodes of its gang by labelling them with its run id and tainting them
``<namespace>.claims.kfp-gpu.io/run=<run id>:NoSchedule`` (the run's ``spec.target.namespace``) in one
conditional patch, so two runs never claim the same node and no pod that lacks the run's own toleration
(:func:`run_toleration`) is scheduled there: another team's GPU pod that tolerates ``nvidia.com/gpu`` stays off
the gang. The key names the namespace so an admission policy can refuse a pod that tolerates another
namespace's claim. The PyTorchJob then selects on that label, parallel runs on one pool stay apart, and
teardown (or the janitor) releases exactly its own nodes with :func:`unclaim`.

Nodes travel as plain JSON dicts (``_preload_content=False``): the kubernetes client builds a
``Configuration`` (and resets logger levels) for every model object it deserialises, which made a 64-node
list + watch cost over a second of CPU. ``Node`` below is that dict.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu import fanout
from kfp_gpu.cluster import node_labels
from kfp_gpu.cluster.conditional import patch_conditionally
from kfp_gpu.cluster.listwatch import ERROR, Event, Watcher
from kfp_gpu.cluster.node_labels import pool_of
from kfp_gpu.ownership import (
    CLAIM_TAINT_SUFFIX,
    LABEL_LEASE,
    LABEL_RUN_ID,
    LEGACY_RUN_TAINT_KEY,
    PROTECTED_BY,
    SWAP_OUT_ANNOTATION,
    UNHEALTHY_TAINT,
    label_safe,
)
from kfp_gpu.plan import readiness
from kfp_gpu.plan.readiness import gpus_allocatable, is_ready

GPU = readiness.GPU
GKE_POOL_LABEL = node_labels.GKE.pool
ZONE_LABEL = "topology.kubernetes.io/zone"


Node = dict[str, Any]  # a Node object as the API server's JSON


@dataclass(frozen=True)
class NodeView:
    name: str
    pool: str
    zone: str
    ready: bool
    gpus: int
    run_id: str  # claim label value, "" when unclaimed
    deleting: bool
    going: bool = False  # cordoned or tainted for shutdown (a preemption notice): never usable again
    uid: str = ""  # a VM recreated under the same name registers a new Node (new uid)


    @classmethod
    def of(cls, node: Node) -> NodeView:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        return cls(
            name=str(meta.get("name", "")),
            pool=pool_of(labels),
            zone=labels.get(ZONE_LABEL, ""),
            ready=is_ready(node),
            gpus=gpus_allocatable(node),
            run_id=labels.get(LABEL_RUN_ID, ""),
            deleting=meta.get("deletionTimestamp") is not None,
            going=is_going(node),
            uid=str(meta.get("uid", "")),
        )


def is_going(node: Node) -> bool:
    """Cordoned, shutting down (the kubelet's graceful node shutdown: Ready=False, "node is shutting down"), or
    tainted by a shutdown/termination notice (:data:`kfp_gpu.plan.recovery.SHUTDOWN_TAINTS`)."""
    from kfp_gpu.plan.recovery import NODE_SHUTTING_DOWN, SHUTDOWN_TAINTS

    spec = node.get("spec") or {}
    shutting = any(c.get("type") == "Ready" and c.get("status") != "True" and NODE_SHUTTING_DOWN in str(c.get("message") or "")
                   for c in (node.get("status") or {}).get("conditions") or [])
    return shutting or bool(spec.get("unschedulable")) or any(
        t.get("key") in SHUTDOWN_TAINTS for t in spec.get("taints") or [])


def name_of(node: Node) -> str:
    return str((node.get("metadata") or {}).get("name", ""))


def labels_of(node: Node) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("labels") or {})


def list_nodes(api: client.ApiClient, selector: str = "", *, field_selector: str = "") -> tuple[list[Node], str]:
    """Nodes matching ``selector`` (and ``field_selector``) and the list's resourceVersion (to start a watch
    without gaps)."""
    resp = client.CoreV1Api(api).list_node(label_selector=selector or None, field_selector=field_selector or None,
                                           _preload_content=False)
    data = json.loads(resp.data)
    return list(data.get("items") or []), str((data.get("metadata") or {}).get("resourceVersion", ""))


def _read(core: client.CoreV1Api, name: str) -> Node:
    return dict(json.loads(core.read_node(name, _preload_content=False).data))


def read_node(api: client.ApiClient, name: str) -> Node | None:
    """One Node as JSON, or None when it does not exist. Raises: ApiException (non-404)."""
    try:
        return _read(client.CoreV1Api(api), name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def leaving(api: client.ApiClient, name: str) -> bool:
    """Is ``name`` a live node its run gives up: swapped out (annotated ``kfp-gpu.io/swap-out``: a stall's repeat
    offender, a straggler) or released for a bad GPU (tainted ``kfp-gpu.io/gpu-unhealthy``)? False when it is gone.
    A backend that can release one node (``releases_one_node``) gives such a node back before it sizes the
    replacement. Raises: ApiException (non-404)."""
    node = read_node(api, name)
    if node is None:
        return False
    swapped = SWAP_OUT_ANNOTATION in ((node.get("metadata") or {}).get("annotations") or {})
    return swapped or any(t.get("key") == UNHEALTHY_TAINT for t in (node.get("spec") or {}).get("taints") or [])




def claim_taint_key(namespace: str) -> str:
    """The claim taint key of runs in ``namespace``: ``<namespace>.claims.kfp-gpu.io/run``. A namespace name
    is a DNS label, so the prefix is a DNS subdomain and the key a valid qualified name.

    Raises: ValueError when ``namespace`` is empty (the key would not be a qualified name).
    """
    if not namespace:
        raise ValueError("claim_taint_key: the namespace is empty")
    return namespace + CLAIM_TAINT_SUFFIX


def _key_of(taint: Any) -> str:
    return str((taint.get("key") if isinstance(taint, dict) else getattr(taint, "key", "")) or "")


def is_claim_taint(taint: Any) -> bool:
    """A run's claim taint, of any namespace (``<namespace>.claims.kfp-gpu.io/run``), or the key of older
    versions (``kfp-gpu.io/run``), so nodes they claimed are released too. ``taint`` is a taint dict (or a
    kubernetes client ``V1Taint``/``V1Toleration``)."""
    key = _key_of(taint)
    return key == LEGACY_RUN_TAINT_KEY or (key.endswith(CLAIM_TAINT_SUFFIX) and len(key) > len(CLAIM_TAINT_SUFFIX))


def claim_namespace(taint: Any) -> str:
    """The namespace a claim taint names; "" for the key of older versions and for a taint that is no claim."""
    key = _key_of(taint)
    return key[:-len(CLAIM_TAINT_SUFFIX)] if key != LEGACY_RUN_TAINT_KEY and is_claim_taint(taint) else ""


def run_taint(run_id: str, namespace: str) -> dict[str, str]:
    """The NoSchedule taint a claim of a run in ``namespace`` puts on a node: only pods with
    :func:`run_toleration` land there. Raises: ValueError (empty ``namespace``)."""
    return {"key": claim_taint_key(namespace), "value": label_safe(run_id), "effect": "NoSchedule"}


def run_toleration(run_id: str, namespace: str) -> dict[str, str]:
    """The toleration of :func:`run_taint` that the run's own pods (in ``namespace``) carry.
    Raises: ValueError (empty ``namespace``)."""
    return {"key": claim_taint_key(namespace), "operator": "Equal", "value": label_safe(run_id),
            "effect": "NoSchedule"}


def _taints(node: Node) -> list[dict[str, Any]]:
    return [dict(t) for t in (node.get("spec") or {}).get("taints") or []]


SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"


def annotations_of(node: Node) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("annotations") or {})


def _protection(node: Node, run_id: str) -> dict[str, str]:
    """The annotations a protecting claim adds: none when the node already carries scale-down-disabled
    that kfp-gpu did not set (it belongs to someone else and stays as it is)."""
    ann = annotations_of(node)
    if ann.get(SCALE_DOWN_DISABLED) == "true" and PROTECTED_BY not in ann:
        return {}
    return {SCALE_DOWN_DISABLED: "true", PROTECTED_BY: label_safe(run_id)}


def claim(api: client.ApiClient, node: Node, run_id: str, lease_expires: float, *, namespace: str,
          attempts: int = 8, protect: bool = False) -> bool:
    """Label an unclaimed node with ``run_id`` and taint it for the run (:func:`run_taint` of ``namespace``, the
    run's ``spec.target.namespace``); False when another run got it first (or it vanished), or the node carries
    another namespace's claim taint.

    ``protect`` (the node is in a pool the cluster autoscaler manages, and the spec says protect): the same
    patch annotates it ``cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"`` (plus
    ``kfp-gpu.io/scale-down-disabled-by``, so :func:`unclaim` removes only what a claim set), and the
    autoscaler leaves it alone while the run holds it.

    Label and taint go in one patch conditional on ``resourceVersion`` (the taint list is replaced whole, so
    the patch carries the node's other taints as read, minus any other claim taint, e.g. the key of older
    versions); a conflict caused by a heartbeat (status update) is retried on the fresh object as long as the
    node is still unclaimed.

    Raises:
        ApiException: any API error other than 404 (node gone) and 409 (conflict, retried).
        ValueError: ``namespace`` is empty.
    """
    core = client.CoreV1Api(api)
    mine = label_safe(run_id)
    taint = run_taint(run_id, namespace)

    def change(node: Node) -> Node | bool:
        owner = labels_of(node).get(LABEL_RUN_ID, "")
        taints = _taints(node)
        claims = [t for t in taints if is_claim_taint(t)]
        if owner and owner != mine:
            return False
        if any(claim_namespace(t) not in ("", namespace) for t in claims):
            return False  # a run of another namespace holds it (even one whose run id maps to the same label)
        annotate = _protection(node, run_id) if protect else {}
        ann = annotations_of(node)
        if owner == mine and claims == [taint] and all(ann.get(k) == v for k, v in annotate.items()):
            return True
        body: dict[str, Any] = {
            "metadata": {
                "resourceVersion": node["metadata"]["resourceVersion"],
                "labels": {LABEL_RUN_ID: mine, LABEL_LEASE: str(int(lease_expires))},
            },
            "spec": {"taints": [t for t in taints if not is_claim_taint(t)] + [taint]},
        }
        if annotate:
            body["metadata"]["annotations"] = annotate
        return body

    name = name_of(node)
    return patch_conditionally(node, change, lambda body: core.patch_node(name, body, _preload_content=False),
                               lambda: read_node(api, name), attempts=attempts)


def claim_all(api: client.ApiClient, nodes: Sequence[Node], run_id: str, lease_expires: float, *, namespace: str,
              protect: Callable[[Node], bool] | None = None) -> list[bool]:
    """:func:`claim` every node of ``nodes`` at once (one write each, concurrently: a gang of N is not N round
    trips in a row) for the run ``run_id`` of ``namespace``; the outcomes in order. ``protect(node)``: claim that
    node with ``protect=True``.

    Raises:
        ApiException: as :func:`claim`, the first one in ``nodes`` order, once every claim has finished.
        ValueError: ``namespace`` is empty.
    """
    run_taint(run_id, namespace)  # an empty namespace fails here, before any write
    return fanout.run_all([functools.partial(claim, api, node, run_id, lease_expires, namespace=namespace,
                                             protect=bool(protect is not None and protect(node))) for node in nodes])


def unclaim(api: client.ApiClient, name: str, *, attempts: int = 8) -> bool:
    """Remove the run claim (label, lease label and every claim taint, :func:`is_claim_taint`: of any namespace,
    or the key of older versions) from a node, and the scale-down-disabled annotation when a claim set it
    (:data:`PROTECTED_BY`). Missing nodes are a no-op (returns False).

    The taint list is replaced whole, so the patch is conditional on the ``resourceVersion`` read and retried
    on a conflict: a taint another actor added in between (a shutdown notice) is kept. The node is read by a
    by-name list, so ``list`` + ``patch`` on nodes is all it needs (the janitor's RBAC).

    Raises:
        ApiException: any API error other than 404, or a conflict on every attempt.
    """
    core = client.CoreV1Api(api)

    def read() -> Node | None:
        found, _ = list_nodes(api, field_selector=f"metadata.name={name}")
        return found[0] if found else None

    def change(node: Node) -> Node:
        taints = _taints(node)
        body: dict[str, Any] = {"metadata": {
            "resourceVersion": node["metadata"]["resourceVersion"],
            "labels": {LABEL_RUN_ID: None, LABEL_LEASE: None},
        }}
        if PROTECTED_BY in annotations_of(node):
            body["metadata"]["annotations"] = {SCALE_DOWN_DISABLED: None, PROTECTED_BY: None}
        if any(is_claim_taint(t) for t in taints):
            body["spec"] = {"taints": [t for t in taints if not is_claim_taint(t)]}
        return body

    return patch_conditionally(read(), change, lambda body: core.patch_node(name, body, _preload_content=False),
                               read, attempts=attempts, raise_when_exhausted=True)


EventFn = Callable[[str, Node, float], None]


class NodeWatch(Watcher):
    """Scale-up's Node watch (a :class:`kfp_gpu.cluster.listwatch.Watcher`): ``on_event(type, node,
    received_at)`` for every event, from ``resource_version`` on (the caller listed and seeded already).

    Stream timeouts resume from the last resourceVersion; 410 Gone re-lists (``relist()`` when given, else a
    list with the same selector) and replays each node as ``SYNC``, so no state is lost. A refused watch (401/403) is
    passed on once as ``on_event("ERROR", {"error": ApiException}, at)`` and also kept in ``error``; ``stop()``
    ends it. Watches cost one API request per (re)connect, not one per node.
    """

    def __init__(self, api: client.ApiClient, selector: str, resource_version: str, on_event: EventFn,
                 relist: Callable[[], tuple[list[Node], str]] | None = None) -> None:
        self.error: BaseException | None = None

        def emit(ev: Event) -> None:
            if ev.type == ERROR:
                self.error = ev.obj["error"]
            on_event(ev.type, ev.obj, ev.at)

        super().__init__("node", client.CoreV1Api(api).list_node, emit, label_selector=selector or None,
                         since=resource_version, relist=relist)
