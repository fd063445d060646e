"""A node pool's managed instance group (MIG) in time: VMs are created, boot, register as Nodes, get
their GPUs, are preempted with notice and recreated, or fail on a stockout and are retried.

Every transition runs on the world's :class:`~kfp_gpu_rehearsal.sim.clock.Timeline` under the state lock and
returns the node-backend calls it implies; the caller runs them after releasing the lock, in order.
See docs/sim.md, "World behaviour", for the provider behaviour each rule follows.
"""

from __future__ import annotations

import collections
import logging
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from kfp_gpu_rehearsal.sim import reservations as rsv
from kfp_gpu_rehearsal.sim import shapes
from kfp_gpu_rehearsal.sim.clock import Timeline, compress
from kfp_gpu_rehearsal.sim.scenario import PoolSpec, Scenario
from kfp_gpu_rehearsal.sim.topology import Hosts, site

log = logging.getLogger(__name__)
Action = tuple[str, Callable[[], None]]  # (node name, backend call): calls for one node run in order
MAX_ERRORS = 500  # listErrors keeps the newest errors per group
NODE_SHARDS = 16  # backend calls for different nodes run in parallel on this many threads

# Instance states. "creating": the MIG will (re)try to create the VM; "booting": the VM exists, its
# Node has not registered yet; "running": the Node exists; "notice": preemption notice running;
# "deleting": removed by deleteInstances, waiting for the operation to delete it.
CREATING, BOOTING, RUNNING, NOTICE, DELETING = "creating", "booting", "running", "notice", "deleting"


class NodeBackend(Protocol):
    def create(self, pool: PoolSpec, cluster: str, name: str, boot_delay_s: float,
               sampled_s: float | None = None, *, gpus_ready: bool = True,
               labels: dict[str, str] | None = None) -> None: ...

    def delete(self, name: str) -> None: ...

    def notice(self, name: str, taint_key: str) -> None: ...

    def kill(self, name: str) -> None: ...

    def gpus_ready(self, name: str, gpus: int) -> None: ...


class MemoryBackend:
    """Nodes exist only in the stand-in's memory (pure HTTP tests); every call is recorded."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.noticed: list[str] = []
        self.killed: list[str] = []
        self.gpus: dict[str, int] = {}
        self.boot_samples: dict[str, float | None] = {}
        self.labels: dict[str, dict[str, str]] = {}  # the topology labels each node registered with

    @property
    def preempted(self) -> list[str]:
        return self.noticed

    def create(self, pool: PoolSpec, cluster: str, name: str, boot_delay_s: float,
               sampled_s: float | None = None, *, gpus_ready: bool = True,
               labels: dict[str, str] | None = None) -> None:
        self.created.append(name)
        self.labels[name] = dict(labels or {})
        self.boot_samples[name] = sampled_s
        self.gpus[name] = pool.gpus_per_node if gpus_ready else 0

    def delete(self, name: str) -> None:
        self.deleted.append(name)
        self.gpus.pop(name, None)

    def notice(self, name: str, taint_key: str) -> None:
        self.noticed.append(name)

    def kill(self, name: str) -> None:
        self.killed.append(name)

    def gpus_ready(self, name: str, gpus: int) -> None:
        self.gpus[name] = gpus


@dataclass
class Instance:
    name: str
    state: str
    requested_at: float  # timeline time of the request this incarnation answers (setSize, repair)
    recreate: bool = False  # a repair of a preempted VM (currentActions.recreating)
    gen: int = 0  # bumped on every incarnation change; stale timed events compare it
    node: bool = False  # its Kubernetes Node exists
    deadline: float = 0.0  # timeline time a preempted VM's Node goes away
    reservation: tuple[str, str] | None = None  # (zone, name) of the reservation it consumes (or will)
    labels: dict[str, str] = field(default_factory=dict)  # its host's topology labels (kfp_gpu_rehearsal.sim.topology)


@dataclass
class PoolRuntime:
    """One pool's MIG. ``target`` is the MIG targetSize; ``nodes`` the instances whose Node exists."""

    spec: PoolSpec
    instances: dict[str, Instance] = field(default_factory=dict)  # creation order
    next_index: int = 0
    target: int = 0
    running_op: str = ""
    rng: Any = None
    errors: list[dict[str, Any]] = field(default_factory=list)  # instanceGroupManagers.listErrors

    @property
    def nodes(self) -> list[str]:
        return [i.name for i in self.instances.values() if i.node]

    def count(self, *states: str, recreate: bool | None = None) -> int:
        return sum(1 for i in self.instances.values()
                   if i.state in states and (recreate is None or i.recreate == recreate))


class World:
    """The MIG mechanics shared by every pool: timeline, lock, backend and scenario timing."""

    def __init__(self, scenario: Scenario, timeline: Timeline, lock: threading.RLock, backend: NodeBackend,
                 stockout: Callable[..., dict[str, Any] | None], reservations: rsv.Book | None = None,
                 quota: Callable[[PoolSpec], dict[str, Any] | None] | None = None, hosts: Hosts | None = None) -> None:
        self.hosts = hosts if hosts is not None else Hosts(scenario.topology, f"{scenario.project}/{scenario.cluster}")
        self.sc, self.tl, self.lock, self.backend, self.stockout = scenario, timeline, lock, backend, stockout
        self.quota: Callable[[PoolSpec], dict[str, Any] | None] = quota or (lambda _spec: None)
        self.reservations: rsv.Book = {} if reservations is None else reservations
        w = scenario.world
        self.retry_s, self.plugin_s, self.notice_s = compress(w.mig_retry_s), compress(w.device_plugin_s), \
            compress(w.notice_s)
        self.pod_grace_s = compress(w.pod_grace_s)
        # GKE (>= 1.20) shows the notice through the kubelet's graceful node shutdown and adds no taint; the AWS
        # flavour stands for aws-node-termination-handler, which taints the node (its README, "taintNode")
        self.taint_key = "" if w.cloud == "gcp" else IMPENDING_AWS
        self._shards = [] if timeline.virtual else [
            ThreadPoolExecutor(1, thread_name_prefix=f"sim-node-{i}") for i in range(NODE_SHARDS)]
        self._pending: collections.Counter[str] = collections.Counter()

    # ---- scheduling ---------------------------------------------------------------------------
    def later(self, dt: float, fn: Callable[[], list[Action]]) -> None:
        """Run ``fn`` under the lock ``dt`` seconds from now, then the backend calls it returns."""
        def run() -> None:
            with self.lock:
                actions = fn()
            self.dispatch(actions)
        self.tl.after(dt, run)

    def dispatch(self, actions: list[Action]) -> None:
        """Run backend calls: inline on virtual time, else on the node's shard thread (in order per node)."""
        for name, call in actions:
            if not self._shards:
                call()
                continue
            with self.lock:
                self._pending[name] += 1
            self._shards[zlib.crc32(name.encode()) % len(self._shards)].submit(self._run, name, call)

    def _run(self, name: str, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception:  # noqa: BLE001 - one failing API call must not stop the world
            log.exception("sim: backend call for node %s failed", name)
        finally:
            with self.lock:
                self._pending[name] -= 1
                if self._pending[name] <= 0:
                    del self._pending[name]
            with self.tl.changed:
                self.tl.changed.notify_all()

    def busy(self, name: str) -> bool:
        """Backend calls for ``name`` are still queued or running (lock held)."""
        return self._pending.get(name, 0) > 0

    def shutdown(self) -> None:
        for ex in self._shards:
            ex.shutdown(wait=False, cancel_futures=True)

    def instance_url(self, p: PoolRuntime, name: str) -> str:
        return f"{shapes.COMPUTE}/projects/{self.sc.project}/zones/{p.spec.zone}/instances/{name}"

    def managed_instances(self, p: PoolRuntime) -> list[dict[str, Any]]:
        """instanceGroupManagers.listManagedInstances items (lock held): each VM's ``currentAction``, its
        ``instanceStatus`` once the VM exists, and ``lastAttempt.errors`` (the newest listErrors item of a VM the
        group is still trying to create)."""
        last: dict[str, dict[str, Any]] = {}
        for e in p.errors:
            last[e["instanceActionDetails"]["instance"]] = e["error"]
        out = []
        for inst in p.instances.values():
            url = self.instance_url(p, inst.name)
            item: dict[str, Any] = {"instance": url, "name": inst.name, "currentAction": {
                CREATING: "RECREATING" if inst.recreate else "CREATING", BOOTING: "RECREATING" if inst.recreate
                else "CREATING", RUNNING: "NONE", NOTICE: "NONE", DELETING: "DELETING"}[inst.state]}
            if inst.state != CREATING:
                item["instanceStatus"] = {BOOTING: "STAGING", NOTICE: "STOPPING", DELETING: "STOPPING"}.get(
                    inst.state, "RUNNING")
            elif url in last:
                item["lastAttempt"] = {"errors": {"errors": [dict(last[url])]}}
            out.append(item)
        return out

    # ---- growth and shrink (lock held) ----------------------------------------------------------
    def add(self, p: PoolRuntime, n: int, requested_at: float, spread_s: float) -> None:
        """Add ``n`` VMs; their creations are attempted evenly over the next ``spread_s`` seconds."""
        for j in range(n):
            name = f"gke-{self.sc.cluster}-{p.spec.name}-{p.next_index:04d}"
            p.next_index += 1
            p.instances[name] = Instance(name, CREATING, requested_at)
            rsv.earmark(self.reservations, p.spec, p.instances[name])
            self.attempt_later(p, p.instances[name], spread_s * (j + 1) / (n + 1))
        p.target = len(p.instances)

    def remove(self, p: PoolRuntime, n: int) -> list[Action]:
        """Shrink by ``n``: VMs not created yet go first (newest first), then booting, then running ones."""
        order = {CREATING: 0, BOOTING: 1, DELETING: 2, NOTICE: 3, RUNNING: 4}
        ranked = sorted(reversed(list(p.instances.values())), key=lambda i: order[i.state])
        actions: list[Action] = []
        for inst in ranked[:n]:
            actions += self.drop(p, inst)
        p.target = len(p.instances)
        return actions

    def drop(self, p: PoolRuntime, inst: Instance) -> list[Action]:
        had_node, inst.node = inst.node, False
        p.instances.pop(inst.name, None)
        self.hosts.release(inst.name)
        rsv.release(self.reservations, inst)
        inst.gen += 1
        return [(inst.name, lambda: self.backend.delete(inst.name))] if had_node else []

    # ---- one VM's life ------------------------------------------------------------------------
    def attempt_later(self, p: PoolRuntime, inst: Instance, dt: float) -> None:
        gen = inst.gen
        self.later(dt, lambda: self._attempt(p, inst, gen))

    def _current(self, p: PoolRuntime, inst: Instance, gen: int) -> bool:
        return p.instances.get(inst.name) is inst and inst.gen == gen

    def _attempt(self, p: PoolRuntime, inst: Instance, gen: int) -> list[Action]:
        if not self._current(p, inst, gen) or inst.state != CREATING:
            return []
        rsv.earmark(self.reservations, p.spec, inst)  # a slot may have freed since the VM was planned
        if inst.reservation is not None:  # reserved capacity: no stock needed, its quota is already held
            item = None
        elif p.spec.reservation_affinity.effective == "specific" and not p.spec.spot:
            item = rsv.exhausted_item(p.spec)
        else:  # quota is checked per VM, before the zone's stock (docs/sim.md rule 4b)
            item = self.quota(p.spec) or self.stockout(p.spec.zone, p.spec.accelerator, model=p.spec.provisioning_model)
        if item is None:  # a host: a strict compact pool's VMs only in its block, a best-effort one's spill (docs/sim.md)
            labels = self.hosts.place(site(p.spec.zone, p.spec.machine_type), p.spec.name, inst.name, p.spec.placement == "COMPACT",
                                      need=p.count(CREATING), strict=p.spec.placement_strict)
            if labels is None:
                item = shapes.stockout_item(p.spec.zone, self.sc.project, False)
            else:
                inst.labels = labels
        if item is not None:  # the MIG records the error and keeps retrying (targetSize unchanged)
            p.errors.append({
                "instanceActionDetails": {"action": "RECREATING" if inst.recreate else "CREATING",
                                          "instance": self.instance_url(p, inst.name)},
                "error": {"code": item["code"], "message": item["message"]},
                "timestamp": shapes.now_rfc3339(),
            })
            del p.errors[:-MAX_ERRORS]
            self.attempt_later(p, inst, self.retry_s)
            return []
        rsv.created(self.reservations, inst)
        inst.state = BOOTING
        boot = compress(p.spec.boot.sample(p.rng))
        self.later(boot, lambda: self._register(p, inst, gen))
        return []

    def _register(self, p: PoolRuntime, inst: Instance, gen: int) -> list[Action]:
        if not self._current(p, inst, gen) or inst.state != BOOTING:
            return []
        inst.state, inst.recreate, inst.node = RUNNING, False, True
        total = round(self.tl.now() - inst.requested_at, 4)
        self.later(self.plugin_s, lambda: self._gpus(p, inst, gen))
        labels = dict(inst.labels)
        return [(inst.name, lambda: self.backend.create(p.spec, self.sc.cluster, inst.name, 0.0, sampled_s=total,
                                                        gpus_ready=False, labels=labels))]

    def _gpus(self, p: PoolRuntime, inst: Instance, gen: int) -> list[Action]:
        if not self._current(p, inst, gen) or inst.state != RUNNING:
            return []
        return [(inst.name, lambda: self.backend.gpus_ready(inst.name, p.spec.gpus_per_node))]

    def preempt(self, p: PoolRuntime, inst: Instance) -> float:
        """Start the reclaim notice of a running VM; returns the timeline time its Node goes away."""
        inst.state = NOTICE
        inst.gen += 1
        gen = inst.gen
        self.later(0.0, lambda: self.node_shutdown(inst, gen))
        self.later(self.notice_s, lambda: self._reclaim(p, inst, gen))
        return self.tl.now() + self.notice_s

    def node_shutdown(self, inst: Instance, gen: int) -> list[Action]:
        """The notice (returned: its pods told, the Node shutting down), and the kill of its pods ``pod_grace_s``
        later (scheduled), unless the instance changed incarnation by then. The kill is counted from the notice, not
        from when the API calls telling the pods returned: their latency only shortens the pods' grace."""
        self.later(self.pod_grace_s, lambda: [(inst.name, lambda: self.backend.kill(inst.name))]
                   if inst.gen == gen else [])
        return [(inst.name, lambda: self.backend.notice(inst.name, self.taint_key))]

    def _reclaim(self, p: PoolRuntime, inst: Instance, gen: int) -> list[Action]:
        if not self._current(p, inst, gen):
            return []
        actions: list[Action] = [(inst.name, lambda: self.backend.delete(inst.name))]
        inst.node = False
        self.hosts.release(inst.name)  # the repaired VM gets a host anew
        if self.sc.world.cloud == "gcp":  # the MIG repairs the VM under the same name
            inst.state, inst.recreate, inst.requested_at = CREATING, True, self.tl.now()
            inst.gen += 1
            self.attempt_later(p, inst, 0.0)
        else:  # an Auto Scaling group launches a replacement instance (a new name)
            p.instances.pop(inst.name)
            rsv.release(self.reservations, inst)
            inst.gen += 1
            self.add(p, 1, self.tl.now(), 0.0)
        return actions


IMPENDING_AWS = "aws-node-termination-handler/spot-itn"

