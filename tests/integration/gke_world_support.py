"""Shared setup of the tests that run a GKE stand-in of their own on the shared control plane (one implementation per
mechanism, for test setup too):

* :class:`GkeWorlds`: stand-ins started for one test, each with its own cluster name (label
  ``kfp-gpu.io/sim-cluster``), ``n`` Ready spot nodes of ``POOL``; ``stop()`` stops them and deletes their Nodes
  (tests/integration/test_spot_rank_loss.py, test_stall_hang.py, test_kueue_stall.py, test_notice_faults.py).
* :func:`default_world`: the default scenario (kfp_gpu_rehearsal/sim/scenarios/default.yaml) with fast lognormal boots, as a
  fixture body (test_recovery_e2e.py, test_health_e2e.py).
* :func:`gang_manifest`, :func:`operator_restarts`, :func:`create_pytorchjob`, :func:`ranks_running`: a plain
  PyTorchJob (no kfp-gpu) of 8-GPU ranks pinned to the world's nodes, the baseline of the fault tests.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kfp_gpu.cluster import podtemplate, pytorchjob
from kfp_gpu.job import JobTemplate
from kfp_gpu.ownership import Owner
from kfp_gpu.providers.base import PoolRef
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu.steps.capacity import Capacity, Placement
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim import SimServer, from_dict
from tests.integration.standin_support import serving
from tests.integration.test_train_support import wait_until
from tests.sim._helpers import PROJECT, REGION, scenario

ROOT = Path(__file__).resolve().parents[2]
POOL, ZONE = "h100-80gb-spot-a", "us-central1-a"
JOB_NAME = "training.kubeflow.org/job-name"


def ready_gpu_nodes(kube: Kube, cluster: str) -> list[str]:
    """The world's Nodes that are Ready with 8 allocatable GPUs (the device plugin has reported)."""
    return [n.metadata.name for n in kube.core.list_node(label_selector=f"kfp-gpu.io/sim-cluster={cluster}").items
            if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
            and (n.status.allocatable or {}).get("nvidia.com/gpu") == "8"]


def delete_world_nodes(kube: Kube, cluster: str) -> None:
    for node in kube.core.list_node(label_selector=f"kfp-gpu.io/sim-cluster={cluster}").items:
        try:
            kube.core.delete_node(node.metadata.name)
        except ApiException as e:
            if e.status != 404:
                raise


class GkeWorlds:
    """GKE stand-ins started for one test (``scenario`` of tests/sim/_helpers.py, no API errors, fixed boots)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.started: list[tuple[SimServer, str]] = []

    def make(self, n: int, owner: Owner, *, boot_s: float, **scenario_kw: Any) -> tuple[SimServer, GkeProvider,
                                                                                          list[str]]:
        """A stand-in whose pools boot in ``boot_s`` (world seconds), with ``n`` Ready spot nodes of ``POOL`` owned by
        ``owner``: (server, provider, sorted node names)."""
        name = f"s{uuid.uuid4().hex[:6]}"
        data = scenario(cluster=name, api={"error_rate": 0.0}, **scenario_kw)
        for p in data["pools"]:
            p["boot"] = {"dist": "fixed", "median_s": boot_s}
        sim = SimServer(from_dict(data), str(self.kube.kubeconfig))
        sim.start()
        self.started.append((sim, name))
        prov = GkeProvider(PROJECT, REGION, name, endpoint=sim.url)
        if not n:
            return sim, prov, []
        prov.resize(PoolRef(POOL, ZONE), n, owner)
        nodes = wait_until(f"{n} Ready spot nodes", lambda: (ns := ready_gpu_nodes(self.kube, name)) and len(ns) == n
                           and ns, timeout=60)
        return sim, prov, sorted(nodes)

    def stop(self) -> None:
        for sim, name in self.started:
            sim.stop()
            delete_world_nodes(self.kube, name)


def default_world(kube: Kube, **overrides: Any) -> Iterator[SimServer]:
    """Fixture body: the default scenario under a fresh cluster name, pools booting in ~0.3 s (lognormal, seeded),
    ``overrides`` set on the scenario (e.g. ``gpu_faults``); afterwards the server stops and its Nodes go."""
    cluster = f"c{uuid.uuid4().hex[:6]}"
    data: dict[str, Any] = yaml.safe_load((ROOT / "kfp_gpu_rehearsal/sim/scenarios/default.yaml").read_text())
    data["cluster"] = cluster
    for i, p in enumerate(data["pools"]):
        p["boot"] = {"dist": "lognormal", "median_s": 0.3, "sigma": 0.3, "seed": i}
    data.update(overrides)
    yield from serving(SimServer(from_dict(data), kube.kubeconfig), kube, cluster)


def gang_manifest(name: str, namespace: str, nodes: list[str], template: JobTemplate,
                  checkpoint_uri: str = "") -> dict[str, Any]:
    """A PyTorchJob without kfp-gpu: one 8-GPU rank on each of ``nodes`` (spot nodes of ``POOL``)."""
    cap = Capacity(name, (Placement(POOL, ZONE, tuple(nodes)),), 8, "nvidia-h100-80gb", spot=True,
                   namespace=namespace)
    body = pytorchjob.manifest(name, capacity=cap, template=template, labels={}, nodes=len(nodes),
                               checkpoint_uri=checkpoint_uri, run_id=name)
    pin = {"nodeAffinity": podtemplate.node_affinity({}, nodes)}  # no claims here: pinned by name
    for replica in body["spec"]["pytorchReplicaSpecs"].values():
        replica["template"]["spec"]["affinity"] = pin
    return body


def operator_restarts(body: dict[str, Any], on_failure: bool = True) -> dict[str, Any]:
    """The Training Operator restarts the job's failed pods: backoffLimit 10, restartPolicy OnFailure if asked."""
    body["spec"]["runPolicy"]["backoffLimit"] = 10
    if on_failure:
        for r in body["spec"]["pytorchReplicaSpecs"].values():
            r["restartPolicy"] = "OnFailure"
    return body


def create_pytorchjob(kube: Kube, namespace: str, body: dict[str, Any]) -> None:
    kube.custom.create_namespaced_custom_object(pytorchjob.GROUP, pytorchjob.VERSION, namespace, pytorchjob.PLURAL,
                                                body)


def pods_by_node(core: client.CoreV1Api, namespace: str, job: str) -> dict[str, Any]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"{JOB_NAME}={job}").items
    return {p.spec.node_name: p for p in pods if p.spec.node_name}


def ranks_running(kube: Kube, namespace: str, job: str) -> dict[str, Any]:
    """Waits (60 s) until the job's 4 ranks are Running: {node: pod}."""
    def running() -> dict[str, Any]:
        m = pods_by_node(kube.core, namespace, job)
        return m if len([p for p in m.values() if p.status.phase == "Running"]) == 4 else {}

    placed: dict[str, Any] = wait_until("4 ranks Running", running, timeout=60)
    return placed
