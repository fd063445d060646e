"""The GKE stand-in serves queued-provisioning.gke.io ProvisioningRequests as GKE does (docs/sim.md, section 12).

Real API server + KWOK + scheduler; the PodTemplates, requests and pods are created here with the plain kubernetes
client, as a user (or Kueue) would. Scenario times are real-world seconds (booking 600 s = 5 s here).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kfp_gpu_rehearsal.sim import scenario as scenario_mod
from kfp_gpu_rehearsal.sim.server import SimServer
from tests.waiting import wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
CRD = "provisioningrequests.autoscaling.x-k8s.io"
GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"
POOL = "h100-dws-a"
CLASS = "queued-provisioning.gke.io"


def _ensure_crd(api: client.ApiClient) -> None:
    """`devcluster up` (the kube fixture) installs the v1 CRD; it must be established."""
    ext = client.ApiextensionsV1Api(api)
    wait_until("ProvisioningRequest CRD established", lambda: any(
        c.type == "Established" and c.status == "True"
        for c in ext.read_custom_resource_definition(CRD).status.conditions or []), timeout=30)


def _scenario(cluster: str, **dws: Any) -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "kfp_gpu_rehearsal/sim/scenarios/default.yaml").read_text())
    data["cluster"] = cluster
    data["api"] = {"error_rate": 0.0}
    data["pools"].append({"name": POOL, "zone": "us-central1-a", "accelerator": "h100-80gb", "gpus_per_node": 8,
                          "max_nodes": 4, "queued_provisioning": True, "autoscaling": {"enabled": True},
                          "boot": {"dist": "lognormal", "median_s": 60, "sigma": 0.3, "seed": 1}})
    data["dws"] = {"accept_s": 10, "queue": {"dist": "fixed", "median_s": 60}, "booking_s": 600, **dws}
    return data


@pytest.fixture
def sims(kube: Any) -> Iterator[Any]:
    """make(data) -> SimServer on the shared cluster; stops them and deletes their leftover nodes."""
    _ensure_crd(kube.api)
    made: list[SimServer] = []

    def make(data: dict[str, Any]) -> SimServer:
        sim = SimServer(scenario_mod.from_dict(copy.deepcopy(data)), kube.kubeconfig)
        sim.start()
        made.append(sim)
        return sim

    yield make
    core = client.CoreV1Api(kube.api)
    for sim in made:
        sim.stop()
        for n in core.list_node(label_selector=f"kfp-gpu.io/sim-cluster={sim.scenario.cluster}").items:
            core.delete_node(n.metadata.name)


def _create(api: client.ApiClient, ns: str, name: str, cluster: str, count: int = 2, **params: str) -> None:
    client.CoreV1Api(api).create_namespaced_pod_template(ns, {
        "metadata": {"name": f"{name}-tmpl"},
        "template": {"spec": {
            "nodeSelector": {"cloud.google.com/gke-nodepool": POOL, "kfp-gpu.io/sim-cluster": cluster},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"},
                            {"key": "cloud.google.com/gke-queued", "operator": "Exists"}],
            "containers": [{"name": "w", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        }},
    })
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProvisioningRequest", "metadata": {"name": name},
        "spec": {"provisioningClassName": CLASS, "parameters": params,
                 "podSets": [{"count": count, "podTemplateRef": {"name": f"{name}-tmpl"}}]},
    })


def _cond(api: client.ApiClient, ns: str, name: str, ctype: str) -> dict[str, Any] | None:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


def _true(api: client.ApiClient, ns: str, name: str, ctype: str) -> dict[str, Any] | None:
    c = _cond(api, ns, name, ctype)
    return c if c is not None and c["status"] == "True" else None


def _nodes(api: client.ApiClient, cluster: str) -> list[client.V1Node]:
    return client.CoreV1Api(api).list_node(label_selector=f"kfp-gpu.io/sim-cluster={cluster}").items


def _ready_gpu(n: client.V1Node) -> bool:
    ready = any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
    return ready and (n.status.allocatable or {}).get("nvidia.com/gpu") == "8"


def test_accepted_then_provisioned_ready_nodes_then_unconsumed_booking_expires(kube: Any, namespace: str,
                                                                               sims: Any) -> None:
    mine, other = f"d{uuid.uuid4().hex[:6]}", f"o{uuid.uuid4().hex[:6]}"
    sim = sims(_scenario(mine))
    bystander = sims(_scenario(other))  # same queued pool names, another cluster: must leave the request alone
    _create(kube.api, namespace, "train", mine, maxRunDurationSeconds="3600")
    acc = wait_until("Accepted", lambda: _true(kube.api, namespace, "train", "Accepted"), timeout=20)
    assert acc["reason"] == "SuccessfullyQueued" and acc["observedGeneration"] == 1
    prov = wait_until("Provisioned", lambda: _true(kube.api, namespace, "train", "Provisioned"), timeout=30)
    assert prov["reason"] == "Provisioned"
    nodes = _nodes(kube.api, mine)
    assert len(nodes) == 2 and all(_ready_gpu(n) for n in nodes), [n.metadata.name for n in nodes]
    for n in nodes:
        assert n.metadata.labels["cloud.google.com/gke-nodepool"] == POOL
        assert n.metadata.labels["autoscaling.gke.io/provisioning-request"]
        assert any(t.key == "cloud.google.com/gke-queued" and t.effect == "NoSchedule" for t in n.spec.taints or [])
    assert _nodes(kube.api, other) == [] and bystander.provisioning_requests() == {}
    exp = wait_until("BookingExpired", lambda: _true(kube.api, namespace, "train", "BookingExpired"), timeout=20)
    assert exp["reason"] == "BookingExpired"
    wait_until("unconsumed nodes removed", lambda: _nodes(kube.api, mine) == [], timeout=20)
    assert sim.nodes(POOL) == []


def _consumer(api: client.ApiClient, ns: str, name: str, request: str, cluster: str) -> None:
    client.CoreV1Api(api).create_namespaced_pod(ns, {
        "metadata": {"name": name, "annotations": {"autoscaling.x-k8s.io/consume-provisioning-request": request,
                                                   "autoscaling.x-k8s.io/provisioning-class-name": CLASS}},
        "spec": {"nodeSelector": {"cloud.google.com/gke-nodepool": POOL, "kfp-gpu.io/sim-cluster": cluster},
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"},
                                 {"key": "cloud.google.com/gke-queued", "operator": "Exists"}],
                 "containers": [{"name": "w", "image": "busybox",
                                 "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
    })


def test_consumed_nodes_outlive_the_booking_then_revocation_removes_them(kube: Any, namespace: str,
                                                                         sims: Any) -> None:
    cluster = f"d{uuid.uuid4().hex[:6]}"
    sim = sims(_scenario(cluster))
    _create(kube.api, namespace, "job", cluster)
    for i in range(2):  # created with the request, pending until the nodes exist (as a gang would be)
        _consumer(kube.api, namespace, f"worker-{i}", "job", cluster)
    wait_until("Provisioned", lambda: _true(kube.api, namespace, "job", "Provisioned"), timeout=30)
    core = client.CoreV1Api(kube.api)
    wait_until("workers bound", lambda: all(
        core.read_namespaced_pod(f"worker-{i}", namespace).spec.node_name for i in range(2)), timeout=20)
    wait_until("BookingExpired", lambda: _true(kube.api, namespace, "job", "BookingExpired"), timeout=20)
    assert len(_nodes(kube.api, cluster)) == 2  # consumed: not scaled down
    revoked = sim.revoke_provisioning(namespace, "job")
    assert len(revoked) == 2
    rev = wait_until("CapacityRevoked", lambda: _true(kube.api, namespace, "job", "CapacityRevoked"), timeout=10)
    assert rev["reason"] == "CapacityRevoked"
    wait_until("revoked nodes removed", lambda: _nodes(kube.api, cluster) == [], timeout=20)


def test_stocked_out_queued_pool_fails_after_the_wait_time(kube: Any, namespace: str, sims: Any) -> None:
    cluster = f"d{uuid.uuid4().hex[:6]}"
    data = _scenario(cluster, queue_timeout_s=600)
    data["stockouts"] = [{"zone": "us-central1-a", "window": "always"}]
    sims(data)
    _create(kube.api, namespace, "starved", cluster)
    wait_until("Accepted", lambda: _true(kube.api, namespace, "starved", "Accepted"), timeout=20)
    failed = wait_until("Failed", lambda: _true(kube.api, namespace, "starved", "Failed"), timeout=30)
    assert failed["reason"] == "WaitTimeExceeded"
    assert _cond(kube.api, namespace, "starved", "Provisioned") is None and _nodes(kube.api, cluster) == []
