"""The AWS stand-in's drain on the real control plane: an evicted pod keeps running for its
terminationGracePeriodSeconds (in the world's time), as a kubelet SIGTERMs it and kills it only when the grace runs
out, instead of vanishing the instant the Eviction API accepts it (docs/sim.md, AWS stand-in A4)."""

from __future__ import annotations

import time
import uuid

import pytest

from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.devcluster.nodes import make_gpu_node
from kfp_gpu_rehearsal.sim.aws.nodes import EksKubeNodes
from kfp_gpu_rehearsal.sim.clock import compress
from tests.integration.conftest import kube, namespace  # noqa: F401 - fixtures
from tests.waiting import wait_until

pytestmark = pytest.mark.integration
GRACE_S = 240  # real-world seconds: 2 s here


def test_an_evicted_pod_runs_out_its_grace_before_it_is_gone(kube: Kube, namespace: str) -> None:  # noqa: F811
    node = f"ip-10-0-{uuid.uuid4().hex[:6]}.ec2.internal"
    kube.core.create_node(make_gpu_node(node, "p4d-spot-a", "a100-40gb", "us-east-1a"))
    try:
        wait_until("the node Ready", lambda: any(c.type == "Ready" and c.status == "True" for c in
                                                 kube.core.read_node(node).status.conditions or []), timeout=30)
        kube.core.create_namespaced_pod(namespace, {"metadata": {"name": "rank"}, "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": GRACE_S, "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "train:1"}]}})
        wait_until("the pod Running", lambda: kube.core.read_namespaced_pod("rank", namespace).status.phase
                   == "Running", timeout=30, every=0.05)
        t0 = time.monotonic()
        EksKubeNodes(str(kube.kubeconfig), "us-east-1").drain(node)
        pod = kube.core.read_namespaced_pod("rank", namespace)  # evicted, and still there: SIGTERM, not SIGKILL
        assert pod.metadata.deletion_timestamp is not None and pod.status.phase == "Running", pod.status.phase
        assert kube.core.read_node(node).spec.unschedulable  # cordoned

        def gone() -> bool:
            return not kube.core.list_namespaced_pod(namespace, field_selector="metadata.name=rank").items

        wait_until("the pod gone", gone, timeout=30, every=0.05)
        took = time.monotonic() - t0
        assert took >= 0.9 * compress(GRACE_S), took  # its grace, in the world's time
    finally:
        kube.core.delete_node(node)
