"""Image pull on a fresh stand-in node, on the real control plane (docs/sim.md rule 2b): KWOK holds a marked pod
Pending until the world's ``kfp-gpu.io/pulled-at``; a second pod with the same image on that node starts at once."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from kfp_gpu.ownership import Owner
from kfp_gpu.providers.base import PoolRef
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.devcluster.nodes import make_gpu_node
from kfp_gpu_rehearsal.sim import SimServer, from_dict
from kfp_gpu_rehearsal.sim.aws.scenario import default as aws_default
from kfp_gpu_rehearsal.sim.aws.server import AwsSimServer
from kfp_gpu_rehearsal.sim.clock import compress
from kfp_gpu_rehearsal.sim.worldspec import BootLatency, PullSpec
from tests.integration.conftest import kube, namespace  # noqa: F401 - fixtures
from tests.sim._helpers import PROJECT, REGION, scenario
from tests.waiting import wait_until

pytestmark = pytest.mark.integration
LABEL = "kfp-gpu.io/sim-cluster"
POOL = PoolRef("a100-80gb-a", "us-central1-a")
IMAGE_GB, RATE = 60.0, 125.0  # 491.52 real-world seconds: 4.1 s here (KWOK itself lags ~1 s under load)
PULL_S = compress(IMAGE_GB * 1024 / RATE)


def _gke(kube: Kube, name: str) -> Any:  # noqa: F811
    data = scenario(cluster=name, api={"error_rate": 0.0}, device_plugin_s=0,
                    image_pull={"image_gb": IMAGE_GB, "pull_mib_s": RATE})
    for p in data["pools"]:
        p["boot"] = {"dist": "fixed", "median_s": 60}
    sim = SimServer(from_dict(data), str(kube.kubeconfig))
    sim.start()
    GkeProvider(PROJECT, REGION, name, endpoint=sim.url).resize(POOL, 1, Owner("run-pull", "scale-up", 2_000_000_000.0))
    return sim


def _aws(kube: Kube, name: str) -> Any:  # noqa: F811
    sc = aws_default()
    groups = tuple(dataclasses.replace(g, desired_size=1 if i == 0 else 0, boot=BootLatency("fixed", 60.0))
                   for i, g in enumerate(sc.nodegroups))
    sc = dataclasses.replace(sc, cluster=name, nodegroups=groups, device_plugin_s=0,
                             image_pull=PullSpec(IMAGE_GB, RATE))
    sim = AwsSimServer(sc, str(kube.kubeconfig))
    sim.start()
    return sim


@pytest.fixture(params=["gke", "aws"])
def node(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:  # noqa: F811
    """One fresh Ready node of a stand-in (GKE or AWS) whose world pulls IMAGE_GB at RATE."""
    name = f"t{uuid.uuid4().hex[:6]}"
    sim = (_gke if request.param == "gke" else _aws)(kube, name)
    try:
        nodes = wait_until("the node Ready", lambda: [
            n.metadata.name for n in kube.core.list_node(label_selector=f"{LABEL}={name}").items
            if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])], timeout=30)
        yield nodes[0]
    finally:
        sim.stop()
        for n in kube.core.list_node(label_selector=f"{LABEL}={name}").items:
            try:
                kube.core.delete_node(n.metadata.name)
            except ApiException as e:
                if e.status != 404:
                    raise


def _pod(name: str, node: str, timeout: str = "60s") -> dict[str, Any]:
    notes = {"kfp-gpu.io/image-pull": "world"}
    if timeout:  # 60 s: had the world's pulled-at been ignored, the pod would wait that long
        notes["kfp-gpu.io/image-pull-timeout"] = timeout
    return {"metadata": {"name": name, "annotations": notes},
            "spec": {"nodeName": node, "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "main", "image": "us-docker.pkg.dev/p/r/train:1"}]}}


def _running_after(kube: Kube, namespace: str, name: str, node: str, timeout: str = "60s") -> float:  # noqa: F811
    """Create pod ``name`` on ``node``; seconds until it is Running (polled every 50 ms)."""
    t0 = time.monotonic()
    kube.core.create_namespaced_pod(namespace, _pod(name, node, timeout))
    wait_until(f"{name} Running", lambda: kube.core.read_namespaced_pod(name, namespace).status.phase == "Running",
               timeout=30, every=0.05)
    return time.monotonic() - t0


def test_a_fresh_node_pulls_the_image_once(kube: Kube, namespace: str, node: str) -> None:  # noqa: F811
    first = _running_after(kube, namespace, "first", node)
    second = _running_after(kube, namespace, "second", node)  # IfNotPresent: the image is on the node
    assert first >= 0.9 * PULL_S, (first, PULL_S)  # the image was pulled before the container started
    assert second < 0.5 * PULL_S, (second, PULL_S)  # cached on the node: no second pull
    ann = kube.core.read_namespaced_pod("first", namespace).metadata.annotations
    assert "kfp-gpu.io/pulled-at" in ann, ann


def test_a_marked_pod_on_a_node_no_world_serves_does_not_hang(kube: Kube, namespace: str) -> None:  # noqa: F811
    name = f"nopull-{uuid.uuid4().hex[:6]}"
    kube.core.create_node(make_gpu_node(name, "nopull", "a100-80gb", "us-central1-a"))
    try:
        wait_until("the node Ready", lambda: any(c.type == "Ready" and c.status == "True" for c in
                                                 kube.core.read_node(name).status.conditions or []), timeout=30)
        took = _running_after(kube, namespace, "orphan", name, timeout="")  # the stage's default: 1 s
        assert took >= 0.9, took  # KWOK held it for the timeout...
        notes = kube.core.read_namespaced_pod("orphan", namespace).metadata.annotations
        assert "kfp-gpu.io/pulled-at" not in notes, notes  # ...as no world answered for this node
    finally:
        kube.core.delete_node(name)
