"""How GKE shows a queued-provisioning (flex-start) node pool in nodePools.get/list, and its refusal of setSize.

The generic pool rendering is :meth:`kfp_gpu_rehearsal.sim.pool_views.PoolViews.node_pool_json`; this adds what a pool
created with
``--flex-start --enable-queued-provisioning --enable-autoscaling --location-policy=ANY --reservation-affinity=none``
shows (docs/sim.md, section 12).
"""

from __future__ import annotations

from typing import Any

from kfp_gpu_rehearsal.sim import shapes
from kfp_gpu_rehearsal.sim.scenario import Scenario
from kfp_gpu_rehearsal.sim.state import SimState

QUEUED_TAINT_JSON = {"key": "cloud.google.com/gke-queued", "value": "true", "effect": "NO_SCHEDULE"}


def render(sc: Scenario, payload: Any) -> None:
    """Add the queued-provisioning fields to a nodePools.get answer or to every pool of a nodePools.list answer."""
    pools = payload.get("nodePools") if isinstance(payload, dict) and "nodePools" in payload else [payload]
    queued = {p.name for p in sc.pools if p.queued_provisioning}
    for pool in pools or []:
        if not isinstance(pool, dict) or pool.get("name") not in queued:
            continue
        pool["queuedProvisioning"] = {"enabled": True}
        config = pool.setdefault("config", {})
        config["flexStart"] = True
        config["reservationAffinity"] = {"consumeReservationType": "NO_RESERVATION"}
        taints = config.setdefault("taints", [])
        if QUEUED_TAINT_JSON not in taints:
            taints.append(dict(QUEUED_TAINT_JSON))
        config.setdefault("resourceLabels", {})["goog-gke-node-pool-provisioning-model"] = "flex-start"
        config.setdefault("labels", {})["cloud.google.com/gke-flex-start"] = "true"
        auto = pool.setdefault("autoscaling", {})
        if auto.get("enabled"):
            auto["locationPolicy"] = "ANY"
        pool["management"] = {"autoRepair": False, "autoUpgrade": True}


def refuse_set_size(st: SimState, pool: str) -> None:
    """Nodes of a queued pool come only through ProvisioningRequests (GKE: queuedProvisioning.enabled "meaning
    nodes can be only obtained through queuing via the Cluster Autoscaler ProvisioningRequest API").

    Raises: SimHttpError 400 FAILED_PRECONDITION for a queued pool.
    """
    spec = next((p for p in st.scenario.pools if p.name == pool), None)
    if spec is None or not spec.queued_provisioning:
        return
    err = shapes.http_error(
        400, f"Node pool {pool} uses queued provisioning: its nodes can only be obtained through a "
        "ProvisioningRequest (class queued-provisioning.gke.io), not by resizing it.", reason="failedPrecondition")
    err.body["error"]["status"] = "FAILED_PRECONDITION"
    raise err
