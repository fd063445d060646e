"""GKE's queued provisioning (Dynamic Workload Scheduler, class ``queued-provisioning.gke.io``) in the stand-in's world.

A ProvisioningRequest for a queued pool of this stand-in is Accepted, waits in the queue, then gets all its nodes at
once through the pool's MIG (same boot latency, device-plugin delay and labels as every sim node), is Provisioned when
they all run with GPUs, is BookingExpired ``booking_s`` later (unconsumed nodes go away), and is CapacityRevoked at
maxRunDurationSeconds (every node goes away). Every rule and its source: docs/sim.md, section 12.

This module is the world side only: :class:`DwsWorld` runs on the world's :class:`~kfp_gpu_rehearsal.sim.clock.Timeline` under
the state lock, so tests drive it on virtual time. Kubernetes I/O (watching requests and pods, reading PodTemplates,
writing status) lives in :mod:`kfp_gpu_rehearsal.sim.dws_controller`; it calls :meth:`DwsWorld.submit`, :meth:`withdraw` and
:meth:`set_busy`, and receives status through the ``publish`` callback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kfp_gpu import rehearsal_seam
from kfp_gpu_rehearsal.sim.clock import compress
from kfp_gpu_rehearsal.sim.mig import NOTICE, RUNNING, Action, PoolRuntime
from kfp_gpu_rehearsal.sim.pool_views import igm_name
from kfp_gpu_rehearsal.sim.state import SimState

log = logging.getLogger(__name__)

CLASS = "queued-provisioning.gke.io"
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"
POOL_LABEL = "cloud.google.com/gke-nodepool"
SIM_CLUSTER_LABEL = rehearsal_seam.LOCAL_CLUSTER_LABEL
QUEUED_TAINT = {"key": "cloud.google.com/gke-queued", "value": "true", "effect": "NoSchedule"}
FLEX_START_LABEL = "cloud.google.com/gke-flex-start"
REQUEST_LABEL = "autoscaling.gke.io/provisioning-request"  # GKE: the node's resize request, i.e. its request
MAX_RUN_KEY = "maxRunDurationSeconds"
MAX_RUN_S = 7 * 24 * 3600  # default and maximum (GKE docs)
POLL_S = 5.0  # real-world seconds between looks at booting nodes

# Reasons and messages as GKE's cluster-autoscaler writes them (pkg/provisioningrequests/provreqstate/state.go)
NOT_ACCEPTED = ("NotAccepted", "Provisioning Request wasn't accepted.")
ACCEPTED = ("SuccessfullyQueued", "Provisioning Request was successfully queued.")
PROVISIONED = ("Provisioned", "Provisioning Request was successfully provisioned.")
BOOKING_EXPIRED = ("BookingExpired", "Capacity booking for the Provisioning Request has expired and the nodes are "
                   "now candidates for scale down when underutilized.")
REVOKED = ("CapacityRevoked", "Capacity provisioned for the Provisioning Request was reclaimed and is no longer "
           "available in the cluster.")
WAIT_EXCEEDED = ("WaitTimeExceeded", "Provisioning Request could not provision queued instances in the allocated time.")

# Lifecycle phases of one request in the world
PENDING, QUEUED, PROVISIONING, PROVISIONED_, RELEASED, REVOKED_, FAILED, DELETED = (
    "pending", "queued", "provisioning", "provisioned", "released", "revoked", "failed", "deleted")

Key = tuple[str, str]  # (namespace, name)
Publish = Callable[[Key, dict[str, Any]], None]  # (request, status body) -> write it


@dataclass(frozen=True)
class Demand:
    """What one request asks of one queued pool: ``count`` nodes for at most ``max_run_s`` real-world seconds."""

    pool: str
    count: int
    max_run_s: float = float(MAX_RUN_S)


@dataclass(frozen=True)
class Refusal:
    """The request is this stand-in's but GKE would fail it at once (reason, message)."""

    reason: str
    message: str
    pool: str = ""


def rfc3339(dt: datetime | None = None) -> str:
    return (dt or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conds: list[dict[str, Any]], ctype: str, status: str, reason_msg: tuple[str, str],
                  generation: int, now: str) -> bool:
    """Set one condition as GKE's autoscaler does (in place, appended when new; lastTransitionTime and
    observedGeneration move when status, reason or message change). Returns whether anything changed."""
    reason, message = reason_msg
    for c in conds:
        if c["type"] == ctype:
            if (c["status"], c["reason"], c["message"]) == (status, reason, message):
                return False
            c.update(status=status, reason=reason, message=message, lastTransitionTime=now,
                     observedGeneration=generation)
            return True
    conds.append({"type": ctype, "status": status, "reason": reason, "message": message,
                  "lastTransitionTime": now, "observedGeneration": generation})
    return True


def is_true(conds: list[dict[str, Any]], ctype: str) -> bool:
    return any(c.get("type") == ctype and c.get("status") == "True" for c in conds)


@dataclass
class Tracked:
    key: Key
    uid: str
    generation: int
    demand: Demand | Refusal
    phase: str = PENDING
    conditions: list[dict[str, Any]] = field(default_factory=list)
    details: dict[str, str] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    busy: set[str] = field(default_factory=set)
    provisioned_at: float = 0.0


class DwsWorld:
    """Queued provisioning for the queued pools of ``state``'s scenario (lock = ``state.lock``).

    ``publish(key, status)`` is called (outside the lock, in order per request) with the whole
    ``{"conditions": [...], "provisioningClassDetails": {...}}`` after every change.
    """

    def __init__(self, state: SimState, publish: Publish) -> None:
        self.state, self.publish = state, publish
        self.spec = state.scenario.dws
        self.requests: dict[Key, Tracked] = {}
        self.node_owner: dict[str, Key] = {}
        self._rng = self.spec.queue.sampler()

    # ---- inputs (any thread) --------------------------------------------------------------------
    def submit(self, key: Key, uid: str, generation: int, demand: Demand | Refusal) -> bool:
        """A new request of this stand-in. Returns False when it is already known (same uid)."""
        with self.state.lock:
            old = self.requests.get(key)
            if old is not None and old.uid == uid:
                return False
            t = Tracked(key, uid, generation, demand)
            self.requests[key] = t
        self.state.world.later(compress(self.spec.accept_s), lambda: self._admit(t))
        return True

    def withdraw(self, key: Key, uid: str = "") -> None:
        """The request was deleted: a queued one leaves the queue; provisioned nodes lose their booking
        (idle ones go at once, busy ones when their consuming pods are gone); booting ones are cancelled."""
        with self.state.lock:
            t = self.requests.get(key)
            if t is None or (uid and t.uid != uid):
                return
            prior, t.phase = t.phase, DELETED
            actions = self._drop(t, t.nodes) if prior == PROVISIONING else self._release_idle(t)
        self.state.world.dispatch(actions)

    def set_busy(self, key: Key, nodes: set[str]) -> None:
        """The request's nodes that run a non-terminal pod consuming it (the controller's pod view)."""
        with self.state.lock:
            t = self.requests.get(key)
            if t is None:
                return
            t.busy = set(nodes)
            actions = self._release_idle(t) if t.phase in (RELEASED, DELETED) else []
        self.state.world.dispatch(actions)

    def revoke(self, key: Key) -> list[str]:
        """GKE reclaims a provisioned request's capacity: BookingExpired (if not yet) and CapacityRevoked are
        set, every node gets the reclaim notice and is deleted after it. Returns the nodes.

        Raises: KeyError (unknown request), ValueError (not provisioned).
        """
        with self.state.lock:
            t = self.requests[key]
            if t.phase not in (PROVISIONED_, RELEASED):
                raise ValueError(f"provisioning request {key[0]}/{key[1]} is {t.phase}, not provisioned")
            actions = self._revoke(t, notice=True)
            nodes = list(t.nodes)
        self.state.world.dispatch(actions)
        return nodes

    def revoke_pool(self, pool: str) -> list[Key]:
        """Revoke every provisioned request of ``pool`` (scenario ``provisioning_revocations``)."""
        with self.state.lock:
            keys = [k for k, t in self.requests.items() if t.phase in (PROVISIONED_, RELEASED)
                    and isinstance(t.demand, Demand) and t.demand.pool == pool]
        for k in keys:
            self.revoke(k)
        return keys

    def node_extras(self, pool: str, node: str) -> tuple[dict[str, str], list[dict[str, str]]]:
        """Labels and taints GKE puts on a node of a queued pool (none for other pools)."""
        rt = self.state.pools.get(pool)  # a pool node auto-provisioning created is not in the scenario
        spec = rt.spec if rt is not None else None
        if spec is None or not spec.queued_provisioning:
            return {}, []
        labels = {FLEX_START_LABEL: "true"}
        with self.state.lock:
            key = self.node_owner.get(node)
        if key is not None:
            labels[REQUEST_LABEL] = resize_request_name(key)[:63].rstrip("-")
        return labels, [dict(QUEUED_TAINT)]

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self.state.lock:
            return {f"{k[0]}/{k[1]}": {"phase": t.phase, "nodes": list(t.nodes), "busy": sorted(t.busy),
                                       "conditions": [dict(c) for c in t.conditions]}
                    for k, t in self.requests.items()}

    # ---- the lifecycle (timeline callbacks, lock held) --------------------------------------------
    def _now(self) -> str:
        return rfc3339()

    def _status(self, t: Tracked) -> Action:
        body = {"conditions": [dict(c) for c in t.conditions], "provisioningClassDetails": dict(t.details)}
        key = t.key
        return (f"provreq:{key[0]}/{key[1]}", lambda: self.publish(key, body))

    def _set(self, t: Tracked, ctype: str, status: str, rm: tuple[str, str]) -> bool:
        return set_condition(t.conditions, ctype, status, rm, t.generation, self._now())

    def _fail(self, t: Tracked, rm: tuple[str, str]) -> list[Action]:
        t.phase = FAILED
        self._set(t, "Failed", "True", rm)
        return [self._status(t)]

    def _admit(self, t: Tracked) -> list[Action]:
        if self.requests.get(t.key) is not t or t.phase != PENDING:
            return []
        if isinstance(t.demand, Refusal):
            self._set(t, "Accepted", "False", NOT_ACCEPTED)
            return self._fail(t, (t.demand.reason, t.demand.message))
        p = self.state.pools[t.demand.pool]
        t.details = {"NodePoolName": p.spec.name, "NodeGroupName": igm_name(self.state.scenario.cluster, p),
                     "ResizeRequestName": resize_request_name(t.key), "AcceleratorType": p.spec.accelerator,
                     "SelectedZone": p.spec.zone, "ProvisioningMode": "resize_request"}
        quota = self._quota(p, t.demand.count)
        if quota is not None:
            self._set(t, "Accepted", "False", NOT_ACCEPTED)
            return self._fail(t, quota)
        t.phase = QUEUED
        self._set(t, "Accepted", "True", ACCEPTED)
        wait = self.spec.queue.sample(self._rng)
        self.state.world.later(compress(wait), lambda: self._try(t))
        self.state.world.later(compress(self.spec.queue_timeout_s - self.spec.accept_s), lambda: self._timeout(t))
        return [self._status(t)]

    def _quota(self, p: PoolRuntime, count: int) -> tuple[str, str] | None:
        """GPU and vCPU quota for all ``count`` VMs at once (the request is atomic), as GCE checks each VM."""
        from kfp_gpu_rehearsal.sim import vmquota

        err = vmquota.creation_error(self.state, p.spec, count)
        return None if err is None else ("QuotaExceeded", str(err["message"]))

    def _try(self, t: Tracked) -> list[Action]:
        """The queue wait is over: take all nodes at once, or wait on (stockout, full pool) and look again."""
        if self.requests.get(t.key) is not t or t.phase != QUEUED or not isinstance(t.demand, Demand):
            return []
        p = self.state.pools[t.demand.pool]
        full = len(p.instances) + t.demand.count > p.spec.max_nodes
        if full or self.state.stockout(p.spec.zone, p.spec.accelerator, t.demand.count) is not None:
            self.state.world.later(compress(self.spec.retry_s), lambda: self._try(t))
            return []
        quota = self._quota(p, t.demand.count)
        if quota is not None:
            return self._fail(t, quota)
        before = set(p.instances)
        self.state.world.add(p, t.demand.count, self.state.timeline.now(), 0.0)
        t.nodes = [n for n in p.instances if n not in before]
        for n in t.nodes:
            self.node_owner[n] = t.key
        t.phase = PROVISIONING
        self.state.world.later(compress(POLL_S), lambda: self._check_ready(t))
        return []

    def _check_ready(self, t: Tracked) -> list[Action]:
        if self.requests.get(t.key) is not t or t.phase != PROVISIONING:
            return []
        p = self.state.pools[t.demand.pool] if isinstance(t.demand, Demand) else None
        running = p is not None and all(
            (i := p.instances.get(n)) is not None and i.state == RUNNING and i.node for n in t.nodes)
        if running:  # the last one registered at most POLL_S ago; its GPUs follow the device-plugin delay
            self.state.world.later(self.state.world.plugin_s, lambda: self._provisioned(t))
        else:
            self.state.world.later(compress(POLL_S), lambda: self._check_ready(t))
        return []

    def _provisioned(self, t: Tracked) -> list[Action]:
        if self.requests.get(t.key) is not t or t.phase != PROVISIONING or not isinstance(t.demand, Demand):
            return []
        t.phase, t.provisioned_at = PROVISIONED_, self.state.timeline.now()
        self._set(t, "Provisioned", "True", PROVISIONED)
        self.state.world.later(compress(self.spec.booking_s), lambda: self._booking_end(t))
        self.state.world.later(compress(t.demand.max_run_s), lambda: self._max_run(t))
        return [self._status(t)]

    def _booking_end(self, t: Tracked) -> list[Action]:
        if self.requests.get(t.key) is not t or t.phase not in (PROVISIONED_, DELETED):
            return []
        if t.phase == PROVISIONED_:
            t.phase = RELEASED
            self._set(t, "BookingExpired", "True", BOOKING_EXPIRED)
            return [self._status(t), *self._release_idle(t)]
        return self._release_idle(t)

    def _max_run(self, t: Tracked) -> list[Action]:
        """maxRunDurationSeconds after Provisioned GCE deletes the VMs; GKE marks the request CapacityRevoked."""
        if self.requests.get(t.key) is not t or t.phase not in (PROVISIONED_, RELEASED, DELETED):
            return []
        return self._revoke(t, notice=False)

    def _revoke(self, t: Tracked, *, notice: bool) -> list[Action]:
        deleted, t.phase = t.phase == DELETED, REVOKED_
        self._set(t, "BookingExpired", "True", BOOKING_EXPIRED)
        self._set(t, "CapacityRevoked", "True", REVOKED)
        actions = [] if deleted else [self._status(t)]
        if not notice:
            return actions + self._drop(t, list(t.nodes))
        p = self.state.pools[t.demand.pool] if isinstance(t.demand, Demand) else None
        world = self.state.world
        for n in list(t.nodes):
            inst = p.instances.get(n) if p is not None else None
            if inst is None or not inst.node:
                actions += self._drop(t, [n])
                continue
            inst.state, inst.gen = NOTICE, inst.gen + 1
            actions += world.node_shutdown(inst, inst.gen)
        world.later(world.notice_s, lambda: self._drop(t, list(t.nodes)))
        return actions

    def _timeout(self, t: Tracked) -> list[Action]:
        if self.requests.get(t.key) is not t or t.phase != QUEUED:
            return []
        return self._fail(t, WAIT_EXCEEDED)

    def _release_idle(self, t: Tracked) -> list[Action]:
        """Nodes out of booking that run no consuming pod are scaled down (GKE: when underutilized)."""
        return self._drop(t, [n for n in t.nodes if n not in t.busy])

    def _drop(self, t: Tracked, nodes: list[str]) -> list[Action]:
        p = self.state.pools[t.demand.pool] if isinstance(t.demand, Demand) else None
        actions: list[Action] = []
        for n in nodes:
            if n in t.nodes:
                t.nodes.remove(n)
            self.node_owner.pop(n, None)
            inst = p.instances.get(n) if p is not None else None
            if p is not None and inst is not None:
                actions += self.state.world.drop(p, inst)
        if p is not None:
            p.target = len(p.instances)
        if t.phase == DELETED and not t.nodes:
            self.requests.pop(t.key, None)
        return actions


def resize_request_name(key: Key) -> str:
    """The name GKE gives the request's Compute resize request (stand-in form: ``gke-<namespace>-<name>``)."""
    return f"gke-{key[0]}-{key[1]}"
