"""The stand-in driving the real local control plane: setSize -> KWOK Nodes (registered at boot, GPUs
after the device plugin), stockouts, preemption with notice and same-name recreation."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import watch
from kubernetes.client.rest import ApiException

from kfp_gpu.errors import CapacityUnavailable, Scope
from kfp_gpu.ownership import Owner
from kfp_gpu.providers.base import OpStatus, PoolRef
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim import SimServer, from_dict
from kfp_gpu_rehearsal.sim.clock import compress
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
        data = scenario(**{"cluster": name, "api": {"error_rate": 0.0}, **overrides})
        for p in data["pools"]:
            p["boot"] = {"dist": "fixed", "median_s": 60}  # real-world seconds: 0.5 s here
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
    t0 = time.monotonic()
    op = _until_done(p, p.resize(PoolRef("l4-spot-b", "us-central1-b"), 3, OWNER))
    assert op.status is OpStatus.DONE and op.error is None
    nodes = wait_until("3 Ready nodes with their GPU", lambda: (ns := _nodes(kube, p.cluster, "l4-spot-b")) and
                       len([n for n in ns if _ready(n) and n.status.allocatable["nvidia.com/gpu"] == "1"]) == 3
                       and ns)
    n = nodes[0]
    labels = n.metadata.labels
    assert labels["cloud.google.com/gke-accelerator"] == "nvidia-l4"
    assert labels["topology.kubernetes.io/zone"] == "us-central1-b"
    assert labels["topology.kubernetes.io/region"] == REGION
    assert labels["node.kubernetes.io/instance-type"] == "g2-standard-4"
    assert labels["cloud.google.com/gke-spot"] == "true"
    assert n.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
    # The Node registers when its VM has booted: the whole latency from the setSize request (operation
    # PENDING + the creation attempt + the sampled boot) is on the Node, and it cannot be shorter than
    # the boot sample itself.
    for x in nodes:
        sample = float(x.metadata.annotations["kfp-gpu.io/boot-sample"])
        assert compress(60) <= sample <= time.monotonic() - t0, sample
    assert any(t.key == "nvidia.com/gpu" and t.effect == "NoSchedule" for t in n.spec.taints)
    assert sorted(x.metadata.name for x in nodes) == sorted(sim.nodes("l4-spot-b"))
    _until_done(p, p.resize(PoolRef("l4-spot-b", "us-central1-b"), 1, OWNER))
    left = wait_until("1 node left", lambda: (ns := _nodes(kube, p.cluster, "l4-spot-b")) and len(ns) == 1 and ns)
    assert [x.metadata.name for x in left] == [f"gke-{p.cluster}-l4-spot-b-0000"]


def test_gpus_become_allocatable_only_after_the_device_plugin(kube: Kube, cluster_sim: Any) -> None:  # noqa: F811
    sim, p = cluster_sim(device_plugin_s=240)  # 2 s here
    seen: list[str] = []
    registered = threading.Event()

    def watch_nodes() -> None:
        w = watch.Watch()
        for ev in w.stream(kube.core.list_node, label_selector=f"{SIM_CLUSTER_LABEL}={p.cluster}",
                           timeout_seconds=60):
            registered.set()
            seen.append(ev["object"].status.allocatable.get("nvidia.com/gpu", ""))
            if seen[-1] == "8":
                w.stop()

    watcher = threading.Thread(target=watch_nodes, daemon=True)
    watcher.start()
    _until_done(p, p.resize(PoolRef("a100-80gb-a", "us-central1-a"), 1, OWNER))
    watcher.join(timeout=60)
    assert registered.is_set() and seen[0] == "0" and seen[-1] == "8", seen
    node = _nodes(kube, p.cluster, "a100-80gb-a")[0]
    assert node.status.capacity["nvidia.com/gpu"] == "8" and _ready(node)


def test_many_nodes_register_concurrently(kube: Kube, cluster_sim: Any) -> None:  # noqa: F811
    sim, p = cluster_sim()
    t0 = time.monotonic()
    _until_done(p, p.resize(PoolRef("l4-c", "us-central1-c"), 64, OWNER))
    wait_until("64 nodes", lambda: len(_nodes(kube, p.cluster, "l4-c")) == 64, timeout=30)
    elapsed = time.monotonic() - t0
    assert elapsed < 30, f"64 nodes took {elapsed:.1f}s to register"


def test_stockout_surfaces_through_the_google_client(kube: Kube, cluster_sim: Any) -> None:  # noqa: F811
    sim, p = cluster_sim(stockouts=[{"zone": "us-central1-f", "window": "always"}])
    with pytest.raises(CapacityUnavailable) as info:
        p.resize(PoolRef("a100-80gb-f", "us-central1-f"), 2, OWNER)
    assert info.value.scope is Scope.ZONE and info.value.fields["zone"] == "us-central1-f"
    assert _nodes(kube, p.cluster, "a100-80gb-f") == []
    assert p.pool(PoolRef("a100-80gb-f", "us-central1-f")).size == 0


def test_preemption_notice_then_the_mig_recreates_the_node_under_the_same_name(
    kube: Kube, namespace: str, cluster_sim: Any,  # noqa: F811
) -> None:
    sim, p = cluster_sim(preemption={"notice_s": 240, "pod_grace_s": 120})  # 2 s and 1 s here
    ref = PoolRef("h100-80gb-spot-a", "us-central1-a")
    _until_done(p, p.resize(ref, 1, OWNER))
    node = wait_until("Ready node with GPUs", lambda: [
        n for n in _nodes(kube, p.cluster, "h100-80gb-spot-a")
        if _ready(n) and n.status.allocatable["nvidia.com/gpu"] == "8"])[0]
    name, uid = node.metadata.name, node.metadata.uid
    kube.core.patch_node(name, {"metadata": {"labels": {"kfp-gpu.io/run-id": "r1"}}})
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
    t0 = time.monotonic()
    out = sim.preempt(name)
    assert time.monotonic() - t0 < 0.5, "preempt must return at once"
    assert (out["node"], out["pool"], out["poolSize"]) == (name, "h100-80gb-spot-a", 1) and out["noticeS"] == 2.0

    # during the notice: the kubelet's graceful node shutdown (no taint on GKE); the pod keeps running, told
    noticed = wait_until("node under notice", lambda: (n := kube.core.read_node(name)) and any(
        c.type == "Ready" and c.status == "False" for c in n.status.conditions) and n, timeout=10)
    ready = next(c for c in noticed.status.conditions if c.type == "Ready")
    assert ready.message == "node is shutting down"
    assert not any(t.key == "cloud.google.com/impending-node-termination" for t in (noticed.spec.taints or []))
    told = wait_until("pod told", lambda: (x := kube.core.read_namespaced_pod("trainer", namespace)) and any(
        c.type == "DisruptionTarget" for c in (x.status.conditions or [])) and x, timeout=10)
    cond = next(c for c in told.status.conditions if c.type == "DisruptionTarget")
    assert (cond.status, cond.reason, told.status.phase) == ("True", "TerminationByKubelet", "Running")
    assert time.monotonic() - t0 < 0.9, "the pod grace ran out before its checks"
    got = wait_until("pod killed", lambda: (x := kube.core.read_namespaced_pod("trainer", namespace))
                     and x.status.phase == "Failed" and x, timeout=10)
    killed_after = time.monotonic() - t0
    assert 1.0 <= killed_after < 2.0, f"killed {killed_after:.2f}s after the notice (grace: 1 s here)"
    assert got.status.container_statuses[0].state.terminated.exit_code == 137

    # after the notice the Node is gone, the pool keeps its size, and the VM comes back as a fresh Node
    assert sim.state.wait_node_gone(name, 10.0)
    assert p.pool(ref).size == 1
    back = wait_until("node recreated", lambda: [n for n in _nodes(kube, p.cluster, "h100-80gb-spot-a")
                                                 if _ready(n) and n.metadata.uid != uid], timeout=30)
    assert [n.metadata.name for n in back] == [name]
    assert "kfp-gpu.io/run-id" not in back[0].metadata.labels
    assert not any(t.key == "cloud.google.com/impending-node-termination" for t in (back[0].spec.taints or []))
