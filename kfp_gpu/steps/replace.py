"""Replacing lost gang nodes during spot recovery, and the capacity bookkeeping that goes with it.

A lost node is replaced through the run's reprovision hook (default :func:`reprovision`),
which first counts what the cloud is already bringing back: a GKE managed instance group keeps its target
size through a preemption and recreates the VM under the same name, so the replacement is usually that
recreated Node, claimed again, and no extra resize is issued. The merged capacity keeps the survivors and
adds the replacements, whatever their names.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes import client

from kfp_gpu.errors import NotFound
from kfp_gpu.plan.placement import matching_pools
from kfp_gpu.providers.base import CapacityProvider, Owner, PoolRef, PoolState
from kfp_gpu.spec import CapacityType, ProvisioningSpec
from kfp_gpu.steps.capacity import Capacity, Placement
from kfp_gpu.steps.retry import retry_transient
from kfp_gpu.steps.scale_up import provision

log = logging.getLogger(__name__)

Reprovision = Callable[..., Capacity]
"""``(spec, run_id, api, provider, *, lost: int, zone_hint: str, on_demand: bool) -> Capacity``: the
replacement nodes, or the whole gang (:func:`reprovision`); merged either way."""


class Background:
    """Run ``fn`` on a daemon thread (a cancelled step must not wait for it); ``result()`` re-raises."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._error: BaseException | None = None
        self._done = threading.Event()

        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # handed to the step thread by result()
                self._error = exc
            finally:
                self._done.set()

        threading.Thread(target=run, name="kfp-gpu-reprovision", daemon=True).start()

    def result(self) -> None:
        """Wait for ``fn``; re-raise what it raised."""
        while not self._done.wait(0.2):  # short waits keep the step thread responsive to SIGTERM
            pass
        if self._error is not None:
            raise self._error


def replace(spec: ProvisioningSpec, run_id: str, api: client.ApiClient, capacity: Capacity, lost: Sequence[str],
            *, zone_hint: str, on_demand: bool, attempt: int, hook: Reprovision | None,
            lost_uids: Sequence[str] = (), deficit: int = 0) -> Capacity:
    """Capacity for ``lost`` nodes of ``capacity``; returns the merged gang (survivors + replacements).

    Raises: ProvisioningTimeout, CapacityUnavailable, QuotaExceeded, NotFound (no matching, e.g. on-demand,
    pool), PermissionDenied: as :func:`kfp_gpu.steps.scale_up.provision`. ``hook`` replaces
    :func:`reprovision` (tests, custom capacity). ``deficit`` more nodes are asked for besides ``lost``'s.
    """
    count = len(lost) + deficit
    if hook is None:
        from kfp_gpu.providers import for_target

        # attempt keys the provider's idempotency: each recovery is a distinct (run_id, step) mutation
        where = {n: (p.pool, p.zone) for p in capacity.placements for n in p.nodes if n in lost}
        keep = {n: (p.pool, p.zone) for p in capacity.placements for n in p.nodes if n not in lost}
        new = reprovision(spec, run_id, api, for_target(spec.target), lost=count, zone_hint=zone_hint,
                          on_demand=on_demand, attempt=attempt, lost_uids=lost_uids, lost_where=where, keep=keep)
    else:
        new = hook(spec, run_id, api, None, lost=count, zone_hint=zone_hint, on_demand=on_demand)
    return merge_capacity(capacity, set(lost), new)


def reprovision(spec: ProvisioningSpec, run_id: str, api: client.ApiClient, provider: CapacityProvider,
                lost: int, zone_hint: str = "", on_demand: bool = False, *, attempt: int = 1,
                lost_uids: Sequence[str] = (), lost_where: Mapping[str, tuple[str, str]] | None = None,
                keep: dict[str, tuple[str, str]] | None = None) -> Capacity:
    """Replace ``lost`` nodes of a running gang (spot recovery): same zone first, on-demand when asked.

    ``lost_uids`` are the lost Node objects' uids: a preempted node can still be listed (tainted, being
    drained) while the replacement is requested, and must not count as capacity the run still holds; a VM
    its instance group recreated under the same name is a new Node (new uid) and counts.

    What the cloud is already bringing back counts first: a GKE managed instance group keeps its target size
    through a spot preemption and recreates the VM (same name), so in the same pool no resize is issued and
    the recreated node is claimed when Ready. When the replacement goes elsewhere instead (the on-demand
    fallback), the lost instances' slots (``lost_where``: node -> (pool, zone)) are given up first
    (:func:`release_slots`), so the instance group does not bring back a node nobody will use.

    ``keep`` (survivor -> (pool, zone)) is the run's gang without the lost nodes (see :func:`provision`).

    Returns the run's whole capacity (survivors + replacements). Raises: as :func:`provision`.
    """
    if on_demand and spec.capacity is CapacityType.SPOT:
        spec = on_demand_spec(spec, provider.pools(spec.target.region, sizes=False))
        release_slots(provider, spec.target.region, lost_where or {}, Owner.for_step(run_id, f"recovery-{attempt}",
                                                                                     spec.lease_ttl_s))
    if zone_hint and zone_hint in spec.zones:
        spec = spec.replace(zones=(zone_hint, *[z for z in spec.zones if z != zone_hint]))
    owner = Owner.for_step(run_id, f"recovery-{attempt}", spec.lease_ttl_s)

    def blocked(zone: str) -> None:  # a stocked-out group would bring the node back later, unused
        release_slots(provider, spec.target.region, {n: pz for n, pz in (lost_where or {}).items() if pz[1] == zone},
                      owner)

    return provision(spec, run_id, api, provider, extra=lost, step=f"recovery-{attempt}", allow_spread=True,
                     exclude=lost_uids, on_zone_blocked=blocked, keep=keep)


def release_slots(provider: CapacityProvider, region: str, lost_where: Mapping[str, tuple[str, str]],
                  owner: Owner) -> list[str]:
    """Stop instance groups from recreating lost nodes that will be replaced elsewhere.

    GKE: ``instanceGroupManagers.deleteInstances`` of the named instances (also while they are being
    recreated), which lowers the target size by as many. Providers without it get a resize to the pool's
    size minus the lost count. Failures are returned as messages (and logged), never raised: the slot is then
    released by teardown, which restores the pools the run grew.
    """
    groups: dict[PoolRef, list[str]] = {}
    for name, (pool, zone) in lost_where.items():
        groups.setdefault(PoolRef(pool, zone, region), []).append(name)
    errors: list[str] = []
    deleter = getattr(provider, "delete_nodes", None)
    for ref, names in groups.items():
        if deleter is not None:
            retry_transient(functools.partial(deleter, ref, sorted(names)), errors,
                            f"release {len(names)} slot(s) of {ref.pool}")
            continue
        sizes = {st.ref: st.size for st in provider.pools(region) if st.ref.pool == ref.pool}
        size = next((v for k, v in sizes.items() if k.zone == ref.zone), None)
        if size is not None:
            retry_transient(functools.partial(provider.resize, ref, max(0, size - len(names)), owner), errors,
                            f"shrink {ref.pool} by {len(names)}")
    for err in errors:
        log.warning("recovery: %s", err)
    return errors


def on_demand_spec(spec: ProvisioningSpec, pools: Sequence[PoolState]) -> ProvisioningSpec:
    """``spec`` switched to on-demand capacity of the same accelerator, for the recovery fallback.

    The target's on-demand pools are used even when ``target.pools`` lists only spot pools: the listed
    on-demand pools first (in the listed order), else every on-demand pool that matches.

    Raises: NotFound naming what to add when the cluster offers no such on-demand pool.
    """
    base = spec.replace(capacity=CapacityType.ON_DEMAND, recovery=spec.recovery.__class__(
        max_preemptions=spec.recovery.max_preemptions, on_demand_after=0,
        app_failure_retries=spec.recovery.app_failure_retries))
    if matching_pools(base, pools):
        return base
    import dataclasses

    unrestricted = base.replace(target=dataclasses.replace(base.target, pools=()))
    if matching_pools(unrestricted, pools):
        return unrestricted
    raise NotFound(
        f"recovery.on_demand_after={spec.recovery.on_demand_after}: on-demand fallback needs an on-demand node "
        f"pool with {spec.gpus_per_node}x {spec.accelerator} in {spec.target.region}, and the cluster has none",
        remediation=f"add an on-demand (non-spot) {spec.accelerator} node pool with {spec.gpus_per_node} GPUs per "
        "node (and list it in target.pools if you restrict pools), or set recovery.on_demand_after=0",
    )


def merge_capacity(old: Capacity, lost: set[str], new: Capacity) -> Capacity:
    """``old`` without the ``lost`` nodes, plus the nodes of ``new`` (deduplicated by name).

    A node of ``new`` may carry a lost node's name: the instance group recreated that VM, and the fresh
    Node is the replacement.
    """
    seen: set[str] = set()
    placements: list[Placement] = []
    for p in old.placements:
        nodes = tuple(n for n in p.nodes if n not in lost and n not in seen)
        seen.update(nodes)
        if nodes:
            placements.append(Placement(p.pool, p.zone, nodes))
    for p in new.placements:
        nodes = tuple(n for n in p.nodes if n not in seen)
        seen.update(nodes)
        if nodes:
            placements.append(Placement(p.pool, p.zone, nodes))
    merged: dict[tuple[str, str], list[str]] = {}
    for p in placements:
        merged.setdefault((p.pool, p.zone), []).extend(p.nodes)
    extra = dict(old.extra)
    protected = sorted(set(old.extra.get("protected_pools", [])) | set(new.extra.get("protected_pools", [])))
    if protected:
        extra["protected_pools"] = protected
    return Capacity(old.run_id, tuple(Placement(pool, zone, tuple(ns)) for (pool, zone), ns in merged.items()),
                    old.gpus_per_node, old.accelerator_label, spot=old.spot and new.spot,
                    timeline_json=old.timeline_json, extra=extra)
