"""What a GKE node pool's managed instance group is doing: target, running, creating, and its errors.

* :func:`pool_activity` reads ``instanceGroupManagers.get`` (``targetSize``, ``currentActions``) and
  ``instanceGroupManagers.listErrors`` (the creation/recreation errors, e.g. a stockout).
* :func:`creation_failure` turns the instance errors a setSize met *after* its GKE operation started into the
  classified error: GKE finishes the operation DONE once the group's target is set, while the group fails to
  create some VMs: ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS] (a zone-scoped
  :class:`~kfp_gpu.errors.CapacityUnavailable`) or QUOTA_EXCEEDED (:class:`~kfp_gpu.errors.QuotaExceeded`).

https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/listErrors
https://cloud.google.com/compute/docs/instance-groups/creating-groups-of-managed-instances#monitoring_groups
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from kfp_gpu.errors import CapacityUnavailable, KfpGpuError, NotFound, QuotaExceeded, Scope
from kfp_gpu.providers.base import PoolActivity, PoolError, PoolRef
from kfp_gpu.providers.gke import classify as cl

if TYPE_CHECKING:
    from kfp_gpu.providers.gke.provider import GkeProvider

MAX_ERROR_PAGES = 5  # 500 errors a page; older pages do not change a decision


def unix(ts: str) -> float:
    """RFC 3339 (Google's timestamps, 'Z' or offset, with or without fraction) -> unix seconds; 0 if bad."""
    if not ts:
        return 0.0
    try:
        return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def igm_name(p: GkeProvider, ref: PoolRef) -> str:
    """The name of the managed instance group behind ``ref`` (cached per pool and zone).

    Raises: NotFound (no such pool, or no group in that zone), PermissionDenied, RateLimited,
    TransientCloudError.
    """
    key = (ref.pool, ref.zone)
    with p._lock:
        if key in p._igms:
            return p._igms[key]
    np = p.node_pool(ref)
    url = next((u for u in np.instance_group_urls if f"/zones/{ref.zone}/" in u), "")
    if not url:
        raise NotFound(f"node pool {ref.pool} has no instance group in {ref.zone}",
                       remediation="use a zone the pool spans (its node locations)", zone=ref.zone)
    with p._lock:
        p._igms[key] = url.rsplit("/", 1)[-1]
    return p._igms[key]


def list_errors(p: GkeProvider, ref: PoolRef, since: float = 0.0) -> list[PoolError]:
    """The group's instance errors at or after ``since`` (unix seconds), oldest first.

    Raises: NotFound, PermissionDenied, RateLimited, TransientCloudError.
    """
    igm = igm_name(p, ref)
    out: list[PoolError] = []
    token = ""
    for _ in range(MAX_ERROR_PAGES):
        from google.cloud import compute_v1

        req = compute_v1.ListErrorsInstanceGroupManagersRequest(
            project=p.project, zone=ref.zone, instance_group_manager=igm, page_token=token)
        resp = p._call("igm", "list_errors", at_zone=ref.zone, request=req)
        page: Any = resp  # a pager delegates items / next_page_token to its current page
        for item in page.items:
            at = unix(str(item.timestamp))
            if at and at < since:
                continue
            details = item.instance_action_details
            out.append(PoolError(str(item.error.code), str(item.error.message), str(details.instance).rsplit("/", 1)[-1],
                                 _enum(details.action), at))
        token = str(page.next_page_token or "")
        if not token:
            break
    return sorted(out, key=lambda e: e.at)


def pool_activity(p: GkeProvider, ref: PoolRef, since: float = 0.0) -> PoolActivity:
    """See :meth:`GkeProvider.pool_activity`.

    Raises: NotFound, PermissionDenied, RateLimited, TransientCloudError.
    """
    igm = p._call("igm", "get", at_zone=ref.zone, request={
        "project": p.project, "zone": ref.zone, "instance_group_manager": igm_name(p, ref)})
    actions: Any = igm.current_actions
    creating = int(actions.creating) + int(actions.recreating) + int(actions.creating_without_retries)
    return PoolActivity(ref, int(igm.target_size), int(actions.none), creating,
                        tuple(list_errors(p, ref, since)))


def creation_failure(p: GkeProvider, ref: PoolRef, started: float, target: int) -> KfpGpuError | None:
    """Why a resize to ``target`` is missing VMs: the instance errors its group met after ``started`` (unix
    seconds), or None. A ``QUOTA_EXCEEDED`` instance error (GCE checks quota per VM, not at setSize) is a
    region-scoped :class:`QuotaExceeded` naming the metric (provider scope for ``GPUS_ALL_REGIONS``); a stockout a
    zone-scoped :class:`CapacityUnavailable`. Quota wins: no other zone of the region can help.

    Raises: NotFound, PermissionDenied, RateLimited, TransientCloudError.
    """
    act = pool_activity(p, ref, since=started)
    quota = [e for e in act.errors if e.quota]
    stockouts = [e for e in act.errors if e.stockout]
    if not (quota or stockouts) or act.running >= act.target:  # the group got every VM it wants after all
        return None
    size = target if target >= 0 else act.target
    region = ref.region or ref.zone.rsplit("-", 1)[0]
    counts = {"running": act.running, "target": act.target, "creating": act.creating}
    if quota:
        last = quota[-1]
        err = cl.classify_fault(cl.Fault(last.message, 0, [last.code], cl.metric_in(last.message)),
                                zone=ref.zone, region=region)
        metric = err.fields.get("metric", "the quota")
        return QuotaExceeded(
            f"quota {metric} refused VMs of node pool {ref.pool} ({ref.zone}) resized to {size}: {act.running} of "
            f"{act.target} running, {len(quota)} creation error(s): {last.message}",
            scope=err.scope, code=last.code, metric=metric, zone=ref.zone, region=region, failed=len(quota), **counts,
            remediation=str(err.remediation) + "; the instance group keeps retrying until its target is lowered")
    last = stockouts[-1]
    return CapacityUnavailable(
        f"GCE stockout in {ref.zone} while resizing node pool {ref.pool} to {size}: {act.running} of "
        f"{act.target} instances running, {len(stockouts)} creation error(s) ({last.code}): {last.message}",
        scope=Scope.ZONE, code=last.code, zone=ref.zone, region=region, failed=len(stockouts), **counts,
        remediation="fail over to another zone, use a reservation, or retry later; the instance group keeps "
        "retrying the missing VMs until its target is lowered",
    )


def _enum(value: Any) -> str:
    return str(getattr(value, "name", value))
