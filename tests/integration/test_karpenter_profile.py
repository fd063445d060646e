"""The Karpenter profile of the dev cluster (issue 15): the real Karpenter (kwok cloud provider) launches AWS-shaped
GPU nodes for the pods a NodePool admits, fails a launch into an out-of-stock offering with its insufficient-capacity
error, drains a node whose NodeClaim is deleted (what Karpenter does on a spot interruption), and removes a deleted
NodePool's nodes.

The profile installs no NodePool; each test creates its own (tainted with a key only its pods tolerate, and selected
by name) and deletes it at the end.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from kfp_gpu_rehearsal.devcluster import karpenter_profile, karpenter_types
from kfp_gpu_rehearsal.devcluster.client import Kube
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

GROUP, VERSION = "karpenter.sh", "v1"
POOL_LABEL = "karpenter.sh/nodepool"
CT_LABEL = "karpenter.sh/capacity-type"
TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
TAINT_KEY = "kfp-gpu.io/karpenter-test"
GPU = "nvidia.com/gpu"


def nodepool(name: str, itype: str, zone: str, capacity_type: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "NodePool", "metadata": {"name": name},
        "spec": {
            "template": {"spec": {
                "nodeClassRef": {"group": karpenter_profile.NODECLASS_GROUP, "kind": "KWOKNodeClass",
                                 "name": karpenter_profile.NODE_CLASS},
                "requirements": [
                    {"key": TYPE_LABEL, "operator": "In", "values": [itype]},
                    {"key": CT_LABEL, "operator": "In", "values": [capacity_type]},
                    {"key": ZONE_LABEL, "operator": "In", "values": [zone]},
                ],
                "taints": [{"key": TAINT_KEY, "value": name, "effect": "NoSchedule"}],
                "expireAfter": "Never",
            }},
            "limits": {GPU: str(gpus)},
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never"},
        },
    }


def pod(name: str, pool: str, gpus: int) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "nodeSelector": {POOL_LABEL: pool},
        "tolerations": [{"key": TAINT_KEY, "operator": "Equal", "value": pool, "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "worker", "image": "pytorch/pytorch",
                        "resources": {"requests": {GPU: str(gpus), "cpu": "1"}, "limits": {GPU: str(gpus)}}}],
    }}


class Pools:
    """NodePools made by a test; deleted at the end, waiting until their NodeClaims and nodes are gone."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.made: list[str] = []

    def create(self, itype: str, zone: str, capacity_type: str, gpus: int = 8) -> str:
        name = f"kt-{uuid.uuid4().hex[:8]}"
        self.kube.custom.create_cluster_custom_object(GROUP, VERSION, "nodepools",
                                                      nodepool(name, itype, zone, capacity_type, gpus))
        self.made.append(name)
        return name

    def delete(self, name: str) -> None:
        try:
            self.kube.custom.delete_cluster_custom_object(GROUP, VERSION, "nodepools", name)
        except ApiException as e:
            if e.status != 404:
                raise

    def claims(self, name: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.kube.custom.list_cluster_custom_object(
            GROUP, VERSION, "nodeclaims", label_selector=f"{POOL_LABEL}={name}")["items"]
        return out

    def nodes(self, name: str) -> list[Any]:
        return list(self.kube.core.list_node(label_selector=f"{POOL_LABEL}={name}").items)

    def close(self) -> None:
        for name in self.made:
            self.delete(name)
        for name in self.made:
            wait_until(f"NodeClaims and nodes of NodePool {name} gone",
                       lambda n=name: not self.claims(n) and not self.nodes(n), timeout=60)


@pytest.fixture
def pools(karpenter: karpenter_profile.Profile, kube: Kube) -> Iterator[Pools]:
    p = Pools(kube)
    yield p
    p.close()


def _ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def _running_on(kube: Kube, namespace: str, name: str) -> Callable[[], str]:
    def check() -> str:
        p = kube.core.read_namespaced_pod(name, namespace)
        return str(p.spec.node_name) if p.status.phase == "Running" else ""
    return check


def _events(kube: Kube, reason: str, name_prefix: str) -> list[Any]:
    evs = kube.core.list_event_for_all_namespaces(field_selector=f"reason={reason}").items
    return [e for e in evs if e.involved_object.name.startswith(name_prefix)]


def test_nodepool_launches_a_labelled_gpu_node_within_its_limits_and_its_deletion_removes_it(
        kube: Kube, namespace: str, pools: Pools) -> None:
    t0 = time.monotonic()
    pool = pools.create("p4d.24xlarge", "us-east-1a", "spot")
    kube.core.create_namespaced_pod(namespace, pod("w0", pool, 8))
    [claim] = wait_until("a NodeClaim of the NodePool", lambda: pools.claims(pool), timeout=30)
    t_claim = time.monotonic() - t0
    node_name = wait_until("the pod running", _running_on(kube, namespace, "w0"), timeout=60)
    t_running = time.monotonic() - t0
    node = kube.core.read_node(node_name)
    labels = node.metadata.labels
    assert (labels[POOL_LABEL], labels[CT_LABEL], labels[TYPE_LABEL], labels[ZONE_LABEL]) == \
        (pool, "spot", "p4d.24xlarge", "us-east-1a")
    assert labels["karpenter.k8s.aws/instance-gpu-name"] == "a100"
    assert _ready(node) and node.status.allocatable[GPU] == "8"
    assert node.metadata.annotations.get("kwok.x-k8s.io/node") == "fake"  # our KWOK runs it
    assert {t.key for t in node.spec.taints or []} == {TAINT_KEY}  # karpenter.sh/unregistered removed

    def claim_conditions() -> dict[str, str]:
        obj = kube.custom.get_cluster_custom_object(GROUP, VERSION, "nodeclaims", claim["metadata"]["name"])
        conds = {c["type"]: c["status"] for c in obj["status"].get("conditions") or []}
        assert obj["status"]["nodeName"] == node_name
        return conds if all(conds.get(t) == "True" for t in ("Launched", "Registered", "Initialized", "Ready")) \
            else {}
    wait_until("the NodeClaim Launched, Registered, Initialized and Ready", claim_conditions, timeout=30)
    t_init = time.monotonic() - t0
    print(f"[timing] NodePool -> NodeClaim {t_claim:.1f}s, -> pod Running on a Ready node {t_running:.1f}s, "
          f"-> NodeClaim Initialized {t_init:.1f}s")

    # the NodePool's limits (8 GPUs) are the other stockout: a second 8-GPU pod gets no NodeClaim
    kube.core.create_namespaced_pod(namespace, pod("w1", pool, 8))

    def limit_events() -> list[Any]:
        evs = kube.core.list_namespaced_event(namespace, field_selector="involvedObject.name=w1,reason=FailedScheduling")
        return [e for e in evs.items if e.source.component == "karpenter" and "exceed limits" in (e.message or "")]
    [ev] = wait_until("Karpenter's FailedScheduling event for the NodePool's limits", limit_events, timeout=30)
    assert f"NodePool={pool}" in ev.message, ev.message
    assert len(pools.claims(pool)) == 1

    t1 = time.monotonic()
    pools.delete(pool)
    wait_until("the NodePool's node and NodeClaim gone", lambda: not pools.nodes(pool) and not pools.claims(pool),
               timeout=60)
    print(f"[timing] NodePool deleted -> node gone {time.monotonic() - t1:.1f}s")
    with pytest.raises(ApiException) as gone:
        kube.core.read_namespaced_pod("w0", namespace)
    assert gone.value.status == 404  # drained (evicted) before the node went


def test_launch_into_an_out_of_stock_offering_fails_with_insufficient_capacity(
        kube: Kube, namespace: str, pools: Pools) -> None:
    assert not karpenter_types.in_stock("p4d.24xlarge", "us-east-1c", "spot")
    pool = pools.create("p4d.24xlarge", "us-east-1c", "spot")
    kube.core.create_namespaced_pod(namespace, pod("w0", pool, 8))
    [ev, *_] = wait_until("an InsufficientCapacityError event on a NodeClaim of the NodePool",
                          lambda: _events(kube, "InsufficientCapacityError", pool), timeout=60)
    assert ev.involved_object.kind == "NodeClaim" and ev.type == "Warning"
    assert "insufficient capacity" in ev.message and "unavailable" in ev.message, ev.message
    time.sleep(2)
    assert not pools.nodes(pool)
    assert kube.core.read_namespaced_pod("w0", namespace).status.phase == "Pending"


def test_deleting_a_nodeclaim_taints_and_drains_its_node(kube: Kube, namespace: str, pools: Pools) -> None:
    """A spot interruption on EKS: Karpenter's interruption controller deletes the NodeClaim; the same path here."""
    pool = pools.create("g6.xlarge", "us-east-1b", "on-demand", gpus=2)
    for i in range(2):
        kube.core.create_namespaced_pod(namespace, pod(f"w{i}", pool, 1))
    n0 = wait_until("w0 running", _running_on(kube, namespace, "w0"), timeout=60)
    n1 = wait_until("w1 running", _running_on(kube, namespace, "w1"), timeout=60)
    assert n0 != n1  # g6.xlarge carries one L4
    [victim] = [c for c in pools.claims(pool) if c["status"]["nodeName"] == n0]
    t0 = time.monotonic()
    kube.custom.delete_cluster_custom_object(GROUP, VERSION, "nodeclaims", victim["metadata"]["name"])

    def tainted() -> bool:
        try:
            node = kube.core.read_node(n0)
        except ApiException:
            return True  # already gone: the taint came first (checked through the pod below)
        return any(t.key == "karpenter.sh/disrupted" and t.effect == "NoSchedule" for t in node.spec.taints or [])
    wait_until("karpenter.sh/disrupted:NoSchedule on the node", tainted, timeout=30, every=0.05)

    def pod_gone() -> bool:
        try:
            kube.core.read_namespaced_pod("w0", namespace)
        except ApiException as e:
            return e.status == 404
        return False
    wait_until("w0 evicted", pod_gone, timeout=30)
    wait_until("the node gone", lambda: n0 not in {n.metadata.name for n in pools.nodes(pool)}, timeout=30)
    print(f"[timing] NodeClaim deleted -> pod evicted and node gone {time.monotonic() - t0:.1f}s")
    assert kube.core.read_namespaced_pod("w1", namespace).spec.node_name == n1  # the other node is untouched
    assert _ready(kube.core.read_node(n1))


def test_the_run_s_node_class_is_the_profiles_even_beside_another(karpenter: karpenter_profile.Profile,
                                                                   kube: Kube) -> None:
    """A cluster may hold several node classes (a killed bench left its own behind, and CI then failed every
    Karpenter run with 'several KWOKNodeClasss'): the backend picks the one named ``default``, the profile's."""
    from kubernetes import client

    from kfp_gpu.cluster import karpenter as api_k

    co = client.CustomObjectsApi(kube.api)
    args = (karpenter_profile.NODECLASS_GROUP, karpenter_profile.NODECLASS_VERSION, "kwoknodeclasses")
    other = f"other-{uuid.uuid4().hex[:6]}"
    co.create_cluster_custom_object(*args, {"apiVersion": f"{args[0]}/{args[1]}", "kind": "KWOKNodeClass",
                                            "metadata": {"name": other}, "spec": {}})
    try:
        assert api_k.node_class(kube.api) == {"group": karpenter_profile.NODECLASS_GROUP, "kind": "KWOKNodeClass",
                                              "name": karpenter.node_class}
    finally:
        co.delete_cluster_custom_object(*args, other)
