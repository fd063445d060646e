"""The stand-in's mutable world: pools, nodes, quotas, operations, reservations, faults.

Pure Python, thread-safe (one lock), no HTTP. Time-dependent behaviour (operations, VM boots,
preemption notices, MIG retries) runs on a :class:`~kfp_gpu_rehearsal.sim.clock.Timeline` through
:mod:`kfp_gpu_rehearsal.sim.mig`. A :class:`NodeBackend` is where nodes become real (Kubernetes Node objects
via :mod:`kfp_gpu_rehearsal.sim.kube`) or stay in memory (:class:`MemoryBackend`).
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from kfp_gpu import accelerators
from kfp_gpu.errors import InvalidSpec
from kfp_gpu_rehearsal.sim import reservations as rsv
from kfp_gpu_rehearsal.sim import shapes, vmquota
from kfp_gpu_rehearsal.sim.clock import Timeline, compress, expand
from kfp_gpu_rehearsal.sim.mig import CREATING, DELETING, NOTICE, RUNNING, Action, Instance, World
from kfp_gpu_rehearsal.sim.mig import MemoryBackend as MemoryBackend
from kfp_gpu_rehearsal.sim.mig import NodeBackend as NodeBackend
from kfp_gpu_rehearsal.sim.mig import PoolRuntime as PoolRuntime
from kfp_gpu_rehearsal.sim.pool_views import PoolViews
from kfp_gpu_rehearsal.sim.scenario import RegionSpec, Scenario
from kfp_gpu_rehearsal.sim.shapes import SimHttpError
from kfp_gpu_rehearsal.sim.topology import COMPACT, Hosts, site

log = logging.getLogger(__name__)


class SimState(PoolViews):
    """The world. ``timeline`` defaults to the wall clock; pass ``Timeline(virtual=True)`` to drive it
    with :meth:`Timeline.advance` (tests)."""

    def __init__(self, scenario: Scenario, backend: NodeBackend | None = None, *,
                 timeline: Timeline | None = None) -> None:
        self.scenario = scenario
        self.backend: NodeBackend = backend or MemoryBackend()
        self.lock = threading.RLock()
        self.timeline = timeline or Timeline()
        self.reservations: rsv.Book = {(r.zone, r.name): rsv.from_spec(scenario.project, r)
                                       for r in scenario.reservations}
        self.hosts = Hosts(scenario.topology, f"{scenario.project}/{scenario.cluster}")  # blocks, sub-blocks, hosts (kfp_gpu_rehearsal.sim.topology)
        self.world = World(scenario, self.timeline, self.lock, self.backend, self.stockout, self.reservations,
                           quota=lambda spec: vmquota.creation_error(self, spec), hosts=self.hosts)
        self.pools: dict[str, PoolRuntime] = {}
        self.gke_ops: dict[str, dict[str, Any]] = {}
        self.compute_ops: dict[str, dict[str, Any]] = {}
        self.quota_prefs: dict[str, dict[str, Any]] = {}
        self.requests: collections.Counter[str] = collections.Counter()
        self.routes: collections.Counter[str] = collections.Counter()
        self.fault_hits: list[int] = [0] * len(scenario.faults)
        self.preempted: list[str] = []
        for p in scenario.pools:
            self.pools[p.name] = PoolRuntime(p, rng=p.boot.sampler())
        for p in scenario.pools:  # a pool that already has nodes when the world starts
            rt = self.pools[p.name]
            for _ in range(p.initial_size):
                name = f"gke-{scenario.cluster}-{p.name}-{rt.next_index:04d}"
                rt.next_index += 1
                rt.instances[name] = Instance(name, RUNNING, 0.0, node=True)
                rsv.earmark(self.reservations, p, rt.instances[name])
                rsv.created(self.reservations, rt.instances[name])
                labels = self.hosts.place(site(p.zone, p.machine_type), p.name, name, p.placement == COMPACT, need=p.initial_size,
                                          strict=p.placement_strict)
                if labels is None:
                    raise InvalidSpec(f"pools.{p.name}.initial_size", p.initial_size, "more VMs than the scenario's "
                                      "topology has hosts for (a compact pool's VMs share one block)",
                                      remediation="raise topology.block_nodes or topology.blocks, or lower initial_size")
                rt.instances[name].labels = labels
                self.backend.create(p, scenario.cluster, name, 0.0, gpus_ready=True, labels=labels)
            rt.target = len(rt.instances)

    # ---- time, faults, log ------------------------------------------------------------------
    def elapsed(self) -> float:
        """Stand-in seconds since the world started (the timeline's clock)."""
        return self.timeline.now()

    def record(self, method: str, path: str, route: str) -> None:
        with self.lock:
            self.requests[f"{method} {path}"] += 1
            self.routes[route] += 1

    def injected_fault(self, method: str, path: str) -> SimHttpError | None:
        with self.lock:
            for i, f in enumerate(self.scenario.faults):
                if f.method and f.method != method:
                    continue
                if re.search(f.path, path) and self.fault_hits[i] < f.count:
                    self.fault_hits[i] += 1
                    return shapes.http_error(f.status, f.message, reason=f.reason)
        return None

    # ---- lookups ----------------------------------------------------------------------------
    def check_project(self, project: str) -> None:
        if project != self.scenario.project:
            raise shapes.http_error(
                403, f"Permission denied on resource project {project} (or it may not exist).",
                reason="forbidden",
            )

    def region(self, name: str) -> RegionSpec:
        try:
            return self.scenario.regions[name]
        except KeyError:
            raise shapes.compute_not_found(f"projects/{self.scenario.project}/regions/{name}") from None

    def zone_region(self, zone: str) -> RegionSpec:
        for r in self.scenario.regions.values():
            if zone in r.zones:
                return r
        raise shapes.compute_not_found(f"projects/{self.scenario.project}/zones/{zone}")

    def pools_in(self, location: str, cluster: str) -> list[PoolRuntime]:
        if cluster != self.scenario.cluster:
            raise shapes.container_not_found(
                f"projects/{self.scenario.project}/locations/{location}/clusters/{cluster}")
        if location not in self.scenario.regions and not any(
            location in r.zones for r in self.scenario.regions.values()
        ):
            raise shapes.container_not_found(f"projects/{self.scenario.project}/locations/{location}")
        return [p for p in self.pools.values() if location in (p.spec.zone, p.spec.region)]

    def pool(self, location: str, cluster: str, name: str) -> PoolRuntime:
        for p in self.pools_in(location, cluster):
            if p.spec.name == name:
                return p
        raise shapes.container_not_found(
            f"projects/{self.scenario.project}/locations/{location}/clusters/{cluster}/nodePools/{name}")

    # ---- quota ------------------------------------------------------------------------------
    def _used(self, want: Callable[[str, str, str], bool]) -> float:
        """GPUs counted against quota, for the (region, metric, accelerator) ``want`` keeps: each reservation's
        reserved GPUs, plus the VMs of pools that hold no reserved slot (VMs inside a reservation are in its
        count: max(reserved, used), never the sum). VMs of a SPECIFIC pool without a slot do not exist, nor do VMs
        the group has not created yet (CREATING): they use no quota."""
        with self.lock:
            used = sum(
                p.spec.gpus_per_node for p in self.pools.values() for i in p.instances.values()
                if i.reservation is None and i.state != CREATING and (p.spec.spot or p.spec.reservation_affinity.effective != "specific")
                and want(p.spec.region, p.spec.quota_metric, p.spec.accelerator))
            used += sum(r["_gpus"] for (zone, _), r in self.reservations.items()
                        if r["_acc"] and want(self.zone_region(zone).name, r["_metric"], r["_acc"]))
            return float(used)

    def usage(self, region: str, metric: str) -> float:
        """GPUs of existing nodes + reservations counted against ``metric`` in ``region``."""
        return self._used(lambda r, m, _a: r == region and m == metric)

    def family_usage(self, region: str, family: str) -> float:
        return self._used(lambda r, _m, a: r == region and accelerators.get(a).gcp_gpu_family == family)

    def all_regions_usage(self) -> float:
        return self._used(lambda _r, _m, _a: True)

    def quota_short(self, region: str, metric: str, family: str | None, extra: float
                    ) -> tuple[str, str, float] | None:
        """(metric, region or "global", limit) of the first GPU quota ``extra`` more GPUs would exceed, else None."""
        r = self.region(region)
        q = r.quotas.get(metric)
        if q is not None and q.usage + self.usage(region, metric) + extra > q.limit:
            return metric, region, q.limit
        if q is None and family and family in r.gpu_families:
            if self.family_usage(region, family) + extra > r.gpu_families[family]:
                return f"GPUS-PER-GPU-FAMILY ({family})", region, r.gpu_families[family]
        g = self.scenario.global_quotas.get(accelerators.GCP_ALL_REGIONS_METRIC)
        if g is not None and g.usage + self.all_regions_usage() + extra > g.limit:
            return accelerators.GCP_ALL_REGIONS_METRIC, "global", g.limit
        return None

    def quota_check(self, region: str, metric: str, family: str | None, extra: float) -> SimHttpError | None:
        """The first quota that ``extra`` more GPUs would exceed, as a 403, else None."""
        short = self.quota_short(region, metric, family, extra)
        if short is None:
            return None
        m, where, limit = short
        if where == "global":
            used = self.all_regions_usage() + self.scenario.global_quotas[m].usage
        elif m == metric:
            used = self.usage(region, metric) + self.region(region).quotas[metric].usage
        else:
            used = self.family_usage(region, family or "")
        return shapes.quota_exceeded(m, where, limit, used, extra)

    def stockout(self, zone: str, accelerator: str, need: int = 1, model: str = "") -> dict[str, Any] | None:
        """The stockout error item when ``zone`` has no room for ``need`` more VMs of ``accelerator`` now (windows
        are in real-world seconds since the world started; a window with ``capacity`` k has room for k VMs of the
        accelerator in the zone, counting the created ones), else None."""
        t = expand(self.elapsed())
        for s in self.scenario.stockouts:
            if s.zone == zone and s.active(t, accelerator, model):
                if s.capacity is not None and self._created_in(zone, s.accelerator) + need <= s.capacity:
                    continue
                return shapes.stockout_item(zone, self.scenario.project, s.with_details)
        return None

    def _created_in(self, zone: str, accelerator: str) -> int:
        """VMs (of ``accelerator``; "" = any) that exist in ``zone``: created, not merely planned."""
        with self.lock:
            return sum(1 for p in self.pools.values() if p.spec.zone == zone
                       and (not accelerator or p.spec.accelerator == accelerator)
                       for i in p.instances.values() if i.state != CREATING)

    # ---- node pools -------------------------------------------------------------------------
    def set_size(self, location: str, cluster: str, name: str, count: int) -> dict[str, Any]:
        """GKE nodePools.setSize. Returns the Operation JSON (PENDING); the MIG's target changes when
        it turns RUNNING, and it is DONE ``operations.set_size_s`` later, whatever the VMs do.

        Quota is not checked here: the MIG's VM creations are (docs/sim.md rule 4b).

        Raises: SimHttpError (404 unknown pool, 400 bad count / running operation).
        """
        p = self.pool(location, cluster, name)
        project = self.scenario.project
        target = f"{shapes.CONTAINER}/projects/{project}/locations/{location}/clusters/{cluster}/nodePools/{name}"
        ops = self.scenario.world.operations
        with self.lock:
            if count < 0 or count > p.spec.max_nodes:
                raise shapes.http_error(
                    400, f"nodeCount {count} is outside [0, {p.spec.max_nodes}] for node pool {name}.")
            if p.running_op:
                raise shapes.operation_in_progress(p.running_op, name)
            op = shapes.container_operation(project, location, "SET_NODE_POOL_SIZE", target)
            if count > len(p.instances):  # quota is checked per VM creation (vmquota), not here
                item = self.stockout(p.spec.zone, p.spec.accelerator, model=p.spec.provisioning_model)
                room = self.hosts.room(site(p.spec.zone, p.spec.machine_type), p.spec.name, p.spec.placement == COMPACT,
                                       count - len(p.instances), strict=p.spec.placement_strict)
                if item is None and room is not None and room < count - len(p.instances):  # a full compact block
                    item = shapes.stockout_item(p.spec.zone, project, False)
                if item is not None:  # no stock at all right now: GKE fails the operation at once
                    self.gke_ops[op["name"]] = op
                    shapes.fail_container_operation(op, 503, [item])
                    return dict(op)
            op["status"] = "PENDING"
            self.gke_ops[op["name"]] = op
            p.running_op = op["name"]
            asked_at, run_s = self.timeline.now(), compress(ops.set_size_s)

            def running() -> list[Action]:
                op["status"] = "RUNNING"
                actions: list[Action] = []
                if count > len(p.instances):
                    self.world.add(p, count - len(p.instances), asked_at, run_s)
                else:
                    actions = self.world.remove(p, len(p.instances) - count)
                self.world.later(run_s, done)
                return actions

            def done() -> list[Action]:
                shapes.finish_container_operation(op)
                p.running_op = ""
                return []

            self.world.later(compress(ops.pending_s), running)
            return dict(op)

    def delete_instances(self, zone: str, igm: str, names: list[str]) -> dict[str, Any]:
        """Compute instanceGroupManagers.deleteInstances: remove specific VMs, shrinking the target.
        The Compute Operation goes PENDING -> RUNNING (target shrinks, VMs deleting) -> DONE (gone).

        Raises: SimHttpError (404 unknown group, 400 a name that is not in the group, 400
        resourceNotReady while another operation changes the group).
        """
        s = self.scenario
        p = self._igm_pool(zone, igm)
        victims = [n.rsplit("/", 1)[-1] for n in names]
        path = f"projects/{s.project}/zones/{zone}/instanceGroupManagers/{igm}"
        ops = s.world.operations
        with self.lock:
            missing = [v for v in victims if v not in p.instances]
            if missing:
                raise shapes.http_error(400, f"Instances {missing} are not members of {igm}.", reason="invalid")
            if p.running_op:
                raise shapes.http_error(400, f"The resource '{path}' is not ready", reason="resourceNotReady")
            op = shapes.compute_operation(s.project, zone, "compute.instanceGroupManagers.deleteInstances",
                                          f"{shapes.COMPUTE}/{path}")
            for k in ("startTime", "endTime"):
                op.pop(k, None)
            op.update(status="PENDING", progress=0)
            self.compute_ops[op["name"]] = op
            p.running_op = op["name"]
            marked: list[Instance] = []

            def running() -> list[Action]:
                op.update(status="RUNNING", startTime=shapes.now_rfc3339())
                for v in victims:
                    inst = p.instances.get(v)
                    if inst is not None:
                        inst.state = DELETING
                        inst.gen += 1
                        marked.append(inst)
                p.target = len(p.instances) - len(marked)
                self.world.later(compress(ops.delete_instances_s), done)
                return []

            def done() -> list[Action]:
                actions: list[Action] = []
                for inst in marked:
                    if p.instances.get(inst.name) is inst:
                        actions += self.world.drop(p, inst)
                p.target = len(p.instances)
                op.update(status="DONE", progress=100, endTime=shapes.now_rfc3339())
                p.running_op = ""
                return actions

            self.world.later(compress(ops.pending_s), running)
            return dict(op)

    # ---- preemption -------------------------------------------------------------------------
    def preempt(self, node: str) -> dict[str, Any]:
        """Reclaim one spot VM, returning at once: its Node is tainted and shut down now, deleted
        after the notice; the MIG keeps its target and recreates the VM (GCE: same name).

        Raises: SimHttpError 404 when no running node of a simulated pool has that name.
        """
        with self.lock:
            for p in self.pools.values():
                inst = p.instances.get(node)
                if inst is not None and inst.node and inst.state in (RUNNING, NOTICE):
                    break
            else:
                raise shapes.http_error(404, f"node {node} is not a running node of any simulated node pool")
            if inst.state == RUNNING:
                inst.deadline = self.world.preempt(p, inst)
                self.preempted.append(node)
            left = max(0.0, inst.deadline - self.timeline.now())
            deadline = datetime.now(timezone.utc) + timedelta(seconds=left)
            return {"node": node, "pool": p.spec.name, "poolSize": p.target,
                    "noticeS": round(left, 3), "deadline": deadline.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}

    def preempt_pool(self, pool: str, count: int) -> list[str]:
        """Reclaim the ``count`` newest running nodes of ``pool``. Raises: KeyError for an unknown pool."""
        with self.lock:
            p = self.pools[pool]
            victims = [i.name for i in reversed(list(p.instances.values())) if i.state == RUNNING and i.node]
        return [self.preempt(n)["node"] for n in victims[:count]]

    def node_exists(self, node: str) -> bool:
        with self.lock:
            return self.world.busy(node) or any(
                (i := p.instances.get(node)) is not None and i.node for p in self.pools.values())

    def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until ``predicate()`` holds (checked after every world event), at most ``timeout`` s."""
        end = time.monotonic() + timeout
        with self.timeline.changed:
            while not predicate():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.timeline.changed.wait(min(left, 0.2))
        return True

    def wait_node_gone(self, node: str, timeout: float = 30.0) -> bool:
        """Wall-clock worlds: wait until ``node``'s Node was deleted (e.g. after a preemption notice)."""
        return self.wait_until(lambda: not self.node_exists(node), timeout)

    def shutdown(self) -> None:
        self.timeline.stop()
        self.world.shutdown()
