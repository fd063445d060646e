"""The cluster-autoscaler profile of the dev cluster (issue 13): the real cluster-autoscaler (kwok provider) serves
``autoscaling.x-k8s.io/v1`` ProvisioningRequests for the GPU node groups of ``kfp_gpu_rehearsal.devcluster.ca_profile``.

Each test uses its own namespace and a node group the others here do not use; requests are deleted at the end
and CA removes its nodes after its (short) scale-down timings.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kfp_gpu.cluster.nodes import NodeView
from kfp_gpu_rehearsal.devcluster import ca_profile
from kfp_gpu_rehearsal.devcluster.ca_profile import CLUSTER, CLUSTER_LABEL, NODE_GROUPS, NodeGroup
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.devcluster.provreq_crd import CRD_NAME
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"
ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
CHECK = "check-capacity.autoscaling.x-k8s.io"
POOL_LABEL = "cloud.google.com/gke-nodepool"
GPU = "nvidia.com/gpu"


def group(name: str) -> NodeGroup:
    return next(g for g in NODE_GROUPS if g.name == name)


def pod_spec(g: NodeGroup, *, tolerate_dedicated: bool = True) -> dict[str, Any]:
    tolerations = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
    if tolerate_dedicated:
        tolerations.append(ca_profile.toleration())
    return {
        "nodeSelector": {POOL_LABEL: g.name, CLUSTER_LABEL: CLUSTER},
        "tolerations": tolerations,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "worker", "image": "pytorch/pytorch",
                        "resources": {"requests": {GPU: str(g.gpus), "cpu": "1"}, "limits": {GPU: str(g.gpus)}}}],
    }


def nodes_of(kube: Kube, g: NodeGroup) -> list[NodeView]:
    resp = kube.core.list_node(label_selector=f"{POOL_LABEL}={g.name}", _preload_content=False)
    return [NodeView.of(n) for n in json.loads(resp.data)["items"]]


def conditions(kube: Kube, namespace: str, name: str) -> dict[str, tuple[str, str]]:
    obj = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return {c["type"]: (c["status"], c.get("reason", "")) for c in (obj.get("status") or {}).get("conditions") or []}


class Requests:
    """Creates PodTemplate + ProvisioningRequest pairs (template first), deletes them at the end."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.made: list[str] = []

    def create(self, g: NodeGroup, count: int, cls: str, params: dict[str, str] | None = None) -> str:
        name = f"pr-{uuid.uuid4().hex[:6]}"
        self.kube.core.create_namespaced_pod_template(self.namespace, {
            "metadata": {"name": name}, "template": {"spec": pod_spec(g)}})
        body: dict[str, Any] = {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProvisioningRequest", "metadata": {"name": name},
            "spec": {"provisioningClassName": cls, "podSets": [{"podTemplateRef": {"name": name}, "count": count}]},
        }
        if params:
            body["spec"]["parameters"] = params
        self.kube.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)
        self.made.append(name)
        return name

    def delete_all(self) -> None:
        for name in self.made:
            for fn in (lambda n: self.kube.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                                                  PLURAL, n),
                       lambda n: self.kube.core.delete_namespaced_pod_template(n, self.namespace)):
                try:
                    fn(name)
                except ApiException as e:
                    if e.status != 404:
                        raise


@pytest.fixture
def requests(autoscaler: ca_profile.Profile, kube: Kube, namespace: str) -> Iterator[Requests]:
    r = Requests(kube, namespace)
    yield r
    r.delete_all()


def test_crd_serves_v1(autoscaler: ca_profile.Profile, kube: Kube, namespace: str) -> None:
    crd = client.ApiextensionsV1Api(kube.api).read_custom_resource_definition(CRD_NAME)
    assert [(v.name, v.served, v.storage) for v in crd.spec.versions] == [("v1", True, True)]
    assert kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"] == []
    status = kube.core.read_namespaced_config_map(ca_profile.STATUS_CM, "kube-system")
    assert "status" in (status.data or {}), status.data  # the backend detection reads it


def test_atomic_request_provisions_ready_gpu_nodes(kube: Kube, namespace: str, requests: Requests) -> None:
    g = group("ca-a100-b")
    before = {n.name for n in nodes_of(kube, g)}
    t0 = time.monotonic()
    name = requests.create(g, 2, ATOMIC)
    wait_until("Provisioned=True", lambda: conditions(kube, namespace, name).get("Provisioned", ("",))[0] == "True",
               timeout=60, every=0.05)
    t_prov = time.monotonic() - t0

    def ready_new() -> list[NodeView]:
        new = [n for n in nodes_of(kube, g) if n.name not in before]
        return new if len(new) >= 2 and all(n.ready and n.gpus == g.gpus for n in new) else []

    new = wait_until("2 new Ready GPU nodes of the group", ready_new, timeout=60, every=0.05)
    t_ready = time.monotonic() - t0
    print(f"\n[ca-profile] atomic 2 x {g.gpus} GPUs: Provisioned=True after {t_prov:.2f}s, "
          f"all nodes Ready after {t_ready:.2f}s")
    assert len(new) == 2
    assert {(n.pool, n.zone) for n in new} == {(g.name, g.zone)}
    raw = kube.core.read_node(new[0].name)
    assert raw.metadata.labels["node.kubernetes.io/instance-type"] == g.machine.name
    assert raw.metadata.labels["cloud.google.com/gke-accelerator"] == g.gke_label
    assert {(t.key, t.effect) for t in raw.spec.taints or []} >= {(GPU, "NoSchedule"),
                                                                 ("kfp-gpu.io/dedicated", "NoSchedule")}
    requests.delete_all()  # CA scales the unbooked nodes down after --scale-down-unneeded-time
    gone = {n.name for n in new}
    wait_until("CA removes the nodes once the request is deleted",
               lambda: not gone & {n.name for n in nodes_of(kube, g)}, timeout=90, every=0.5)


def test_request_above_max_size_is_not_found(kube: Kube, namespace: str, requests: Requests) -> None:
    g = group("ca-l4-a")
    before = {n.name for n in nodes_of(kube, g)}
    name = requests.create(g, g.max_size + 1, ATOMIC)
    cond = wait_until("a Provisioned condition", lambda: conditions(kube, namespace, name).get("Provisioned"),
                      timeout=60, every=0.1)
    assert cond == ("False", "CapacityIsNotFound")
    time.sleep(3)  # several 1 s CA loops: still no partial scale-up
    assert {n.name for n in nodes_of(kube, g)} == before
    assert conditions(kube, namespace, name)["Provisioned"] == ("False", "CapacityIsNotFound")


def test_check_capacity_no_retry_answers(kube: Kube, namespace: str, requests: Requests) -> None:
    g = group("ca-a100-spot-a")
    assert not [n for n in nodes_of(kube, g) if n.ready], "precondition: the group has no nodes"
    name = requests.create(g, 1, CHECK, {"noRetry": "true"})
    conds = wait_until("an answer (Failed or Provisioned)", lambda: (lambda c: c if (
        c.get("Failed", ("",))[0] == "True" or c.get("Provisioned", ("",))[0] == "True") else None)(
        conditions(kube, namespace, name)), timeout=60, every=0.1)
    assert conds["Failed"] == ("True", "CapacityIsNotFound"), conds  # no node exists and check-capacity adds none
    assert not nodes_of(kube, g)


def test_pod_without_the_dedicated_toleration_never_scales_up(kube: Kube, namespace: str,
                                                              autoscaler: ca_profile.Profile) -> None:
    g = group("ca-a100-spot-a")
    before = {n.name for n in nodes_of(kube, g)}
    kube.core.create_namespaced_pod(namespace, {"metadata": {"name": "no-toleration"},
                                                "spec": pod_spec(g, tolerate_dedicated=False)})

    def refused() -> list[str]:  # CA evaluates GPU pods once they are 30 s old (its fixed GPU buffer)
        evs = kube.core.list_namespaced_event(namespace, field_selector="involvedObject.name=no-toleration").items
        # one event per CA loop; a loop may name only other groups' reasons (selector), so wait for the taint
        return [e.message for e in evs if e.reason == "NotTriggerScaleUp" and "taint" in e.message]

    msgs = wait_until("CA's NotTriggerScaleUp event naming the taint", refused, timeout=90, every=0.5)
    assert "taint" in msgs[0], msgs
    assert {n.name for n in nodes_of(kube, g)} == before
    pod = kube.core.read_namespaced_pod("no-toleration", namespace)
    assert pod.spec.node_name is None
