"""The stand-in's read views of its node pools and their managed instance groups, as the GKE and Compute REST
APIs render them (nodePools.get/list, instanceGroupManagers.get/aggregatedList/listErrors/listManagedInstances).

Contract: :class:`PoolViews` is mixed into :class:`~kfp_gpu_rehearsal.sim.state.SimState`; its methods only read
the world (under its lock) and return JSON-ready dicts shaped like the real resources; an unknown group is a
Compute 404 (:func:`kfp_gpu_rehearsal.sim.shapes.compute_not_found`). A pool's instance group is named
:func:`igm_name` (``gke-<cluster>-<pool>-grp``), as GKE names the groups it creates.

https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters.nodePools
https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers
"""

from __future__ import annotations

import threading
from typing import Any

from kfp_gpu import accelerators
from kfp_gpu_rehearsal.sim import reservations as rsv
from kfp_gpu_rehearsal.sim import shapes
from kfp_gpu_rehearsal.sim.mig import BOOTING, CREATING, DELETING, NOTICE, RUNNING, PoolRuntime, World
from kfp_gpu_rehearsal.sim.scenario import Scenario
from kfp_gpu_rehearsal.sim.topology import placement_policy_name

__all__ = ["PoolViews", "igm_name"]


class PoolViews:
    """Needs the world's ``scenario``, ``lock``, ``pools`` and ``world`` (SimState sets them)."""

    scenario: Scenario
    lock: threading.RLock
    pools: dict[str, PoolRuntime]
    world: World

    def igm_names(self) -> list[tuple[str, str]]:
        """(zone, group name) of every managed instance group, sorted (aggregatedList's order)."""
        with self.lock:
            return sorted((p.spec.zone, igm_name(self.scenario.cluster, p)) for p in self.pools.values())

    def _igm_pool(self, zone: str, igm: str) -> PoolRuntime:
        s = self.scenario
        for p in self.pools.values():
            if p.spec.zone == zone and igm_name(s.cluster, p) == igm:
                return p
        raise shapes.compute_not_found(f"projects/{s.project}/zones/{zone}/instanceGroupManagers/{igm}")

    def igm_errors(self, zone: str, igm: str) -> list[dict[str, Any]]:
        """instanceGroupManagers.listErrors items, oldest first: one per failed VM creation/recreation.

        Raises: SimHttpError 404 for an unknown group.
        """
        p = self._igm_pool(zone, igm)
        with self.lock:
            return [dict(e) for e in p.errors]

    def igm_instances(self, zone: str, igm: str) -> list[dict[str, Any]]:
        """instanceGroupManagers.listManagedInstances items. Raises: SimHttpError 404 for an unknown group."""
        p = self._igm_pool(zone, igm)
        with self.lock:
            return self.world.managed_instances(p)

    def node_pool_json(self, p: PoolRuntime, location: str, cluster: str) -> dict[str, Any]:
        s = self.scenario
        acc = accelerators.get(p.spec.accelerator)
        base = f"{shapes.CONTAINER}/projects/{s.project}/locations/{location}/clusters/{cluster}"
        labels = {"cloud.google.com/gke-nodepool": p.spec.name, "cloud.google.com/gke-accelerator": acc.gke_label}
        if p.spec.spot:
            labels["cloud.google.com/gke-spot"] = "true"
        config = {
            "machineType": p.spec.machine_type, "diskSizeGb": 100, "imageType": "COS_CONTAINERD",
            "accelerators": [{"acceleratorCount": str(p.spec.gpus_per_node), "acceleratorType": acc.gke_label}],
            "spot": p.spec.spot, "labels": labels, "resourceLabels": {"kfp_gpu_sim": "true"},
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}],
        }
        affinity = rsv.affinity_json(p.spec)
        if affinity is not None:
            config["reservationAffinity"] = affinity
        extra: dict[str, Any] = {"placementPolicy": {"type": p.spec.placement}} if p.spec.placement else {}
        if p.spec.placement_max_distance:  # a named Compute Engine policy with a max distance
            extra["placementPolicy"]["policyName"] = placement_policy_name(p.spec.name)
        return {**extra,
            "name": p.spec.name,
            "config": config,
            "initialNodeCount": p.spec.initial_size,
            "locations": [p.spec.zone],
            "autoscaling": shapes.autoscaling_json(p.spec),
            "selfLink": f"{base}/nodePools/{p.spec.name}",
            "instanceGroupUrls": [
                f"{shapes.COMPUTE}/projects/{s.project}/zones/{p.spec.zone}/instanceGroupManagers/{igm_name(cluster, p)}"
            ],
            "version": "1.30.5-gke.1000",
            "status": "RECONCILING" if p.running_op else "RUNNING",
        }

    def igm_json(self, zone: str, name: str) -> dict[str, Any]:
        """Compute instanceGroupManagers.get: targetSize, currentActions, status.isStable."""
        s = self.scenario
        p = self._igm_pool(zone, name)
        with self.lock:
            actions = {
                "creating": p.count(CREATING, BOOTING, recreate=False),
                "recreating": p.count(CREATING, BOOTING, recreate=True),
                "deleting": p.count(DELETING), "none": p.count(RUNNING, NOTICE),
                "abandoning": 0, "creatingWithoutRetries": 0, "refreshing": 0, "restarting": 0,
                "resuming": 0, "starting": 0, "stopping": 0, "suspending": 0, "verifying": 0,
            }
            stable = not p.running_op and actions["none"] == len(p.instances)
            return {
                "kind": "compute#instanceGroupManager", "id": shapes.next_id(), "name": name,
                "zone": f"{shapes.COMPUTE}/projects/{s.project}/zones/{zone}",
                "baseInstanceName": f"gke-{s.cluster}-{p.spec.name}", "targetSize": p.target,
                "currentActions": actions, "status": {"isStable": stable},
                "selfLink": f"{shapes.COMPUTE}/projects/{s.project}/zones/{zone}/instanceGroupManagers/{name}",
            }


def igm_name(cluster: str, p: PoolRuntime) -> str:
    return f"gke-{cluster}-{p.spec.name}-grp"
