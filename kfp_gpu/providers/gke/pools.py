"""Node pool calls of GkeProvider that need more than one round trip: get (with a useful NotFound),
setSize (adopting an operation already in flight) and deleteInstances (idempotent).

https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters.nodePools/setSize
https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/deleteInstances
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kfp_gpu import retry as retry_mod
from kfp_gpu.errors import KfpGpuError, NotFound, TransientCloudError
from kfp_gpu.providers.base import Operation, OpStatus, PoolRef
from kfp_gpu.providers.gke import activity
from kfp_gpu.providers.gke import reservations as res_mod

if TYPE_CHECKING:
    from kfp_gpu.providers.gke.provider import GkeProvider

log = logging.getLogger(__name__)
_OP_RE = re.compile(r"\b(operation-[A-Za-z0-9-]+)")


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
        return p._gke_op(raw, f"{ref.pool}/{ref.zone}", ref.zone, region)

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
    return p._gke_op(raw, f"{ref.pool}/{ref.zone}", ref.zone, ref.region or ref.zone.rsplit("-", 1)[0])


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
    op = res_mod.compute_op(raw, "delete-nodes", f"{ref.pool}/{ref.zone}", ref.zone)
    if op.status is OpStatus.FAILED and op.error is not None:
        raise op.error
    return op
