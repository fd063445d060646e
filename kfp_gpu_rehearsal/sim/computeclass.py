"""GKE custom ComputeClasses in the stand-in's world: node auto-provisioning walks a class's ``priorities`` for its
pending pods (docs/sim.md, section "ComputeClass"; every rule below cites GKE or cluster-autoscaler docs there).

* Rules are tried in priority order, at each autoscaler scan (``--scan-interval``, 10 s). A rule gets a node pool
  per zone, created on first use (node auto-provisioning); its VMs are the pool's MIG VMs (same boot, device plugin,
  quota, reservations and stockouts as every pool of the world).
* A rule that cannot give a node now (a stockout of its provisioning model in every zone, its reservation
  exhausted, quota) is backed off (``--initial-node-group-backoff-duration``, 5 min) and the next rule is asked, for
  as many nodes as are still missing: a gang can land on two rules.
* A VM its MIG could not create within ``--max-node-provision-time`` (15 min: a stockout or quota hit after the
  autoscaler asked) is deleted and its rule backed off.
* flex-start: each node waits its own turn (GKE documents all-at-once only with queued provisioning: our reading, docs/sim.md [GKE-FLEX]); the
  wait is the scenario's flex-start obtainability (``dws.queue``); a node not obtained within
  ``--max-node-provision-time`` (15 min) is given up, the rule backed off and the next rule asked.
* activeMigration (``optimizeRulePriority: true``): at each scan, the node of the lowest rule gets a node of a more
  preferred rule when that rule can give one now; once the new node runs, the old one is drained and deleted.
* Scale-down: a node of a class that runs no pod, is not annotated
  ``cluster-autoscaler.kubernetes.io/scale-down-disabled``, and has no pending pod to wait for, is removed after
  ``--scale-down-unneeded-time`` (10 min).

Pure world logic on the :class:`~kfp_gpu_rehearsal.sim.state.SimState` (its lock and timeline, so tests run it on virtual
time); the Kubernetes side is :mod:`kfp_gpu_rehearsal.sim.computeclass_controller`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kfp_gpu import accelerators
from kfp_gpu_rehearsal.sim import reservations as rsv
from kfp_gpu_rehearsal.sim import vmquota
from kfp_gpu_rehearsal.sim.clock import compress
from kfp_gpu_rehearsal.sim.mig import CREATING, RUNNING, Action, PoolRuntime
from kfp_gpu_rehearsal.sim.scenario import PoolSpec
from kfp_gpu_rehearsal.sim.state import SimState
from kfp_gpu_rehearsal.sim.worldspec import Autoscaling, BootLatency, ReservationAffinity

log = logging.getLogger(__name__)

CLASS_LABEL = "cloud.google.com/compute-class"
SCAN_S = 10.0  # cluster-autoscaler --scan-interval
BACKOFF_S = 300.0  # --initial-node-group-backoff-duration
MAX_PROVISION_S = 900.0  # --max-node-provision-time
UNNEEDED_S = 600.0  # --scale-down-unneeded-time
NAP_MAX_NODES = 1000


def capacity_of(rule: Mapping[str, Any]) -> str:
    if rule.get("reservations"):
        return "reservation"
    if (rule.get("flexStart") or {}).get("enabled"):
        return "flex-start"
    return "spot" if rule.get("spot") else "on-demand"


@dataclass
class Ask:
    """One flex-start node asked of a rule, waiting for capacity."""

    rule: int
    zone: str
    done: bool = False


@dataclass
class Klass:
    name: str
    spec: dict[str, Any]
    rules: list[dict[str, Any]]
    zones: list[str]
    migrate: bool
    pending: int = 0  # pods selecting the class that wait for a node
    busy: set[str] = field(default_factory=set)  # nodes running a pod
    protected: set[str] = field(default_factory=set)  # scale-down-disabled nodes
    closed: set[str] = field(default_factory=set)  # nodes the waiting pods cannot use: cordoned, untolerated taint
    nodes: dict[str, int] = field(default_factory=dict)  # node -> rule
    asks: list[Ask] = field(default_factory=list)
    backoff: dict[int, float] = field(default_factory=dict)  # rule -> timeline time it may be asked again
    idle_since: dict[str, float] = field(default_factory=dict)
    migrating: dict[str, str] = field(default_factory=dict)  # new node -> the node it replaces
    history: list[str] = field(default_factory=list)  # what the autoscaler did, for tests and the log


class ComputeClassWorld:
    """Node auto-provisioning for the world's ComputeClasses."""

    def __init__(self, state: SimState) -> None:
        self.state = state
        self.classes: dict[str, Klass] = {}
        self._rng = state.scenario.dws.queue.sampler()

    def moved_to(self, state: SimState) -> ComputeClassWorld:
        """A world for ``state`` (a reset) that knows this world's live classes."""
        out = ComputeClassWorld(state)
        for k in self.classes.values():
            if k.rules:
                out.set_class(k.name, k.spec)
        return out

    # ---- inputs (from the controller) ---------------------------------------------------------------
    def set_class(self, name: str, spec: Mapping[str, Any] | None) -> None:
        """A ComputeClass was created/changed (``spec``) or deleted (None: its nodes scale down when unneeded)."""
        with self.state.lock:
            k = self.classes.get(name)
            if spec is None:
                if k is not None:
                    k.rules, k.pending, k.migrate = [], 0, False
                return
            zones = list(((spec.get("priorityDefaults") or {}).get("location") or {}).get("zones") or [])
            if not zones:
                zones = sorted(z for r in self.state.scenario.regions.values() for z in r.zones)
            migrate = bool((spec.get("activeMigration") or {}).get("optimizeRulePriority"))
            rules = [dict(r) for r in spec.get("priorities") or []]
            if k is None:
                self.classes[name] = Klass(name, dict(spec), rules, zones, migrate)
            else:
                k.spec, k.rules, k.zones, k.migrate = dict(spec), rules, zones, migrate

    def set_pods(self, name: str, pending: int, busy: set[str], protected: set[str],
                 closed: set[str] | None = None) -> None:
        with self.state.lock:
            k = self.classes.get(name)
            if k is not None:
                k.pending, k.busy, k.protected, k.closed = pending, set(busy), set(protected), set(closed or ())

    def node_extras(self, pool: str, node: str) -> tuple[dict[str, str], list[dict[str, str]]]:
        """Labels and taints of a node of a class's pool (GKE: the class label and taint, the provisioning model's
        label, the reservation consumed)."""
        rt = self.state.pools.get(pool)
        if rt is None or not rt.spec.compute_class:
            return {}, []
        spec, inst = rt.spec, rt.instances.get(node)
        labels = {CLASS_LABEL: spec.compute_class}
        if spec.spot:
            labels["cloud.google.com/gke-spot"] = "true"
        if spec.flex_start:
            labels["cloud.google.com/gke-flex-start"] = "true"
        if inst is not None and inst.reservation is not None:
            labels["cloud.google.com/reservation-name"] = inst.reservation[1]
        return labels, [{"key": CLASS_LABEL, "value": spec.compute_class, "effect": "NoSchedule"}]

    # ---- the autoscaler's loop --------------------------------------------------------------------------
    def scan(self) -> list[Action]:
        """One autoscaler pass over every class; returns the node deletions to run outside the lock."""
        actions: list[Action] = []
        with self.state.lock:
            now = self.state.timeline.now()
            for k in list(self.classes.values()):
                self._prune(k)
                actions += self._give_up_stuck(k, now)
                actions += self._scale_up(k, now)
                actions += self._migrate(k)
                actions += self._scale_down(k, now)
        return actions

    def _prune(self, k: Klass) -> None:
        alive = {n for p in self.state.pools.values() if p.spec.compute_class == k.name for n in p.instances}
        for n in [n for n in k.nodes if n not in alive]:
            k.nodes.pop(n)
            k.idle_since.pop(n, None)
        k.asks = [a for a in k.asks if not a.done]
        k.migrating = {new: old for new, old in k.migrating.items() if new in k.nodes and old in k.nodes}

    def _give_up_stuck(self, k: Klass, now: float) -> list[Action]:
        """A VM still not created --max-node-provision-time after it was asked for (its MIG keeps failing: a
        stockout, quota) is given up: deleted, and its rule backed off."""
        actions: list[Action] = []
        for p in self.state.pools.values():
            if p.spec.compute_class != k.name:
                continue
            for inst in list(p.instances.values()):
                if inst.state == CREATING and now - inst.requested_at >= compress(MAX_PROVISION_S):
                    rule = k.nodes.get(inst.name, p.spec.class_rule)
                    actions += self._drop(k, inst.name)
                    k.backoff[rule] = now + compress(BACKOFF_S)
                    _note(k, f"rule {rule} ({capacity_of(k.rules[rule]) if rule < len(k.rules) else '?'}) "
                             f"VM {inst.name} not created in {MAX_PROVISION_S:g}s: backed off")
        return actions

    def _scale_up(self, k: Klass, now: float) -> list[Action]:
        replacing = set(k.migrating)
        coming = sum(1 for n in k.nodes if n not in k.busy and n not in replacing and n not in k.closed) + len(k.asks)
        need = k.pending - coming
        for i in range(len(k.rules)):
            if need <= 0:
                break
            if k.backoff.get(i, -1.0) > now:
                continue
            got = self._ask(k, i, need, now)
            if got == 0:
                k.backoff[i] = now + compress(BACKOFF_S)
                _note(k, f"rule {i} ({capacity_of(k.rules[i])}) backed off")
            need -= got
        return []

    def _ask(self, k: Klass, i: int, need: int, now: float) -> int:
        """Up to ``need`` nodes from rule ``i`` (flex-start: asks that wait their turn). Returns how many."""
        rule, got = k.rules[i], 0
        for zone in k.zones:
            pool = self._pool(k, i, zone)
            if pool is None:
                return 0
            if pool.spec.flex_start:
                if self.state.stockout(zone, pool.spec.accelerator, 1, model="flex-start") is not None:
                    continue
                for _ in range(need - got):
                    self._flex(k, Ask(i, zone))
                return need
            n = self.room(pool, need - got)
            if n > 0:
                self.state.world.add(pool, n, now, 0.0)
                for name in list(pool.instances)[-n:]:
                    k.nodes[name] = i
                got += n
                _note(k, f"rule {i} ({capacity_of(rule)}) +{n} in {zone}")
            if got >= need:
                break
        return got

    def room(self, pool: PoolRuntime, want: int) -> int:
        """How many of ``want`` VMs the pool can get now: its reservation's free slots (a reservation rule), the
        zone's stock for its provisioning model, and quota."""
        spec = pool.spec
        n = want
        if spec.reservation_affinity.consume == "specific":
            n = min(n, rsv.free_for(self.state.reservations, spec))
        while n > 0 and (self.state.stockout(spec.zone, spec.accelerator, n, model=spec.provisioning_model) is not None
                         or vmquota.creation_error(self.state, spec, n) is not None):
            n -= 1
        return n

    def _flex(self, k: Klass, ask: Ask) -> None:
        """A flex-start node waits its turn; past --max-node-provision-time it is given up and the rule backed off."""
        k.asks.append(ask)
        wait = self.state.scenario.dws.queue.sample(self._rng)
        world = self.state.world

        def obtained() -> list[Action]:
            if ask.done:
                return []
            ask.done = True
            pool = self._pool(k, ask.rule, ask.zone)
            if pool is None or self.room(pool, 1) < 1:
                k.backoff[ask.rule] = self.state.timeline.now() + compress(BACKOFF_S)
                return []
            world.add(pool, 1, self.state.timeline.now(), 0.0)
            k.nodes[list(pool.instances)[-1]] = ask.rule
            _note(k, f"rule {ask.rule} (flex-start) +1 in {ask.zone}")
            return []

        def given_up() -> list[Action]:
            if not ask.done:
                ask.done = True
                k.backoff[ask.rule] = self.state.timeline.now() + compress(BACKOFF_S)
                _note(k, f"rule {ask.rule} (flex-start) not obtained in {MAX_PROVISION_S:g}s: backed off")
            return []

        if wait <= MAX_PROVISION_S:
            world.later(compress(wait), obtained)
        else:
            world.later(compress(MAX_PROVISION_S), given_up)

    def _migrate(self, k: Klass) -> list[Action]:
        actions: list[Action] = []
        for new, old in list(k.migrating.items()):  # the preferred node runs: drain and delete the old one
            if self._running(new):
                k.migrating.pop(new)
                actions += self._drop(k, old)
                _note(k, f"migrated {old} (rule {k.nodes.get(old, -1)}) to {new} (rule {k.nodes[new]})")
        if not k.migrate or k.migrating:
            return actions
        now = self.state.timeline.now()
        lowest = sorted((r, n) for n, r in k.nodes.items() if self._running(n))
        for rule_now, node in reversed(lowest):
            for j in range(rule_now):
                if k.backoff.get(j, -1.0) > now or capacity_of(k.rules[j]) == "flex-start":
                    continue
                for zone in k.zones:
                    pool = self._pool(k, j, zone)
                    if pool is not None and self.room(pool, 1) == 1:
                        self.state.world.add(pool, 1, now, 0.0)
                        new = list(pool.instances)[-1]
                        k.nodes[new], k.migrating[new] = j, node
                        _note(k, f"migrating {node} (rule {rule_now}) to rule {j}")
                        return actions
        return actions

    def _scale_down(self, k: Klass, now: float) -> list[Action]:
        actions: list[Action] = []
        for n in list(k.nodes):
            if n in k.busy or n in k.protected or k.pending > 0 or n in k.migrating or not self._running(n):
                k.idle_since.pop(n, None)
                continue
            since = k.idle_since.setdefault(n, now)
            if now - since >= compress(UNNEEDED_S):
                actions += self._drop(k, n)
                _note(k, f"scaled down unneeded {n}")
        return actions

    # ---- pools and nodes -----------------------------------------------------------------------------------
    def _pool(self, k: Klass, i: int, zone: str) -> PoolRuntime | None:
        """The auto-created pool of rule ``i`` in ``zone`` (created on first use); None for a rule this stand-in
        cannot place (no GPU in the catalog)."""
        name = f"nap-{hashlib.sha256(k.name.encode()).hexdigest()[:8]}-r{i}-{zone.rsplit('-', 1)[-1]}"
        if name in self.state.pools:
            return self.state.pools[name]
        rule = k.rules[i]
        gpu = rule.get("gpu") or {}
        acc = next((a for a in accelerators.names() if accelerators.get(a).gke_label == gpu.get("type")), None)
        if acc is None:
            return None
        cap = capacity_of(rule)
        # the same machine in the same zone boots as the world's pools of it do (their boot model and seed)
        like = next((p for p in self.state.scenario.pools if p.zone == zone and p.accelerator == acc), None)
        names = tuple(str(s.get("name", "")) for s in (rule.get("reservations") or {}).get("specific") or [])
        spec = PoolSpec(name=name, zone=zone, accelerator=acc, gpus_per_node=int(gpu.get("count", 8)),
                        spot=cap == "spot", max_nodes=NAP_MAX_NODES,
                        machine_type=accelerators.get(acc).gce_machine_for(int(gpu.get("count", 8))).name,
                        autoscaling=Autoscaling(enabled=True, max_nodes=NAP_MAX_NODES),
                        reservation_affinity=ReservationAffinity("specific", names) if cap == "reservation"
                        else ReservationAffinity("none"),
                        flex_start=cap == "flex-start", compute_class=k.name, class_rule=i,
                        boot=like.boot if like is not None else BootLatency())
        rt = PoolRuntime(spec, rng=spec.boot.sampler())
        self.state.pools[name] = rt
        return rt

    def _running(self, node: str) -> bool:
        for p in self.state.pools.values():
            inst = p.instances.get(node)
            if inst is not None:
                return inst.state == RUNNING and inst.node
        return False

    def _drop(self, k: Klass, node: str) -> list[Action]:
        k.nodes.pop(node, None)
        k.idle_since.pop(node, None)
        for p in self.state.pools.values():
            inst = p.instances.get(node)
            if inst is not None:
                actions = self.state.world.drop(p, inst)
                p.target = len(p.instances)
                return actions
        return []

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self.state.lock:
            return {k.name: {"nodes": dict(k.nodes), "pending": k.pending, "history": list(k.history),
                             "backoff": dict(k.backoff), "migrating": dict(k.migrating)}
                    for k in self.classes.values()}


def _note(k: Klass, what: str) -> None:
    """What the autoscaler did for a class: kept for the snapshot and logged (as cluster-autoscaler logs its
    scale-ups, backoffs and scale-downs)."""
    k.history.append(what)
    log.info("computeclass %s: %s", k.name, what)
