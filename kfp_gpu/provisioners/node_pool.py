"""The ``node-pool`` provisioner: the run resizes dedicated node pools itself (GKE node pools, EKS managed node
groups) through the :class:`~kfp_gpu.providers.base.CapacityProvider`.

acquire is :func:`kfp_gpu.provisioners.resize.provision` (all-or-nothing resizes, Node watch, zone failover,
rollback past the deadline). Autoscaled pools are protected (scale-down-disabled on the nodes the run holds)
or refused, as ``target.autoscaled_pools`` says. replace counts what the instance groups are already
bringing back, falls back to on-demand pools when asked, and gives up the lost instances' slots when the
replacement goes elsewhere. release shrinks every pool the run grew by what it added (the run's own nodes
first, where the provider can delete named instances).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client

from kfp_gpu.cluster import ledger
from kfp_gpu.cluster.capacity import Capacity
from kfp_gpu.cluster.nodes import NodeView, list_nodes
from kfp_gpu.cluster.nodes import leaving as nodes_leaving
from kfp_gpu.errors import KfpGpuError, NotFound
from kfp_gpu.ownership import LABEL_RUN_ID, Owner, label_safe
from kfp_gpu.plan.placement import matching_pools
from kfp_gpu.plan.scale import rollback_sizes
from kfp_gpu.providers.base import CapacityProvider, Operation, PoolRef, PoolState
from kfp_gpu.provisioners.base import GangRequest, NothingExtra, Released
from kfp_gpu.provisioners.resize import provision
from kfp_gpu.retry import retry_transient
from kfp_gpu.spec import CapacityType, ProvisioningSpec

NAME = "node-pool"
log = logging.getLogger(__name__)


class NodePoolProvisioner(NothingExtra):
    """The node-pool backend (contract: :mod:`kfp_gpu.provisioners.base`)."""

    name = NAME
    releases_one_node = True  # deleteInstances / TerminateInstanceInAutoScalingGroup of the node given up

    def __init__(self, api: client.ApiClient, provider: CapacityProvider | None) -> None:
        self.api, self._provider = api, provider

    @property
    def provider(self) -> CapacityProvider:
        """The target's cloud provider, made on first use when none was given."""
        if self._provider is None:
            raise NotFound("the node-pool backend has no cloud provider for this target",
                           remediation="give the target an endpoint (local stand-in) or cloud credentials")
        return self._provider

    def acquire(self, spec: ProvisioningSpec, run_id: str, request: GangRequest) -> Capacity:
        """Raises: ProvisioningTimeout, CapacityUnavailable, NotFound, InvalidSpec, QuotaExceeded,
        PermissionDenied (see :func:`kfp_gpu.provisioners.resize.provision`)."""
        cap = provision(spec, run_id, self.api, self.provider, extra=request.extra, step=request.step,
                        allow_spread=request.allow_spread, gang_size=request.nodes or None, wait=request.wait,
                        lease_ttl_s=request.lease_ttl_s, exclude=request.exclude,
                        on_zone_blocked=request.on_zone_blocked,
                        keep=dict(request.keep) if request.keep is not None else None)
        return _tagged(cap, spec)

    def replace(self, spec: ProvisioningSpec, run_id: str, capacity: Capacity, lost: Sequence[str], *,
                extra: int, zone_hint: str, on_demand: bool, attempt: int, lost_uids: Sequence[str]) -> Capacity:
        """Raises: as :meth:`acquire`, and NotFound when the on-demand fallback has no pool."""
        where = {n: (p.pool, p.zone) for p in capacity.placements for n in p.nodes if n in lost}
        keep = {n: (p.pool, p.zone) for p in capacity.placements for n in p.nodes if n not in lost}
        # a node released for a bad GPU (kfp_gpu.steps.health_gate) or swapped out (a stall's repeat offender, a
        # straggler) is still a live VM its instance group counts: give its slot up first, or the group's target would
        # look as if it held the replacement
        leaving = {n: pz for n, pz in where.items() if nodes_leaving(self.api, n)}
        if leaving:
            _give_up(self.provider, spec.target.region, leaving,
                     Owner.for_step(run_id, f"recovery-{attempt}", spec.lease_ttl_s))
        return _tagged(reprovision(spec, run_id, self.api, self.provider, lost=extra, zone_hint=zone_hint,
                                   on_demand=on_demand, attempt=attempt, lost_uids=lost_uids, lost_where=where,
                                   keep=keep), spec)

    def release(self, spec: ProvisioningSpec, run_id: str) -> Released:
        """Shrink the pools the run grew (from its ledgers). Never raises for what is already gone."""
        out = Released()
        ns = spec.target.namespace
        ledgers = sorted(ledger.list_for_run(self.api, ns, run_id), key=lambda cm: ledger.data_of(cm).get("started", 0))
        nodes, _ = list_nodes(self.api, f"{LABEL_RUN_ID}={label_safe(run_id)}")
        claimed: dict[PoolRef, list[str]] = {}
        for node in nodes:
            view = NodeView.of(node)
            claimed.setdefault(PoolRef(view.pool, view.zone, spec.target.region), []).append(view.name)
        out.pools_restored = _restore_pools(spec, self.provider, run_id, ledgers, out, claimed)
        return out


def _give_up(provider: CapacityProvider, region: str, swap: Mapping[str, tuple[str, str]], owner: Owner,
             timeout_s: float = 120.0) -> None:
    """Release the slots of live nodes the run swaps out and wait for it (the pool's size must have dropped before
    the replacement is sized, or the plan counts the old node): the provider's ``delete_nodes`` operations are
    polled to done; a provider without it gets :func:`release_slots`' resize. Failures are logged, not raised."""
    deleter = getattr(provider, "delete_nodes", None)
    if deleter is None:
        release_slots(provider, region, swap, owner)
        return
    groups: dict[PoolRef, list[str]] = {}
    for name, (pool, zone) in swap.items():
        groups.setdefault(PoolRef(pool, zone, region), []).append(name)
    ops = []
    for ref, names in groups.items():
        try:
            ops.append(deleter(ref, sorted(names)))
        except KfpGpuError as exc:
            log.warning("recovery: release of %s from %s failed: %s", ", ".join(names), ref.pool, exc)
    deadline = time.time() + timeout_s
    while ops and time.time() < deadline:
        try:
            ops = [op for op in (provider.operation(o) for o in ops) if not op.done]
        except KfpGpuError as exc:
            log.warning("recovery: polling a node release failed: %s", exc)
        if ops:
            time.sleep(0.2)


def _tagged(cap: Capacity, spec: ProvisioningSpec) -> Capacity:
    extra: dict[str, Any] = {**cap.extra, "provisioner": NAME}
    if spec.target.tolerations:
        extra["tolerations"] = list(spec.target.tolerations)
    return dataclasses.replace(cap, extra=extra)


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

    ``keep`` (survivor -> (pool, zone)) is the run's gang without the lost nodes (see :func:`provision`). A
    ``topology="required"`` gang is replaced from the survivors' pools and zone only (a compact placement pool keeps
    its block), and its nodes are claimed in the survivors' domain (:meth:`kfp_gpu.cluster.gang.GangTracker.pick`).

    Returns the run's whole capacity (survivors + replacements). Raises: as :func:`provision`.
    """
    if on_demand and spec.capacity is CapacityType.SPOT:
        spec = on_demand_spec(spec, provider.pools(spec.target.region, sizes=False))
        release_slots(provider, spec.target.region, lost_where or {}, Owner.for_step(run_id, f"recovery-{attempt}",
                                                                                     spec.lease_ttl_s))
    if spec.topology == "required" and keep and not on_demand:  # the survivors' pools and zone: their domain
        spec = spec.replace(target=dataclasses.replace(spec.target, pools=tuple(dict.fromkeys(p for p, _ in keep.values()))),
                            zones=tuple(dict.fromkeys(z for _, z in keep.values())))
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
    unrestricted = base.replace(target=dataclasses.replace(base.target, pools=()))
    if matching_pools(unrestricted, pools):
        return unrestricted
    raise NotFound(
        f"recovery.on_demand_after={spec.recovery.on_demand_after}: on-demand fallback needs an on-demand node "
        f"pool with {spec.gpus_per_node}x {spec.accelerator} in {spec.target.region}, and the cluster has none",
        remediation=f"add an on-demand (non-spot) {spec.accelerator} node pool with {spec.gpus_per_node} GPUs per "
        "node (and list it in target.pools if you restrict pools), or set recovery.on_demand_after=0",
    )


def _restore_pools(spec: ProvisioningSpec, provider: CapacityProvider, run_id: str,
                   ledgers: list[client.V1ConfigMap], rep: Released,
                   claimed: dict[PoolRef, list[str]]) -> dict[str, int]:
    """Shrink every pool the run grew by what it added.

    When the provider can delete specific nodes (GKE: instanceGroupManagers.deleteInstances), the run's
    own claimed nodes go first, so a parallel run's nodes in the same pool are never the ones removed.
    The rest is a plain resize to ``rollback_sizes`` (the size found, or current - added).
    """
    found: dict[PoolRef, int] = {}
    targets: dict[PoolRef, int] = {}
    region = spec.target.region
    for cm in ledgers:  # oldest first: the earliest step's "found" is what the run found
        data = ledger.data_of(cm)
        for key, size in dict(data.get("found", {})).items():
            pool, zone = key.split("|", 1)
            found.setdefault(PoolRef(pool, zone, region), int(size))
        for key, size in dict(data.get("targets", {})).items():
            pool, zone = key.split("|", 1)
            ref = PoolRef(pool, zone, region)
            targets[ref] = max(targets.get(ref, 0), int(size))
    if not targets:
        return {}
    owner = Owner.for_step(run_id, "teardown", 600)
    deleter = getattr(provider, "delete_nodes", None)
    deleted: dict[PoolRef, int] = {}
    if callable(deleter):
        ops: list[Operation] = []
        for ref, target in targets.items():
            victims = claimed.get(ref, [])[: max(0, target - found.get(ref, 0))]
            if victims and retry_transient(functools.partial(_submit, ops, deleter, ref, victims), rep.errors,
                                           f"delete nodes of {ref.pool}"):
                deleted[ref] = len(victims)
                rep.nodes_deleted += victims
        _wait_ops(provider, ops)
    for ref, k in deleted.items():  # those deletions removed k of what the run added
        targets[ref] -= k
    current = {PoolRef(st.ref.pool, st.ref.zone, region): st.size for st in provider.pools(region)}
    restore = rollback_sizes(found, targets, current)
    done: dict[str, int] = {f"{r.pool}|{r.zone}": targets[r] for r in deleted}
    for ref, size in restore.items():
        if retry_transient(functools.partial(provider.resize, ref, size, owner), rep.errors,
                           f"restore {ref.pool} to {size}"):
            done[f"{ref.pool}|{ref.zone}"] = size
    return done


def _submit(ops: list[Operation], deleter: Any, ref: PoolRef, names: list[str]) -> None:
    ops.append(deleter(ref, names))


def _wait_ops(provider: CapacityProvider, ops: list[Operation], timeout_s: float = 30.0) -> None:
    end = time.time() + timeout_s
    pending = list(ops)
    while pending and time.time() < end:
        try:
            pending = [op for op in (provider.operation(o) for o in pending) if not op.done]
        except KfpGpuError:
            pass
        if pending:
            time.sleep(0.05)


