"""The node-pool backend's gang provisioning: all-or-nothing resizes of node pools within the spec's deadline.

1. Observe: matching pools from the provider, nodes (existing, booting, claimed) from the cluster.
2. Plan absolute per-pool sizes for the whole gang (kfp_gpu.plan.scale), write them to the ledger
   *before* resizing, so a retried pod re-attaches instead of resizing twice.
3. Issue every resize concurrently; wait on a Node **watch** until the gang is Ready with GPUs
   (:mod:`kfp_gpu.provisioners.gang_wait`, which reads the cloud operations on the side).
4. Zone-scoped errors block the zone and move the need to the next candidate (kfp_gpu.plan.failover);
   transient ones back off with jitter; permanent ones fail at once.
5. Claim the gang's nodes with the run-id label. Past the deadline: roll back what this run added and
   raise ProvisioningTimeout carrying the per-node timeline.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from kubernetes import client

from kfp_gpu import accelerators, fanout, rehearsal_seam
from kfp_gpu.cluster import ledger, node_labels
from kfp_gpu.cluster.capacity import Capacity, Placement
from kfp_gpu.cluster.gang import GangTracker
from kfp_gpu.cluster.nodes import NodeView, NodeWatch, claim, claim_all, list_nodes, name_of
from kfp_gpu.errors import (
    CapacityUnavailable,
    InvalidSpec,
    KfpGpuError,
    NotFound,
    ProvisioningTimeout,
)
from kfp_gpu.ownership import Owner
from kfp_gpu.plan import topology
from kfp_gpu.plan.autoscaled import protected_pools, refusal
from kfp_gpu.plan.backoff import Backoff
from kfp_gpu.plan.failover import Action, Candidate, FailoverState
from kfp_gpu.plan.placement import candidate_zones, matching_pools
from kfp_gpu.plan.scale import plan_scale, rollback_sizes
from kfp_gpu.providers.base import CapacityProvider, Operation, PoolRef
from kfp_gpu.provisioners.gang_wait import wait_gang
from kfp_gpu.retry import retry_transient
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.timeline import Timeline

STEP = "scale_up"
log = logging.getLogger(__name__)


def _key(ref: PoolRef) -> str:
    return f"{ref.pool}|{ref.zone}"


def _ref(key: str, region: str) -> PoolRef:
    pool, zone = key.split("|", 1)
    return PoolRef(pool, zone, region)


def provision(spec: ProvisioningSpec, run_id: str, api: client.ApiClient, provider: CapacityProvider, *,
              extra: int | None = None, step: str = STEP, allow_spread: bool | None = None,
              rng: random.Random | None = None, gang_size: int | None = None, wait: bool = True,
              lease_ttl_s: float | None = None, exclude: Sequence[str] = (),  # Node uids to ignore
              on_zone_blocked: Callable[[str], None] | None = None,
              keep: dict[str, tuple[str, str]] | None = None) -> Capacity:
    """Make ``spec.nodes`` (or, with ``extra``, our claimed nodes + extra) GPU nodes Ready and claimed.

    With ``extra`` (recovery), the gang is ``keep``'s survivors (node -> pool) that are in the candidate
    pools plus ``extra``: counting survivors from the run's own list, not from live claims, keeps a survivor
    that is preempted meanwhile in the count (its instance group brings it back). The instance groups of the candidate zones are watched too: nodes they are
    recreating count as coming (no resize is issued for them), and a stockout they report while we wait
    blocks that zone like a failed resize would; ``on_zone_blocked(zone)`` is called when a zone is given up.

    Raises:
        ProvisioningTimeout: the deadline passed; this run's resizes were rolled back.
        CapacityUnavailable: every candidate zone is blocked (carries the failover history).
        NotFound: no node pool matches the spec.
        InvalidSpec: the plan would resize an autoscaled pool and target.autoscaled_pools is "refuse"; a
            ``topology="required"`` gang whose every matching pool spreads its nodes (no cluster placement group).
        QuotaExceeded, PermissionDenied: permanent cloud errors.
    """
    ns, region = spec.target.namespace, spec.target.region
    owner = Owner.for_step(run_id, step, lease_ttl_s or spec.lease_ttl_s)
    selector = node_selector(spec)
    pools_read = fanout.spawn(lambda: provider.pools(region))  # the cloud round trips overlap the kube reads
    led = ledger.read(api, ns, run_id, step)
    warm = ledger.read(api, ns, run_id, "warm_pool") if step == STEP else {}
    nodes, rv = list_nodes(api, selector)
    listed_at = time.time()
    states = matching_pools(spec, pools_read.result())
    started = float(led.get("started", time.time()))
    deadline = started + spec.scale_up_deadline_s
    if not states:
        raise NotFound(
            f"no node pool in {region} offers {spec.gpus_per_node}x {spec.accelerator} "
            f"({'spot' if spec.spot else 'on-demand'}){' among ' + ', '.join(spec.target.pools) if spec.target.pools else ''}",
            remediation="create a matching GPU node pool or fix target.pools / accelerator / capacity in the spec",
        )
    use, apart = topology.placement_pools({s.ref.pool: s.placement for s in states}, spec.topology,
                                          spec.topology_level)
    if apart:
        raise InvalidSpec("topology", spec.topology, apart, remediation=f"{topology.PLACEMENT_FIX}, or use topology='preferred'")
    rank = {pool: i for i, pool in enumerate(use)}  # a required gang grows its compact pools only; a preferred
    states = sorted((s for s in states if s.ref.pool in rank), key=lambda s: rank[s.ref.pool])  # one fills them first
    protected = protected_pools(states, spec.target.autoscaled_pools)  # claims there: scale-down-disabled
    timeline = Timeline.from_json(led.get("timeline", "")) if led.get("timeline") else Timeline(run_id)
    if led.get("rolled_back") and time.time() >= deadline:  # a KFP retry of a step that already timed out
        raise _timeout(spec, timeline, gang_size or spec.nodes)
    tracker = GangTracker(run_id, {s.ref.pool for s in states}, timeline, spec.gpus_per_node, spec.spot,
                          exclude=exclude, topology=spec.topology,
                          domain_label=node_labels.get(provider.scheme).topology_label(spec.topology_level))
    for key in warm.get("targets", {}):  # nodes the warm pool requested were requested then, not when seen
        pool, zone = key.split("|", 1)
        tracker.mark_requested(pool, zone, float(warm.get("started", time.time())))
    tracker.seed(nodes, listed_at)
    gang = gang_size or spec.nodes
    if extra is not None and keep is not None:  # the run's own view of its gang: survivor -> (pool, zone)
        gang = sum(1 for pool, _ in keep.values() if pool in tracker.pools) + extra
    elif extra is not None:
        gang = len([n for n in tracker.claimed() if n.pool in tracker.pools]) + extra
    watcher = NodeWatch(api, selector, rv, tracker.on_event, relist=lambda: list_nodes(api, selector)).start()
    failover = FailoverState.from_dict(led.get("failover", {}))
    found: dict[str, int] = dict(led.get("found", {}))
    targets: dict[str, int] = dict(led.get("targets", {}))
    spread = spec.allow_zone_spread if allow_spread is None else allow_spread
    zones = [z for r in {region} for z in candidate_zones(spec, r, states)]
    candidates = [Candidate(region, z) for z in zones]
    backoff, attempt = Backoff(base=0.2, cap=5.0, rng=rng or random.Random()), 0

    def save(**more: Any) -> None:
        ledger.write(api, ns, owner, {"spec": spec.to_json(), "started": started, "found": found, "targets": targets,
                                      "failover": failover.to_dict(), "timeline": timeline.to_json(), **more})

    early: dict[str, Future[bool]] = {}
    # Its own bounded executor, not kfp_gpu.fanout: up to a gang's worth of claim writes trickle in while nodes
    # boot; on the shared pool they would hold every thread and push the step's reads into their callers.
    claimer = ThreadPoolExecutor(max_workers=16, thread_name_prefix="kfp-gpu-claim")
    try:
        while True:
            # survivors in a zone given up still hold their place: plan (and wait for) only the rest there
            need = gang - sum(1 for pool, zone in (keep or {}).values()
                              if pool in tracker.pools and zone in failover.blocked_zones)
            plan = plan_scale(need, tracker.observations(states), zones=zones,
                              blocked_zones=failover.blocked_zones, allow_zone_spread=spread)
            if failover.provider_blocked or not [c for c in candidates if not failover.is_blocked(c)]:
                raise failover.exhausted(f"{gang} x {spec.gpus_per_node} {spec.accelerator} nodes")
            if not plan.feasible:
                raise CapacityUnavailable(f"cannot place {gang} nodes: {plan.reason}",
                                          remediation="raise the pools' max node counts, add zones, or allow_zone_spread=True",
                                          failover_history=failover.history)
            refused = refusal(states, plan.targets, spec.target.autoscaled_pools)
            if refused is not None:  # an autoscaled pool under autoscaled_pools="refuse": before any resize
                raise refused
            for ref, size in plan.targets.items():
                found.setdefault(_key(ref), plan.found.get(ref, 0) + tracker.others_in(ref.pool, ref.zone))
                targets[_key(ref)] = size + tracker.others_in(ref.pool, ref.zone)
            save()
            ops, err_zone, err = _resize_all(provider, owner, {r: targets[_key(r)] for r in plan.targets}, tracker)
            if err is None and not wait:
                save(requested=True)
                return Capacity(run_id, (), spec.gpus_per_node, accelerators.get(spec.accelerator).gke_label,
                                spec.spot, timeline.to_json(), {"zones": list(plan.zones)}, scheme=provider.scheme,
                                accelerator=spec.accelerator, namespace=spec.target.namespace)
            if err is None:
                if spec.topology == "none":  # a topology gang is claimed once a domain holds it
                    tracker.claim_early(lambda node: early.setdefault(
                        node["metadata"]["name"], claimer.submit(claim, api, node, run_id, owner.lease_expires,
                                                                 namespace=spec.target.namespace,
                                                                 protect=NodeView.of(node).pool in protected)),
                        plan.zones, gang - len(tracker.claimed()))
                watched = [st.ref for st in states if st.ref.zone in plan.zones] if extra is not None else []
                err_zone, err = wait_gang(tracker, need, plan.zones, deadline, provider, ops, watched, started)
            if err is None:
                if tracker.ready_count(plan.zones) < need:
                    raise _timeout(spec, timeline, gang)
                cap = _claim(api, spec, run_id, owner, tracker, gang, plan.zones, early, protected,
                             provider.scheme)
                if len(cap.nodes) >= gang:
                    break
                if time.time() >= deadline:  # another run claimed nodes we counted: re-plan until the deadline
                    raise _timeout(spec, timeline, gang)
                continue
            decision = failover.decide(err, Candidate(region, err_zone), candidates, at=time.time())
            if decision.action is Action.RETRY:
                time.sleep(min(backoff.delay(attempt), max(0.0, deadline - time.time())))
                attempt += 1
            elif decision.action is Action.FAILOVER:
                _rollback(provider, owner, found, targets, region, zone=err_zone)
                if on_zone_blocked is not None:
                    on_zone_blocked(err_zone)
            else:
                raise failover.exhausted(f"{gang} x {spec.gpus_per_node} {spec.accelerator} nodes")
            if time.time() >= deadline:
                raise _timeout(spec, timeline, gang)
        save(capacity=cap.to_json(), done=True)
        return cap
    except ProvisioningTimeout:
        _rollback(provider, owner, found, targets, region)
        save(rolled_back=True)
        raise
    finally:
        watcher.stop()
        claimer.shutdown(wait=True)


def node_selector(spec: ProvisioningSpec) -> str:
    """Nodes of the target cluster. The local stand-in labels its nodes with the simulated cluster name,
    so several stand-ins (tests, benchmarks) can share one control plane; real clusters need no filter."""
    return ",".join(f"{k}={v}" for k, v in rehearsal_seam.node_selector(spec.target).items())


def _resize_all(provider: CapacityProvider, owner: Owner, sizes: dict[PoolRef, int], tracker: GangTracker,
                ) -> tuple[list[tuple[PoolRef, Operation]], str, KfpGpuError | None]:
    """Issue every resize at once. Returns (operations, zone of the first error, classified error)."""
    if not sizes:
        return [], "", None

    def one(ref: PoolRef, size: int) -> tuple[PoolRef, Operation | KfpGpuError]:
        tracker.mark_requested(ref.pool, ref.zone, time.time())
        try:
            return ref, provider.resize(ref, size, owner)
        except KfpGpuError as exc:
            return ref, exc

    results = fanout.run_all([functools.partial(one, ref, size) for ref, size in sizes.items()])
    ops = [(ref, res) for ref, res in results if isinstance(res, Operation)]
    for ref, res in results:
        if isinstance(res, KfpGpuError):
            return ops, ref.zone, res
    return ops, "", None


def _claim(api: client.ApiClient, spec: ProvisioningSpec, run_id: str, owner: Owner, tracker: GangTracker,
           gang: int, zones: tuple[str, ...], early: dict[str, Future[bool]],
           protected: frozenset[str] = frozenset(), scheme: str = "gke") -> Capacity:
    """The gang's nodes, claimed: the early claims made while nodes booted, topped up if any were lost
    (nodes of ``protected`` pools are claimed with the scale-down-disabled annotation)."""
    mine = list(dict.fromkeys([v.name for v in tracker.claimed()]
                              + [n for n, f in list(early.items()) if f.result()]))
    by_name = {name_of(n): n for n in list_nodes(api, node_selector(spec))[0]} if len(mine) < gang else {}
    free = [v.name for v in tracker.claimable(zones) if v.name not in mine and v.name in by_name]
    if tracker.topology != "none" and len(mine) < gang:  # the nodes of one domain, the run's own nodes' first
        free = [n for n in tracker.pick(zones, mine, gang - len(mine)) or [] if n in by_name]
    while len(mine) < gang and free:  # claim the missing ones concurrently; lost races take the next free
        batch, free = free[: gang - len(mine)], free[gang - len(mine):]
        won = claim_all(api, [by_name[n] for n in batch], run_id, owner.lease_expires, namespace=spec.target.namespace,
                        protect=lambda node: NodeView.of(node).pool in protected)
        mine += [n for n, ok in zip(batch, won, strict=True) if ok]
    views = {v.name: v for v in tracker.claimable()}
    placements: dict[tuple[str, str], list[str]] = {}
    for name in mine:
        v = views.get(name)
        if v is not None:
            placements.setdefault((v.pool, v.zone), []).append(name)
    return Capacity(run_id=run_id, placements=tuple(Placement(p, z, tuple(sorted(ns))) for (p, z), ns in placements.items()),
                    gpus_per_node=spec.gpus_per_node, accelerator_label=accelerators.get(spec.accelerator).gke_label,
                    spot=spec.spot, timeline_json=tracker.timeline.to_json(),
                    extra={"protected_pools": sorted(protected)} if protected else {},
                    scheme=scheme, accelerator=spec.accelerator, namespace=spec.target.namespace)


def _rollback(provider: CapacityProvider, owner: Owner, found: dict[str, int], targets: dict[str, int],
              region: str, zone: str | None = None) -> None:
    """Shrink pools this run grew back toward what it found (only ``zone`` when given).

    Transient errors (e.g. the resize just issued still in progress) are retried; anything else is logged:
    teardown retries from the ledger, which still lists these pools.
    """
    refs = {k: _ref(k, region) for k in targets if zone is None or _ref(k, region).zone == zone}
    if not refs:
        return
    errors: list[str] = []
    current: dict[PoolRef, int] = {}
    retry_transient(lambda: current.update({_ref(_key(st.ref), region): st.size for st in provider.pools(region)}),
                    errors, "read pool sizes")
    restore = rollback_sizes({refs[k]: found.get(k, 0) for k in refs}, {refs[k]: targets[k] for k in refs}, current)
    for ref, size in restore.items():
        retry_transient(functools.partial(provider.resize, ref, size, owner), errors, f"roll back {ref.pool} to {size}")
    for err in errors:
        log.warning("scale-up rollback: %s", err)
    for k in refs:
        targets.pop(k, None)


def _timeout(spec: ProvisioningSpec, timeline: Timeline, gang: int) -> ProvisioningTimeout:
    ready = len(timeline.ready_latencies())
    what = f"only {ready}/{gang} nodes Ready"
    fix = ""
    if spec.topology == "required":
        what = f"no {spec.topology_level} held {gang} Ready nodes (topology='required'; {ready} Ready in all)"
        fix = ", or use a compact placement pool (its nodes share one block) or topology='preferred'"
    return ProvisioningTimeout(
        f"{what} within scale_up_deadline_s={spec.scale_up_deadline_s:g}; rolled back what this run added",
        remediation=f"raise scale_up_deadline_s, use a warm pool or reservation, or add zones{fix}",
        timeline=timeline.to_json(),
    )


__all__ = ["provision", "node_selector"]
