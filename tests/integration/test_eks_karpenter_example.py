"""The EKS example through the ``karpenter`` backend (pipelines/llm_finetune_karpenter.py), end to end on the REAL
Karpenter kwok provider of the dev cluster (issue 15, "Must show"): the pipeline's own steps (preflight, warm pool,
scale-up, train, teardown) run as the controller's identity, like tests/integration/test_eks_node_groups.py runs
the node-group twin; Karpenter launches the nodes for the run's NodePool; a Spot interruption as Karpenter handles
one (the NodeClaim is deleted, the node drained) is recovered from the checkpoint; after teardown nothing is left:
no NodePool, NodeClaim, node, pod, job or labelled object of the run.

The steps get ``api=step_api`` (as in the node-group test): an EKS target's step building its own client would ask
kfp_gpu.cluster.identity whether the credentials reach EKS cluster ``kfp-gpu-eks``, and the dev cluster is not it.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kfp_gpu import iam
from kfp_gpu.checkpoint.store import CheckpointStore
from kfp_gpu.cluster import pytorchjob
from kfp_gpu.cluster.balloons import balloon_name
from kfp_gpu.cluster.capacity import Capacity
from kfp_gpu.ownership import BALLOON_LABEL, LABEL_RUN_ID, label_safe
from kfp_gpu.plan import karpenter as plan
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps import preflight_step, scale_up, teardown, warm_pool
from kfp_gpu_rehearsal.demo import extras_for
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.leftovers import leftovers
from pipelines.llm_finetune_karpenter import SPEC
from tests.integration.test_train_support import StepThread, job_json, running_pods
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> str:
    """The AWS stand-in's URL: teardown's EKS provider calls (node groups, reservations) go there, not to AWS."""
    from kfp_gpu_rehearsal.sim import daemon

    for k, v in iam.sim_controller_env().items():  # the controller's principal (deploy/aws-policy.json)
        monkeypatch.setenv(k, v)
    return daemon.start_aws()


def _custom(api: client.ApiClient, plural: str, selector: str) -> list[dict[str, Any]]:
    return list(client.CustomObjectsApi(api).list_cluster_custom_object(plan.GROUP, plan.VERSION, plural,
                                                                        label_selector=selector)["items"])


def _claims(api: client.ApiClient, pool: str) -> dict[str, str]:
    """The NodePool's NodeClaims: name -> node name ("" until registered)."""
    return {str(c["metadata"]["name"]): str((c.get("status") or {}).get("nodeName", ""))
            for c in _custom(api, plan.NODECLAIMS, f"{plan.NODEPOOL_LABEL}={pool}")}


def _left(kube: Kube, ns: str, run: str) -> dict[str, list[str]]:
    """Admin view of what is still there for the run: Karpenter's objects, nodes, pods, jobs."""
    pool, mine = plan.nodepool_name(run), f"{LABEL_RUN_ID}={label_safe(run)}"
    jobs = client.CustomObjectsApi(kube.api).list_namespaced_custom_object(
        pytorchjob.GROUP, pytorchjob.VERSION, ns, pytorchjob.PLURAL)["items"]
    found = {
        "nodepools": [p["metadata"]["name"] for p in _custom(kube.api, plan.NODEPOOLS, mine)],
        "nodeclaims": list(_claims(kube.api, pool)),
        "nodes": [n.metadata.name for n in kube.core.list_node(label_selector=f"{plan.NODEPOOL_LABEL}={pool}").items]
        + [n.metadata.name for n in kube.core.list_node(label_selector=mine).items],
        "pods": [p.metadata.name for p in kube.core.list_namespaced_pod(ns).items],
        "pytorchjobs": [j["metadata"]["name"] for j in jobs],
    }
    return {k: v for k, v in found.items() if v}


def _spec(ns: str, aws_url: str, ckpt: Path) -> ProvisioningSpec:
    return SPEC.replace(target=dataclasses.replace(SPEC.target, endpoint=aws_url, namespace=ns),
                        checkpoint_uri=str(ckpt))


def test_the_example_asks_for_karpenter_and_the_rehearsal_boots_it() -> None:
    """Fast: the example's spec (no pools, two zones, provisioner karpenter) and what `kfp-gpu run` brings up."""
    assert (SPEC.target.kind.value, SPEC.target.provisioner, SPEC.target.pools) == ("eks", "karpenter", ())
    assert SPEC.zones == ("us-east-1a", "us-east-1b") and SPEC.warm_pool.nodes == 1
    assert extras_for(SPEC) == ("karpenter",)


def test_karpenter_example_interruption_recovers_and_leaves_nothing(
    kube: Kube, karpenter: Any, aws: str, namespace: str, step_api: client.ApiClient, tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt"
    spec = _spec(namespace, aws, ckpt)
    run = f"run-{uuid.uuid4().hex[:6]}"
    pool = plan.nodepool_name(run)
    deleted: list[str] = []
    try:
        pre = preflight_step.run(spec, run, "", api=step_api)
        assert json.loads(pre.output_json)["provisioner"]["name"] == "karpenter", pre.output_json[:2000]

        # warm pool: the backend's own placeholder (tolerating the NodePool's taint), no generic balloon
        warm = json.loads(warm_pool.run(spec, run, pre.output_json, api=step_api).output_json)
        pods = kube.core.list_namespaced_pod(namespace, label_selector=f"{BALLOON_LABEL}=true").items
        assert sorted(warm["balloons"]) == sorted(p.metadata.name for p in pods) and len(pods) == 1, warm
        assert balloon_name(run, 0) not in warm["balloons"]
        assert pods[0].spec.node_selector == {plan.NODEPOOL_LABEL: pool}
        assert plan.pool_taint_key(namespace) in {t.key for t in pods[0].spec.tolerations or []}
        warm_claims = wait_until("the warm pool's NodeClaim", lambda: _claims(kube.api, pool), timeout=30)

        cap_json = scale_up.run(spec, run, pre.output_json, api=step_api).output_json
        cap = Capacity.from_json(cap_json)
        assert cap.scheme == "karpenter" and cap.extra["nodepool"] == pool and len(cap.nodes) == 2
        claims = _claims(kube.api, pool)
        assert set(warm_claims) <= set(claims) and len(claims) == 2, claims  # the warm node is part of the gang
        assert sorted(claims.values()) == sorted(cap.nodes)
        for name in cap.nodes:
            labels = kube.core.read_node(name).metadata.labels
            assert labels[plan.NODEPOOL_LABEL] == pool and labels[plan.CAPACITY_TYPE_LABEL] == "spot"
            assert labels[plan.ZONE_LABEL] in SPEC.zones and labels[plan.INSTANCE_TYPE_LABEL] == "p4d.24xlarge"
            assert not [k for k in labels if k.startswith("cloud.google.com/")]

        th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=job_json(8.0), api=step_api)
        th.start()
        job = pytorchjob.job_name(run, "train")
        wait_until("2 pods running", lambda: running_pods(kube.core, namespace, job, 2), timeout=90)
        CheckpointStore(str(ckpt)).save(15, {"w": b"15"}, meta={"loss": 3.0})
        victim = cap.nodes[1]
        (interrupted,) = [c for c, n in _claims(kube.api, pool).items() if n == victim]
        # a Spot interruption as Karpenter handles it: its interruption controller deletes the NodeClaim
        client.CustomObjectsApi(kube.api).delete_cluster_custom_object(plan.GROUP, plan.VERSION, plan.NODECLAIMS,
                                                                       interrupted)
        out = json.loads(th.outcome(240).output_json)
    finally:
        rep = json.loads(teardown.run(spec, run, "", api=step_api).output_json)
        deleted = list(rep.get("nodes_deleted") or [])
    assert out["status"] == "Succeeded" and out["preemptions"] == 1, json.dumps(out.get("ledger"), indent=1)[:6000]
    p = out["ledger"]["preemptions"][0]
    assert p["lost_nodes"] == [victim] and p["checkpoint_step"] == 15, p
    (new,) = p["replacement_nodes"]
    assert new not in cap.nodes  # Karpenter launched a replacement for the run's NodePool
    assert f"nodepool {pool}" in rep["requests"] and rep["errors"] == [], rep
    # zero left: the run's labelled objects (the step's own view, NodePools included) and Karpenter's objects
    assert leftovers(step_api, namespace, run, deleted, timeout_s=30) == {}
    wait_until("nothing of the run left", lambda: not _left(kube, namespace, run), timeout=30)


def test_the_leak_check_names_a_nodepool_a_run_left(kube: Kube, karpenter: Any, namespace: str,
                                                     step_api: client.ApiClient) -> None:
    """`kfp-gpu run`'s leak check (leftovers.leftovers, as the controller's identity) reports a run's NodePool."""
    from kfp_gpu.cluster import karpenter as api_k

    run = f"run-{uuid.uuid4().hex[:6]}"
    pool = plan.nodepool_name(run)
    body = plan.nodepool_body(pool, labels={LABEL_RUN_ID: label_safe(run)}, annotations={},
                              instance_types=["p4d.24xlarge"], cand=plan.Candidate("us-east-1a", "spot"),
                              limit_nodes=1, gpus_per_node=8, node_class=api_k.node_class(kube.api),
                              run_label=label_safe(run), namespace=namespace)
    api_k.ensure_nodepool(kube.api, body)  # no pod asks for it: Karpenter launches nothing
    try:
        assert leftovers(step_api, namespace, run, timeout_s=0.5) == {"nodepool": [pool]}
        assert leftovers(step_api, namespace, f"{run}x", timeout_s=0.5) == {}  # another run's view is clean
    finally:
        api_k.delete_nodepool(kube.api, pool)
    assert leftovers(step_api, namespace, run, timeout_s=10) == {}
