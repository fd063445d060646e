"""The one node-readiness predicate: when a Node may run a gang's pods. Pure (a Node as JSON in, a bool out).

Every reader of "is this node ready" calls :func:`is_ready`: the node views of the provisioners
(:class:`kfp_gpu.cluster.nodes.NodeView`), the gang watch's facts (:func:`kfp_gpu.cluster.facts.node_fact`),
preflight's count of Ready GPU nodes, the dev cluster's and the benchmarks' waits for Ready nodes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

GPU = "nvidia.com/gpu"

# Taints a node is born with and that its controller removes once it may run pods; a Ready node that still carries
# one is not usable yet. Karpenter launches every node with karpenter.sh/unregistered:NoExecute and removes it when
# it registers the NodeClaim (sigs.k8s.io/karpenter pkg/apis/v1/taints.go, nodeclaim/lifecycle/registration.go): a
# pod bound to the node before that, by nodeName, is evicted at once by the taint-eviction controller. The cloud
# controller manager removes node.cloudprovider.kubernetes.io/uninitialized once it has initialized the node
# (https://kubernetes.io/docs/tasks/administer-cluster/running-cloud-controller/).
STARTUP_TAINTS: frozenset[str] = frozenset({"karpenter.sh/unregistered", "node.cloudprovider.kubernetes.io/uninitialized"})


def gpus_allocatable(node: Mapping[str, Any]) -> int:
    """The node's allocatable ``nvidia.com/gpu`` (0 when absent or not a whole number)."""
    alloc = (node.get("status") or {}).get("allocatable") or {}
    try:
        return int(str(alloc.get(GPU, "0")))
    except ValueError:
        return 0


def is_ready(node: Mapping[str, Any], *, gpus: int = 0, startup: Collection[str] = ()) -> bool:
    """The Ready condition is True, no :data:`STARTUP_TAINTS` taint (nor one keyed in ``startup``: the startup taints
    the node's NodePool declares, which their agent removes) is left, and (``gpus`` > 0) at least ``gpus``
    ``nvidia.com/gpu`` are allocatable (the device plugin has registered them)."""
    if any((t or {}).get("key") in STARTUP_TAINTS or (t or {}).get("key") in startup
           for t in (node.get("spec") or {}).get("taints") or []):
        return False
    if gpus > 0 and gpus_allocatable(node) < gpus:
        return False
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False
