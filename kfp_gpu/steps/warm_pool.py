"""reserve_warm_pool: hold capacity just in time, without waiting for it.

It requests ``warm_pool.nodes`` GPU nodes from the provider (not waiting for boot: scale-up waits),
places balloon pods on them in a negative-priority PriorityClass so training pods preempt them, and
optionally creates a cloud reservation. A backend that holds its own placeholders
(:func:`kfp_gpu.provisioners.base.holds_placeholders`, e.g. karpenter: pods tolerating the run NodePool's taint,
for which Karpenter launches) gets no generic balloons: its placeholders are the warm pool. Every object carries the
run id (and a lease-expiry label the janitor reads only for objects whose run has no GpuGang left).

``warm_pool.cloud_reservation``: the reservation is made *where the resize grows*, after the backend submitted
it: one reservation per (zone, machine type) the warm pool's resize added nodes to (the ledger's targets minus
what the pools had), counting those nodes, with the growing pool's machine type, so the very VMs being created
are the ones that consume it (never a second, idle copy of the capacity). Without a resize to follow (the
provisioning-request backend, or ``warm_pool.nodes=0``) it reserves ``max(1, warm_pool.nodes)`` VMs in the first
candidate zone. Each reservation is recorded as a ``reservation-held`` run event in the warm pool's ledger
timeline (teardown records ``reservation-released``), so the cost report bills it once.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

from kubernetes import client

from kfp_gpu import ownership, provisioners
from kfp_gpu.cluster import balloons, ledger
from kfp_gpu.ownership import LABEL_RUN_ID, LABEL_STEP, Owner, label_safe
from kfp_gpu.plan.placement import candidate_zones, matching_pools
from kfp_gpu.providers.base import CapacityProvider, PoolState, ReservationRequest
from kfp_gpu.provisioners.base import holds_placeholders
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps.result import StepResult
from kfp_gpu.timeline import Timeline

RESERVATION_HELD = "reservation-held"  # kfp_gpu.report.cost reads these run events

STEP = "warm_pool"


def run(spec: ProvisioningSpec, run_id: str, upstream_json: str, *, api: client.ApiClient | None = None,
        provider: CapacityProvider | None = None) -> StepResult:
    """Raises: QuotaExceeded, CapacityUnavailable, PermissionDenied (cloud); ApiException (cluster)."""
    from kfp_gpu.cluster.kube import api_client
    from kfp_gpu.providers import for_target
    from kfp_gpu.rehearsal_seam import world_time_scale
    from kfp_gpu.report._common import clock_note, duration

    t0 = time.time()
    wp = spec.warm_pool
    if wp.nodes == 0 and not wp.cloud_reservation:
        out = {"balloons": [], "requested_nodes": 0, "reservation": ""}
        return StepResult(json.dumps(out), {"warm_nodes": 0.0}, "## warm pool: disabled (warm_pool.nodes=0)")
    api = api or api_client(spec.target)
    provider = provider or for_target(spec.target)
    ttl = min(wp.ttl_s, spec.lease_ttl_s)
    owner = Owner.for_step(run_id, STEP, ttl)
    names, held = _reserve(spec, run_id, api, provider, owner, ttl)
    took = time.time() - t0
    scale = world_time_scale()  # the summary in the world's clock; the metric leaves on this clock (run_step scales it)
    reservation = ", ".join(r.name for r in held)
    out = {"balloons": names, "requested_nodes": wp.nodes, "reservation": reservation,
           "reservations": [{"name": r.name, "zone": r.zone, "count": r.count, "machine_type": r.machine_type}
                            for r in held], "lease_expires": owner.lease_expires}
    md = (f"## warm pool: {wp.nodes} node(s) requested, {len(names)} balloon pod(s) "
          f"in PriorityClass {balloons.PRIORITY_CLASS} ({balloons.PRIORITY_VALUE}), lease {ttl:.0f}s"
          + (f", reservation {reservation}" if reservation else "") + f" in {duration(took * scale)}"
          + (f"\n\n_{note}_" if (note := clock_note(scale)) else ""))
    return StepResult(json.dumps(out, sort_keys=True), {"warm_nodes": float(wp.nodes), "warm_pool_seconds": took}, md)


def _reserve(spec: ProvisioningSpec, run_id: str, api: client.ApiClient, provider: CapacityProvider,
             owner: Owner, ttl: float) -> tuple[list[str], list[ReservationRequest]]:
    """The resize, the balloons, then the reservations where the resize grows. Raises: as :func:`run`."""
    wp = spec.warm_pool
    names: list[str] = []
    if wp.nodes:
        backend = provisioners.select(spec, api, provider)
        request = provisioners.GangRequest(nodes=wp.nodes, step=STEP, wait=False, lease_ttl_s=ttl)
        if holds_placeholders(backend):  # the backend's own placeholders are the warm pool (e.g. karpenter)
            backend.acquire(spec, run_id, request)
            names = _placeholders(api, spec.target.namespace, run_id)
        else:
            balloons.ensure_priority_class(api)
            with ThreadPoolExecutor(max_workers=1) as ex:  # balloons go in while the resize is in flight
                pods = ex.submit(balloons.create_balloons, api, spec.target.namespace, owner, wp.nodes,
                                 spec.gpus_per_node, spec.accelerator, list(spec.target.pools),
                                 provider.scheme)
                backend.acquire(spec, run_id, request)
                names = pods.result()
    led = ledger.read(api, spec.target.namespace, run_id, STEP)
    held: list[ReservationRequest] = []
    timeline = Timeline.from_json(led["timeline"]) if led.get("timeline") else Timeline(run_id)
    if wp.cloud_reservation:
        pools = provider.pools(spec.target.region, sizes=False)
        plan = reservations_for(spec, run_id, pools, led.get("targets", {}), led.get("found", {}))
        recorded = {str(e.get("name")) for e in timeline.events if e.get("kind") == RESERVATION_HELD}
        for req, grown in plan:
            provider.reserve(req, owner)  # re-attaches to the same name on a retried step
            held.append(req)
            if req.name not in recorded:
                timeline.event(RESERVATION_HELD, time.time(), name=req.name, gpus=req.count * req.gpus_per_node,
                               pools=grown)
    if names or held:
        ledger.write(api, spec.target.namespace, owner,
                     {**led, "balloons": names, "reservation": ", ".join(r.name for r in held),
                      "timeline": timeline.to_json(), "started": led.get("started", time.time())})
    return names, held


def _placeholders(api: client.ApiClient, namespace: str, run_id: str) -> list[str]:
    """The warm pool's pods a backend placed itself (balloon-labelled, of this run and step). Raises: ApiException."""
    selector = (f"{LABEL_RUN_ID}={label_safe(run_id)},{LABEL_STEP}={label_safe(STEP)},"
                f"{ownership.BALLOON_LABEL}=true")
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items
    return sorted(str(p.metadata.name) for p in pods)


def reservations_for(spec: ProvisioningSpec, run_id: str, pools: list[PoolState], targets: dict[str, int],
                     found: dict[str, int]) -> list[tuple[ReservationRequest, list[str]]]:
    """(reservation, pools whose new nodes consume it): one per (zone, machine type) the resize grows, counting
    the nodes it adds there (``targets`` - ``found``, keyed "pool|zone"), with that pool's machine type. Without
    growth to follow, ``max(1, warm_pool.nodes)`` VMs in the first candidate zone. Pure."""
    by_ref = {(p.ref.pool, p.ref.zone): p for p in pools}
    grow: dict[tuple[str, str], tuple[int, list[str]]] = {}
    for key, size in sorted(targets.items()):
        pool, zone = key.split("|", 1)
        added = int(size) - int(found.get(key, 0))
        st = by_ref.get((pool, zone))
        if added <= 0 or st is None:
            continue
        count, grown = grow.get((zone, st.machine_type), (0, []))
        grow[(zone, st.machine_type)] = (count + added, [*grown, pool])
    base = "kfp-gpu-" + "".join(c if c.isalnum() else "-" for c in label_safe(run_id)[:40]).strip("-")
    if not grow:
        zone = candidate_zones(spec, spec.target.region, pools)[0]
        match = [p for p in matching_pools(spec, pools) if p.ref.zone == zone]
        grow[(zone, match[0].machine_type if match else "")] = (max(1, spec.warm_pool.nodes),
                                                                [p.ref.pool for p in match[:1]])
    out = []
    for i, ((zone, machine), (count, grown)) in enumerate(sorted(grow.items())):
        name = base if len(grow) == 1 else f"{base}-{i}"
        out.append((ReservationRequest(name, zone, spec.accelerator, spec.gpus_per_node, count, machine_type=machine),
                    sorted(set(grown))))
    return out
