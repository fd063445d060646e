"""A job built with the kubeflow-training SDK, run by the train step on the real Training Operator.

The user's PyTorchJob carries a PVC volume, a ServiceAccount, CPU/memory requests, a /dev/shm emptyDir,
labels and ``nprocPerNode``. The train step (as the controller's identity) fills in placement, gang size,
ownership and the resume env. The Training Operator must accept it and create pods that keep all of it and
land on the gang's nodes. KWOK does not mount volumes, but the API server, the operator and the scheduler
(bound PVC, existing ServiceAccount, resources that fit) must all accept the spec.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubeflow.training import models
from kubernetes.client import (
    ApiClient,
    V1Container,
    V1EmptyDirVolumeSource,
    V1EnvVar,
    V1ObjectMeta,
    V1PersistentVolumeClaimVolumeSource,
    V1PodSpec,
    V1PodTemplateSpec,
    V1ResourceRequirements,
    V1Volume,
    V1VolumeMount,
)
from kubernetes.client.rest import ApiException

from kfp_gpu.cluster import pytorchjob
from kfp_gpu.job import JobTemplate
from kfp_gpu_rehearsal.devcluster.client import Kube
from tests.integration.test_train_support import StepThread, job_pods, make_capacity, make_spec

pytestmark = pytest.mark.integration
NodeFactory = Callable[..., tuple[str, list[str]]]


@pytest.fixture
def bound_pvc(kube: Kube, namespace: str) -> Iterator[str]:
    """A PVC bound to a hostPath PV (pre-bound both ways, so the scheduler's volume check passes)."""
    pv, claim = f"pv-{namespace}"[:63], "datasets"
    kube.core.create_persistent_volume({
        "metadata": {"name": pv, "labels": {"kfp-gpu.io/test": "true"}},
        "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": "/tmp/kfp-gpu-datasets"},
                 "claimRef": {"namespace": namespace, "name": claim}}})
    kube.core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": claim},
        "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": pv,
                 "resources": {"requests": {"storage": "10Gi"}}}})
    yield claim
    try:
        kube.core.delete_persistent_volume(pv)
    except ApiException as e:
        if e.status != 404:
            raise


def users_job(claim: str, service_account: str) -> models.KubeflowOrgV1PyTorchJob:
    """What a kubeflow-training SDK user writes (replicas, restart policy and GPUs are overridden)."""
    pod = V1PodTemplateSpec(
        metadata=V1ObjectMeta(labels={"team": "ml"}, annotations={"example.com/owner": "alice",
                                                                  pytorchjob.SIM_DURATION_ANNOTATION: "3s"}),
        spec=V1PodSpec(
            service_account_name=service_account,
            containers=[V1Container(
                name="pytorch", image="busybox", command=["torchrun"], args=["train.py", "--epochs", "1"],
                env=[V1EnvVar(name="DATA_DIR", value="/data")],
                resources=V1ResourceRequirements(requests={"cpu": "4", "memory": "16Gi"},
                                                 limits={"memory": "16Gi", "nvidia.com/gpu": "8"}),
                volume_mounts=[V1VolumeMount(name="data", mount_path="/data", read_only=True),
                               V1VolumeMount(name="dshm", mount_path="/dev/shm")])],
            volumes=[V1Volume(name="data", persistent_volume_claim=V1PersistentVolumeClaimVolumeSource(
                         claim_name=claim, read_only=True)),
                     V1Volume(name="dshm", empty_dir=V1EmptyDirVolumeSource(medium="Memory", size_limit="8Gi"))],
        ))
    return models.KubeflowOrgV1PyTorchJob(
        api_version="kubeflow.org/v1", kind="PyTorchJob", metadata=V1ObjectMeta(name="llm"),
        spec=models.KubeflowOrgV1PyTorchJobSpec(
            run_policy=models.KubeflowOrgV1RunPolicy(), nproc_per_node="8",
            pytorch_replica_specs={
                "Master": models.KubeflowOrgV1ReplicaSpec(replicas=1, restart_policy="OnFailure", template=pod),
                "Worker": models.KubeflowOrgV1ReplicaSpec(replicas=1, restart_policy="OnFailure", template=pod)}))


def test_a_kubeflow_training_job_with_volumes_and_a_service_account_runs_on_the_gang(
    kube: Kube, namespace: str, kwok_nodes: NodeFactory, bound_pvc: str, tmp_path: Path, step_api: ApiClient,
) -> None:
    sa = "trainer-wi"
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": sa}})
    _, others = kwok_nodes(2, gpus=8)  # same accelerator, not this run's: the job must not land there
    pool, names = kwok_nodes(3, gpus=8, spot=True)
    run_id = f"run-kft-{uuid.uuid4().hex[:6]}"
    spec = make_spec(namespace, tmp_path / "ckpt", nodes=3)
    template = JobTemplate.build(job=users_job(bound_pvc, sa))

    th = StepThread(spec=spec, run_id=run_id, capacity_json=make_capacity(run_id, pool, names).to_json(),
                    job_json=template.to_json(), api=step_api)
    th.start()
    out = json.loads(th.outcome(180.0).output_json)
    assert out["status"] == "Succeeded" and out["attempts"] == 1

    job = kube.custom.get_namespaced_custom_object(pytorchjob.GROUP, pytorchjob.VERSION, namespace,
                                                   pytorchjob.PLURAL, out["job"])
    conditions = {c["type"]: c["status"] for c in job["status"]["conditions"]}
    assert conditions.get("Created") == "True" and conditions.get("Succeeded") == "True"
    assert job["spec"]["nprocPerNode"] == "8"
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2  # the gang, not the model's 1

    pods = job_pods(kube.core, namespace, out["job"])
    assert len(pods) == 3
    assert sorted(p.spec.node_name for p in pods) == sorted(names)  # one per gang node, none on `others`
    assert not {p.spec.node_name for p in pods} & set(others)
    for p in pods:
        assert [o.kind for o in p.metadata.owner_references] == ["PyTorchJob"]  # created by the operator
        assert p.metadata.labels["team"] == "ml" and p.metadata.labels["kfp-gpu.io/step"] == "train"
        assert p.metadata.annotations["example.com/owner"] == "alice"
        assert p.spec.service_account_name == sa
        vols = {v.name: v for v in p.spec.volumes}
        assert vols["data"].persistent_volume_claim.claim_name == bound_pvc
        assert vols["dshm"].empty_dir.medium == "Memory" and vols["dshm"].empty_dir.size_limit == "8Gi"
        c = p.spec.containers[0]
        mounts = {m.mount_path: m for m in c.volume_mounts}
        assert mounts["/data"].name == "data" and mounts["/data"].read_only and mounts["/dev/shm"].name == "dshm"
        assert c.resources.requests == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "8"}
        assert c.resources.limits == {"memory": "16Gi", "nvidia.com/gpu": "8"}
        assert c.image == "busybox" and c.args == ["train.py", "--epochs", "1"]
        env = {e.name: e.value for e in c.env}
        # the user's env, kfp-gpu's resume env, and the operator's rendezvous env from nprocPerNode
        assert env["DATA_DIR"] == "/data" and env[pytorchjob.ENV_RUN_ID] == run_id
        assert env[pytorchjob.ENV_RESUME_STEP] == "0" and env["PET_NPROC_PER_NODE"] == "8"
    master = [p for p in pods if p.metadata.labels[pytorchjob.REPLICA_TYPE_LABEL] == "master"]
    assert len(master) == 1 and master[0].status.phase == "Succeeded"
