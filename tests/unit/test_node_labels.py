"""Placement is cloud-neutral: the job, balloons and ProvisioningRequest pods select nodes in the label keys of the
capacity's scheme. The EKS and Karpenter paths must carry no GKE key."""

from __future__ import annotations

import json

import pytest

from kfp_gpu.cluster import node_labels, pytorchjob
from kfp_gpu.cluster.capacity import Capacity, Placement
from kfp_gpu.job import JobTemplate
from kfp_gpu.provisioners.provreq import pod_spec
from kfp_gpu.spec import ProvisioningSpec, Target


def _cap(scheme: str, placements: tuple[Placement, ...], **extra: object) -> Capacity:
    return Capacity("run-1", placements, 8, "nvidia-a100-80gb", spot=True, extra=dict(extra), scheme=scheme,
                    accelerator="a100-80gb")


def _job(cap: Capacity) -> dict[str, object]:
    return pytorchjob.manifest("j", capacity=cap, template=JobTemplate.build(image="img:1"), labels={}, nodes=2,
                               checkpoint_uri="", resume_step=0, run_id="run-1", pin=True)


def _eks_spec() -> ProvisioningSpec:
    return ProvisioningSpec(accelerator="a100-80gb", nodes=2, gpus_per_node=8, capacity="spot",  # type: ignore[arg-type]
                            target=Target(kind="eks", cluster="c", region="us-east-1",  # type: ignore[arg-type]
                                          pools=("gpu-a", "gpu-b")),
                            zones=("us-east-1a",))


@pytest.mark.parametrize("scheme", ["eks", "karpenter"])
def test_job_for_a_non_gke_target_has_no_gke_key(scheme: str) -> None:
    two_pools = _cap(scheme, (Placement("gpu-a", "us-east-1a", ("n1",)), Placement("gpu-b", "us-east-1b", ("n2",))))
    body = json.dumps(_job(two_pools))
    assert "cloud.google.com" not in body
    pod = _job(two_pools)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]  # type: ignore[index]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 1  # the instance-type requirement; the gang pin is the claim label, not a term per node
    assert pod["nodeSelector"] == {"kfp-gpu.io/run-id": "run-1"}
    for t in terms:
        assert {"key": node_labels.INSTANCE_TYPE, "operator": "In", "values": ["p4de.24xlarge"]} in t["matchExpressions"]
    one_pool = _cap(scheme, (Placement("gpu-a", "us-east-1a", ("n1", "n2")),))
    assert one_pool.node_selector() == {node_labels.get(scheme).pool: "gpu-a"}
    assert "cloud.google.com" not in json.dumps(_job(one_pool))


def test_gke_capacity_selects_by_gke_labels() -> None:
    cap = _cap("gke", (Placement("p1", "us-central1-a", ("n1",)), Placement("p2", "us-central1-b", ("n2",))))
    assert cap.node_selector() == {"cloud.google.com/gke-accelerator": "nvidia-a100-80gb"}
    assert cap.node_requirements() == []
    assert _cap("gke", (Placement("p1", "z", ("n1",)),)).node_selector() == {"cloud.google.com/gke-nodepool": "p1"}


def test_capacity_json_keeps_scheme_and_rejects_unknown() -> None:
    cap = _cap("karpenter", (Placement("np", "us-east-1a", ("n1",)),))
    back = Capacity.from_json(cap.to_json())
    assert back.scheme == "karpenter" and back.accelerator == "a100-80gb"
    old = json.loads(cap.to_json())
    del old["scheme"], old["accelerator"]  # written before schemes existed: GKE
    assert Capacity.from_json(json.dumps(old)).scheme == "gke"
    from kfp_gpu.errors import InvalidSpec

    with pytest.raises(InvalidSpec, match="capacity_json"):
        Capacity.from_json(json.dumps({**old, "scheme": "azure"}))


def test_provisioning_request_pods_for_eks_use_eks_labels() -> None:
    body = pod_spec(_eks_spec(), "run-1", zone="us-east-1a")
    text = json.dumps(body)
    assert "cloud.google.com" not in text
    assert body["nodeSelector"] == {"eks.amazonaws.com/capacityType": "SPOT"}
    exprs = body["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"]
    keys = {e["key"] for e in exprs}
    assert keys == {node_labels.INSTANCE_TYPE, node_labels.ZONE, "eks.amazonaws.com/nodegroup"}


def test_pool_of_reads_every_scheme() -> None:
    assert node_labels.pool_of({"eks.amazonaws.com/nodegroup": "ng"}) == "ng"
    assert node_labels.pool_of({"karpenter.sh/nodepool": "np"}) == "np"
    assert node_labels.pool_of({"cloud.google.com/gke-nodepool": "gp"}) == "gp"
    assert node_labels.pool_of({}) == ""
