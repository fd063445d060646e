"""The provisioning-request backend against the real cluster-autoscaler (kwok provider) of the dev cluster's
cluster-autoscaler profile (issue 13). The step functions run as the controller's identity (``step_api``).

Capacity comes only from CA's node groups (:data:`kfp_gpu_rehearsal.devcluster.ca_profile.NODE_GROUPS`): kfp-gpu creates a
PodTemplate and a ProvisioningRequest, CA scales a group up and reports Provisioned, the step claims the booked
nodes. Stockouts are the groups' max sizes, as CA sees them.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from kfp_gpu.cluster import provreq as api_req
from kfp_gpu.cluster.nodes import is_claim_taint
from kfp_gpu.errors import CapacityUnavailable
from kfp_gpu.ownership import LABEL_RUN_ID, label_safe
from kfp_gpu.plan import provreq as plan
from kfp_gpu.provisioners import detect
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target
from kfp_gpu.steps import scale_up, teardown
from kfp_gpu.steps.capacity import Capacity
from kfp_gpu_rehearsal.devcluster import ca_profile
from tests.waiting import wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _spec(ns: str, nodes: int, *, zones: tuple[str, ...] = ("us-central1-a",), pools: tuple[str, ...] = (),
          provisioner: str = "provisioning-request", deadline: float = 60.0) -> ProvisioningSpec:
    return ProvisioningSpec(
        "a100-80gb", nodes, capacity=CapacityType.ON_DEMAND, zones=zones, scale_up_deadline_s=deadline,
        target=Target(kind="local", cluster=ca_profile.CLUSTER, region="us-central1", namespace=ns, pools=pools,
                      provisioner=provisioner, tolerations=(ca_profile.TAINT,)),
    )


def _requests(api: client.ApiClient, ns: str) -> list[dict]:
    return client.CustomObjectsApi(api).list_namespaced_custom_object(plan.GROUP, plan.VERSION, ns, plan.PLURAL)["items"]


def _held(api: client.ApiClient, run: str) -> list[client.V1Node]:
    return client.CoreV1Api(api).list_node(label_selector=f"{LABEL_RUN_ID}={label_safe(run)}").items


def test_atomic_request_gets_the_gang_and_teardown_leaves_nothing(kube, autoscaler, namespace, step_api):
    spec = _spec(namespace, 2)
    run = f"run-{uuid.uuid4().hex[:6]}"
    t0 = time.time()
    res = scale_up.run(spec, run, "", api=step_api)
    took = time.time() - t0
    cap = Capacity.from_json(res.output_json)
    assert cap.extra["provisioner"] == "provisioning-request"
    assert len(cap.nodes) == 2, cap
    nodes = {n.metadata.name: n for n in _held(kube.api, run)}
    assert set(nodes) == set(cap.nodes)
    for n in nodes.values():  # CA's nodes of an on-demand group in the pinned zone, Ready with 8 GPUs
        labels = n.metadata.labels
        assert labels["topology.kubernetes.io/zone"] == "us-central1-a"
        assert labels.get("cloud.google.com/gke-spot") != "true"
        assert labels[ca_profile.GROUP_LABEL] == "ca-a100-a"
        assert n.status.allocatable["nvidia.com/gpu"] == "8"
    (req,) = _requests(kube.api, namespace)
    assert req["spec"]["provisioningClassName"] == plan.ATOMIC
    assert plan.read_state(req["status"]["conditions"]).state is plan.ReqState.PROVISIONED
    assert req["metadata"]["labels"][LABEL_RUN_ID] == label_safe(run)
    print(f"[provreq] request -> gang of 2 Ready and claimed in {took:.2f}s")

    out = teardown.run(spec, run, "", api=step_api)
    assert out.metrics["teardown_errors"] == 0.0, out.output_json
    assert _requests(kube.api, namespace) == []
    assert client.CoreV1Api(kube.api).list_namespaced_pod_template(namespace).items == []
    assert _held(kube.api, run) == []  # claims (labels, run taint) released; CA scales the nodes down itself
    left = {n.metadata.name: n for n in client.CoreV1Api(kube.api).list_node().items}
    for name in cap.nodes:  # a node CA already scaled down (empty once released) carries no claim either
        if name in left:
            assert not any(is_claim_taint(t) for t in left[name].spec.taints or []), name


def test_a_zone_without_room_fails_over_to_the_next(kube, autoscaler, namespace, step_api):
    # another run books 3 of ca-a100-a's 4 nodes: ours (2 nodes) cannot fit in us-central1-a any more
    other = f"other-{uuid.uuid4().hex[:6]}"
    scale_up.run(_spec(namespace, 3), other, "", api=step_api)
    spec = _spec(namespace, 2, zones=("us-central1-a", "us-central1-b"), deadline=60.0)
    run = f"run-{uuid.uuid4().hex[:6]}"
    try:
        cap = Capacity.from_json(scale_up.run(spec, run, "", api=step_api).output_json)
        assert {p.zone for p in cap.placements} == {"us-central1-b"}
        assert len(cap.nodes) == 2
        # the zone-a request was given up (deleted), the zone-b one provisioned
        mine = [r for r in _requests(kube.api, namespace) if r["metadata"]["labels"][LABEL_RUN_ID] == label_safe(run)]
        assert len(mine) == 1  # zone a's request was deleted when the run moved on
        tmpl = client.CoreV1Api(kube.api).read_namespaced_pod_template(mine[0]["metadata"]["name"], namespace)
        terms = tmpl.template.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        zones = [e.values for t in terms.node_selector_terms for e in t.match_expressions
                 if e.key == "topology.kubernetes.io/zone"]
        assert zones == [["us-central1-b"]]
    finally:
        teardown.run(spec, run, "", api=step_api)
        teardown.run(_spec(namespace, 3), other, "", api=step_api)


def test_no_zone_with_room_is_a_clear_error(kube, autoscaler, namespace, step_api):
    spec = _spec(namespace, 5, zones=("us-central1-a", "us-central1-b"), deadline=20.0)  # max 4 per group
    run = f"run-{uuid.uuid4().hex[:6]}"
    with pytest.raises(CapacityUnavailable) as err:
        scale_up.run(spec, run, "", api=step_api)
    assert "us-central1-a" in err.value.message and "us-central1-b" in err.value.message
    assert "CapacityIsNotFound" in err.value.message
    assert _requests(kube.api, namespace) == []  # every request given back
    assert _held(kube.api, run) == []


def test_auto_detects_the_autoscaler_for_its_node_groups(kube, autoscaler, namespace):
    wait_until("the autoscaler status ConfigMap", lambda: api_req.autoscaler_node_groups(kube.api), timeout=30)
    choice = detect(_spec(namespace, 1, provisioner="auto", pools=("ca-a100-a",)), kube.api, None)
    assert choice.name == "provisioning-request", choice
    assert "ca-a100-a" in choice.reason
    other = detect(_spec(namespace, 1, provisioner="auto", pools=("not-a-ca-group",)), kube.api, None)
    assert other.name == "node-pool", other


def test_the_step_account_detects_the_autoscaler_with_the_optional_status_rule(kube, autoscaler, namespace,
                                                                             step_identity, step_api):
    spec = _spec(namespace, 1, provisioner="auto", pools=("ca-a100-a",))
    before = detect(spec, step_api, None)  # the base RBAC: asked first, not read, so not detected
    assert before.name == "node-pool", before
    objs = [d for d in yaml.safe_load_all((ROOT / "kfp_gpu/manifests/optional/autoscaler-status.yaml").read_text()) if d]
    rbac = client.RbacAuthorizationV1Api(kube.api)
    role, binding = objs
    for o in objs:  # a copy of this test's own, bound to its stand-in of the controller's identity
        o["metadata"]["name"] += f"-{namespace}"
    binding["roleRef"]["name"] = role["metadata"]["name"]
    binding["subjects"] = [{"kind": "ServiceAccount", "name": step_identity.name, "namespace": namespace}]
    rbac.create_namespaced_role("kube-system", role)
    rbac.create_namespaced_role_binding("kube-system", binding)
    try:
        wait_until("the status rule to take effect", lambda: step_identity.can(
            "get", "configmaps", "", namespace="kube-system", name="cluster-autoscaler-status"), timeout=10)
        after = detect(spec, step_api, None)
        assert after.name == "provisioning-request" and "ca-a100-a" in after.reason, after
    finally:
        rbac.delete_namespaced_role_binding(binding["metadata"]["name"], "kube-system")
        rbac.delete_namespaced_role(role["metadata"]["name"], "kube-system")


def test_a_booking_on_nodes_that_go_away_is_requested_again(kube, autoscaler, namespace, step_api):
    """CA books a request on empty nodes it already has (Provisioned, CapacityIsFound: no scale-up for it), then
    those nodes are removed, as CA's own scale-down did to an earlier test's nodes in 2 of 8 back-to-back runs.
    The step asks again instead of waiting for nodes that cannot come until its deadline.

    The nodes the request is booked on are another run's, its request deleted (CA's booking of them gone) and its
    claim taint lifted, its label kept: CA sees them empty and fitting, the step cannot claim them. The test then
    taints them ToBeDeletedByClusterAutoscaler, what CA's scale-down does before it deletes a node."""
    import threading

    core = client.CoreV1Api(kube.api)
    other = f"other-{uuid.uuid4().hex[:6]}"
    spec = _spec(namespace, 2, deadline=60.0)
    run = f"run-{uuid.uuid4().hex[:6]}"
    booked = Capacity.from_json(scale_up.run(_spec(namespace, 2), other, "", api=step_api).output_json).nodes
    for name in booked:
        node = core.read_node(name)
        core.patch_node(name, {"spec": {"taints": [t.to_dict() for t in node.spec.taints or []
                                                    if not is_claim_taint(t)] or None}})
    for r in _requests(kube.api, namespace):
        api_req.delete(kube.api, namespace, r["metadata"]["name"])
    result: dict[str, object] = {}

    def step() -> None:
        try:
            result["cap"] = Capacity.from_json(scale_up.run(spec, run, "", api=step_api).output_json)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            result["error"] = exc

    th = threading.Thread(target=step, daemon=True)
    th.start()
    try:
        def first_reason() -> str:
            for r in _requests(kube.api, namespace):
                if r["metadata"]["labels"][LABEL_RUN_ID] == label_safe(run):
                    obs = plan.read_state((r.get("status") or {}).get("conditions"))
                    return obs.reason if obs.state is plan.ReqState.PROVISIONED else ""
            return ""
        wait_until("CA to book our request", first_reason, timeout=30, every=0.1)
        assert first_reason() == plan.CAPACITY_IS_FOUND  # booked on the nodes it has, no scale-up
        t_gone = time.time()
        for name in booked:  # CA's scale-down marks them: never usable again
            node = core.read_node(name)
            taints = [t.to_dict() for t in node.spec.taints or []]
            core.patch_node(name, {"spec": {"taints": [*taints, {"key": "ToBeDeletedByClusterAutoscaler",
                                                                  "value": str(int(t_gone)),
                                                                  "effect": "NoSchedule"}]}})
        th.join(90)
        took = time.time() - t_gone
        mine = [r["metadata"]["name"] for r in _requests(kube.api, namespace)
                if r["metadata"]["labels"][LABEL_RUN_ID] == label_safe(run)]
    finally:
        th.join(90)
        teardown.run(spec, run, "", api=step_api)
        teardown.run(_spec(namespace, 2), other, "", api=step_api)
        for name in booked:  # give the nodes back to CA as they were
            try:
                node = core.read_node(name)
            except client.ApiException:
                continue
            core.patch_node(name, {"spec": {"taints": [t.to_dict() for t in node.spec.taints or []
                                                        if t.key != "ToBeDeletedByClusterAutoscaler"] or None}})
    assert "error" not in result, result.get("error")
    cap = result["cap"]
    assert isinstance(cap, Capacity)
    assert len(cap.nodes) == 2 and not set(cap.nodes) & set(booked), (cap.nodes, booked)
    assert mine == [plan.request_name(run, scale_up.STEP, 0, 1)], mine  # the spent request deleted, one fresh one
    print(f"[provreq] booked nodes gone -> a fresh request's gang claimed {took:.2f}s later")
    assert _requests(kube.api, namespace) == [] and _held(kube.api, run) == []


def test_health_bad_gpu_on_a_provisioning_request_node_is_cordoned_and_replaced_beside_it(
        kube, autoscaler, namespace, step_api, tmp_path):
    """A request's spec is immutable, so the backend cannot give one node back (``releases_one_node`` False): the
    probe's bad node stays cordoned and tainted out of the gang, its claim dropped, the replacement is asked for
    beside it (a second request), and the job runs on the survivor and the replacement only. The world answers the
    probe on every CA node of the run (it adopts them as they register)."""
    import json
    import threading
    from typing import Any

    from kfp_gpu.cluster import pytorchjob
    from kfp_gpu.spec import Health
    from kfp_gpu.steps.health_gate import UNHEALTHY_TAINT
    from kfp_gpu_rehearsal.sim.gpuhealth import GpuFault, GpuHealthWorld
    from tests.integration.test_train_support import StepThread, job_json, job_pods

    spec = _spec(namespace, 2).replace(health=Health(probe=True, probe_timeout_s=30.0),
                                       checkpoint_uri=str(tmp_path / "ckpt"))
    run = f"run-{uuid.uuid4().hex[:6]}"
    world, stop = GpuHealthWorld(kube.api), threading.Event()

    def adopt_ca_nodes() -> None:  # the world knows every node of CA's groups, the replacement too
        seen: set[str] = set()
        while not stop.wait(0.1):
            names = {n.metadata.name for n in client.CoreV1Api(kube.api).list_node(
                label_selector=f"{ca_profile.CLUSTER_LABEL}={ca_profile.CLUSTER}").items}
            if names - seen:
                world.adopt(*(names - seen))
                seen |= names

    seen_bad: dict[str, Any] = {}

    def follow_bad() -> None:  # the bad node as the cluster shows it: cordoned out of the gang, then maybe gone
        while not stop.wait(0.05):
            name = seen_bad.get("name")
            if not name or "gone" in seen_bad:
                continue
            try:
                node = kube.core.read_node(name)
            except client.exceptions.ApiException as exc:
                if exc.status == 404:
                    seen_bad["gone"] = time.time()
                continue
            if node.spec.unschedulable:  # its last state before the autoscaler removed it
                seen_bad["cordoned"] = {"taints": [t.key for t in node.spec.taints or []],
                                        "run": (node.metadata.labels or {}).get(LABEL_RUN_ID)}

    adopter, follower = (threading.Thread(target=f, daemon=True) for f in (adopt_ca_nodes, follow_bad))
    adopter.start()
    follower.start()
    # No wait for the earlier tests' nodes to go: CA may book the request on empty nodes it is scaling down, and the
    # step then asks again (test_a_booking_on_nodes_that_go_away_is_requested_again)
    try:
        cap_json = scale_up.run(spec, run, "", api=step_api).output_json
        first = Capacity.from_json(cap_json).nodes
        wait_until("the world knows the gang", lambda: set(first) <= set(world.owned), timeout=10)
        bad = seen_bad["name"] = first[0]
        world.break_node(bad, GpuFault("dcgm", crash_after_s=120.0))
        th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=job_json(2.0), api=step_api)
        th.start()  # reprovision=None: the real provisioning-request backend asks CA for the replacement
        out = json.loads(th.outcome(180).output_json)
        placed = sorted(p.spec.node_name for p in job_pods(kube.core, namespace, pytorchjob.job_name(run, "train")))
        requests_during = len(_requests(kube.api, namespace))
    finally:
        stop.set()
        world.stop()
        teardown.run(spec, run, "", api=step_api)
    assert out["status"] == "Succeeded" and out["attempts"] == 1 and out["preemptions"] == 0, out
    health = out["ledger"]["health"]
    assert [r["action"] for r in health] == ["replace", "pass"], health
    assert health[0]["bad"] == [{"node": bad, "reason": "dcgmi diag failed"}]
    replacement = health[0]["replacement_nodes"]
    assert len(replacement) == 1 and replacement[0] not in first, health
    assert placed == sorted([first[1], *replacement]), placed  # never on the bad node
    assert requests_during == 2  # the gang's request, and the replacement's beside it (the first is immutable)
    # left to the autoscaler: cordoned, tainted unhealthy, no longer the run's; CA removes it once it is empty
    cordoned = seen_bad.get("cordoned") or {}
    assert UNHEALTHY_TAINT in cordoned.get("taints", []) and not cordoned.get("run"), seen_bad
    print(f"bad node {bad}: cordoned {cordoned}; removed by the autoscaler: {'gone' in seen_bad}")
    assert _requests(kube.api, namespace) == [] and _held(kube.api, run) == []  # teardown gave back the rest
