"""The karpenter backend against the REAL Karpenter (kwok provider) of the dev cluster's Karpenter profile (issue 15).

Steps run as the controller's identity (``step_api``). Capacity comes only from Karpenter: kfp-gpu creates a NodePool
scoped to the run plus placeholder pods, Karpenter makes NodeClaims and (kwok) Nodes, the step claims them. The
profile's instance types (:mod:`kfp_gpu_rehearsal.devcluster.karpenter_types`) have p4d.24xlarge (8 x A100 40GB) spot out of
stock in us-east-1c: a launch there fails with an InsufficientCapacityError and Karpenter deletes the NodeClaim.
A spot interruption is what Karpenter does on one: the NodeClaim is deleted, the node tainted
``karpenter.sh/disrupted`` and drained.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from kubernetes import client

from kfp_gpu import iam
from kfp_gpu.checkpoint.store import CheckpointStore
from kfp_gpu.cluster import ledger, pytorchjob
from kfp_gpu.cluster.nodes import claim_taint_key
from kfp_gpu.errors import CapacityUnavailable, InvalidSpec
from kfp_gpu.ownership import BALLOON_LABEL, LABEL_RUN_ID, label_safe
from kfp_gpu.plan import karpenter as plan
from kfp_gpu.provisioners import GangRequest, detect
from kfp_gpu.provisioners.karpenter import KarpenterProvisioner
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Recovery, Target
from kfp_gpu.steps import janitor, scale_up, teardown
from kfp_gpu.steps.capacity import Capacity
from tests.integration.test_train_support import StepThread, job_json, running_pods
from tests.waiting import wait_until

pytestmark = pytest.mark.integration
STOCKED, STOCKOUT = "us-east-1a", "us-east-1c"  # p4d.24xlarge spot: in stock / out of stock (karpenter_types)


def _spec(ns: str, nodes: int = 2, *, zones: tuple[str, ...] = (STOCKED,), deadline: float = 90.0,
          provisioner: str = "karpenter", ckpt: str = "", recovery: Recovery | None = None,
          endpoint: str = "") -> ProvisioningSpec:
    return ProvisioningSpec(
        "a100-40gb", nodes, gpus_per_node=8, capacity=CapacityType.SPOT, zones=zones, scale_up_deadline_s=deadline,
        checkpoint_uri=ckpt, recovery=recovery or Recovery(max_preemptions=2),
        target=Target(kind="eks", cluster="kfp-gpu-karpenter", region="us-east-1", namespace=ns,
                      provisioner=provisioner, endpoint=endpoint))


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> str:
    """The AWS stand-in's URL (EKS/EC2/Auto Scaling), as an EKS target's endpoint: teardown's EKS provider calls
    (reservations, node groups) go there instead of to AWS."""
    from kfp_gpu_rehearsal.sim import daemon

    for k, v in iam.sim_controller_env().items():  # the controller's principal (deploy/aws-policy.json)
        monkeypatch.setenv(k, v)
    return daemon.start_aws()


def _custom(api: client.ApiClient, plural: str, selector: str) -> list[dict[str, Any]]:
    return list(client.CustomObjectsApi(api).list_cluster_custom_object(plan.GROUP, plan.VERSION, plural,
                                                                        label_selector=selector)["items"])


def _left(api: client.ApiClient, ns: str, run: str) -> dict[str, list[str]]:
    """Everything of the run's that is still there (admin view)."""
    pool, mine = plan.nodepool_name(run), f"{LABEL_RUN_ID}={label_safe(run)}"
    core = client.CoreV1Api(api)
    return {
        "nodepools": [p["metadata"]["name"] for p in _custom(api, plan.NODEPOOLS, mine)],
        "nodeclaims": [c["metadata"]["name"] for c in _custom(api, plan.NODECLAIMS, f"{plan.NODEPOOL_LABEL}={pool}")],
        "nodes": [n.metadata.name for n in core.list_node(label_selector=f"{plan.NODEPOOL_LABEL}={pool}").items]
        + [n.metadata.name for n in core.list_node(label_selector=mine).items],
        "pods": [p.metadata.name for p in core.list_namespaced_pod(ns, label_selector=mine).items],
    }


def _nothing_left(api: client.ApiClient, ns: str, run: str) -> dict[str, list[str]]:
    return _left(api, ns, run) if any(_left(api, ns, run).values()) else {}


def test_gang_interrupted_recovered_from_checkpoint_and_nothing_left(kube, karpenter, aws, namespace, step_api,
                                                                      tmp_path):
    ckpt = tmp_path / "ckpt"
    spec = _spec(namespace, ckpt=str(ckpt), endpoint=aws)
    run = f"run-{uuid.uuid4().hex[:6]}"
    pool = plan.nodepool_name(run)
    try:
        t0 = time.time()
        cap_json = scale_up.run(spec, run, "", api=step_api).output_json
        took = time.time() - t0
        cap = Capacity.from_json(cap_json)
        assert cap.extra["provisioner"] == "karpenter" and cap.extra["nodepool"] == pool
        assert len(cap.nodes) == 2 and cap.pools == (pool,)
        for name in cap.nodes:  # Karpenter's nodes: the run's NodePool, spot, the zone asked, 8 GPUs, claimed
            n = kube.core.read_node(name)
            labels = n.metadata.labels
            assert labels[plan.NODEPOOL_LABEL] == pool and labels[plan.CAPACITY_TYPE_LABEL] == "spot"
            assert labels[plan.ZONE_LABEL] == STOCKED and labels[plan.INSTANCE_TYPE_LABEL] == "p4d.24xlarge"
            assert n.status.allocatable["nvidia.com/gpu"] == "8" and labels[LABEL_RUN_ID] == label_safe(run)
            assert {t.key for t in n.spec.taints or []} >= {plan.pool_taint_key(namespace), claim_taint_key(namespace)}
        np = client.CustomObjectsApi(kube.api).get_cluster_custom_object(plan.GROUP, plan.VERSION, plan.NODEPOOLS, pool)
        assert np["spec"]["limits"] == {"nvidia.com/gpu": "16"}
        assert np["spec"]["disruption"]["budgets"] == [{"nodes": "0"}]
        assert np["metadata"]["labels"][LABEL_RUN_ID] == label_safe(run)
        placeholders = kube.core.list_namespaced_pod(namespace, label_selector=f"{BALLOON_LABEL}=true").items
        assert [p.metadata.name for p in placeholders if p.metadata.deletion_timestamp is None] == []
        print(f"\n[karpenter] NodePool -> 2 x 8 GPU gang Ready and claimed in {took:.2f}s")

        th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=job_json(8.0), api=step_api)
        th.start()
        job = pytorchjob.job_name(run, "train")
        pods = wait_until("2 pods running", lambda: running_pods(kube.core, namespace, job, 2), timeout=90)
        assert all(p.metadata.annotations.get(plan.DO_NOT_DISRUPT) == "true" for p in pods)
        CheckpointStore(str(ckpt)).save(15, {"w": b"15"}, meta={"loss": 3.0})
        victim = cap.nodes[1]
        (claim,) = [c for c in _custom(kube.api, plan.NODECLAIMS, f"{plan.NODEPOOL_LABEL}={pool}")
                    if c["status"].get("nodeName") == victim]
        t_int = time.time()  # a spot interruption as Karpenter handles it: the NodeClaim is deleted
        client.CustomObjectsApi(kube.api).delete_cluster_custom_object(plan.GROUP, plan.VERSION, plan.NODECLAIMS,
                                                                       claim["metadata"]["name"])
        out = json.loads(th.outcome(240).output_json)
        assert out["status"] == "Succeeded" and out["preemptions"] == 1, out
        p = out["ledger"]["preemptions"][0]
        assert p["lost_nodes"] == [victim] and p["checkpoint_step"] == 15, p
        (new,) = p["replacement_nodes"]
        assert new != victim and new not in cap.nodes
        assert kube.core.read_node(new).metadata.labels[plan.NODEPOOL_LABEL] == pool
        print(f"[karpenter] interruption -> decision {(p['decided_at'] - t_int) * 1000:.0f} ms; "
              f"-> resumed gang running {p['time_to_resume_s']:.2f} s")
    finally:
        rep = json.loads(teardown.run(spec, run, "", api=step_api).output_json)
    assert f"nodepool {pool}" in rep["requests"] and rep["errors"] == [], rep
    assert _nothing_left(kube.api, namespace, run) == {}


def test_an_insufficient_capacity_zone_fails_over_to_the_next(kube, karpenter, namespace, step_api):
    spec = _spec(namespace, zones=(STOCKOUT, STOCKED), deadline=90.0)
    run = f"run-{uuid.uuid4().hex[:6]}"
    blocked: list[str] = []
    backend = KarpenterProvisioner(step_api)
    try:
        cap = backend.acquire(spec, run, GangRequest(step="scale_up", on_zone_blocked=blocked.append))
        assert blocked == [STOCKOUT]
        assert {p.zone for p in cap.placements} == {STOCKED} and len(cap.nodes) == 2
        (hist,) = ledger.read(kube.api, namespace, run, "scale_up")["history"]
        assert (hist["zone"], hist["capacity_type"], hist["reason"]) == (STOCKOUT, "spot", plan.ICE_REASON), hist
    finally:
        out = backend.release(spec, run)
        teardown.release_run(spec, run, step_api, None)
    assert out.errors == [] and _nothing_left(kube.api, namespace, run) == {}


def test_without_zones_the_gang_still_forms_in_one_zone(kube, karpenter, namespace, step_api):
    spec = _spec(namespace, nodes=3, zones=())
    run = f"run-{uuid.uuid4().hex[:6]}"
    try:
        cap = KarpenterProvisioner(step_api).acquire(spec, run, GangRequest(step="scale_up"))
        zones = {kube.core.read_node(n).metadata.labels[plan.ZONE_LABEL] for n in cap.nodes}
        assert len(cap.nodes) == 3 and len(zones) == 1, zones
        assert [p.zone for p in cap.placements] == list(zones)
    finally:
        teardown.release_run(spec, run, step_api, None)
    assert _nothing_left(kube.api, namespace, run) == {}


def test_the_platforms_template_labels_and_startup_taints_reach_the_gangs_nodes(kube, karpenter, namespace, step_api,
                                                                                monkeypatch):
    """KFP_GPU_KARPENTER_TEMPLATE (the controller's setting): the run's NodePool carries the node labels and startup
    taints, Karpenter puts them on the nodes it launches, and a node is claimed only once its agent has removed the
    startup taint (Karpenter's Initialized), here this test, after it saw the nodes Ready and unclaimed."""
    import threading

    from kfp_gpu.cluster.karpenter import TEMPLATE_ENV
    from kfp_gpu.plan.readiness import is_ready

    taint = {"key": "example.com/agent-not-ready", "effect": "NoSchedule"}
    monkeypatch.setenv(TEMPLATE_ENV, json.dumps({"labels": {"example.com/gpu-team": "shared"},
                                                 "startupTaints": [taint]}))
    spec = _spec(namespace)
    run = f"run-{uuid.uuid4().hex[:6]}"
    got: dict[str, Any] = {}
    step = threading.Thread(target=lambda: got.update(cap=KarpenterProvisioner(step_api).acquire(
        spec, run, GangRequest(step="scale_up"))), daemon=True)
    selector = f"{plan.NODEPOOL_LABEL}={plan.nodepool_name(run)}"
    try:
        step.start()

        def ready_nodes() -> list[dict[str, Any]]:
            items = kube.api.sanitize_for_serialization(kube.core.list_node(label_selector=selector).items)
            return items if len(items) == 2 and all(is_ready(n) for n in items) else []
        nodes = wait_until("the NodePool's 2 nodes Ready (startup taint still on)", ready_nodes, 90.0)
        time.sleep(1.0)  # the step's watch has seen them Ready: it must still not claim them
        assert all(taint["key"] in [t["key"] for t in n["spec"]["taints"]] for n in nodes)
        assert all(LABEL_RUN_ID not in n["metadata"]["labels"] for n in ready_nodes()) and "cap" not in got
        for n in nodes:  # the agent is done: it removes its taint
            kept = [t for t in kube.core.read_node(n["metadata"]["name"]).spec.taints or [] if t.key != taint["key"]]
            kube.core.patch_node(n["metadata"]["name"], {"spec": {"taints": kube.api.sanitize_for_serialization(kept)}})
        step.join(60.0)
        assert "cap" in got, "the step did not claim the nodes once the startup taint was gone"
        pool = client.CustomObjectsApi(kube.api).get_cluster_custom_object(plan.GROUP, plan.VERSION, plan.NODEPOOLS,
                                                                           plan.nodepool_name(run))
        assert pool["spec"]["template"]["metadata"]["labels"] == {"example.com/gpu-team": "shared"}
        assert pool["spec"]["template"]["spec"]["startupTaints"] == [taint]
        assert sorted(got["cap"].nodes) == sorted(n["metadata"]["name"] for n in nodes)
        assert all(kube.core.read_node(n).metadata.labels.get("example.com/gpu-team") == "shared"
                   for n in got["cap"].nodes)
    finally:
        step.join(90.0)
        teardown.release_run(spec, run, step_api, None)
    assert _nothing_left(kube.api, namespace, run) == {}


def test_the_warm_pool_s_nodes_become_the_gang(kube, karpenter, namespace, step_api):
    spec = _spec(namespace)
    run = f"run-{uuid.uuid4().hex[:6]}"
    pool = plan.nodepool_name(run)
    backend = KarpenterProvisioner(step_api)
    try:
        backend.acquire(spec, run, GangRequest(nodes=2, step="warm_pool", wait=False))

        def ready() -> list[str]:
            nodes = kube.core.list_node(label_selector=f"{plan.NODEPOOL_LABEL}={pool}").items
            return [n.metadata.name for n in nodes
                    if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])]

        warm = wait_until("2 warm nodes Ready", lambda: ready() if len(ready()) == 2 else [], timeout=60)
        claims = {c["metadata"]["name"] for c in _custom(kube.api, plan.NODECLAIMS, f"{plan.NODEPOOL_LABEL}={pool}")}
        cap = backend.acquire(spec, run, GangRequest(step="scale_up"))
        assert sorted(cap.nodes) == sorted(warm)  # scale-up claimed the warm nodes, launched nothing more
        assert {c["metadata"]["name"] for c in _custom(kube.api, plan.NODECLAIMS,
                                                       f"{plan.NODEPOOL_LABEL}={pool}")} == claims
        left = kube.core.list_namespaced_pod(namespace, label_selector=f"{BALLOON_LABEL}=true").items
        assert [p.metadata.name for p in left if p.metadata.deletion_timestamp is None] == []
    finally:
        teardown.release_run(spec, run, step_api, None)
    assert _nothing_left(kube.api, namespace, run) == {}


def test_every_zone_out_of_stock_is_one_clear_error_and_rolls_back(kube, karpenter, namespace, step_api):
    spec = _spec(namespace, zones=(STOCKOUT,), deadline=45.0)
    run = f"run-{uuid.uuid4().hex[:6]}"
    try:
        with pytest.raises(CapacityUnavailable) as err:
            KarpenterProvisioner(step_api).acquire(spec, run, GangRequest(step="scale_up"))
    finally:
        teardown.release_run(spec, run, step_api, None)
    assert f"{STOCKOUT}/spot: {plan.ICE_REASON}" in err.value.message, err.value.message
    assert err.value.remediation and err.value.fields["zones"] == [STOCKOUT]
    assert _nothing_left(kube.api, namespace, run) == {}


def test_a_required_topology_is_refused_before_any_nodepool(kube, karpenter, namespace, step_api):
    spec = _spec(namespace).replace(topology="required")
    run = f"run-{uuid.uuid4().hex[:6]}"
    with pytest.raises(InvalidSpec) as err:
        KarpenterProvisioner(step_api).acquire(spec, run, GangRequest(step="scale_up"))
    assert "cannot keep a gang in one network domain" in err.value.message and "\n" not in err.value.message
    assert "placement group of strategy 'cluster'" in err.value.remediation
    assert _nothing_left(kube.api, namespace, run) == {}  # refused before it created anything


def test_spot_out_of_stock_falls_back_to_on_demand_when_the_spec_allows(kube, karpenter, namespace, step_api):
    spec = _spec(namespace, nodes=1, zones=(STOCKOUT,), recovery=Recovery(max_preemptions=2, on_demand_after=1))
    run = f"run-{uuid.uuid4().hex[:6]}"
    try:
        cap = KarpenterProvisioner(step_api).acquire(spec, run, GangRequest(step="scale_up"))
        assert cap.extra["capacity_type"] == "on-demand" and not cap.spot
        assert kube.core.read_node(cap.nodes[0]).metadata.labels[plan.CAPACITY_TYPE_LABEL] == "on-demand"
    finally:
        teardown.release_run(spec, run, step_api, None)
    assert _nothing_left(kube.api, namespace, run) == {}


def test_the_janitor_sweeps_the_nodepool_of_a_run_whose_lease_expired(kube, karpenter, aws, namespace, step_api,
                                                                          janitor_api):
    spec = _spec(namespace, nodes=1, endpoint=aws)
    run = f"run-{uuid.uuid4().hex[:6]}"
    KarpenterProvisioner(step_api).acquire(spec, run, GangRequest(step="scale_up", lease_ttl_s=60))
    assert _left(kube.api, namespace, run)["nodepools"] == [plan.nodepool_name(run)]
    rep = janitor.collect(namespace, api=janitor_api, runs=[run], lock_namespace=namespace, now=time.time() + 3600)
    assert rep.runs == {label_safe(run): "released"} and rep.errors == [], str(rep)
    assert _nothing_left(kube.api, namespace, run) == {}


def test_auto_picks_karpenter_on_eks_when_nodepools_are_served(kube, karpenter, namespace):
    choice = detect(_spec(namespace, provisioner="auto"), kube.api, None)
    assert choice.name == "karpenter" and "karpenter.sh/v1" in choice.reason
    local = ProvisioningSpec("a100-40gb", 1, target=Target(namespace=namespace, provisioner="auto"))
    assert detect(local, kube.api, None).name != "karpenter"  # a local (GKE stand-in) target keeps its backends


def test_a_swapped_out_node_is_released_through_its_nodeclaim_before_the_replacement(kube, karpenter, namespace,
                                                                                      step_api):
    """A stall's repeat offender (or a straggler, or a bad GPU) is cordoned and annotated swap-out by the train step;
    the karpenter backend's replace deletes its NodeClaim (Karpenter terminates it) before it asks for the
    replacement: the NodePool's GPU limit is the gang's, so the replacement could not launch beside it."""
    from kfp_gpu.ownership import SWAP_OUT_ANNOTATION

    spec = _spec(namespace)
    run = f"run-{uuid.uuid4().hex[:6]}"
    backend = KarpenterProvisioner(step_api)
    try:
        cap = backend.acquire(spec, run, GangRequest(step="scale_up"))
        bad, keep = sorted(cap.nodes)
        kube.core.patch_node(bad, {"metadata": {"annotations": {SWAP_OUT_ANNOTATION: "stall"}},
                                   "spec": {"unschedulable": True}})
        uid = kube.core.read_node(bad).metadata.uid
        t0 = time.time()
        new = backend.replace(spec, run, cap, [bad], extra=1, zone_hint=STOCKED, on_demand=False, attempt=1,
                              lost_uids=[uid])
        took = time.time() - t0
        assert bad not in new.nodes and keep in new.nodes and len(new.nodes) == 2, new.nodes
        pool = plan.nodepool_name(run)
        claims = {str((c.get("status") or {}).get("nodeName")) for c in
                  _custom(kube.api, plan.NODECLAIMS, f"{plan.NODEPOOL_LABEL}={pool}")}
        assert bad not in claims and set(new.nodes) <= claims, claims
        wait_until(f"{bad} gone", lambda: bad not in [n.metadata.name for n in kube.core.list_node().items],
                   timeout=60)
    finally:
        teardown.release_run(spec, run, step_api, None)
    assert _nothing_left(kube.api, namespace, run) == {}
    print(f"\nkarpenter swap: {bad} released (NodeClaim deleted) and replaced in {took:.1f}s")
