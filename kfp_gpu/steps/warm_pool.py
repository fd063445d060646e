"""reserve_warm_pool: hold capacity just in time, without waiting for it.

It requests ``warm_pool.nodes`` GPU nodes from the provider (not waiting for boot: scale-up waits),
places balloon pods on them in a negative-priority PriorityClass so training pods preempt them, and
optionally creates a cloud reservation. Every object carries the run id and a lease-expiry label, renewed by a
:class:`~kfp_gpu.cluster.lease.Heartbeat` while the step runs.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

from kubernetes import client

from kfp_gpu import accelerators, provisioners
from kfp_gpu.cluster import balloons, ledger
from kfp_gpu.cluster.lease import Heartbeat
from kfp_gpu.plan.placement import candidate_zones
from kfp_gpu.providers.base import CapacityProvider, ReservationRequest, label_safe
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps.result import StepResult

STEP = "warm_pool"


def run(spec: ProvisioningSpec, run_id: str, upstream_json: str, *, api: client.ApiClient | None = None,
        provider: CapacityProvider | None = None) -> StepResult:
    """Raises: QuotaExceeded, CapacityUnavailable, PermissionDenied (cloud); ApiException (cluster)."""
    from kfp_gpu.cluster.kube import api_client
    from kfp_gpu.providers import for_target

    t0 = time.time()
    wp = spec.warm_pool
    if wp.nodes == 0 and not wp.cloud_reservation:
        out = {"balloons": [], "requested_nodes": 0, "reservation": ""}
        return StepResult(json.dumps(out), {"warm_nodes": 0.0}, "## warm pool: disabled (warm_pool.nodes=0)")
    api = api or api_client(spec.target)
    provider = provider or for_target(spec.target)
    ttl = min(wp.ttl_s, spec.lease_ttl_s)
    with Heartbeat(api, spec.target.namespace, run_id, STEP, ttl) as heartbeat:  # renews while this step runs
        names, reservation = _reserve(spec, run_id, api, provider, heartbeat, ttl)
        owner = heartbeat.owner
    took = time.time() - t0
    out = {"balloons": names, "requested_nodes": wp.nodes, "reservation": reservation,
           "lease_expires": owner.lease_expires}
    md = (f"## warm pool: {wp.nodes} node(s) requested, {len(names)} balloon pod(s) "
          f"in PriorityClass {balloons.PRIORITY_CLASS} ({balloons.PRIORITY_VALUE}), lease {ttl:.0f}s"
          + (f", reservation {reservation}" if reservation else "") + f" in {took:.2f}s")
    return StepResult(json.dumps(out, sort_keys=True), {"warm_nodes": float(wp.nodes), "warm_pool_seconds": took}, md)


def _reserve(spec: ProvisioningSpec, run_id: str, api: client.ApiClient, provider: CapacityProvider,
             heartbeat: Heartbeat, ttl: float) -> tuple[list[str], str]:
    """The reservation, the resize and the balloons. Raises: as :func:`run`."""
    wp = spec.warm_pool
    acc = accelerators.get(spec.accelerator)
    reservation = ""
    if wp.cloud_reservation:
        zones = candidate_zones(spec, spec.target.region, provider.pools(spec.target.region))
        reservation = f"kfp-gpu-{label_safe(run_id)[:40]}"
        provider.reserve(ReservationRequest(reservation, zones[0], spec.accelerator, spec.gpus_per_node,
                                            max(1, wp.nodes)), heartbeat.owner)
    names: list[str] = []
    if wp.nodes:
        balloons.ensure_priority_class(api)
        with ThreadPoolExecutor(max_workers=1) as ex:  # balloons go in while the resize is in flight
            pods = ex.submit(balloons.create_balloons, api, spec.target.namespace, heartbeat.owner, wp.nodes,
                             spec.gpus_per_node, acc.gke_label, list(spec.target.pools))
            backend = provisioners.select(spec, api, provider)
            backend.acquire(spec, run_id, provisioners.GangRequest(nodes=wp.nodes, step=STEP, wait=False, lease_ttl_s=ttl))
            names = pods.result()
        led = ledger.read(api, spec.target.namespace, run_id, STEP)
        ledger.write(api, spec.target.namespace, heartbeat.owner, {**led, "balloons": names, "reservation": reservation})
    return names, reservation
