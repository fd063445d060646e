"""Shared helpers for the train/recovery integration tests (no tests here).

* :class:`StepThread` runs ``train.run`` in a thread and keeps its result or error.
* :class:`Reprovisioner` is a stand-in for ``scale_up.reprovision``: it creates replacement KWOK nodes
  (spot in the original pool, on-demand in a ``-od`` pool) and returns their Capacity; :func:`reprovisioners` is
  the body of a fixture that hands them out per pool and deletes their nodes after the test.
* :func:`preempt` reclaims a node the way the GKE stand-in does (notice, kill, delete).
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.rest import ApiException

from kfp_gpu import ownership
from kfp_gpu.cluster import pytorchjob
from kfp_gpu.job import JobTemplate
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Recovery, Target
from kfp_gpu.steps import train
from kfp_gpu.steps.capacity import Capacity, Placement
from kfp_gpu.steps.result import StepResult
from kfp_gpu_rehearsal.devcluster.nodes import make_gpu_node
from tests.waiting import wait_until as _wait_until

ACCEL, ACCEL_LABEL, ZONE = "h100-80gb", "nvidia-h100-80gb", "us-central1-a"
IMPENDING = "cloud.google.com/impending-node-termination"


wait_until = functools.partial(_wait_until, every=0.1)


def make_spec(namespace: str, ckpt: Path, *, nodes: int = 4, spot: bool = True, **recovery: int) -> ProvisioningSpec:
    return ProvisioningSpec(
        accelerator=ACCEL, nodes=nodes, gpus_per_node=8,
        capacity=CapacityType.SPOT if spot else CapacityType.ON_DEMAND,
        target=Target(namespace=namespace), checkpoint_uri=str(ckpt), recovery=Recovery(**recovery),
    )


def make_capacity(run_id: str, pool: str, names: list[str], *, spot: bool = True) -> Capacity:
    return Capacity(run_id, (Placement(pool, ZONE, tuple(names)),), 8, ACCEL_LABEL, spot=spot)


def job_json(seconds: float, name: str = "train") -> str:
    """A job whose pods KWOK keeps Running for ``seconds`` (the scenario's sim-duration annotation)."""
    return JobTemplate(name=name, image="busybox", command=("true",), checkpoint_every=10,
                       annotations={pytorchjob.SIM_DURATION_ANNOTATION: f"{seconds:g}s"}).to_json()


@dataclass
class Reprovisioner:
    """Creates ``lost`` replacement KWOK nodes; records every call. Stand-in for scale_up.reprovision."""

    core: client.CoreV1Api
    pool: str
    created: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, spec: ProvisioningSpec, run_id: str, api: Any, provider: Any, *, lost: int,
                 zone_hint: str, on_demand: bool) -> Capacity:
        pool = f"{self.pool}-od" if on_demand else self.pool
        zone = zone_hint or ZONE
        names = [f"{pool}-r{uuid.uuid4().hex[:5]}" for _ in range(lost)]
        for n in names:
            self.core.create_node(make_gpu_node(n, pool, ACCEL_LABEL, zone, gpus=spec.gpus_per_node,
                                                spot=not on_demand))
            self.created.append(n)
        self.calls.append({"lost": lost, "zone_hint": zone_hint, "on_demand": on_demand, "nodes": names})
        return Capacity(run_id, (Placement(pool, zone, tuple(names)),), spec.gpus_per_node, ACCEL_LABEL,
                        spot=not on_demand)

    def cleanup(self) -> None:
        for n in self.created:
            try:
                self.core.delete_node(n)
            except ApiException as e:
                if e.status != 404:
                    raise


R = TypeVar("R", bound=Reprovisioner)


def reprovisioners(make: Callable[[str], R]) -> Iterator[Callable[[str], R]]:
    """Fixture body: yields ``make`` (pool -> Reprovisioner), then cleans up the nodes of every one it made."""
    made: list[R] = []

    def track(pool: str) -> R:
        made.append(make(pool))
        return made[-1]

    yield track
    for r in made:
        r.cleanup()


class StepThread(threading.Thread):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(daemon=True)
        self.kwargs = kwargs
        self.result: StepResult | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = train.run(**self.kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def outcome(self, timeout: float) -> StepResult:
        self.join(timeout)
        assert not self.is_alive(), f"train step still running after {timeout}s"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def job_pods(core: client.CoreV1Api, namespace: str, job: str) -> list[client.V1Pod]:
    return list(core.list_namespaced_pod(namespace, label_selector=f"{ownership.JOB_LABEL}={job}").items)


def running_pods(core: client.CoreV1Api, namespace: str, job: str, n: int) -> list[client.V1Pod]:
    pods = [p for p in job_pods(core, namespace, job)
            if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
    return pods if len(pods) >= n else []


def preempt(kubeconfig: Path, core: client.CoreV1Api, node: str) -> float:
    """Reclaim ``node`` like GCE reclaims a spot VM. Returns the time of the first disruptive call."""
    t0 = time.time()
    try:
        from kfp_gpu_rehearsal.sim.kube import KubeBackend
    except ImportError:  # the stand-in is not there: same calls by hand
        n = core.read_node(node)
        taints = [{"key": t.key, "value": t.value, "effect": t.effect} for t in (n.spec.taints or [])]
        taints.append({"key": IMPENDING, "value": "true", "effect": "NoSchedule"})
        core.patch_node(node, {"spec": {"unschedulable": True, "taints": taints}})
        for p in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items:
            body = client.V1Eviction(metadata=client.V1ObjectMeta(name=p.metadata.name,
                                                                  namespace=p.metadata.namespace))
            core.create_namespaced_pod_eviction(p.metadata.name, p.metadata.namespace, body)
        core.delete_node(node, grace_period_seconds=0)
        return t0
    KubeBackend(str(kubeconfig)).preempt(node)
    return t0


def swapped_after_two_stalls(out: dict[str, Any], bad: str, first: list[str]) -> tuple[str, list[str]]:
    """Check a train outcome of a rank that hung twice on ``bad``: the run succeeded, both stalls named ``bad`` as
    the first to stop, only the second cordoned it, without giving its slot back (a backend that cannot release one
    node), and one new node (not of ``first``, the gang at start) replaced it. Returns the new node and the final
    gang."""
    assert out["status"] == "Succeeded", out
    first_stall, second_stall = out["ledger"]["stalls"]
    assert set(first_stall["first_stopped_nodes"].values()) == {bad} == set(second_stall["first_stopped_nodes"].values())
    assert "cordoned" not in first_stall and second_stall["cordoned"] == [bad], second_stall
    assert second_stall["slot_released"] is False, second_stall
    (new,) = second_stall["replacement_nodes"]
    assert bad in first and new not in first, (first, new)
    final = [n for p in out["capacity"]["placements"] for n in p["nodes"]]
    assert bad not in final and new in final, final
    return new, final
