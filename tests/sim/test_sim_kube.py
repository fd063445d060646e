"""The stand-in driving the real local control plane: setSize -> KWOK Nodes, stockouts, preemption."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import watch
from kubernetes.client.rest import ApiException

from kfp_gpu.devcluster.client import Kube
from kfp_gpu.errors import CapacityUnavailable, Scope
from kfp_gpu.providers.base import OpStatus, Owner, PoolRef
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu.sim import SimServer, from_dict
from tests.integration.conftest import kube, namespace  # noqa: F401 - fixtures
from tests.sim._helpers import PROJECT, REGION, scenario
from tests.waiting import wait_until

pytestmark = pytest.mark.integration
OWNER = Owner("run-int", "scale-up", 2_000_000_000.0)
SIM_CLUSTER_LABEL = "kfp-gpu.io/sim-cluster"


@pytest.fixture
def cluster_sim(kube: Kube) -> Iterator[Callable[..., tuple[SimServer, GkeProvider]]]:  # noqa: F811
    """Factory: a stand-in with a unique cluster name (so node names never collide) on the dev cluster."""
    started: list[tuple[SimServer, str]] = []

    def make(**overrides: Any) -> tuple[SimServer, GkeProvider]:
        name = f"t{uuid.uuid4().hex[:6]}"
        data = scenario(cluster=name, **overrides)
        for p in data["pools"]:
            p["boot"] = {"dist": "fixed", "median_s": 0.5}
        sim = SimServer(from_dict(data), str(kube.kubeconfig))
        sim.start()
        started.append((sim, name))
        return sim, GkeProvider(PROJECT, REGION, name, endpoint=sim.url)

    yield make
    for sim, name in started:
        sim.stop()
        for n in kube.core.list_node(label_selector=f"{SIM_CLUSTER_LABEL}={name}").items:
            try:
                kube.core.delete_node(n.metadata.name)
            except ApiException as e:
                if e.status != 404:
                    raise


def _nodes(kube: Kube, cluster: str, pool: str) -> list[Any]:  # noqa: F811
    sel = f"{SIM_CLUSTER_LABEL}={cluster},cloud.google.com/gke-nodepool={pool}"
    return list(kube.core.list_node(label_selector=sel).items)


def _ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))


def _until_done(p: GkeProvider, op: Any) -> Any:
    return wait_until("operation DONE", lambda: (o := p.operation(op)).done and o)


def test_set_size_produces_ready_gpu_nodes(kube: Kube, cluster_sim: Any) -> None:  # noqa: F811
    sim, p = cluster_sim()
    op = _until_done(p, p.resize(PoolRef("l4-spot-b", "us-central1-b"), 3, OWNER))
    assert op.status is OpStatus.DONE and op.error is None
    nodes = wait_until("3 Ready nodes", lambda: (ns := _nodes(kube, p.cluster, "l4-spot-b")) and
                       len([n for n in ns if _ready(n)]) == 3 and ns)
    n = nodes[0]
    labels = n.metadata.labels
    assert labels["cloud.google.com/gke-accelerator"] == "nvidia-l4"
    assert labels["topology.kubernetes.io/zone"] == "us-central1-b"
    assert labels["topology.kubernetes.io/region"] == REGION
    assert labels["node.kubernetes.io/instance-type"] == "g2-standard-4"
    assert labels["cloud.google.com/gke-spot"] == "true"
    assert n.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
    # The whole sampled boot latency counts from the setSize request; the Node carries the sample and
    # what was left of it when the Node object was registered.
    assert n.metadata.annotations["kfp-gpu.io/boot-sample"] == "0.5"
    left = float(n.metadata.annotations["kfp-gpu.io/boot-delay"].rstrip("s"))
    assert 0.0 < left <= 0.5
    assert n.status.allocatable["nvidia.com/gpu"] == "1"
    assert any(t.key == "nvidia.com/gpu" and t.effect == "NoSchedule" for t in n.spec.taints)
    assert sorted(x.metadata.name for x in nodes) == sorted(sim.nodes("l4-spot-b"))
    _until_done(p, p.resize(PoolRef("l4-spot-b", "us-central1-b"), 1, OWNER))
    left = _nodes(kube, p.cluster, "l4-spot-b")
    assert [x.metadata.name for x in left] == [f"gke-{p.cluster}-l4-spot-b-0000"]


def test_many_nodes_register_concurrently(kube: Kube, cluster_sim: Any) -> None:  # noqa: F811
    sim, p = cluster_sim()
    t0 = time.monotonic()
    _until_done(p, p.resize(PoolRef("l4-c", "us-central1-c"), 64, OWNER))
    elapsed = time.monotonic() - t0
    assert len(_nodes(kube, p.cluster, "l4-c")) == 64
    assert elapsed < 30, f"64 nodes took {elapsed:.1f}s to register"


def test_stockout_surfaces_through_the_google_client(kube: Kube, cluster_sim: Any) -> None:  # noqa: F811
    sim, p = cluster_sim(stockouts=[{"zone": "us-central1-f", "window": "always"}])
    with pytest.raises(CapacityUnavailable) as info:
        p.resize(PoolRef("a100-80gb-f", "us-central1-f"), 2, OWNER)
    assert info.value.scope is Scope.ZONE and info.value.fields["zone"] == "us-central1-f"
    assert _nodes(kube, p.cluster, "a100-80gb-f") == []
    assert p.pool(PoolRef("a100-80gb-f", "us-central1-f")).size == 0


def test_preemption_evicts_pods_and_removes_the_node(
    kube: Kube, namespace: str, cluster_sim: Any,  # noqa: F811
) -> None:
    sim, p = cluster_sim()
    _until_done(p, p.resize(PoolRef("h100-80gb-spot-a", "us-central1-a"), 1, OWNER))
    node = wait_until("Ready node", lambda: [n for n in _nodes(kube, p.cluster, "h100-80gb-spot-a") if _ready(n)])[0]
    name = node.metadata.name
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer", "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": name},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "busybox",
                            "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        },
    }
    kube.core.create_namespaced_pod(namespace, pod)
    wait_until("pod Running", lambda: kube.core.read_namespaced_pod("trainer", namespace).status.phase == "Running")
    seen: list[str] = []

    def watch_pod() -> None:
        w = watch.Watch()
        for ev in w.stream(kube.core.list_namespaced_pod, namespace, field_selector="metadata.name=trainer",
                           timeout_seconds=30):
            obj = ev["object"]
            seen.extend(c.type for c in (obj.status.conditions or []))
            if ev["type"] == "DELETED" or "DisruptionTarget" in seen:
                w.stop()

    watcher = threading.Thread(target=watch_pod, daemon=True)
    watcher.start()
    time.sleep(0.3)
    out = sim.preempt(name)
    assert out == {"node": name, "pool": "h100-80gb-spot-a", "poolSize": 0}
    watcher.join(timeout=30)
    assert "DisruptionTarget" in seen, seen
    wait_until("node deleted", lambda: not _nodes(kube, p.cluster, "h100-80gb-spot-a"))
    assert sim.nodes("h100-80gb-spot-a") == []
    assert p.pool(PoolRef("h100-80gb-spot-a", "us-central1-a")).size == 0
