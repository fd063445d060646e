"""Preflight's cluster-side checks: each reads the Kubernetes API once and returns a ClusterCheck.

Contract: every function here takes the run's spec and a ``kubernetes.client.ApiClient`` (or the result of
:func:`ready_gpu_nodes`, read once and shared) and returns a :class:`~kfp_gpu.plan.preflight.ClusterCheck`;
none raises for a read it cannot make: a refused or failed read is UNKNOWN with the RBAC fix
(:func:`api_error`), never ok. The checks: the namespace ResourceQuota on ``requests.nvidia.com/gpu``
(:func:`namespace_quota`), Ready GPU nodes plus pool headroom (:func:`capacity_check`), one topology domain
for the gang (:func:`topology_check`), and the Kueue ClusterQueue behind the run's LocalQueue
(:func:`kueue_check`). :func:`kfp_gpu.steps.preflight.run_preflight` runs them concurrently.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from kfp_gpu import accelerators, fanout
from kfp_gpu.cluster import node_labels
from kfp_gpu.errors import KfpGpuError
from kfp_gpu.plan import topology
from kfp_gpu.plan.placement import matching_pools
from kfp_gpu.plan.preflight import ClusterCheck
from kfp_gpu.plan.quota import Verdict
from kfp_gpu.providers.base import PoolState
from kfp_gpu.spec import ProvisioningSpec, TargetKind

__all__ = ["NodeCounts", "api_error", "capacity_check", "kueue_check", "namespace_quota", "ready_gpu_nodes",
           "topology_check"]

GPU = "nvidia.com/gpu"


def api_error(name: str, exc: BaseException, what: str) -> ClusterCheck:
    status = getattr(exc, "status", None)
    hint = "grant the preflight service account read access (RBAC)" if status in (401, 403) else ""
    return ClusterCheck(name, Verdict.UNKNOWN, f"cannot read {what}: {status or ''} {getattr(exc, 'reason', exc)}",
                        remediation=hint)


def _qty(value: Any) -> float:
    from kubernetes.utils import parse_quantity

    return float(parse_quantity(str(value)))


def namespace_quota(spec: ProvisioningSpec, api: Any) -> ClusterCheck:
    from kubernetes import client

    ns, need, name = spec.target.namespace, float(spec.total_gpus), "namespace-quota"
    try:
        items = client.CoreV1Api(api).list_namespaced_resource_quota(ns).items
    except Exception as exc:
        return api_error(name, exc, f"ResourceQuotas of namespace {ns}")
    free: float | None = None
    for q in items:
        hard = (q.status.hard if q.status and q.status.hard else None) or (q.spec.hard or {})
        used = (q.status.used if q.status and q.status.used else None) or {}
        for key in (f"requests.{GPU}", f"limits.{GPU}"):
            if key in hard:
                f = _qty(hard[key]) - _qty(used.get(key, 0))
                free = f if free is None else min(free, f)
    if free is None:
        return ClusterCheck(name, Verdict.FITS, f"no ResourceQuota on requests.{GPU} in namespace {ns}", need)
    verdict = Verdict.FITS if free >= need else Verdict.SHORT
    return ClusterCheck(name, verdict, f"ResourceQuota requests.{GPU} in namespace {ns}: {free:g} free", need, free,
                        "" if verdict is Verdict.FITS else f"raise requests.{GPU} in the ResourceQuota of {ns}")


def _node_matches(spec: ProvisioningSpec, labels: dict[str, str]) -> bool:
    acc = accelerators.get(spec.accelerator)
    if spec.target.kind is TargetKind.EKS:
        return labels.get("node.kubernetes.io/instance-type") in {m.name for m in acc.aws_instances}
    return labels.get("cloud.google.com/gke-accelerator") == acc.gke_label


class NodeCounts(NamedTuple):
    ready: int  # Ready schedulable matching GPU nodes
    per_pool: dict[str, int]  # node count per pool label
    per_domain: dict[str, int]  # the Ready ones per ``spec.topology_level`` domain
    pool_domain: dict[str, str]  # pool -> the domain most of its Ready nodes are in


def ready_gpu_nodes(spec: ProvisioningSpec, api: Any) -> NodeCounts:
    """:class:`NodeCounts` from one raw Node list."""
    from kfp_gpu.cluster.nodes import NodeView, labels_of, list_nodes
    from kfp_gpu.plan.readiness import is_ready

    label = node_labels.for_target(spec.target.kind.value).topology_label(spec.topology_level)
    count, per_pool, per_domain = 0, dict[str, int](), dict[str, int]()
    pool_domains: dict[str, dict[str, int]] = {}
    for node in list_nodes(api)[0]:
        view = NodeView.of(node)
        if view.pool:
            per_pool[view.pool] = per_pool.get(view.pool, 0) + 1
        unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
        if is_ready(node, gpus=spec.gpus_per_node) and not unschedulable and _node_matches(spec, labels_of(node)):
            count += 1
            domain = labels_of(node).get(label, "")
            if domain:
                per_domain[domain] = per_domain.get(domain, 0) + 1
                seen = pool_domains.setdefault(view.pool, {})
                seen[domain] = seen.get(domain, 0) + 1
    return NodeCounts(count, per_pool, per_domain,
                       {p: max(ds, key=lambda d: (ds[d], d)) for p, ds in pool_domains.items() if p})


def _headroom(spec: ProvisioningSpec, pools: list[PoolState], per_pool: dict[str, int]) -> int:
    """Nodes the matching pools may still add. Pool sizes are read without the per-pool size calls (one round
    trip): a pool's current size is the number of its nodes the cluster shows."""
    return sum(max(0, p.max_size - (p.size if p.size >= 0 else per_pool.get(p.ref.pool, 0)))
               for p in matching_pools(spec, pools))


def topology_check(spec: ProvisioningSpec, nodes_f: fanout.Task[NodeCounts],
                   pools: list[PoolState] | None) -> ClusterCheck:
    """Whether the gang fits one ``spec.topology_level`` domain (:func:`kfp_gpu.plan.topology.preflight_check`)."""
    label = node_labels.for_target(spec.target.kind.value).topology_label(spec.topology_level)
    try:
        counts = nodes_f.result()
    except Exception as exc:
        return api_error(topology.CHECK_NAME, exc, "Nodes")
    reach = None if pools is None else [
        topology.PoolReach(p.ref.pool, p.placement, _headroom(spec, [p], counts.per_pool),
                           counts.pool_domain.get(p.ref.pool, ""), p.placement_group)
        for p in matching_pools(spec, pools)]
    return topology.preflight_check(spec.nodes, counts.per_domain, topology=spec.topology, level=spec.topology_level,
                                    label=label, pools=reach,
                                    headroom=None if pools is None else _headroom(spec, pools, counts.per_pool))


def capacity_check(spec: ProvisioningSpec, nodes_f: fanout.Task[NodeCounts],
                   pools: list[PoolState] | None, *, pool_bound: bool = True) -> ClusterCheck:
    """Ready matching nodes plus the pools' headroom against the gang; ``pool_bound=False`` (a backend that
    launches without pools): no headroom to count, the cloud's quota is the bound (UNKNOWN here)."""
    name = "gpu-capacity"
    try:
        ready, per_pool, _, _ = nodes_f.result()
    except Exception as exc:
        return api_error(name, exc, "Nodes")
    if not pool_bound:
        return ClusterCheck(name, Verdict.UNKNOWN, f"{ready} Ready matching node(s); the backend launches nodes "
                            "without pools: the cloud's quota is the bound", spec.nodes, ready)
    if pools is None:
        return ClusterCheck(name, Verdict.UNKNOWN, f"{ready} Ready matching node(s); pool headroom unknown",
                            spec.nodes, ready)
    headroom = _headroom(spec, pools, per_pool)
    reach = ready + headroom
    verdict = Verdict.FITS if reach >= spec.nodes else Verdict.SHORT
    return ClusterCheck(
        name, verdict, f"{ready} Ready node(s) with >= {spec.gpus_per_node} allocatable {GPU} + {headroom} "
        "node(s) of pool headroom", spec.nodes, reach,
        "" if verdict is Verdict.FITS else "raise the node pools' max size or add a pool",
    )


def kueue_check(spec: ProvisioningSpec, api: Any) -> ClusterCheck:
    """The ClusterQueue behind the LocalQueue the job will use (target.queue or auto-detected), judged for the
    run's accelerator by :func:`kfp_gpu.plan.kueue.evaluate`; a queue choice that is wrong is SHORT."""
    from kfp_gpu.cluster import kueue
    from kfp_gpu.plan.kueue import CHECK_NAME, evaluate, not_gated

    ns = spec.target.namespace
    try:
        queues = kueue.list_local_queues(api, ns)
        if queues is None and not spec.target.queue:
            return not_gated(ns, f"Kueue is not installed (no CRD {kueue.CRD})")
        lq = kueue.pick_local_queue(ns, spec.target.queue, queues)
    except KfpGpuError as exc:  # InvalidSpec (target.queue), CrdMissing (no v1beta2)
        return ClusterCheck(CHECK_NAME, Verdict.SHORT, exc.message, float(spec.total_gpus), None, exc.remediation)
    except Exception as exc:
        return api_error(CHECK_NAME, exc, f"Kueue LocalQueues of namespace {ns}")
    if lq is None:
        return not_gated(ns)
    try:
        setup = kueue.read_queue_setup(api, lq)
    except Exception as exc:
        return api_error(CHECK_NAME, exc, f"Kueue ClusterQueue {lq.cluster_queue} and its ResourceFlavors")
    return evaluate(setup, spec.accelerator, float(spec.total_gpus))
