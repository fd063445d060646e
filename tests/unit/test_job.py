"""JobTemplate: validation with named errors, placeholders, and a lossless JSON round trip."""

from __future__ import annotations

from typing import Any

import pytest

from kfp_gpu.errors import InvalidSpec
from kfp_gpu.job import PLACEHOLDER_KEY, JobTemplate

P0 = {PLACEHOLDER_KEY: "p0"}

FULL: dict[str, Any] = dict(
    name="finetune", image="registry.example/trainer:1", command=["torchrun"], args=["--steps", 60, P0],
    env={"HF_HOME": "/data/hf", "TOKEN": {"valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}, "X": P0},
    checkpoint_every=5,
    resources={"requests": {"cpu": "8", "memory": "64Gi", "ephemeral-storage": "100Gi"},
               "limits": {"memory": "64Gi", "vpc.amazonaws.com/efa": "4", "rdma/hca": 1}},
    shm_size="16Gi",
    volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
             {"name": "creds", "secret": {"secretName": "gcs-key"}},
             {"name": "cfg", "configMap": {"name": "train-cfg"}},
             {"name": "scratch", "emptyDir": {"sizeLimit": "50Gi"}}],
    volume_mounts=[{"name": "data", "mountPath": "/data", "readOnly": True},
                   {"name": "creds", "mountPath": "/var/secrets"}, {"name": "cfg", "mountPath": "/etc/train"},
                   {"name": "scratch", "mountPath": "/scratch"}],
    service_account="trainer-wi",
    tolerations=[{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
    node_affinity={"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-central1-a"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [
            {"key": "rack", "operator": "In", "values": ["r1"]}]}}]},
    labels={"team": "ml", "app.kubernetes.io/name": "finetune"}, annotations={"example.com/owner": "alice"},
    nproc_per_node=8, image_pull_secrets=["regcred", {"name": "mirror"}],
    container_extra={"workingDir": "/workspace", "imagePullPolicy": "IfNotPresent"},
    pod_extra={"priorityClassName": "training"},
)


def test_a_full_template_round_trips_through_json_losslessly() -> None:
    t = JobTemplate.build(**FULL)
    assert JobTemplate.from_json(t.to_json()) == t
    assert t == JobTemplate(**FULL)  # build(**fields) is the constructor
    # normalised: numbers are strings, mappings are sorted pairs, pull secrets are names
    assert t.args == ("--steps", "60", P0) and t.nproc_per_node == "8"
    assert t.resources["limits"]["rdma/hca"] == "1"
    assert t.image_pull_secrets == ("regcred", "mirror")
    assert dict(t.env)["X"] == P0 and dict(t.env)["TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "token"


def test_the_default_template_round_trips_and_carries_no_simulation_knob() -> None:
    t = JobTemplate()
    assert JobTemplate.from_json(t.to_json()) == t
    assert "sim" not in t.to_json()
    # a template written by kfp-gpu 0.1 (with sim_duration_s) still parses
    old = '{"name": "t", "image": "i", "command": ["c"], "checkpoint_every": 3, "sim_duration_s": 2.0, "env": {}}'
    assert JobTemplate.from_json(old).checkpoint_every == 3


@pytest.mark.parametrize("change, field", [
    ({"resources": {"requests": {"memory": "lots"}}}, "train.resources.requests.memory"),
    ({"resources": {"memory": "64Gi"}}, "train.resources.memory"),
    ({"resources": {"limits": {"nvidia.com/gpu": "4"}}}, "train.resources.limits.nvidia.com/gpu"),
    ({"resources": {"requests": {"gpu": "1"}}}, "train.resources.requests.gpu"),
    ({"resources": {"requests": {"cpu": "9"}, "limits": {"cpu": "8"}}}, "train.resources.requests.cpu"),
    ({"resources": {"requests": {"vpc.amazonaws.com/efa": "4"}}}, "train.resources.requests.vpc.amazonaws.com/efa"),
    ({"shm_size": "16 GB"}, "train.shm_size"),
    ({"volumes": [{"name": "Data", "emptyDir": {}}]}, "train.volumes[0].name"),
    ({"volumes": [{"name": "d", "hostPath": {"path": "/"}}]}, "train.volumes[0]"),
    ({"volumes": [{"name": "d", "persistentVolumeClaim": {}}]}, "train.volumes[0].persistentVolumeClaim.claimName"),
    ({"volumes": [{"name": "dshm", "emptyDir": {}}]}, "train.volumes[0].name"),
    ({"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]}, "train.volumes[1].name"),
    ({"volume_mounts": [{"name": "nope", "mountPath": "/x"}]}, "train.volume_mounts[0].name"),
    ({"volumes": [{"name": "a", "emptyDir": {}}], "volume_mounts": [{"name": "a", "mountPath": "rel"}]},
     "train.volume_mounts[0].mountPath"),
    ({"volumes": [{"name": "a", "emptyDir": {}}], "volume_mounts": [{"name": "a", "mountPath": "/dev/shm"}]},
     "train.volume_mounts[0].mountPath"),
    ({"volumes": [{"name": "a", "emptyDir": {}}], "volume_mounts": [{"name": "a", "mountPath": "/x", "foo": 1}]},
     "train.volume_mounts[0].foo"),
    ({"service_account": "Trainer_SA"}, "train.service_account"),
    ({"tolerations": [{"key": "k", "operator": "In"}]}, "train.tolerations[0].operator"),
    ({"node_affinity": {"podAffinity": {}}}, "train.node_affinity"),
    ({"labels": {"kfp-gpu.io/run-id": "mine"}}, "train.labels.kfp-gpu.io/run-id"),
    ({"labels": {"training.kubeflow.org/replica-type": "x"}}, "train.labels.training.kubeflow.org/replica-type"),
    ({"labels": {"team": "a b"}}, "train.labels.team"),
    ({"annotations": {"kfp-gpu.io/resume-step": "3"}}, "train.annotations.kfp-gpu.io/resume-step"),
    ({"nproc_per_node": 0}, "train.nproc_per_node"),
    ({"nproc_per_node": "many"}, "train.nproc_per_node"),
    ({"image_pull_secrets": ["Reg Cred"]}, "train.image_pull_secrets[0]"),
    ({"env": {"1BAD": "x"}}, "train.env.1BAD"),
    ({"env": {"A": ["x"]}}, "train.env.A"),
    ({"args": ["--x", None]}, "train.args[1]"),
    ({"image": ""}, "train.image"),
    ({"checkpoint_every": 0}, "train.checkpoint_every"),
    ({"container_extra": {"lifecycle": {}}}, "train.container_extra.lifecycle"),
    ({"pod_extra": {"hostNetwork": True}}, "train.pod_extra.hostNetwork"),
    ({"gpus": 8}, "train.gpus"),
])
def test_each_bad_field_is_named(change: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpec) as exc:
        JobTemplate.build(**change)
    assert exc.value.field == field, str(exc.value)
    assert "\n" not in str(exc.value)


def test_placeholders_stand_for_strings_and_are_not_validated() -> None:
    t = JobTemplate.build(image=P0, args=[P0], env={"A": P0}, service_account=P0, shm_size=P0,
                          resources={"requests": {"memory": P0}}, labels={"run": P0}, nproc_per_node=P0,
                          checkpoint_every=P0, volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": P0}}])
    assert JobTemplate.from_json(t.to_json()) == t
    # anything else that is not a plain value is refused, named
    with pytest.raises(InvalidSpec, match="train.args"):
        JobTemplate.build(args=[{"other": 1}])
