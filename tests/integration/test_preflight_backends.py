"""Preflight's check-capacity against the real cluster-autoscaler of the dev cluster's CA profile (issue 13).

cluster-autoscaler answers ``check-capacity.autoscaling.x-k8s.io`` by simulating the gang on the nodes it has now
(never scaling up), so: free nodes -> "capacity available now"; a gang bigger than what exists (here, bigger
than the node groups could ever hold) -> "no capacity now". The controller's identity asks (``step_api``); the
request and its PodTemplate are gone afterwards.
"""

from __future__ import annotations

import time
import uuid

import pytest
from kubernetes import client

from kfp_gpu.cluster import provreq as api_req
from kfp_gpu.ownership import Owner
from kfp_gpu.plan import provreq as plan
from kfp_gpu.plan.preflight import FOUND, NOT_FOUND
from kfp_gpu.provisioners.provreq import pod_spec
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target
from kfp_gpu.steps import check_capacity
from kfp_gpu_rehearsal.devcluster import ca_profile
from tests.waiting import wait_until

pytestmark = pytest.mark.integration
ZONE = "us-central1-a"
SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"


def _spec(ns: str, nodes: int) -> ProvisioningSpec:
    return ProvisioningSpec(
        "a100-80gb", nodes, capacity=CapacityType.ON_DEMAND, zones=(ZONE,), scale_up_deadline_s=60.0,
        target=Target(kind="local", cluster=ca_profile.CLUSTER, region="us-central1", namespace=ns,
                      pools=("ca-a100-a",), provisioner="provisioning-request", tolerations=(ca_profile.TAINT,)))


def _left(api: client.ApiClient, ns: str) -> tuple[list[str], list[str]]:
    reqs = client.CustomObjectsApi(api).list_namespaced_custom_object(plan.GROUP, plan.VERSION, ns, plan.PLURAL)
    tmpls = client.CoreV1Api(api).list_namespaced_pod_template(ns).items
    return [r["metadata"]["name"] for r in reqs["items"]], [t.metadata.name for t in tmpls]


def test_more_than_the_node_groups_allow_is_no_capacity_now(kube, autoscaler, namespace, step_api):
    wait_until("the autoscaler status ConfigMap", lambda: api_req.autoscaler_node_groups(kube.api), timeout=30)
    spec = _spec(namespace, 5)  # ca-a100-a holds at most 4
    provisioner, skip = check_capacity.backend(spec, step_api, None)
    assert provisioner["name"] == "provisioning-request" and skip == "", (provisioner, skip)
    got = check_capacity.ask(spec, step_api, f"run-{uuid.uuid4().hex[:6]}", zones=[ZONE])
    assert got.answer == NOT_FOUND, got
    assert "CapacityIsNotFound" in got.detail and "never scales up" in got.detail
    print(f"[check-capacity] not found in {got.elapsed_s:.2f}s")
    assert _left(kube.api, namespace) == ([], [])


def test_free_nodes_are_capacity_available_now(kube, autoscaler, namespace, step_api):
    core = client.CoreV1Api(kube.api)
    # another run's atomic request makes CA add 2 nodes; scale-down is disabled on them, then the request (and its
    # booking) is deleted: 2 free nodes CA will not remove while the test runs
    other = f"other-{uuid.uuid4().hex[:6]}"
    name = plan.request_name(other, "scale_up")
    spec = _spec(namespace, 2)
    api_req.create(kube.api, namespace, name, pod_spec=pod_spec(spec, other, ZONE), count=2, klass=plan.ATOMIC,
                   parameters={}, labels=Owner.for_step(other, "scale_up", 600).labels())
    wait_until("the atomic request Provisioned", lambda: plan.read_state(
        (api_req.get(kube.api, namespace, name) or {}).get("status", {}).get("conditions")).state
        is plan.ReqState.PROVISIONED, timeout=60)
    group = f"{ca_profile.GROUP_LABEL}=ca-a100-a"

    def ready() -> list[client.V1Node]:
        nodes = core.list_node(label_selector=group).items
        return [n for n in nodes if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
                and not n.metadata.deletion_timestamp]

    nodes = wait_until("2 Ready CA nodes", lambda: ready() if len(ready()) >= 2 else None, timeout=60)
    for n in nodes:
        core.patch_node(n.metadata.name, {"metadata": {"annotations": {SCALE_DOWN_DISABLED: "true"}}})
    try:
        api_req.delete(kube.api, namespace, name)
        time.sleep(1.0)  # let CA drop the deleted request's booking
        got = check_capacity.ask(spec, step_api, f"run-{uuid.uuid4().hex[:6]}", zones=[ZONE])
        assert got.answer == FOUND, got
        assert "CapacityIsFound" in got.detail
        print(f"[check-capacity] found in {got.elapsed_s:.2f}s")
        assert _left(kube.api, namespace) == ([], [])
    finally:
        for n in nodes:
            try:
                core.patch_node(n.metadata.name, {"metadata": {"annotations": {SCALE_DOWN_DISABLED: None}}})
            except client.ApiException:
                pass
