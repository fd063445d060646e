"""The stand-in's mutable world: pools, nodes, quotas, operations, reservations, faults.

Pure Python, thread-safe (one lock), no HTTP. :class:`NodeBackend` is where nodes become real
(Kubernetes Node objects via :mod:`kfp_gpu.sim.kube`) or stay in memory (:class:`MemoryBackend`).
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from kfp_gpu import accelerators
from kfp_gpu.sim import shapes
from kfp_gpu.sim.scenario import PoolSpec, RegionSpec, Scenario
from kfp_gpu.sim.shapes import SimHttpError

log = logging.getLogger(__name__)


class NodeBackend(Protocol):
    def create(self, pool: PoolSpec, cluster: str, name: str, boot_delay_s: float,
               sampled_s: float | None = None) -> None: ...

    def delete(self, name: str) -> None: ...

    def preempt(self, name: str) -> None: ...


class MemoryBackend:
    """Nodes exist only in the stand-in's memory (pure HTTP tests)."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.preempted: list[str] = []

    def create(self, pool: PoolSpec, cluster: str, name: str, boot_delay_s: float,
               sampled_s: float | None = None) -> None:
        self.created.append(name)

    def delete(self, name: str) -> None:
        self.deleted.append(name)

    def preempt(self, name: str) -> None:
        self.preempted.append(name)


@dataclass
class PoolRuntime:
    spec: PoolSpec
    nodes: list[str] = field(default_factory=list)  # creation order, newest last
    next_index: int = 0
    target: int = 0
    running_op: str = ""
    rng: Any = None


class SimState:
    def __init__(self, scenario: Scenario, backend: NodeBackend | None = None) -> None:
        self.scenario = scenario
        self.backend: NodeBackend = backend or MemoryBackend()
        self.lock = threading.RLock()
        self.t0 = time.monotonic()
        self.pools: dict[str, PoolRuntime] = {}
        self.gke_ops: dict[str, dict[str, Any]] = {}
        self.compute_ops: dict[str, dict[str, Any]] = {}
        self.reservations: dict[tuple[str, str], dict[str, Any]] = {}
        self.quota_prefs: dict[str, dict[str, Any]] = {}
        self.requests: collections.Counter[str] = collections.Counter()
        self.routes: collections.Counter[str] = collections.Counter()
        self.fault_hits: list[int] = [0] * len(scenario.faults)
        self.preempted: list[str] = []
        self.pool_exec = ThreadPoolExecutor(max_workers=scenario.node_create_workers, thread_name_prefix="sim-node")
        self.op_exec = ThreadPoolExecutor(max_workers=8, thread_name_prefix="sim-op")
        for p in scenario.pools:
            self.pools[p.name] = PoolRuntime(p, rng=p.boot.sampler())
        for p in scenario.pools:
            if p.initial_size:
                self._grow(self.pools[p.name], p.initial_size)

    # ---- time, faults, log ------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

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
    def usage(self, region: str, metric: str) -> float:
        """GPUs of existing nodes + reservations counted against ``metric`` in ``region``."""
        with self.lock:
            used = sum(
                len(p.nodes) * p.spec.gpus_per_node for p in self.pools.values()
                if p.spec.region == region and p.spec.quota_metric == metric
            )
            for (zone, _), r in self.reservations.items():
                if self.zone_region(zone).name == region and r["_metric"] == metric:
                    used += r["_gpus"]
            return float(used)

    def family_usage(self, region: str, family: str) -> float:
        with self.lock:
            return float(sum(
                len(p.nodes) * p.spec.gpus_per_node for p in self.pools.values()
                if p.spec.region == region and accelerators.get(p.spec.accelerator).gcp_gpu_family == family
            ))

    def all_regions_usage(self) -> float:
        with self.lock:
            nodes = sum(len(p.nodes) * p.spec.gpus_per_node for p in self.pools.values())
            return float(nodes + sum(r["_gpus"] for r in self.reservations.values()))

    def quota_check(self, region: str, metric: str, family: str | None, extra: float) -> SimHttpError | None:
        """The first quota that ``extra`` more GPUs would exceed, as a 403, else None."""
        r = self.region(region)
        q = r.quotas.get(metric)
        if q is not None and q.usage + self.usage(region, metric) + extra > q.limit:
            return shapes.quota_exceeded(metric, region, q.limit, q.usage + self.usage(region, metric), extra)
        if q is None and family and family in r.gpu_families:
            limit, used = r.gpu_families[family], self.family_usage(region, family)
            if used + extra > limit:
                return shapes.quota_exceeded(f"GPUS-PER-GPU-FAMILY ({family})", region, limit, used, extra)
        g = self.scenario.global_quotas.get(accelerators.GCP_ALL_REGIONS_METRIC)
        if g is not None and g.usage + self.all_regions_usage() + extra > g.limit:
            return shapes.quota_exceeded(
                accelerators.GCP_ALL_REGIONS_METRIC, "global", g.limit, g.usage + self.all_regions_usage(), extra)
        return None

    def stockout(self, zone: str, accelerator: str) -> dict[str, Any] | None:
        t = self.elapsed()
        for s in self.scenario.stockouts:
            if s.zone == zone and s.active(t, accelerator):
                return shapes.stockout_item(zone, self.scenario.project, s.with_details)
        return None

    # ---- node pools -------------------------------------------------------------------------
    def set_size(self, location: str, cluster: str, name: str, count: int) -> dict[str, Any]:
        """GKE nodePools.setSize. Returns the Operation JSON.

        Raises: SimHttpError (404 unknown pool, 400 bad count / running operation, 403 quota).
        """
        p = self.pool(location, cluster, name)
        project = self.scenario.project
        target = f"{shapes.CONTAINER}/projects/{project}/locations/{location}/clusters/{cluster}/nodePools/{name}"
        with self.lock:
            if count < 0 or count > p.spec.max_nodes:
                raise shapes.http_error(
                    400, f"nodeCount {count} is outside [0, {p.spec.max_nodes}] for node pool {name}.")
            if p.running_op:
                raise shapes.http_error(
                    400, f"Operation {p.running_op} is currently operating on node pool {name}. "
                    "Please wait and try again once it is done.", reason="conditionNotMet")
            op = shapes.container_operation(project, location, "SET_NODE_POOL_SIZE", target)
            self.gke_ops[op["name"]] = op
            delta = count - len(p.nodes)
            if delta > 0:
                acc = accelerators.get(p.spec.accelerator)
                err = self.quota_check(p.spec.region, p.spec.quota_metric, acc.gcp_gpu_family,
                                       float(delta * p.spec.gpus_per_node))
                if err is not None:
                    del self.gke_ops[op["name"]]
                    raise err
                item = self.stockout(p.spec.zone, p.spec.accelerator)
                if item is not None:
                    shapes.fail_container_operation(op, 503, [item])
                    return dict(op)
            p.target = count
            p.running_op = op["name"]
            self.op_exec.submit(self._converge, p, op)
            return dict(op)

    def _converge(self, p: PoolRuntime, op: dict[str, Any]) -> None:
        try:
            delta = p.target - len(p.nodes)
            if delta > 0:
                self._grow(p, delta)
            elif delta < 0:
                with self.lock:
                    victims = p.nodes[delta:]
                self._shrink(p, victims)
            with self.lock:
                shapes.finish_container_operation(op)
        except Exception as exc:  # noqa: BLE001 - surfaced in the Operation, like GKE does
            log.exception("setSize %s failed", p.spec.name)
            with self.lock:
                shapes.fail_container_operation(op, 500, [{"code": "INTERNAL_ERROR", "message": str(exc)}])
        finally:
            with self.lock:
                p.running_op = ""

    def _grow(self, p: PoolRuntime, n: int) -> None:
        requested = time.monotonic()  # boot latency runs from the request, as a VM's does
        with self.lock:
            names, delays = [], []
            for _ in range(n):
                names.append(f"gke-{self.scenario.cluster}-{p.spec.name}-{p.next_index:04d}")
                delays.append(round(p.spec.boot.sample(p.rng), 3))
                p.next_index += 1
            p.target = max(p.target, len(p.nodes) + n)
        def create(name: str, delay: float) -> None:
            # Registering the Node object itself takes time here (API calls); that time is part of the
            # sampled boot latency, not added to it: the node turns Ready at request + delay.
            left = max(0.0, delay - (time.monotonic() - requested))
            self.backend.create(p.spec, self.scenario.cluster, name, round(left, 3), sampled_s=delay)

        futures = [self.pool_exec.submit(create, name, delay) for name, delay in zip(names, delays, strict=True)]
        errors = []
        for name, fut in zip(names, futures, strict=True):
            try:
                fut.result()
                with self.lock:
                    p.nodes.append(name)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"{name}: {exc}")
        if errors:
            raise RuntimeError(f"{len(errors)} node(s) failed to register: {errors[0]}")

    def _shrink(self, p: PoolRuntime, victims: list[str]) -> None:
        futures = [self.pool_exec.submit(self.backend.delete, name) for name in victims]
        for fut in futures:
            fut.result()
        with self.lock:
            for name in victims:
                if name in p.nodes:
                    p.nodes.remove(name)

    def node_pool_json(self, p: PoolRuntime, location: str, cluster: str) -> dict[str, Any]:
        s = self.scenario
        acc = accelerators.get(p.spec.accelerator)
        base = f"{shapes.CONTAINER}/projects/{s.project}/locations/{location}/clusters/{cluster}"
        labels = {"cloud.google.com/gke-nodepool": p.spec.name, "cloud.google.com/gke-accelerator": acc.gke_label}
        if p.spec.spot:
            labels["cloud.google.com/gke-spot"] = "true"
        return {
            "name": p.spec.name,
            "config": {
                "machineType": p.spec.machine_type, "diskSizeGb": 100, "imageType": "COS_CONTAINERD",
                "accelerators": [{"acceleratorCount": str(p.spec.gpus_per_node), "acceleratorType": acc.gke_label}],
                "spot": p.spec.spot, "labels": labels, "resourceLabels": {"kfp_gpu_sim": "true"},
                "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}],
            },
            "initialNodeCount": p.spec.initial_size,
            "locations": [p.spec.zone],
            "autoscaling": {"enabled": False, "maxNodeCount": p.spec.max_nodes, "totalMaxNodeCount": p.spec.max_nodes},
            "selfLink": f"{base}/nodePools/{p.spec.name}",
            "instanceGroupUrls": [
                f"{shapes.COMPUTE}/projects/{s.project}/zones/{p.spec.zone}/instanceGroupManagers/{igm_name(cluster, p)}"
            ],
            "version": "1.30.5-gke.1000",
            "status": "RECONCILING" if p.running_op else "RUNNING",
        }

    def igm_json(self, zone: str, name: str) -> dict[str, Any]:
        """Compute instanceGroupManagers.get for a pool's managed instance group (targetSize)."""
        s = self.scenario
        for p in self.pools.values():
            if p.spec.zone == zone and igm_name(s.cluster, p) == name:
                with self.lock:
                    creating = max(0, p.target - len(p.nodes))
                    return {
                        "kind": "compute#instanceGroupManager", "id": shapes.next_id(), "name": name,
                        "zone": f"{shapes.COMPUTE}/projects/{s.project}/zones/{zone}",
                        "baseInstanceName": f"gke-{s.cluster}-{p.spec.name}", "targetSize": p.target,
                        "currentActions": {"creating": creating, "none": len(p.nodes)},
                        "status": {"isStable": not p.running_op},
                        "selfLink": f"{shapes.COMPUTE}/projects/{s.project}/zones/{zone}/instanceGroupManagers/{name}",
                    }
        raise shapes.compute_not_found(f"projects/{s.project}/zones/{zone}/instanceGroupManagers/{name}")

    def delete_instances(self, zone: str, igm: str, names: list[str]) -> dict[str, Any]:
        """Compute instanceGroupManagers.deleteInstances: remove specific nodes, shrinking the target.

        Raises: SimHttpError (404 unknown group, 400 a name that is not in the group).
        """
        s = self.scenario
        p = next((x for x in self.pools.values() if x.spec.zone == zone and igm_name(s.cluster, x) == igm), None)
        if p is None:
            raise shapes.compute_not_found(f"projects/{s.project}/zones/{zone}/instanceGroupManagers/{igm}")
        victims = [n.rsplit("/", 1)[-1] for n in names]
        with self.lock:
            missing = [v for v in victims if v not in p.nodes]
            if missing:
                raise shapes.http_error(400, f"Instances {missing} are not members of {igm}.", reason="invalid")
            p.target = max(0, p.target - len(victims))
        self._shrink(p, victims)
        target = f"{shapes.COMPUTE}/projects/{s.project}/zones/{zone}/instanceGroupManagers/{igm}"
        op = shapes.compute_operation(s.project, zone, "compute.instanceGroupManagers.deleteInstances", target)
        with self.lock:
            self.compute_ops[op["name"]] = op
        return op

    # ---- preemption -------------------------------------------------------------------------
    def preempt(self, node: str) -> dict[str, Any]:
        """Reclaim one spot node: taint, evict its pods, delete it, shrink its pool by one.

        Raises: SimHttpError 404 when no pool owns ``node``.
        """
        with self.lock:
            owner = next((p for p in self.pools.values() if node in p.nodes), None)
            if owner is None:
                raise shapes.http_error(404, f"node {node} is not owned by any simulated node pool")
            owner.nodes.remove(node)
            owner.target = max(0, owner.target - 1)
        self.backend.preempt(node)
        with self.lock:
            self.preempted.append(node)
        return {"node": node, "pool": owner.spec.name, "poolSize": owner.target}

    def preempt_pool(self, pool: str, count: int) -> list[str]:
        with self.lock:
            victims = list(reversed(self.pools[pool].nodes))[:count]
        return [self.preempt(n)["node"] for n in victims]

    def shutdown(self) -> None:
        self.op_exec.shutdown(wait=False, cancel_futures=True)
        self.pool_exec.shutdown(wait=False, cancel_futures=True)


def igm_name(cluster: str, p: PoolRuntime) -> str:
    return f"gke-{cluster}-{p.spec.name}-grp"
