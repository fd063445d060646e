"""The ``provisioning-request`` provisioner: the cluster's own autoscaler provisions the gang.

acquire creates a PodTemplate (the gang's pod shape: GPUs, accelerator, spot/on-demand, zone, pools, the
target's tolerations and the run's own toleration) and one ``autoscaling.x-k8s.io/v1`` ProvisioningRequest
for the whole gang (class ``best-effort-atomic-scale-up.autoscaling.x-k8s.io``, or GKE's
``queued-provisioning.gke.io`` for ``capacity="flex-start"`` with ``maxRunDurationSeconds``), then waits on the
request's conditions (:mod:`kfp_gpu.plan.provreq`):

* Provisioned=True: the booked nodes are waited for (Node watch) and claimed like any gang; a booking on
  existing nodes that then go away (:func:`kfp_gpu.plan.provreq.booking_lost`) is spent: the gang is requested
  again in the same zone, at most ``MAX_REBOOKS`` times;
* Failed=True: the zone the request was pinned to is blocked and a new request is made for the next
  candidate zone; when none is left, ``CapacityUnavailable`` with the history;
* Provisioned=False (``CapacityIsNotFound``): the autoscaler retries by itself; with another candidate zone
  left the request is given up after its share of the deadline and the next zone is asked;
* the deadline: the request is deleted (its booking released) and ``ProvisioningTimeout`` raised.

The job's pods consume the request (``autoscaling.x-k8s.io/consume-provisioning-request`` + class annotation).
before_job re-reads the request: BookingExpired (the 10-minute booking lapsed before the pods came) makes a
fresh request. revoked reports the nodes of a request with CapacityRevoked=True, which the train step treats
as preempted. release deletes the run's requests and PodTemplates; the autoscaler scales the nodes down.
Nothing here resizes a pool.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu import accelerators, rehearsal_seam
from kfp_gpu.cluster import apierrors, ledger, node_labels
from kfp_gpu.cluster import provreq as api_req
from kfp_gpu.cluster.capacity import GPU_TAINT_KEY, Capacity, Placement, parse_toleration
from kfp_gpu.cluster.nodes import (
    ZONE_LABEL,
    Node,
    NodeView,
    NodeWatch,
    claim_all,
    list_nodes,
    run_toleration,
    unclaim,
)
from kfp_gpu.errors import CapacityUnavailable, CrdMissing, KfpGpuError, ProvisioningTimeout
from kfp_gpu.ownership import LABEL_RUN_ID, Owner, label_safe
from kfp_gpu.plan import provreq as plan
from kfp_gpu.plan.placement import matching_pools
from kfp_gpu.providers.base import CapacityProvider
from kfp_gpu.provisioners.base import GangRequest, Released
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.timeline import Timeline

NAME = "provisioning-request"
QUEUED_TOLERATION = "cloud.google.com/gke-queued=true:NoSchedule"  # GKE taints DWS (queued provisioning) nodes
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
NOT_FOUND_GRACE_S = 10.0  # "no capacity now" for this long, with another zone left: ask the next zone
log = logging.getLogger(__name__)


class ProvisioningRequestProvisioner:
    """The provisioning-request backend (contract: :mod:`kfp_gpu.provisioners.base`)."""

    name = NAME
    holds_placeholders = False  # the warm pool's generic balloons are what the autoscaler scales up for
    gang_forms_at_admission = False  # the request provisions the gang before the job
    supports_check_capacity = True  # its own autoscaler serves ProvisioningRequests
    capacity_via_autoscaler_groups = True  # the request names the autoscaler's node groups
    launches_without_pools = False  # the autoscaler's node groups bound the gang
    all_or_nothing = True  # atomic scale-up and queued provisioning grant the whole request or nothing
    releases_one_node = False  # a request's spec is immutable: no call frees one of its nodes (cordon + replace)

    def __init__(self, api: client.ApiClient, provider: CapacityProvider | None = None) -> None:
        self.api, self.provider = api, provider

    def _pools(self, spec: ProvisioningSpec, klass: str, zone: str) -> tuple[str, ...]:
        """The pools the request names: ``target.pools``, or for GKE's DWS class the matching pools with queued
        provisioning in ``zone`` (GKE serves a queued request only for the pool its PodTemplate selects)."""
        if spec.target.pools or klass != plan.QUEUED or self.provider is None:
            return spec.target.pools
        return tuple(st.ref.pool for st in matching_pools(spec, self.provider.pools(spec.target.region, sizes=False))
                     if st.queued_provisioning and (not zone or st.ref.zone == zone))

    # ---- acquire -----------------------------------------------------------------------------------------
    def acquire(self, spec: ProvisioningSpec, run_id: str, request: GangRequest) -> Capacity:
        """Raises: CapacityUnavailable (every zone failed), ProvisioningTimeout, PermissionDenied (RBAC),
        CrdMissing (the cluster does not serve ProvisioningRequests)."""
        if not request.wait:  # the warm pool's early submit: its balloon pods already make the autoscaler scale
            return self._capacity(spec, run_id, {}, Timeline(run_id), [])  # up; a booking would hold nodes from them
        ns = spec.target.namespace
        count = request.extra if request.extra is not None else (request.nodes or spec.nodes)
        klass = plan.request_class(spec.capacity.value)
        owner = Owner.for_step(run_id, request.step, request.lease_ttl_s or spec.lease_ttl_s)
        led = ledger.read(self.api, ns, run_id, request.step)
        started = float(led.get("started", time.time()))
        deadline = started + spec.scale_up_deadline_s
        zones = list(spec.zones) or [""]
        attempt, rebooks = int(led.get("attempt", 0)), int(led.get("rebooks", 0))
        history: list[dict[str, Any]] = list(led.get("history", []))
        timeline = Timeline.from_json(led["timeline"]) if led.get("timeline") else Timeline(run_id)
        keep = dict(request.keep or {})
        while attempt < len(zones):
            zone = zones[attempt]
            name = plan.request_name(run_id, request.step, attempt, rebooks)
            pools = self._pools(spec, klass, zone)
            save = functools.partial(self._save, ns, owner, spec, timeline, started=started, attempt=attempt,
                                     rebooks=rebooks, history=history, request=name, zone=zone, **{"class": klass})
            save()
            made_at = time.time()
            apierrors.call(functools.partial(
                api_req.create, self.api, ns, name, pod_spec=pod_spec(spec, run_id, zone, pools), count=count,
                klass=klass, parameters=plan.parameters(klass, max_run_duration_s=spec.max_run_duration_s),
                labels=owner.labels()), f"create ProvisioningRequest {ns}/{name}", not_found=_crd_missing(ns))
            last = attempt == len(zones) - 1
            obs = self._wait(ns, name, deadline, None if last else NOT_FOUND_GRACE_S)
            if obs.state is plan.ReqState.PROVISIONED:
                nodes, lost = self._claim_nodes(spec, run_id, owner, zone, pools, count, deadline, request, timeline,
                                                made_at, obs, keep)
                if len(nodes) >= count:
                    cap = self._capacity(spec, run_id, {**keep, **nodes}, timeline, [name])
                    save(done=True, capacity=cap.to_json())
                    return cap
                spent = plan.booking_lost(obs, lost_nodes=lost, have=len(nodes), count=count)
                if spent and rebooks < plan.MAX_REBOOKS and time.time() < deadline:
                    log.warning("ProvisioningRequest %s/%s: booked on existing nodes, %d of them went away with %d/%d "
                                "claimed: requesting the gang again", ns, name, lost, len(nodes), count)
                    api_req.delete(self.api, ns, name)
                    history.append(plan.tried(zone or spec.target.region, name, plan.Observed(
                        obs.state, "BookedNodesGone", f"{lost} booked node(s) deleted"), time.time()))
                    timeline.event("provisioning-request-rebooked", time.time(), request=name, lost=lost)
                    rebooks += 1  # the whole gang again: its claimed nodes fit the new request and are booked anew
                    continue
                obs = (plan.Observed(plan.ReqState.FAILED, "BookedNodesGone",  # the zone's next requests: spent too
                                     f"{lost} booked node(s) went away after {rebooks} fresh request(s)") if spent
                       else plan.Observed(plan.ReqState.PROVISIONED, "NodesNotReady",
                                          f"{len(nodes)}/{count} booked nodes Ready and claimable"))
            err = plan.error_for(obs, request=name, klass=klass, zone=zone)
            api_req.delete(self.api, ns, name)  # give the booking (or the queue slot) back
            if obs.state not in (plan.ReqState.FAILED, plan.ReqState.WAITING):  # nobody answered in time
                raise ProvisioningTimeout(f"{err.message}; gave up at scale_up_deadline_s={spec.scale_up_deadline_s:g}",
                                          remediation=err.remediation, request=name, history=history,
                                          timeline=timeline.to_json())
            history.append(plan.tried(zone or spec.target.region, name, obs, time.time()))
            if request.on_zone_blocked is not None and zone:
                request.on_zone_blocked(zone)
            attempt, rebooks = attempt + 1, 0
            if time.time() >= deadline:
                break
        raise CapacityUnavailable(
            f"no candidate zone could provision {count} x {spec.gpus_per_node} {spec.accelerator} nodes through "
            f"ProvisioningRequests ({'; '.join(h['zone'] + ': ' + (h['reason'] or h['state']) for h in history)})",
            remediation="add zones, raise the autoscaled pools' max node counts, or retry later",
            failover_history=history)

    def _save(self, ns: str, owner: Owner, spec: ProvisioningSpec, timeline: Timeline, **data: Any) -> None:
        """The step's ledger: the spec (the janitor tears a dead run down with it), the timeline, and ``data``."""
        ledger.write(self.api, ns, owner, {**data, "spec": spec.to_json(), "timeline": timeline.to_json()})

    def _wait(self, ns: str, name: str, deadline: float, not_found_grace_s: float | None) -> plan.Observed:
        """Block until the request is Provisioned or terminal, or the deadline. With ``not_found_grace_s`` (another
        zone is left), a request the autoscaler keeps answering "no capacity" (Provisioned=False) for that long
        is given up: the autoscaler retries it only after its back-off (1 minute at first), the next zone now.

        Raises: PermissionDenied when the watch is refused."""
        terminal = (plan.ReqState.PROVISIONED, plan.ReqState.FAILED, plan.ReqState.BOOKING_EXPIRED,
                    plan.ReqState.REVOKED)
        waiting_since: list[float] = []
        w = api_req.RequestWatch(self.api, ns, name).start()
        try:
            def done(obj: dict[str, Any] | None) -> bool:
                st = plan.read_state((obj or {}).get("status", {}).get("conditions"))
                if st.state is not plan.ReqState.WAITING:
                    waiting_since.clear()
                    return st.state in terminal
                if not waiting_since:
                    waiting_since.append(time.time())
                return not_found_grace_s is not None and time.time() - waiting_since[0] >= not_found_grace_s

            obj = w.wait(done, deadline)
            if w.error is not None:
                raise apierrors.to_error(w.error, f"watch of ProvisioningRequest {ns}/{name}",
                                         not_found=_crd_missing(ns))
        finally:
            w.stop()
        return plan.read_state((obj or {}).get("status", {}).get("conditions"))

    def _claim_nodes(self, spec: ProvisioningSpec, run_id: str, owner: Owner, zone: str, pools: Sequence[str],
                     count: int, deadline: float, request: GangRequest, timeline: Timeline, made_at: float,
                     obs: plan.Observed, keep: dict[str, tuple[str, str]]
                     ) -> tuple[dict[str, tuple[str, str]], int]:
        """Wait (Node watch) for ``count`` Ready, unclaimed nodes that fit the request and claim them. Returns them
        and how many fitting nodes went away (deleted, or tainted for deletion) meanwhile; returns early once that
        spends the booking (:func:`kfp_gpu.plan.provreq.booking_lost`) and nothing has changed for
        :data:`~kfp_gpu.plan.provreq.BOOKING_LOST_GRACE_S`."""
        selector = ",".join([*(f"{k}={v}" for k, v in gang_labels(spec, pools).items()),
                             *(f"{r['key']} in ({','.join(r['values'])})" for r in gang_requirements(spec))])
        nodes, rv = list_nodes(self.api, selector)
        seen: dict[str, Node] = {}
        cond = threading.Condition()

        gone: set[str] = set()  # fitting nodes deleted or tainted for deletion while the gang was short
        changed = [time.time()]

        def on_event(kind: str, node: Node, at: float) -> None:
            if kind == "ERROR":
                return
            with cond:
                name = str(node["metadata"]["name"])
                if kind == "DELETED":
                    if seen.pop(name, None) is not None and name not in mine:
                        gone.add(name)
                else:
                    if name not in seen:
                        changed[0] = at
                    seen[name] = node
                cond.notify_all()

        for n in nodes:
            on_event("SYNC", n, time.time())
        watch = NodeWatch(self.api, selector, rv, on_event, relist=lambda: list_nodes(self.api, selector)).start()
        mine: dict[str, tuple[str, str]] = {}
        excluded = set(request.exclude)
        try:
            while len(mine) < count and time.time() < deadline:
                with cond:
                    views = [NodeView.of(n) for n in seen.values()]
                near = [v for v in views if v.gpus >= spec.gpus_per_node and v.uid not in excluded
                        and v.name not in mine and v.name not in keep and (not zone or v.zone == zone)
                        and (not pools or v.pool in pools)]  # what the request's pods fit, as the autoscaler books
                fits = [v for v in near if v.ready and not v.going and not v.deleting
                        and v.run_id in ("", label_safe(run_id))]
                with cond:
                    gone |= {v.name for v in near if v.going or v.deleting}
                    if plan.booking_lost(obs, lost_nodes=len(gone), have=len(mine) + len(fits), count=count) \
                            and time.time() - changed[0] >= plan.BOOKING_LOST_GRACE_S:
                        break
                batch = fits[: count - len(mine)]
                with cond:
                    bodies = [seen[v.name] for v in batch]
                won = claim_all(self.api, bodies, run_id, owner.lease_expires, namespace=spec.target.namespace)
                at = time.time()
                for v, ok in zip(batch, won, strict=True):
                    if not ok:  # another run claimed it first
                        continue
                    mine[v.name] = (v.pool, v.zone)
                    changed[0] = at
                    timeline.node(v.name, pool=v.pool, zone=v.zone, gpus=spec.gpus_per_node,
                                  spot=spec.spot).claimed_ready(made_at, at)
                if len(mine) < count:
                    with cond:
                        cond.wait(timeout=0.5)
        finally:
            watch.stop()
        return mine, len(gone)

    def _capacity(self, spec: ProvisioningSpec, run_id: str, nodes: dict[str, tuple[str, str]], timeline: Timeline,
                  requests: list[str]) -> Capacity:
        groups: dict[tuple[str, str], list[str]] = {}
        for name, pz in nodes.items():
            groups.setdefault(pz, []).append(name)
        extra: dict[str, Any] = {"provisioner": NAME, "requests": requests,
                                 "class": plan.request_class(spec.capacity.value)}
        tolerate = tolerations(spec)
        if tolerate:
            extra["tolerations"] = tolerate
        return Capacity(run_id, tuple(Placement(p, z, tuple(sorted(ns))) for (p, z), ns in sorted(groups.items())),
                        spec.gpus_per_node, accelerators.get(spec.accelerator).gke_label, spec.spot,
                        timeline.to_json(), extra, scheme=node_labels.for_target(spec.target.kind.value).name,
                        accelerator=spec.accelerator, namespace=spec.target.namespace)

    # ---- the rest of the contract ---------------------------------------------------------------------------
    def replace(self, spec: ProvisioningSpec, run_id: str, capacity: Capacity, lost: Sequence[str], *,
                extra: int, zone_hint: str, on_demand: bool, attempt: int, lost_uids: Sequence[str]) -> Capacity:
        """A new request for the lost nodes (``recovery-N``); on_demand switches spot to on-demand."""
        if on_demand and spec.spot:
            spec = spec.replace(capacity="on-demand", recovery=dataclasses.replace(spec.recovery, on_demand_after=0))
        keep = {n: (p.pool, p.zone) for p in capacity.placements for n in p.nodes if n not in lost}
        new = self.acquire(spec, run_id, GangRequest(step=f"recovery-{attempt}", extra=extra, keep=keep,
                                                     exclude=lost_uids))
        return dataclasses.replace(new, extra={**new.extra, "requests": [*capacity.extra.get("requests", []),
                                                                          *new.extra.get("requests", [])]})

    def before_job(self, spec: ProvisioningSpec, run_id: str, capacity: Capacity) -> Capacity:
        """Before the first job on the newest request: when its booking lapsed (BookingExpired) or the request is
        gone, request the gang again. Once a job has run on a request, BookingExpired is routine (GKE and
        cluster-autoscaler set it 10 minutes after Provisioned even while the pods run) and the nodes' own
        losses are what recovery follows."""
        names = list(capacity.extra.get("requests", []))
        if not names or capacity.extra.get("used") == names[-1]:
            return capacity
        obj = api_req.get(self.api, spec.target.namespace, names[-1])
        obs = plan.read_state((obj or {}).get("status", {}).get("conditions"))
        if obj is not None and obs.state is not plan.ReqState.BOOKING_EXPIRED:
            return dataclasses.replace(capacity, extra={**capacity.extra, "used": names[-1]})
        log.warning("ProvisioningRequest %s: %s before the job's pods came; requesting the capacity again",
                    names[-1], "deleted" if obj is None else f"booking expired ({obs.reason})")
        n = int(capacity.extra.get("rebooked", 0)) + 1
        old = list(capacity.nodes)
        api_req.delete(self.api, spec.target.namespace, names[-1])  # its booking is over; the autoscaler frees it
        new = self.acquire(spec, run_id, GangRequest(step=f"rebook-{n}", nodes=spec.nodes))
        for node in old:
            if node not in new.nodes:
                unclaim(self.api, node)
        requests = [*names, *new.extra.get("requests", [])]
        return dataclasses.replace(new, extra={**new.extra, "rebooked": n, "requests": requests,
                                               "used": requests[-1]})

    def pod_annotations(self, capacity: Capacity) -> dict[str, str]:
        names = list(capacity.extra.get("requests", []))
        if not names:
            return {}
        return {plan.CONSUME_ANNOTATION: names[-1],
                plan.CLASS_ANNOTATION: str(capacity.extra.get("class", plan.ATOMIC))}

    def revoked(self, spec: ProvisioningSpec, capacity: Capacity) -> list[str]:
        """Every node of the capacity when one of its requests reports CapacityRevoked=True."""
        for name in capacity.extra.get("requests", []):
            obj = api_req.get(self.api, spec.target.namespace, name)
            if plan.read_state((obj or {}).get("status", {}).get("conditions")).state is plan.ReqState.REVOKED:
                return list(capacity.nodes)
        return []

    def release(self, spec: ProvisioningSpec, run_id: str) -> Released:
        out = Released()
        try:
            gone = api_req.delete_labelled(self.api, spec.target.namespace, f"{LABEL_RUN_ID}={label_safe(run_id)}")
            out.objects += [f"provisioningrequest {g}" for g in gone]
        except ApiException as exc:
            out.errors.append(f"delete provisioning requests: {exc.reason}")
        return out


# ---- the gang's pod shape --------------------------------------------------------------------------------

def gang_labels(spec: ProvisioningSpec, pools: Sequence[str] = ()) -> dict[str, str]:
    """Labels every node of the gang must carry (the PodTemplate's nodeSelector, the Node watch's selector), in the
    label keys of the target's nodes (:func:`kfp_gpu.cluster.node_labels.for_target`)."""
    sch = node_labels.for_target(spec.target.kind.value)
    out = sch.accelerator_selector(spec.accelerator)
    if spec.spot:
        out[sch.capacity_type] = sch.spot_value
    out.update(rehearsal_seam.node_selector(spec.target))
    if len(pools) == 1:
        out[sch.pool] = pools[0]
    return out


def gang_requirements(spec: ProvisioningSpec) -> list[dict[str, Any]]:
    """Set-based requirements of every gang node: the accelerator's instance types where no label names it."""
    return node_labels.for_target(spec.target.kind.value).accelerator_requirements(spec.accelerator)


def pod_spec(spec: ProvisioningSpec, run_id: str, zone: str = "", pools: Sequence[str] | None = None) -> dict[str, Any]:
    """One gang member: whole-node GPUs on the right accelerator and capacity type, in ``pools`` (default
    ``target.pools``), tolerating the GPU taint, the target's taints and the run's own claim taint (so booked
    nodes stay usable once claimed)."""
    pools = tuple(spec.target.pools if pools is None else pools)
    sch = node_labels.for_target(spec.target.kind.value)
    terms: list[dict[str, Any]] = gang_requirements(spec)
    if zone:
        terms.append({"key": ZONE_LABEL, "operator": "In", "values": [zone]})
    if len(pools) > 1:
        terms.append(sch.pool_requirement(pools))
    if not spec.spot:
        terms.append({"key": sch.capacity_type, "operator": "NotIn", "values": [sch.spot_value]})
    gpus = str(spec.gpus_per_node)
    body: dict[str, Any] = {
        "containers": [{"name": "gpu", "image": PAUSE_IMAGE,
                        "resources": {"requests": {"nvidia.com/gpu": gpus}, "limits": {"nvidia.com/gpu": gpus}}}],
        "nodeSelector": gang_labels(spec, pools),
        "tolerations": [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
                        *[parse_toleration(t) for t in tolerations(spec)],
                        run_toleration(run_id, spec.target.namespace)],
        "restartPolicy": "Never",
    }
    if terms:
        body["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": terms}]}}}
    return body


def tolerations(spec: ProvisioningSpec) -> list[str]:
    """The target's taints to tolerate, plus GKE's queued-provisioning taint for DWS capacity."""
    extra = [QUEUED_TOLERATION] if plan.request_class(spec.capacity.value) == plan.QUEUED else []
    return [*spec.target.tolerations, *[t for t in extra if t not in spec.target.tolerations]]


def _crd_missing(namespace: str) -> Callable[[], KfpGpuError]:
    return CrdMissing.builder(f"{plan.CRD_NAME} (namespace {namespace})",
                              "use target.provisioner='node-pool', or enable ProvisioningRequests "
                              "(GKE >= 1.28 with autoscaled pools; cluster-autoscaler --enable-provisioning-requests)")
