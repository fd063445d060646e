"""Node pool calls of GkeProvider that need more than one round trip: get (with a useful NotFound),
setSize (adopting an operation already in flight) and deleteInstances (idempotent); a pool's state with its
reservation affinity and, for a SPECIFIC affinity, the free VMs of the reservations it names.

https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters.nodePools/setSize
https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/deleteInstances
https://cloud.google.com/kubernetes-engine/docs/how-to/consuming-reservations (NodeConfig.reservationAffinity)
https://cloud.google.com/compute/docs/reference/rest/v1/reservations (specificReservation.count, inUseCount)
https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/aggregatedList
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kfp_gpu import accelerators
from kfp_gpu import retry as retry_mod
from kfp_gpu.errors import CapacityUnavailable, InvalidSpec, KfpGpuError, NotFound, Scope, TransientCloudError
from kfp_gpu.providers.base import Operation, OpStatus, PoolRef, PoolState
from kfp_gpu.providers.gke import activity, operations
from kfp_gpu.providers.gke import reservations as res_mod

if TYPE_CHECKING:
    from kfp_gpu.providers.gke.provider import GkeProvider

log = logging.getLogger(__name__)
NO_MAX = 1000  # a pool without autoscaling limits
AFFINITY = {"ANY_RESERVATION": "any", "SPECIFIC_RESERVATION": "specific", "NO_RESERVATION": "none"}
_OP_RE = re.compile(r"\b(operation-[A-Za-z0-9-]+)")


def igm_target_sizes(p: GkeProvider) -> dict[tuple[str, str], int]:
    """``targetSize`` of every managed instance group of the project, keyed by (zone, group name): one
    instanceGroupManagers.aggregatedList (paged by the client), so a caller that needs many pools' sizes can
    read them beside nodePools.list rather than after it (one round trip instead of two).

    Raises: PermissionDenied (compute.instanceGroupManagers.list), RateLimited, TransientCloudError.
    """
    def read() -> dict[tuple[str, str], int]:
        pager = p._call("igm", "aggregated_list", request={"project": p.project})
        out: dict[tuple[str, str], int] = {}
        for scope, listed in pager:
            zone = str(scope).rsplit("/", 1)[-1]
            for igm in listed.instance_group_managers:
                out[(zone, str(igm.name))] = int(igm.target_size)
        return out

    return p.shared_read(("igm.aggregatedList", p.project), read)


def node_pool(p: GkeProvider, ref: PoolRef) -> Any:
    """nodePools.get; a pool that does not exist is a NotFound listing the pools that do.

    Raises: NotFound, PermissionDenied, RateLimited, TransientCloudError.
    """
    try:
        return p._call("container", "get_node_pool", at_zone=ref.zone, name=f"{p.cluster_path}/nodePools/{ref.pool}")
    except NotFound as exc:
        try:
            names = sorted(str(np.name) for np in p._call(
                "container", "list_node_pools", parent=p.cluster_path).node_pools)
        except KfpGpuError:
            raise exc from None  # the cluster itself is missing or unreadable: that error says so
        raise NotFound(
            f"node pool {ref.pool!r} does not exist in cluster {p.cluster} ({p.location}); its pools: "
            f"{', '.join(names) or '(none)'}",
            remediation="use one of those pool names in the spec, or create it: gcloud container node-pools "
            f"create {ref.pool} --cluster {p.cluster} --location {p.location} --node-locations {ref.zone} "
            "--accelerator type=<gpu>,count=<n>",
            zone=ref.zone, pool=ref.pool, pools=names) from None


def set_size(p: GkeProvider, ref: PoolRef, size: int) -> Operation:
    """nodePools.setSize to the absolute ``size``, retried. When GKE refuses it because an operation is in
    flight that already takes the pool to ``size`` (typically our own setSize whose answer a 5xx lost after
    it took effect), that operation is returned instead of waiting it out.

    Raises: QuotaExceeded, CapacityUnavailable (an op born failed is returned, not raised), PermissionDenied,
    NotFound, RateLimited, TransientCloudError, CloudError.
    """
    from google.cloud import container_v1

    region = ref.region or ref.zone.rsplit("-", 1)[0]
    req = container_v1.SetNodePoolSizeRequest(name=f"{p.cluster_path}/nodePools/{ref.pool}", node_count=size)

    def submit() -> Operation:
        try:
            raw = p._call("container", "set_node_pool_size", at_zone=ref.zone, at_region=region, once=True,
                          request=req)
        except TransientCloudError as exc:
            adopted = _adopt(p, ref, size, exc)
            if adopted is None:
                raise
            return adopted
        return operations.gke_op(p, raw, f"{ref.pool}/{ref.zone}", ref.zone, region)

    return retry_mod.call(submit, policy=p.retry, what=f"setSize {ref.pool}/{ref.zone}={size}")


def _adopt(p: GkeProvider, ref: PoolRef, size: int, exc: TransientCloudError) -> Operation | None:
    found = _OP_RE.search(exc.message)
    if found is None or p.pool(ref).size != size:
        return None
    raw = p._call("container", "get_operation",
                  name=f"projects/{p.project}/locations/{p.location}/operations/{found.group(1)}")
    if not str(raw.target_link).endswith(f"/nodePools/{ref.pool}"):
        return None
    log.info("setSize %s/%s=%d: adopting %s, already in flight", ref.pool, ref.zone, size, raw.name)
    return operations.gke_op(p, raw, f"{ref.pool}/{ref.zone}", ref.zone, ref.region or ref.zone.rsplit("-", 1)[0])


def delete_nodes(p: GkeProvider, ref: PoolRef, nodes: Sequence[str]) -> Operation:
    """instanceGroupManagers.deleteInstances of named VMs; see GkeProvider.delete_nodes.

    A retry carries the same ``requestId`` (Compute answers with the first operation again) and instances
    already gone (deleted, preempted) are skipped (``skipInstancesOnValidationError``).

    Raises: NotFound, PermissionDenied, RateLimited, TransientCloudError, CloudError.
    """
    igm = activity.igm_name(p, ref)
    from google.cloud import compute_v1

    body = compute_v1.InstanceGroupManagersDeleteInstancesRequest(
        instances=[f"zones/{ref.zone}/instances/{n}" for n in nodes], skip_instances_on_validation_error=True)
    raw = p._call("igm", "delete_instances_unary", at_zone=ref.zone, request=compute_v1.DeleteInstancesInstanceGroupManagerRequest(
        project=p.project, zone=ref.zone, instance_group_manager=igm, request_id=str(uuid.uuid4()),
        instance_group_managers_delete_instances_request_resource=body))
    with p._lock:
        p._resizes.pop((ref.pool, ref.zone), None)  # the size changed under any cached resize
        p._seen.pop((ref.pool, ref.zone), None)
    op = res_mod.compute_op(raw, "delete-nodes", f"{ref.pool}/{ref.zone}", ref.zone)
    if op.status is OpStatus.FAILED and op.error is not None:
        raise op.error
    return op


def affinity(np: Any) -> tuple[str, tuple[str, ...]]:
    """(kind, reservation names) of ``config.reservationAffinity``: kind "any" | "specific" | "none", or ""
    when unset (Compute then consumes any matching reservation). Names of a shared reservation
    (``projects/<p>/reservations/<name>``) are kept as their last segment."""
    ra = np.config.reservation_affinity
    kind = AFFINITY.get(str(getattr(ra.consume_reservation_type, "name", ra.consume_reservation_type)), "")
    return kind, tuple(str(v).rsplit("/", 1)[-1] for v in ra.values) if kind == "specific" else ()


def reservation_free(p: GkeProvider, np: Any, zone: str) -> int | None:
    """Free VMs (count - inUseCount) of the reservations a SPECIFIC pool names in ``zone``; a named reservation
    that does not exist holds 0. None for any other affinity (no limit of its own).

    Raises: PermissionDenied (compute.reservations.get), RateLimited, TransientCloudError.
    """
    kind, names = affinity(np)
    if kind != "specific":
        return None
    total = 0
    for name in names:
        try:
            r = p._call("reservations", "get", at_zone=zone, project=p.project, zone=zone, reservation=name)
        except NotFound:
            continue
        sr = r.specific_reservation
        total += max(0, int(sr.count) - int(sr.in_use_count))
    return total


def pool_state(np: Any, zone: str, region: str, size: int, free: int | None) -> PoolState:
    """A container_v1.NodePool in ``zone`` as a PoolState (``free``: see :func:`reservation_free`)."""
    acc_cfg = np.config.accelerators[0]
    try:
        acc = accelerators.get(acc_cfg.accelerator_type).name
    except InvalidSpec:
        acc = acc_cfg.accelerator_type
    auto = np.autoscaling
    max_size = int(auto.max_node_count or auto.total_max_node_count or 0) or NO_MAX
    kind, names = affinity(np)
    # COMPACT: "node placement in the same availability domain" (NodePool.PlacementPolicy.Type). Compute Engine holds
    # VMs there only under a policy with a max distance, else it is best effort
    # (https://cloud.google.com/ai-hypercomputer/docs/placement-policy-and-workload-policy); the max distance is not
    # in Compute v1 (ResourcePolicyGroupPlacementPolicy has no such field), so a GKE COMPACT pool is never taken as
    # a guarantee: "best-effort". Without COMPACT GKE documents no placement: "" (unknown), never "spread".
    compact = np.placement_policy.type_.name == "COMPACT"
    return PoolState(
        ref=PoolRef(np.name, zone, region), size=size, max_size=max_size, accelerator=acc,
        gpus_per_node=int(acc_cfg.accelerator_count), machine_type=np.config.machine_type,
        spot=bool(np.config.spot or np.config.preemptible), labels=dict(np.config.resource_labels),
        autoscaling=bool(auto.enabled),
        autoscaling_min=int(auto.min_node_count or auto.total_min_node_count or 0) if auto.enabled else 0,
        autoscaling_max=int(auto.max_node_count or auto.total_max_node_count or 0) if auto.enabled else 0,
        reservation_affinity=kind, reservations=names, reservation_free=free,
        queued_provisioning=bool(np.queued_provisioning.enabled),
        placement="best-effort" if compact else "",
        placement_group=(np.placement_policy.policy_name or "COMPACT") if compact else "",
    )


def check_reservation(state: PoolState, size: int) -> None:
    """Refuse to grow a SPECIFIC pool beyond the free VMs of its reservations: its VMs exist only inside them,
    so the instance group would retry the rest forever.

    Raises: CapacityUnavailable (provider scope: no zone or retry helps) naming the reservation.
    """
    if state.reservation_affinity != "specific" or state.reservation_free is None:
        return
    want = size - max(0, state.size)
    if want > state.reservation_free:
        names = ", ".join(state.reservations)
        raise CapacityUnavailable(
            f"reservation {names} in {state.ref.zone} has {state.reservation_free} VM(s) free; node pool "
            f"{state.ref.pool} needs {want} more",
            remediation=f"free VMs of reservation {names}, grow its count (gcloud compute reservations update "
            f"{state.reservations[0]} --zone {state.ref.zone} --vm-count=<n>), or ask for fewer nodes",
            scope=Scope.PROVIDER, zone=state.ref.zone, pool=state.ref.pool, reservation=names,
            free=state.reservation_free, wanted=want)
