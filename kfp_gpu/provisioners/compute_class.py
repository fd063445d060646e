"""The ``compute-class`` provisioner: GKE's node auto-provisioning brings the gang for a custom ComputeClass.

acquire (run in the controller, whose ServiceAccount alone may write the cluster-scoped class) creates the run's
ComputeClass from the capacity chain (:func:`kfp_gpu.plan.computeclass.class_body`: one ``priorities[]`` rule per
rung, ``nodePoolAutoCreation``, ``activeMigration``), or checks the class ``target.compute_class`` names, then one
whole-node placeholder pod per wanted node selecting the class (``nodeSelector: cloud.google.com/compute-class``,
tolerating the class's taint; GKE's autoscaler scales up only for pending pods) and follows the class's Nodes with
one list/watch loop (:class:`kfp_gpu.cluster.computeclass.ClassNodes`). Ready nodes (the one readiness predicate,
:mod:`kfp_gpu.plan.readiness`) are claimed like any gang; the placeholders are deleted once it is whole.

All-or-nothing: when the chain has flex-start and the gang has more than one node, the flex-start rung goes through
the ``queued`` backend first if that backend's contract says ``all_or_nothing`` (a ProvisioningRequest of class
``queued-provisioning.gke.io``), within half of the deadline; the class holds the other rungs
(:func:`kfp_gpu.plan.computeclass.split`). release deletes the run's placeholders and class; GKE's autoscaler
removes the then unneeded nodes.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu import accelerators, fanout
from kfp_gpu.cluster import apierrors, balloons
from kfp_gpu.cluster import computeclass as api_cc
from kfp_gpu.cluster import karpenter as api_k
from kfp_gpu.cluster.capacity import GPU_TAINT_KEY, Capacity, Placement, parse_toleration
from kfp_gpu.cluster.nodes import NodeView, claim_all
from kfp_gpu.errors import CapacityUnavailable, CrdMissing, NotFound, ProvisioningTimeout
from kfp_gpu.ownership import LABEL_RUN_ID, Owner, label_safe
from kfp_gpu.plan import computeclass as plan
from kfp_gpu.plan.readiness import is_ready
from kfp_gpu.provisioners.base import GangRequest, NothingExtra, Provisioner, Released
from kfp_gpu.rehearsal_seam import node_selector
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.timeline import Timeline

NAME = "compute-class"
# a ComputeClass flexStart rule has no documented all-at-once allocation (plan.computeclass docstring)
CLASS_FLEX_ALL_OR_NOTHING = False
QUEUED_SHARE = 0.5  # of scale_up_deadline_s, for the flex-start rung through queued provisioning
log = logging.getLogger(__name__)


class ComputeClassProvisioner(NothingExtra):
    """The compute-class backend (contract: :mod:`kfp_gpu.provisioners.base`)."""

    name = NAME
    holds_placeholders = True  # acquire(wait=False)'s placeholders (selecting the class) are the warm pool
    all_or_nothing = False  # a class's rules add nodes as each can (GKE documents no all-at-once allocation)
    releases_one_node = False  # GKE's autoscaler owns the class's nodes: cordoned, it scales the empty one down
    launches_without_pools = True  # the run's class lets node auto-provisioning create its pools (nodePoolAutoCreation)

    def __init__(self, api: client.ApiClient, queued: Provisioner | None = None) -> None:
        self.api = api
        self.queued = queued

    # ---- acquire -----------------------------------------------------------------------------------------
    def acquire(self, spec: ProvisioningSpec, run_id: str, request: GangRequest) -> Capacity:
        """Raises: InvalidSpec (a chain GKE refuses, topology="required"), CrdMissing (no ComputeClass API),
        NotFound (the named class), ProvisioningTimeout (GKE backs a short rule off and asks again: no earlier
        give-up)."""
        plan.check(spec)
        count = request.extra if request.extra is not None else (request.nodes or spec.nodes)
        keep = dict(request.keep or {})
        started = time.time()
        deadline = started + spec.scale_up_deadline_s
        queued_first, rungs = plan.split(spec, class_atomic=CLASS_FLEX_ALL_OR_NOTHING)
        if queued_first and request.wait and not keep and self.queued is not None and getattr(
                self.queued, "all_or_nothing", False):
            cap = self._queued_flex(spec, run_id, request)
            if cap is not None:
                return cap
        name = spec.target.compute_class or plan.class_name(run_id)
        owner = Owner.for_step(run_id, request.step, request.lease_ttl_s or spec.lease_ttl_s)
        self._ensure_class(spec, run_id, name, rungs, owner)
        held = 0 if keep else self._held(spec, run_id, name)
        names = api_k.placeholder_names(name, request.step, 0, max(0, count - held))
        self._placeholders(spec, name, owner, names)
        timeline = Timeline(run_id)
        if not request.wait:  # the warm pool: GKE scales up for the placeholders; scale-up claims the nodes later
            return self._capacity(spec, run_id, {}, timeline, name)
        mine = self._gather(spec, run_id, owner, name, count, keep, request, deadline, timeline, started)
        balloons.delete_balloons(self.api, spec.target.namespace, run_id)  # these and the warm pool's placeholders
        return self._capacity(spec, run_id, {**keep, **mine}, timeline, name)

    def _placeholders(self, spec: ProvisioningSpec, name: str, owner: Owner, names: list[str]) -> None:
        """One whole-node pod per name selecting the class (GKE scales up only for pending pods). Raises:
        KfpGpuError."""
        if names:
            apierrors.call(functools.partial(api_k.create_placeholders, self.api, spec.target.namespace, names,
                                             labels=owner.labels(), nodepool="", gpus_per_node=spec.gpus_per_node,
                                             tolerations=_tolerations(spec, name),
                                             selector={plan.CLASS_LABEL: name, **node_selector(spec.target)}),
                           f"create ComputeClass {name}'s placeholder pods")

    def _held(self, spec: ProvisioningSpec, run_id: str, name: str) -> int:
        """What the warm pool already holds for the run: its placeholders (pending or on a node), or the class's
        Ready unclaimed nodes, whichever is more (a placeholder on a Ready node is both). Raises: KfpGpuError."""
        from kfp_gpu.cluster.nodes import list_nodes

        pods = self._placeholder_pods(spec, run_id)
        nodes, _ = apierrors.call(functools.partial(list_nodes, self.api, f"{plan.CLASS_LABEL}={name}"),
                                  f"list ComputeClass {name}'s nodes")
        free = [n for n in nodes if is_ready(n, gpus=spec.gpus_per_node) and not NodeView.of(n).run_id]
        return max(len(pods), len(free))

    def _queued_flex(self, spec: ProvisioningSpec, run_id: str, request: GangRequest) -> Capacity | None:
        """The flex-start rung through the all-or-nothing backend; None when it gave up (the class goes on)."""
        assert self.queued is not None
        flex = spec.replace(capacity="flex-start", fallback=(), reservation="", active_migration=False,
                            scale_up_deadline_s=max(1.0, spec.scale_up_deadline_s * QUEUED_SHARE),
                            target=dataclasses.replace(spec.target, provisioner="provisioning-request",
                                                       compute_class=""))
        try:
            return self.queued.acquire(flex, run_id, GangRequest(nodes=request.nodes, step=f"{request.step}-flex",
                                                                 lease_ttl_s=request.lease_ttl_s))
        except (CapacityUnavailable, ProvisioningTimeout) as exc:
            log.warning("flex-start through queued provisioning gave up (%s); the ComputeClass takes the next rungs",
                        exc)
            self.queued.release(flex, run_id)
            return None

    def _ensure_class(self, spec: ProvisioningSpec, run_id: str, name: str, rungs: list[str], owner: Owner) -> None:
        from kfp_gpu.ownership import LEASE_NAMESPACE_ANNOTATION as NAMESPACE_ANNOTATION

        if spec.target.compute_class:
            found = apierrors.call(functools.partial(api_cc.get_class, self.api, name), f"read ComputeClass {name}",
                                   not_found=_crd_missing)
            if found is None:
                raise NotFound(f"ComputeClass {name!r} (target.compute_class) does not exist",
                               remediation=f"create it (kubectl apply -f class.yaml, see {plan.DOCS}) or set "
                               "target.compute_class='' to let the controller create one for the run")
            return
        body = plan.class_body(name, spec, rungs, labels=owner.labels(),
                               annotations={NAMESPACE_ANNOTATION: f"{spec.target.namespace}/{label_safe(run_id)}"})
        apierrors.call(functools.partial(api_cc.ensure_class, self.api, body), f"create ComputeClass {name}",
                       not_found=_crd_missing)

    def _gather(self, spec: ProvisioningSpec, run_id: str, owner: Owner, name: str, count: int,
                keep: dict[str, tuple[str, str]], request: GangRequest, deadline: float, timeline: Timeline,
                asked_at: float) -> dict[str, tuple[str, str]]:
        """Claim Ready nodes of the class until ``count``. Raises: ProvisioningTimeout at the deadline."""
        mine: dict[str, tuple[str, str]] = {}
        excluded = set(request.exclude)
        watch = api_cc.ClassNodes(self.api, name).start()
        rounds, checked = 0, 0.0  # reconcile rounds (the names of placeholders they create), when the last ran
        try:
            while True:
                if watch.error is not None:
                    raise apierrors.to_error(watch.error, f"watch of ComputeClass {name}'s nodes")
                raw = watch.snapshot()
                views = [(NodeView.of(n), n) for n in raw if is_ready(n, gpus=spec.gpus_per_node)]
                free = [(v, n) for v, n in views if not v.going and not v.deleting and v.uid not in excluded
                        and v.name not in mine and v.name not in keep and v.run_id in ("", label_safe(run_id))]
                batch = free[: max(0, count - len(mine))]
                if batch or time.time() >= checked + 2.0:  # before the claim: its taint would shut out a placeholder
                    rounds += 1  # not yet bound to the node
                    self._reconcile(spec, run_id, name, owner, request.step, rounds,
                                    {*mine, *keep, *(v.name for v, _ in batch)}, count - len(mine) - len(batch))
                    checked = time.time()
                won = claim_all(self.api, [n for _, n in batch], run_id, owner.lease_expires,  # GKE's autoscaler
                                namespace=spec.target.namespace, protect=lambda _n: True)  # keeps them till release
                seen = time.time()
                for (v, n), ok in zip(batch, won, strict=True):
                    if ok:
                        mine[v.name] = (v.pool, v.zone)
                        spot = (n.get("metadata") or {}).get("labels", {}).get("cloud.google.com/gke-spot") == "true"
                        timeline.node(v.name, pool=v.pool, zone=v.zone, gpus=spec.gpus_per_node,
                                      spot=spot).claimed_ready(asked_at, seen)
                verdict = plan.assess(ready=len(mine), wanted=count, now=time.time(), deadline=deadline)
                if verdict.verdict is plan.Verdict.READY:
                    return mine
                if verdict.verdict is plan.Verdict.TIMEOUT:
                    raise plan.timed_out(ready=len(mine), wanted=count, name=name,
                                         deadline_s=spec.scale_up_deadline_s, rules=[c.value for c in spec.chain])
                watch.wait(min(1.0, max(0.0, deadline - time.time())))
        finally:
            watch.stop()

    def _reconcile(self, spec: ProvisioningSpec, run_id: str, name: str, owner: Owner, step: str, round_: int,
                   claimed: set[str], need: int) -> None:
        """Keep exactly ``need`` of the run's placeholders that can still bring a node (pending, or on a node not
        ``claimed``), like a ReplicaSet: delete those on claimed nodes (they hold nothing more) and the surplus
        (pending ones first), create the shortfall (a placeholder is a bare pod of low priority: preempted, or gone
        with its node, nothing recreates it). GKE's autoscaler brings a node for every pending pod that selects the
        class and no upcoming node can take, so a placeholder our claim's taint shuts out before it binds would get
        a node of its own, and a missing one leaves a node that never came unreplaced. A surplus pod is deleted only
        at the resourceVersion listed: one the scheduler bound meanwhile is kept and the pass lists again (deleting
        it would leave a pending one, and its node, one short). Raises: KfpGpuError."""
        useful: list[Pod] = []
        for _ in range(3):
            live = self._placeholder_pods(spec, run_id)
            spent = [p for p in live if p.node in claimed]
            useful = sorted((p for p in live if p.node not in claimed), key=lambda p: bool(p.node))
            surplus = useful[: max(0, len(useful) - need)]
            if spent:
                apierrors.call(functools.partial(balloons.delete_pods, self.api, spec.target.namespace,
                                                 [p.name for p in spent]),
                               "delete the placeholders on claimed nodes")
            if not surplus:
                break
            gone = apierrors.call(functools.partial(_delete_unchanged, self.api, spec.target.namespace, surplus),
                                  "delete the placeholders the claimed nodes made surplus")
            if all(gone):
                useful = useful[len(surplus):]
                break
        self._placeholders(spec, name, owner, api_k.placeholder_names(name, step, round_, max(0, need - len(useful))))

    def _placeholder_pods(self, spec: ProvisioningSpec, run_id: str) -> list[Pod]:
        """The run's placeholder pods not being deleted (a fresh list: read from etcd, as raw JSON: a pass at a
        gang of hundreds would spend seconds building the client's models). Raises: KfpGpuError."""
        pods = apierrors.call(functools.partial(balloons.list_balloons, self.api, spec.target.namespace, run_id),
                              f"list the run's placeholder pods in {spec.target.namespace}")
        return [pod for pod in map(Pod.of, pods) if pod.live]

    def _capacity(self, spec: ProvisioningSpec, run_id: str, nodes: dict[str, tuple[str, str]], timeline: Timeline,
                  name: str) -> Capacity:
        groups: dict[tuple[str, str], list[str]] = {}
        for node, pz in nodes.items():
            groups.setdefault(pz, []).append(node)
        acc = accelerators.get(spec.accelerator)
        extra: dict[str, Any] = {"provisioner": NAME, "compute_class": name,
                                 "node_selector": {plan.CLASS_LABEL: name, **node_selector(spec.target)},
                                 "tolerations": [*spec.target.tolerations, f"{plan.CLASS_LABEL}={name}:NoSchedule"]}
        return Capacity(run_id, tuple(Placement(p, z, tuple(sorted(ns))) for (p, z), ns in sorted(groups.items())),
                        spec.gpus_per_node, acc.gke_label, spec.spot, timeline.to_json(), extra,
                        accelerator=acc.name, namespace=spec.target.namespace)

    # ---- the rest of the contract ---------------------------------------------------------------------------
    def replace(self, spec: ProvisioningSpec, run_id: str, capacity: Capacity, lost: Sequence[str], *,
                extra: int, zone_hint: str, on_demand: bool, attempt: int, lost_uids: Sequence[str]) -> Capacity:
        """The lost nodes again from the same class (GKE walks its rules again). Raises: as :meth:`acquire`."""
        keep = {n: (p.pool, p.zone) for p in capacity.placements for n in p.nodes if n not in lost}
        return self.acquire(spec, run_id, GangRequest(step=f"recovery-{attempt}", extra=extra, keep=keep,
                                                      exclude=list(lost_uids)))

    def release(self, spec: ProvisioningSpec, run_id: str) -> Released:
        """Delete the run's placeholders and the ComputeClasses the run created (a named class is the admin's)."""
        out = Released()
        selector = f"{LABEL_RUN_ID}={label_safe(run_id)}"
        try:
            classes = api_cc.list_classes(self.api, selector)
            if classes or spec.target.compute_class:  # the run used this backend: its placeholders go first
                out.objects += [f"pod {spec.target.namespace}/{n}"
                                for n in balloons.delete_balloons(self.api, spec.target.namespace, run_id)]
            for c in classes:
                name = str(c["metadata"]["name"])
                if api_cc.delete_class(self.api, name):
                    out.objects.append(f"computeclass {name}")
        except ApiException as exc:
            out.errors.append(f"delete computeclasses: {exc.status} {exc.reason}")
        return out


@dataclasses.dataclass(frozen=True)
class Pod:
    """What a reconcile pass reads of a placeholder pod."""

    name: str
    node: str  # bound to ("" while pending)
    resource_version: str
    live: bool  # neither being deleted nor finished

    @classmethod
    def of(cls, obj: dict[str, Any]) -> Pod:
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        return cls(str(meta.get("name", "")), str((obj.get("spec") or {}).get("nodeName") or ""),
                   str(meta.get("resourceVersion", "")),
                   not meta.get("deletionTimestamp") and status.get("phase") not in ("Succeeded", "Failed"))


def _delete_unchanged(api: client.ApiClient, namespace: str, pods: Sequence[Pod]) -> list[bool]:
    """Delete each pod at the resourceVersion it was listed at (concurrently); per pod, False when it changed since
    (409: bound, usually) and was kept. Raises: ApiException but 404 and 409."""
    core = client.CoreV1Api(api)

    def one(pod: Pod) -> bool:
        opts = client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(
            resource_version=pod.resource_version))
        try:
            _ = core.delete_namespaced_pod(pod.name, namespace, body=opts, _preload_content=False).data
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
            return bool(exc.status == 404)
        return True

    return fanout.run_all([functools.partial(one, p) for p in pods])


def _tolerations(spec: ProvisioningSpec, name: str) -> list[dict[str, str]]:
    """The GPU taint, the target's taints and the class's taint (GKE taints the nodes it creates for a class and
    adds the toleration to pods that select it; kfp-gpu's pods carry it themselves)."""
    return [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
            *[parse_toleration(t) for t in spec.target.tolerations],
            parse_toleration(f"{plan.CLASS_LABEL}={name}:NoSchedule")]


_crd_missing = CrdMissing.builder(f"{plan.CRD_NAME} ({plan.GROUP}/{plan.VERSION})",
                                  "use a GKE cluster of 1.30.3-gke.1451000 or later (ComputeClasses), or "
                                  "target.provisioner='provisioning-request' or 'node-pool'")
