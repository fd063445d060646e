"""The ``karpenter`` provisioner: Karpenter (karpenter.sh/v1) launches the gang for a NodePool scoped to the run.

acquire creates the run's NodePool (:func:`kfp_gpu.plan.karpenter.nodepool_body`: the catalog's instance types
for the accelerator and GPU count, ``karpenter.sh/capacity-type``, one zone; ``limits`` = the gang's GPUs; a
disruption budget of ``nodes: "0"``; a taint only the run's pods tolerate), then one placeholder pod per
wanted node (Karpenter provisions only for pending pods), and follows NodeClaims, Nodes and Karpenter's pod
events (:class:`kfp_gpu.cluster.karpenter.PoolWatch`). Ready nodes are claimed like any gang
(:func:`kfp_gpu.cluster.nodes.claim`); the placeholders are deleted once the gang is whole.

A blocked candidate (:func:`kfp_gpu.plan.karpenter.assess`: an ICE, a failed launch, "no offering") is given up:
its placeholders, NodeClaims and claims are dropped and the NodePool's requirements are patched to the next
(zone, capacity type) of :func:`kfp_gpu.plan.karpenter.candidates`. With no zone named (and no zone spread
allowed) one placeholder goes first and the NodePool is pinned to the zone its NodeClaim launched in (or the
survivors' zone in a recovery) before the rest are created; a gang blocked in that zone is dropped and led again
with the zone excluded (``NotIn``), up to ``ICE_RETRIES_ANY_ZONE`` zones; when none is left, ``CapacityUnavailable``
names every zone and Karpenter's reason. replace (spot recovery: Karpenter deleted an interrupted node's
NodeClaim, tainting the node ``karpenter.sh/disrupted``) asks the same NodePool for the lost nodes, raising its
limit by the lost nodes still draining. release deletes the run's NodePool (Karpenter terminates its NodeClaims
and nodes) and waits until they are gone. The job's pods carry ``karpenter.sh/do-not-disrupt: "true"``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu import accelerators
from kfp_gpu.cluster import apierrors, ledger
from kfp_gpu.cluster import karpenter as api_k
from kfp_gpu.cluster.balloons import delete_balloons, delete_pods
from kfp_gpu.cluster.capacity import GPU_TAINT_KEY, Capacity, Placement, parse_toleration
from kfp_gpu.cluster.nodes import claim_all, unclaim
from kfp_gpu.cluster.nodes import leaving as nodes_leaving
from kfp_gpu.errors import CrdMissing
from kfp_gpu.ownership import LABEL_RUN_ID, Owner, label_safe
from kfp_gpu.plan import karpenter as plan
from kfp_gpu.plan.readiness import is_ready
from kfp_gpu.provisioners.base import GangRequest, NothingExtra, Released
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.timeline import Timeline

NAME = "karpenter"
SCHEME = "karpenter"
RELEASE_WAIT_S = 120.0
LEADER_WAIT_S = 60.0  # a leader NodeClaim without a zone by then: pod affinity alone keeps the gang together
log = logging.getLogger(__name__)


class KarpenterProvisioner(NothingExtra):
    """The karpenter backend (contract: :mod:`kfp_gpu.provisioners.base`)."""

    name = NAME
    holds_placeholders = True  # acquire(wait=False)'s placeholders (tolerating the NodePool's taint) are the warm pool
    releases_one_node = True  # a node given up: its NodeClaim deleted (Karpenter drains and terminates it)
    launches_without_pools = True  # Karpenter launches for the run's NodePool: no cloud node group bounds the gang

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    # ---- acquire -----------------------------------------------------------------------------------------
    def acquire(self, spec: ProvisioningSpec, run_id: str, request: GangRequest) -> Capacity:
        """Raises: CapacityUnavailable (every candidate blocked), ProvisioningTimeout, PermissionDenied (RBAC),
        CrdMissing (no karpenter.sh/v1 NodePool API), NotFound (no node class), InvalidSpec (flex-start,
        topology="required", or no EC2 instance type with ``gpus_per_node`` of the accelerator)."""
        return self._acquire(spec, run_id, request, list(spec.zones))

    def _acquire(self, spec: ProvisioningSpec, run_id: str, request: GangRequest, zones: list[str]) -> Capacity:
        plan.check_topology(spec.topology)
        ns = spec.target.namespace
        count = request.extra if request.extra is not None else (request.nodes or spec.nodes)
        keep = dict(request.keep or {})
        pool = plan.nodepool_name(run_id)
        owner = Owner.for_step(run_id, request.step, request.lease_ttl_s or spec.lease_ttl_s)
        cands = plan.candidates(zones, spec.capacity.value,
                                on_demand_fallback=spec.spot and spec.recovery.on_demand_after > 0)
        types = [accelerators.get(spec.accelerator).aws_instance_for(spec.gpus_per_node).name]
        led = ledger.read(self.api, ns, run_id, request.step)
        if led.get("done") and led.get("capacity"):
            return Capacity.from_json(str(led["capacity"]))  # a retried pod re-attaches to what it got
        started = float(led.get("started", time.time()))
        deadline = started + spec.scale_up_deadline_s
        attempt = int(led.get("attempt", 0))
        history: list[dict[str, Any]] = list(led.get("history", []))
        timeline = Timeline.from_json(led["timeline"]) if led.get("timeline") else Timeline(run_id)
        apierrors.call(functools.partial(self._ensure_pool, spec, run_id, pool, owner, types,
                                         cands[min(attempt, len(cands) - 1)], len(keep) + count),
                       f"create NodePool {pool}", not_found=_crd_missing)
        if not request.wait:  # the warm pool: placeholders make Karpenter launch; scale-up claims the nodes later
            names = api_k.placeholder_names(pool, request.step, 0, count)
            cand = apierrors.call(functools.partial(self._place, spec, pool, types, cands[0], names, count, keep, owner,
                                                    deadline, retarget=False), f"place NodePool {pool}'s placeholders",
                                  not_found=_crd_missing)
            return self._capacity(spec, run_id, {}, timeline, pool, cand)
        while attempt < len(cands):
            cand = cands[attempt]
            ledger.write(self.api, ns, owner, {"spec": spec.to_json(), "timeline": timeline.to_json(), "started": started,
                                               "attempt": attempt, "history": history, "nodepool": pool})
            names = api_k.placeholder_names(pool, request.step, attempt * 10 + len(cand.avoid), count)
            cand = apierrors.call(functools.partial(self._place, spec, pool, types, cand, names, count, keep, owner,
                                                    deadline, retarget=True), f"place NodePool {pool}'s placeholders",
                                  not_found=_crd_missing)
            verdict, mine = self._gather(spec, run_id, owner, pool, cand, names, count, deadline, request, timeline)
            delete_pods(self.api, ns, names)
            if verdict.verdict is plan.Verdict.READY:
                delete_balloons(self.api, ns, run_id)  # the warm pool's placeholders too: the gang is whole
                cap = self._capacity(spec, run_id, {**keep, **mine}, timeline, pool, cand)
                ledger.write(self.api, ns, owner, {"spec": spec.to_json(), "timeline": timeline.to_json(),
                                                   "started": started, "attempt": attempt, "history": history,
                                                   "nodepool": pool, "done": True, "capacity": cap.to_json()})
                return cap
            self._drop(pool, mine, keep)
            if verdict.verdict is plan.Verdict.TIMEOUT:
                self._rollback(pool, keep, len(keep), spec.gpus_per_node)
                raise plan.timed_out(ready=len(mine), wanted=count, nodepool=pool, cand=cand,
                                     deadline_s=spec.scale_up_deadline_s, history=history)
            history.append({"zone": cand.zone, "capacity_type": cand.capacity_type, "reason": verdict.reason,
                            "message": verdict.message, "at": time.time()})
            log.warning("NodePool %s: %s blocked (%s); trying the next candidate", pool, cand.label, verdict.reason)
            if request.on_zone_blocked is not None and cand.zone:
                request.on_zone_blocked(cand.zone)
            again = plan.lead_again(cands[attempt], cand, recovering=bool(keep))
            if again is not None:  # the zone a leader chose is blocked: lead again, that zone excluded
                cands[attempt] = again
                continue
            attempt += 1
        self._rollback(pool, keep, len(keep), spec.gpus_per_node)
        raise plan.exhausted(history, nodes=count, gpus_per_node=spec.gpus_per_node, accelerator=spec.accelerator,
                             nodepool=pool)

    def _ensure_pool(self, spec: ProvisioningSpec, run_id: str, pool: str, owner: Owner, types: list[str],
                     cand: plan.Candidate, gang: int) -> None:
        from kfp_gpu.ownership import LEASE_NAMESPACE_ANNOTATION

        body = plan.nodepool_body(pool, labels=owner.labels(), instance_types=types, cand=cand, limit_nodes=gang,
                                  annotations={LEASE_NAMESPACE_ANNOTATION: f"{spec.target.namespace}/{label_safe(run_id)}"},
                                  gpus_per_node=spec.gpus_per_node, node_class=api_k.node_class(self.api),
                                  run_label=label_safe(run_id), namespace=spec.target.namespace,
                                  **api_k.template_extras())
        api_k.ensure_nodepool(self.api, body)

    def _retarget(self, pool: str, types: list[str], cand: plan.Candidate, gang: int, gpus_per_node: int,
                  keep: dict[str, tuple[str, str]]) -> None:
        """Point the NodePool at ``cand``; its limit is the gang plus the run's other NodeClaims still counted
        (lost nodes draining during a recovery)."""
        others = [c for c in api_k.list_nodeclaims(self.api, pool)
                  if str((c.get("status") or {}).get("nodeName", "")) not in keep]
        limit = plan.limit_for_replace(gang=gang, still_listed=len(others) if keep else 0, gpus_per_node=gpus_per_node)
        api_k.patch_nodepool(self.api, pool, {"spec": {"limits": limit, "template": {"spec": {
            "requirements": plan.requirements(types, cand)}}}})

    def _place(self, spec: ProvisioningSpec, pool: str, types: list[str], cand: plan.Candidate, names: list[str],
               count: int, keep: dict[str, tuple[str, str]], owner: Owner, deadline: float, *, retarget: bool,
               ) -> plan.Candidate:
        """Point the NodePool at ``cand`` (``retarget``: it was just created for it otherwise) and create the
        placeholders that make Karpenter launch; returns the candidate they were pinned to. With no zone named
        (and no zone spread allowed) the gang goes to the survivors' zone in a recovery, else one placeholder goes
        first and the NodePool is pinned to the zone its NodeClaim launched in: pod affinity alone spreads a gang
        that Karpenter sees in two batches. Raises: ApiException."""
        ns, label = spec.target.namespace, label_safe(owner.run_id)
        one_zone = not cand.zone and not spec.allow_zone_spread

        def create(some: list[str]) -> None:
            api_k.create_placeholders(self.api, ns, some, labels=owner.labels(), nodepool=pool,
                                      gpus_per_node=spec.gpus_per_node, tolerations=_pod_tolerations(spec, label),
                                      one_zone=one_zone)

        def point(at: plan.Candidate) -> None:
            self._retarget(pool, types, at, len(keep) + count, spec.gpus_per_node, keep)

        kept = {z for _, z in keep.values() if z}
        if one_zone and len(kept) == 1:  # one patch, straight to the survivors' zone
            cand = dataclasses.replace(cand, zone=kept.pop())
            point(cand)
        else:
            if retarget:
                point(cand)
            if one_zone and count > 1:
                create(names[:1])
                zone = self._leader_zone(pool, keep, min(deadline, time.time() + LEADER_WAIT_S), cand.avoid)
                if zone:
                    cand = dataclasses.replace(cand, zone=zone)
                    point(cand)
        create(names)
        return cand

    def _leader_zone(self, pool: str, keep: dict[str, tuple[str, str]], until: float,
                     avoid: tuple[str, ...] = ()) -> str:
        """The zone Karpenter launched the first placeholder's NodeClaim in ("" if none by ``until``): the
        rest of the gang is pinned to it. Raises: ApiException."""
        while time.time() < until:
            for c in api_k.list_nodeclaims(self.api, pool):
                view = plan.read_claim(c)
                if (view.zone and view.node not in keep and view.zone not in avoid
                        and view.state is not plan.ClaimState.DELETING):
                    return view.zone
            time.sleep(0.25)
        return ""

    def _gather(self, spec: ProvisioningSpec, run_id: str, owner: Owner, pool: str, cand: plan.Candidate,
                names: list[str], count: int, deadline: float, request: GangRequest, timeline: Timeline,
                ) -> tuple[plan.Assessment, dict[str, tuple[str, str]]]:
        """Claim Ready nodes of the NodePool in ``cand``'s zone until ``count`` or a verdict other than WAIT."""
        mine: dict[str, tuple[str, str]] = {}
        excluded, keep, asked_at = set(request.exclude), dict(request.keep or {}), time.time()
        # the platform's declared startup taints: a node is claimed once they are gone (Karpenter's Initialized)
        startup = {str(t["key"]) for t in api_k.template_extras().get("startup_taints", [])}
        watch = api_k.PoolWatch(self.api, spec.target.namespace, pool, names).start()
        try:
            while True:
                claims, views, raw, signals = watch.snapshot()
                if watch.error is not None:
                    raise apierrors.to_error(watch.error, f"watch of NodePool {pool}", not_found=_crd_missing)
                by_name = {str(n["metadata"]["name"]): n for n in raw}
                free = [v for v in views
                        if v.ready and (not startup or is_ready(by_name[v.name], startup=startup))
                        and not v.going and not v.deleting and v.gpus >= spec.gpus_per_node
                        and v.uid not in excluded and v.name not in mine and v.name not in keep
                        and v.run_id in ("", label_safe(run_id)) and (not cand.zone or v.zone == cand.zone)]
                batch = free[: max(0, count - len(mine))]
                won = claim_all(self.api, [by_name[v.name] for v in batch], run_id, owner.lease_expires,
                                namespace=spec.target.namespace)
                seen = time.time()
                for v, ok in zip(batch, won, strict=True):
                    if not ok:  # another run claimed it first
                        continue
                    mine[v.name] = (pool, v.zone)
                    timeline.node(v.name, pool=pool, zone=v.zone, gpus=spec.gpus_per_node,
                                  spot=cand.capacity_type == "spot").claimed_ready(asked_at, seen)
                verdict = plan.assess(ready=len(mine), wanted=count, claims=claims, signals=signals, asked_at=asked_at,
                                      now=time.time(), deadline=deadline, pinned=bool(cand.zone))
                if verdict.verdict is not plan.Verdict.WAIT:
                    return verdict, mine
                watch.wait(0.5)
        finally:
            watch.stop()

    def _drop(self, pool: str, mine: dict[str, tuple[str, str]], keep: dict[str, tuple[str, str]]) -> None:
        """Give a blocked candidate's nodes back: unclaim them and delete the NodeClaims not serving ``keep``."""
        for node in mine:
            unclaim(self.api, node)
        for c in api_k.list_nodeclaims(self.api, pool):
            if str((c.get("status") or {}).get("nodeName", "")) not in keep:
                api_k.delete_nodeclaim(self.api, str(c["metadata"]["name"]))

    def _rollback(self, pool: str, keep: dict[str, tuple[str, str]], gang: int, gpus_per_node: int) -> None:
        """A failed first acquire deletes the NodePool; a failed recovery keeps it for the survivors."""
        if not keep:
            api_k.delete_nodepool(self.api, pool)
        else:
            api_k.patch_nodepool(self.api, pool, {"spec": {"limits": plan.gpu_limit(gang, gpus_per_node)}})

    def _capacity(self, spec: ProvisioningSpec, run_id: str, nodes: dict[str, tuple[str, str]], timeline: Timeline,
                  pool: str, cand: plan.Candidate) -> Capacity:
        groups: dict[tuple[str, str], list[str]] = {}
        for name, pz in nodes.items():
            groups.setdefault(pz, []).append(name)
        extra: dict[str, Any] = {"provisioner": NAME, "scheme": SCHEME, "nodepool": pool,
                                 "capacity_type": cand.capacity_type,
                                 "tolerations": [*spec.target.tolerations, plan.pool_toleration(label_safe(run_id),
                                                                                      spec.target.namespace)]}
        return Capacity(run_id, tuple(Placement(p, z, tuple(sorted(ns))) for (p, z), ns in sorted(groups.items())),
                        spec.gpus_per_node, accelerators.get(spec.accelerator).gke_label, cand.capacity_type == "spot",
                        timeline.to_json(), extra, scheme=SCHEME, accelerator=accelerators.get(spec.accelerator).name,
                        namespace=spec.target.namespace)

    # ---- the rest of the contract ---------------------------------------------------------------------------
    def replace(self, spec: ProvisioningSpec, run_id: str, capacity: Capacity, lost: Any, *,
                extra: int, zone_hint: str, on_demand: bool, attempt: int, lost_uids: Any) -> Capacity:
        """The lost nodes again from the run's NodePool (``recovery-N``), in the survivors' zone first;
        ``on_demand`` switches spot to on-demand. Raises: as :meth:`acquire`."""
        if on_demand and spec.spot:
            spec = spec.replace(capacity="on-demand", recovery=dataclasses.replace(spec.recovery, on_demand_after=0))
        keep = {n: (p.pool, p.zone) for p in capacity.placements for n in p.nodes if n not in lost}
        leaving = [n for n in lost if nodes_leaving(self.api, n)]  # swapped out or a bad GPU: still a live node
        pool = str(capacity.extra.get("nodepool") or "")
        if leaving and pool:  # its GPUs count against the NodePool's limit (the gang's) until its NodeClaim is gone
            try:
                gone = api_k.release_nodes(self.api, pool, leaving)
                log.info("recovery: released %s (NodeClaims %s) before the replacement", ", ".join(leaving),
                         ", ".join(gone) or "none found")
            except ApiException as exc:
                log.warning("recovery: release of %s failed: %s %s", ", ".join(leaving), exc.status, exc.reason)
        zones = list(spec.zones) or [""]
        first = zone_hint or next((z for _, z in keep.values() if z), "")
        if first:
            zones = [first, *[z for z in zones if z != first]] if spec.allow_zone_spread or not keep else [first]
        return self._acquire(spec, run_id, GangRequest(step=f"recovery-{attempt}", extra=extra, keep=keep,
                                                       exclude=list(lost_uids)), zones)

    def pod_annotations(self, capacity: Capacity) -> dict[str, str]:
        return {plan.DO_NOT_DISRUPT: "true"} if capacity.extra.get("nodepool") else {}

    def release(self, spec: ProvisioningSpec, run_id: str) -> Released:
        """Delete the run's NodePools and wait (up to 120 s) until they and their nodes are gone."""
        out = Released()
        selector = f"{LABEL_RUN_ID}={label_safe(run_id)}"
        try:
            pools = [str(p["metadata"]["name"]) for p in api_k.list_nodepools(self.api, selector)]
            if not pools:
                return out
            from kfp_gpu.cluster.nodes import list_nodes

            for pool in pools:
                nodes, _ = list_nodes(self.api, f"{plan.NODEPOOL_LABEL}={pool}")
                out.nodes_deleted += [str(n["metadata"]["name"]) for n in nodes]
                if api_k.delete_nodepool(self.api, pool):
                    out.objects.append(f"nodepool {pool}")
            left = api_k.wait_gone(self.api, pools, selector, time.time() + RELEASE_WAIT_S)
            if left:
                out.errors.append(f"still there {RELEASE_WAIT_S:g}s after deleting the NodePool: {', '.join(left)}")
        except ApiException as exc:
            out.errors.append(f"delete nodepools: {exc.status} {exc.reason}")
        return out


def _pod_tolerations(spec: ProvisioningSpec, run_label: str) -> list[dict[str, str]]:
    """The placeholders tolerate the GPU taint, the target's taints and the NodePool's taint, but not the run's
    claim taint: a recovery's placeholders never fit on the surviving (claimed) nodes, so Karpenter launches."""
    return [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
            *[parse_toleration(t) for t in spec.target.tolerations],
            parse_toleration(plan.pool_toleration(run_label, spec.target.namespace))]


_crd_missing = CrdMissing.builder(f"{plan.CRD_NAME} ({plan.GROUP}/{plan.VERSION})",
                                  "install Karpenter v1 (its NodePool/NodeClaim CRDs and controller), or use "
                                  "target.provisioner='node-pool'")
