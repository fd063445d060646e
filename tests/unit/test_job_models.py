"""kubeflow-training SDK models as a JobTemplate, and the PyTorchJob kfp-gpu renders from it."""

from __future__ import annotations

from typing import Any

import pytest
from kubeflow.training import models
from kubernetes.client import (
    V1Affinity,
    V1Container,
    V1EmptyDirVolumeSource,
    V1EnvVar,
    V1EnvVarSource,
    V1LocalObjectReference,
    V1NodeAffinity,
    V1NodeSelector,
    V1NodeSelectorRequirement,
    V1NodeSelectorTerm,
    V1ObjectMeta,
    V1PersistentVolumeClaimVolumeSource,
    V1PodAffinity,
    V1PodSpec,
    V1PodTemplateSpec,
    V1ResourceRequirements,
    V1SecretKeySelector,
    V1Toleration,
    V1Volume,
    V1VolumeMount,
)

from kfp_gpu import ownership
from kfp_gpu.cluster import pytorchjob
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.job import JobTemplate
from kfp_gpu.steps.capacity import Capacity, Placement

CAP = Capacity("run-1", (Placement("spot-a", "us-central1-a", ("n0", "n1", "n2")),), 8, "nvidia-h100-80gb", spot=True)


def pod(**over: Any) -> V1PodTemplateSpec:
    container = dict(
        name="pytorch", image="registry.example/llm:2", command=["torchrun"], args=["train.py", "--epochs", "3"],
        env=[V1EnvVar(name="HF_HOME", value="/data/hf"),
             V1EnvVar(name="HF_TOKEN", value_from=V1EnvVarSource(secret_key_ref=V1SecretKeySelector(
                 name="hf", key="token")))],
        resources=V1ResourceRequirements(requests={"cpu": "16", "memory": "128Gi"},
                                         limits={"memory": "128Gi", "nvidia.com/gpu": "8", "rdma/hca": "1"}),
        volume_mounts=[V1VolumeMount(name="data", mount_path="/data"), V1VolumeMount(name="shm", mount_path="/dev/shm")],
        working_dir="/workspace",
    )
    container.update(over.pop("container", {}))
    spec = dict(
        containers=[V1Container(**container)],
        volumes=[V1Volume(name="data", persistent_volume_claim=V1PersistentVolumeClaimVolumeSource(claim_name="ds")),
                 V1Volume(name="shm", empty_dir=V1EmptyDirVolumeSource(medium="Memory", size_limit="32Gi"))],
        service_account_name="trainer-irsa",
        tolerations=[V1Toleration(key="dedicated", operator="Equal", value="ml", effect="NoSchedule")],
        node_selector={"example.com/fabric": "ib"},
        image_pull_secrets=[V1LocalObjectReference(name="regcred")],
        restart_policy="OnFailure",
    )
    spec.update(over)
    return V1PodTemplateSpec(metadata=V1ObjectMeta(labels={"team": "ml"}, annotations={"example.com/a": "b"}),
                             spec=V1PodSpec(**spec))


def job(master: V1PodTemplateSpec | None = None, worker: V1PodTemplateSpec | None = None,
        **spec: Any) -> models.KubeflowOrgV1PyTorchJob:
    replicas = {"Master": models.KubeflowOrgV1ReplicaSpec(replicas=1, restart_policy="OnFailure",
                                                          template=master or pod())}
    replicas["Worker"] = models.KubeflowOrgV1ReplicaSpec(replicas=7, template=worker or pod())
    return models.KubeflowOrgV1PyTorchJob(
        api_version="kubeflow.org/v1", kind="PyTorchJob", metadata=V1ObjectMeta(name="llm", labels={"project": "x"}),
        spec=models.KubeflowOrgV1PyTorchJobSpec(
            run_policy=spec.pop("run_policy", models.KubeflowOrgV1RunPolicy()), nproc_per_node="8",
            pytorch_replica_specs=replicas, **spec))


def test_a_kubeflow_training_job_keeps_everything_the_user_set() -> None:
    t = JobTemplate.build(job=job())
    assert t.name == "llm" and t.image == "registry.example/llm:2" and t.command == ("torchrun",)
    assert t.args == ("train.py", "--epochs", "3") and t.nproc_per_node == "8"
    assert dict(t.env) == {"HF_HOME": "/data/hf",
                           "HF_TOKEN": {"valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}}
    # the GPU line is kfp-gpu's (the node's GPUs); the rest is kept
    assert t.resources == {"requests": {"cpu": "16", "memory": "128Gi"}, "limits": {"memory": "128Gi", "rdma/hca": "1"}}
    assert t.shm_size == "32Gi" and [v["name"] for v in t.volumes] == ["data"]
    assert t.volume_mounts == ({"name": "data", "mountPath": "/data"},)
    assert t.service_account == "trainer-irsa" and t.image_pull_secrets == ("regcred",)
    assert t.tolerations == ({"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},)
    assert t.node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "example.com/fabric", "operator": "In", "values": ["ib"]}]}]
    assert dict(t.labels) == {"project": "x", "team": "ml"} and dict(t.annotations) == {"example.com/a": "b"}
    assert t.container_extra == {"workingDir": "/workspace"}
    # the spec alone, a plain dict, and overrides on top
    s = JobTemplate.build(job=job().spec, name="llm")
    assert s.image == t.image and s.volumes == t.volumes and dict(s.labels) == {"team": "ml"}
    assert JobTemplate.build(job=_camel(job())) == t
    assert JobTemplate.build(job=_camel(job()), args=["x"]) == JobTemplate.build(**{**_fields(t), "args": ["x"]})
    assert JobTemplate.from_json(t.to_json()) == t


def _fields(t: JobTemplate) -> dict[str, Any]:
    return {k: getattr(t, k) for k in t.to_dict()}


def _camel(j: Any) -> dict[str, Any]:
    from kubeflow.training import ApiClient

    out: dict[str, Any] = ApiClient().sanitize_for_serialization(j)
    return out


def test_the_rendered_job_keeps_the_users_pod_and_adds_kfp_gpus_placement() -> None:
    t = JobTemplate.build(job=job())
    body = pytorchjob.manifest("j", capacity=CAP, template=t, labels={"kfp-gpu.io/run-id": "run-1"}, nodes=3,
                               checkpoint_uri="gs://b/c", resume_step=20, run_id="run-1", pin=True)
    assert body["spec"]["nprocPerNode"] == "8" and body["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] == 3
    assert body["metadata"]["labels"] == {"project": "x", "team": "ml", "kfp-gpu.io/run-id": "run-1",
                                          ownership.JOB_LABEL: "j"}
    rs = body["spec"]["pytorchReplicaSpecs"]
    assert rs["Master"]["replicas"] == 1 and rs["Worker"]["replicas"] == 2  # gang size, not the model's 7
    for r in rs.values():
        assert r["restartPolicy"] == "Never"
        spec = r["template"]["spec"]
        assert "kfp-gpu.io/sim-duration" not in r["template"]["metadata"]["annotations"]  # not a local target
        c = spec["containers"][0]
        assert c["resources"]["limits"] == {"memory": "128Gi", "rdma/hca": "1", "nvidia.com/gpu": "8"}
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}} in spec["volumes"]
        env = {e["name"]: e for e in c["env"]}
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "token"
        assert env[pytorchjob.ENV_RESUME_STEP]["value"] == "20" and c["workingDir"] == "/workspace"
        assert spec["serviceAccountName"] == "trainer-irsa" and spec["imagePullSecrets"] == [{"name": "regcred"}]
        assert spec["tolerations"][:len(CAP.tolerations())] == CAP.tolerations()
        assert spec["tolerations"][-1]["key"] == "dedicated"
        assert spec["nodeSelector"] == {**CAP.node_selector(), "kfp-gpu.io/run-id": "run-1"}  # the claim label
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [{"key": "example.com/fabric", "operator": "In",
                                                "values": ["ib"]}]}]  # the user's, one term whatever the gang size


def test_the_local_target_default_duration_gives_way_to_the_templates_and_the_steps() -> None:
    def ann(t: JobTemplate, **kw: Any) -> dict[str, str]:
        body = pytorchjob.manifest("j", capacity=CAP, template=t, labels={}, nodes=1, checkpoint_uri="",
                                   resume_step=0, run_id="r", **kw)
        out: dict[str, str] = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["annotations"]
        return out

    key, pull = pytorchjob.SIM_DURATION_ANNOTATION, "kfp-gpu.io/image-pull"
    assert ann(JobTemplate(), local=True) == {key: "2s", pull: "world"}  # the local world charges the image pull
    assert ann(JobTemplate(annotations={key: "9s"}), local=True) == {key: "9s", pull: "world"}
    assert ann(JobTemplate(annotations={key: "9s"}), local=True, pod_annotations={key: "1s"}) == \
        {key: "1s", pull: "world"}
    assert ann(JobTemplate()) == {}


@pytest.mark.parametrize("make, field", [
    (lambda: job(run_policy=models.KubeflowOrgV1RunPolicy(backoff_limit=3)), "job.spec.runPolicy"),
    (lambda: job(elastic_policy=models.KubeflowOrgV1ElasticPolicy(max_replicas=4)), "job.spec.elasticPolicy"),
    (lambda: job(worker=pod(container={"image": "other:1"})), "job.spec.pytorchReplicaSpecs.Worker.template"),
    (lambda: job(master=pod(init_containers=[V1Container(name="i", image="x")]),
                 worker=pod(init_containers=[V1Container(name="i", image="x")])),
     "job.spec.pytorchReplicaSpecs.Master.template.spec.initContainers"),
    (lambda: job(master=pod(containers=[V1Container(name="pytorch", image="a"), V1Container(name="s", image="b")])),
     "job.spec.pytorchReplicaSpecs.Master.template.spec.containers"),
    (lambda: job(master=pod(affinity=V1Affinity(pod_affinity=V1PodAffinity(required_during_scheduling_ignored_during_execution=[])))),
     "job.spec.pytorchReplicaSpecs.Master.template.spec.affinity.podAffinity"),
    (lambda: job(master=pod(container={"volume_mounts": [V1VolumeMount(name="data", mount_path="/dev/shm")]})),
     "job.spec.pytorchReplicaSpecs.Master.template.spec.volumes[data]"),
    (lambda: job(master=pod(container={"lifecycle": {"preStop": {}}})),
     "job.spec.pytorchReplicaSpecs.Master.template.spec.containers[0].lifecycle"),
    (lambda: {"kind": "TFJob", "spec": {"tfReplicaSpecs": {}}}, "job.kind"),
    (lambda: "not a job", "job"),
])
def test_what_kfp_gpu_cannot_keep_is_refused_by_name(make: Any, field: str) -> None:
    with pytest.raises(InvalidSpec) as exc:
        JobTemplate.build(job=make())
    assert exc.value.field == field, str(exc.value)


def test_node_affinity_of_the_model_is_anded_with_the_gang() -> None:
    terms = [V1NodeSelectorTerm(match_expressions=[V1NodeSelectorRequirement(key="a", operator="In", values=["1"])]),
             V1NodeSelectorTerm(match_expressions=[V1NodeSelectorRequirement(key="b", operator="Exists")])]
    aff = V1Affinity(node_affinity=V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=V1NodeSelector(node_selector_terms=terms)))
    p = pod(affinity=aff, node_selector=None)
    t = JobTemplate.build(job=job(master=p, worker=p))
    a = pytorchjob.node_affinity(t.node_affinity, ("n1",))
    got = a["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [([e["key"] for e in t["matchExpressions"]], t["matchFields"][0]["values"]) for t in got] == [
        (["a"], ["n1"]), (["b"], ["n1"])]
