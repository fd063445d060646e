"""The EKS example (pipelines/llm_finetune_eks.py) end to end through the node-pool backend: real boto3 ->
the AWS stand-in (kfp_gpu_rehearsal.sim.aws) -> EKS-labelled KWOK nodes in the local control plane, a Spot interruption
(two minutes' notice, cordon + drain) recovered from the checkpoint, and nothing left after teardown.
Plus a fast test: the PyTorchJob built for an EKS target carries no ``cloud.google.com/*`` key."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kfp_gpu.checkpoint.store import CheckpointStore
from kfp_gpu.cluster import pytorchjob
from kfp_gpu.cluster.capacity import Capacity, Placement
from kfp_gpu.job import JobTemplate
from kfp_gpu.providers.eks import EksProvider
from kfp_gpu.steps import preflight_step, scale_up, teardown, warm_pool
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.leftovers import leftovers
from kfp_gpu_rehearsal.sim.aws import AwsSimServer
from kfp_gpu_rehearsal.sim.aws.scenario import default
from kfp_gpu_rehearsal.sim.worldspec import BootLatency
from pipelines.llm_finetune_eks import SPEC
from tests.integration.standin_support import serving
from tests.integration.test_train_support import StepThread, job_json, running_pods
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
FAST_BOOT = {"dist": "lognormal", "median_s": 40, "sigma": 0.3, "min_s": 20}


def _google_keys(obj: Any, path: str = "") -> list[str]:
    """Every dict key or string value mentioning cloud.google.com, with where it is."""
    out: list[str] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if "cloud.google.com" in str(k):
                out.append(f"{path}.{k}")
            out += _google_keys(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _google_keys(v, f"{path}[{i}]")
    elif isinstance(obj, str) and "cloud.google.com" in obj:
        out.append(f"{path} = {obj}")
    return out


def test_pytorchjob_for_an_eks_target_has_no_gke_key() -> None:
    """Fast: the job the train step builds for the EKS example's capacity (scheme from EksProvider)."""
    provider = EksProvider(SPEC.target.cluster, SPEC.target.region, endpoint_url=SPEC.target.endpoint)
    cap = Capacity("run-eks", (Placement("p4d-spot-a", "us-east-1a", ("ip-10-0-0-14.ec2.internal",
                                                                       "ip-10-0-0-15.ec2.internal")),),
                   SPEC.gpus_per_node, "nvidia-tesla-a100", True, scheme=provider.scheme, accelerator=SPEC.accelerator)
    template = JobTemplate(name="finetune", image="python:3.11-slim", command=("python", "-m", "x"))
    body = pytorchjob.manifest(pytorchjob.job_name("run-eks", "finetune"), capacity=cap, template=template,
                               labels={"kfp-gpu.io/run-id": "run-eks"}, nodes=SPEC.nodes,
                               checkpoint_uri=SPEC.checkpoint_uri, run_id="run-eks", pin=True)
    assert not _google_keys(body), _google_keys(body)
    pod = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert pod["nodeSelector"] == {"eks.amazonaws.com/nodegroup": "p4d-spot-a",  # placed through the EKS scheme
                                   "kfp-gpu.io/run-id": "run-eks"}  # on the nodes the run claimed
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


@pytest.fixture
def aws(kube: Kube) -> Iterator[AwsSimServer]:
    cluster = f"eks-{uuid.uuid4().hex[:6]}"
    sc = default()
    groups = tuple(dataclasses.replace(g, boot=BootLatency(**FAST_BOOT, seed=i)) for i, g in enumerate(sc.nodegroups))
    sc = dataclasses.replace(sc, cluster=cluster, nodegroups=groups, device_plugin_s=20, update_s=20, terminate_s=20)
    yield from serving(AwsSimServer(sc, str(kube.kubeconfig)), kube, cluster)


@pytest.mark.integration
def test_eks_example_spot_interruption_recovers_and_leaves_nothing(
    kube: Kube, namespace: str, step_api: client.ApiClient, aws: AwsSimServer, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))  # EksProvider reads Nodes' providerID with it
    ckpt = tmp_path / "ckpt"
    spec = SPEC.replace(target=dataclasses.replace(SPEC.target, cluster=aws.scenario.cluster, endpoint=aws.url,
                                                   namespace=namespace),
                        checkpoint_uri=str(ckpt), scale_up_deadline_s=120)
    run = f"run-{uuid.uuid4().hex[:6]}"
    provider = EksProvider.from_target(spec.target)
    found = {n: g["desired"] for n, g in aws.world.snapshot()["nodegroups"].items()}
    pre = preflight_step.run(spec, run, "", api=step_api)
    pre_out = json.loads(pre.output_json)
    assert pre_out["provisioner"]["name"] == "node-pool", pre.output_json[:2000]
    warm_pool.run(spec, run, pre.output_json, api=step_api)
    cap_json = scale_up.run(spec, run, pre.output_json, api=step_api, provider=provider).output_json
    cap = Capacity.from_json(cap_json)
    assert cap.scheme == "eks" and len(cap.nodes) == 2
    core = client.CoreV1Api(kube.api)
    for name in cap.nodes:
        node = core.read_node(name)
        labels = node.metadata.labels
        assert labels["eks.amazonaws.com/capacityType"] == "SPOT" and labels["eks.amazonaws.com/nodegroup"] in (
            "p4d-spot-a", "p4d-spot-b")
        assert node.spec.provider_id.startswith(f"aws:///{labels['topology.kubernetes.io/zone']}/i-")
    th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=job_json(6.0), api=step_api)
    th.start()
    job = pytorchjob.job_name(run, "train")
    deleted: list[str] = []
    try:
        wait_until("2 pods running", lambda: running_pods(kube.core, namespace, job, 2), timeout=90)
        pods = running_pods(kube.core, namespace, job, 2)
        assert not _google_keys(client.ApiClient().sanitize_for_serialization(pods[0].spec))
        CheckpointStore(str(ckpt)).save(15, {"w": b"15"}, meta={"loss": 3.0})
        victim = cap.nodes[1]
        notice = aws.interrupt(victim)
        assert notice["noticeS"] == 120
        out = json.loads(th.outcome(240).output_json)
    finally:
        rep = teardown.run(spec, run, "", api=step_api, provider=provider)
        deleted = list(json.loads(rep.output_json).get("nodes_deleted") or [])
    assert out["status"] == "Succeeded" and out["preemptions"] == 1, json.dumps(out["ledger"], indent=1)[:6000]
    p = out["ledger"]["preemptions"][0]
    assert p["lost_nodes"] == [victim] and p["checkpoint_step"] == 15, p
    assert p["replacement_nodes"] and victim not in p["replacement_nodes"], p  # AWS replaces with a new instance
    # zero left: the run's objects, its nodes (terminated through Auto Scaling) and the groups' desired sizes
    assert leftovers(step_api, namespace, run, deleted, timeout_s=30) == {}
    wait_until("the run's instances terminated", lambda: not [
        i for i in aws.world.snapshot()["instances"].values() if i["state"] != "terminated"], timeout=30)
    assert {n: g["desired"] for n, g in aws.world.snapshot()["nodegroups"].items()} == found
    wait_until("no stand-in node left", lambda: not core.list_node(
        label_selector=f"kfp-gpu.io/sim-cluster={aws.scenario.cluster}").items, timeout=30)
    wait_until("no pod left", lambda: not kube.core.list_namespaced_pod(namespace).items, timeout=30)
    assert {"autoscaling:TerminateInstanceInAutoScalingGroup", "eks:UpdateNodegroupConfig"} <= set(aws.requests)
