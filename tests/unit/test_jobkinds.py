"""The job-kind seam without a cluster: both builders (PyTorchJob, TrainJob) render the same pod, the TrainJob's
shape (trainer fields + kfp-gpu's runtime patch), decoration-time checks of kind/runtime, the kubeflow SDK's
TrainJob model as a template, and the gang watch reading a TrainJob's attempts, conditions and suspension."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kfp_gpu import jobkinds, ownership
from kfp_gpu.checkpoint.resume import Resume
from kfp_gpu.cluster import trainjob
from kfp_gpu.cluster.watch import Event
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.job import JobTemplate
from kfp_gpu.jobkinds import JobRequest, PyTorchJobKind, TrainJobKind
from kfp_gpu.plan.recovery import Cause, Verdict
from kfp_gpu.steps.capacity import Capacity, Placement

CAP = Capacity("run-1", (Placement("spot-a", "us-central1-a", ("n0", "n1", "n2")),), 8, "nvidia-h100-80gb",
               spot=True, extra={"tolerations": ["dedicated=ml:NoSchedule"]})
OWNER = {"kfp-gpu.io/run-id": "run-1", "kfp-gpu.io/step": "train", "kfp-gpu.io/lease-expires": "9999999999"}
TPL = dict(name="finetune", image="img:1", command=["python", "-m", "t"], args=["--steps", "30"],
           env={"A": "1"}, resources={"requests": {"cpu": "4"}, "limits": {"memory": "64Gi"}}, shm_size="8Gi",
           tolerations=[{"key": "dedicated", "operator": "Exists"}], annotations={"team": "ml"},
           labels={"project": "x"}, service_account="trainer-sa", resume_args=["--resume_from_checkpoint", "{path}"])
RESUME = Resume(step=20, path="/ck/step-20", format="kfp-gpu", created=1.0, root="/ck", name="step-20")


def _req(template: JobTemplate, **kw: Any) -> JobRequest:
    args: dict[str, Any] = dict(checkpoint_uri="/ck", resume=RESUME, dataset_uri="gs://d",
                                pod_annotations={"autoscaling.x-k8s.io/consume-provisioning-request": "pr-1"})
    args.update(kw)
    cap = args.pop("capacity", CAP)
    return JobRequest("j", template, cap, OWNER, 3, "run-1", **args)


def _ptj_pod(body: dict[str, Any]) -> dict[str, Any]:
    tpl: dict[str, Any] = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    return tpl


def _tj_pod(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    patch = body["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]
    pod: dict[str, Any] = patch["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    return pod, body["spec"]["trainer"]


def test_both_kinds_place_their_pods_identically() -> None:
    ptj = PyTorchJobKind().build(_req(JobTemplate(**TPL)))
    tj = TrainJobKind().build(_req(JobTemplate(**TPL, kind="trainjob")))
    p, (t, trainer) = _ptj_pod(ptj)["spec"], _tj_pod(tj)
    for key in ("nodeSelector", "tolerations", "volumes", "serviceAccountName"):
        assert t["spec"][key] == p[key], key
    assert "affinity" not in t["spec"] and "affinity" not in p  # no per-node terms: the pin is one label
    assert t["spec"]["tolerations"][:len(CAP.tolerations())] == CAP.tolerations()  # GPU taint, target's, claim taint
    assert t["spec"]["nodeSelector"] == {"cloud.google.com/gke-nodepool": "spot-a",
                                         "kfp-gpu.io/run-id": "run-1"}  # pinned to the nodes run-1 claimed
    c = p["containers"][0]
    assert (trainer["image"], trainer["command"], trainer["args"], trainer["env"], trainer["resourcesPerNode"]) == (
        c["image"], c["command"], c["args"], c["env"], c["resources"])
    assert t["spec"]["containers"] == [{"name": "node", "volumeMounts": c["volumeMounts"]}]  # no env: refused there
    ann = _ptj_pod(ptj)["metadata"]["annotations"]
    assert t["metadata"]["annotations"] == ann == {"team": "ml",
                                                   "autoscaling.x-k8s.io/consume-provisioning-request": "pr-1"}
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert env == {"A": "1", "KFP_GPU_CHECKPOINT_URI": "/ck", "KFP_GPU_RESUME_STEP": "20",
                   "KFP_GPU_RESUME_PATH": "/ck/step-20", "KFP_GPU_RESUME_FORMAT": "kfp-gpu", "KFP_GPU_RUN_ID": "run-1",
                   "KFP_GPU_DATASET_URI": "gs://d"}
    assert trainer["args"] == ["--steps", "30", "--resume_from_checkpoint", "/ck/step-20"]
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "8"
    assert tj["metadata"]["annotations"]["kfp-gpu.io/resume-step"] == ptj["metadata"]["annotations"][
        "kfp-gpu.io/resume-step"] == "20"


def test_a_trainjob_references_its_runtime_runs_the_gang_and_labels_every_pod() -> None:
    kind = jobkinds.for_template(JobTemplate(**TPL, kind="trainjob", nproc_per_node="gpu"))
    assert isinstance(kind, TrainJobKind)
    body = kind.build(_req(JobTemplate(**TPL, kind="trainjob", nproc_per_node="gpu"), resume=None))
    assert body["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and body["kind"] == "TrainJob"
    assert body["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                          "name": "torch-distributed"}
    pod, trainer = _tj_pod(body)
    assert trainer["numNodes"] == 3 and trainer["numProcPerNode"] == 8 and "suspend" not in body["spec"]
    assert trainer["args"] == ["--steps", "30"]  # fresh start: no resume arguments
    patch = body["spec"]["runtimePatches"][0]
    assert patch["manager"] == "kfp-gpu.io/train"
    assert patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["name"] == "node"
    attempt = body["metadata"]["annotations"][ownership.ATTEMPT]
    assert pod["metadata"]["labels"] == {**OWNER, "project": "x", "kfp-gpu.io/job": "j", ownership.ATTEMPT: attempt}
    assert body["metadata"]["labels"] == {**OWNER, "project": "x", "kfp-gpu.io/job": "j"}
    assert kind.job_key(body) == kind.pod_key(pod) == attempt
    again = kind.build(_req(JobTemplate(**TPL, kind="trainjob"), resume=None))
    assert again["metadata"]["annotations"][ownership.ATTEMPT] != attempt  # every attempt is told apart


def test_a_queued_trainjob_is_created_suspended_with_the_queue_label() -> None:
    body = TrainJobKind().build(_req(JobTemplate(**TPL, kind="trainjob"), queue="team-a"))
    assert body["spec"]["suspend"] is True and body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    kind = TrainJobKind()
    assert kind.suspended(body) and not kind.suspended({"spec": {}})


def test_a_namespaced_runtime_is_referenced_as_a_training_runtime() -> None:
    t = JobTemplate(**TPL, kind="trainjob", runtime="my-torch", runtime_kind="TrainingRuntime")
    body = jobkinds.for_template(t).build(_req(t))
    assert body["spec"]["runtimeRef"]["kind"] == "TrainingRuntime" and body["spec"]["runtimeRef"]["name"] == "my-torch"


def test_the_trainjob_conditions_read_as_the_watch_expects() -> None:
    kind = TrainJobKind()
    done = {"status": {"conditions": [{"type": "Complete", "status": "True", "reason": "JobSetCompleted"},
                                      {"type": "Suspended", "status": "False"}]}}
    assert kind.conditions(done) == {"Succeeded": "JobSetCompleted"}
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "message": "node-0 failed"}]}}
    assert kind.conditions(failed) == {"Failed": "node-0 failed"}


@pytest.mark.parametrize("fields, field, words", [
    (dict(kind="jaxjob"), "train.kind", "allowed: pytorchjob, trainjob"),
    (dict(runtime="torch-distributed"), "train.runtime", "TrainJob setting"),
    (dict(kind="trainjob", runtime_kind="Runtime"), "train.runtime_kind", "ClusterTrainingRuntime"),
    (dict(kind="trainjob", runtime="Torch"), "train.runtime", "runtime name"),
    (dict(kind="trainjob", nproc_per_node="cpu"), "train.nproc_per_node", "numProcPerNode"),
    (dict(kind="trainjob", pod_extra={"priorityClassName": "high"}), "train.pod_extra.priorityClassName",
     "runtime patch cannot set it"),
    (dict(kind="trainjob", container_extra={"workingDir": "/w"}), "train.container_extra.workingDir",
     "runtime patch cannot set it"),
    (dict(kind="trainjob", env={"PET_NNODES": "2"}), "train.env.PET_NNODES", "PET_* variables"),
])
def test_bad_kind_settings_fail_at_decoration_time_in_one_line(fields: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidSpec) as err:
        JobTemplate.build(**fields)
    assert err.value.fields["field"] == field and words in str(err.value) and "\n" not in str(err.value)


def test_the_kind_travels_in_the_template_json_and_pytorchjob_templates_stay_as_they_were() -> None:
    t = JobTemplate(**TPL, kind="trainjob")
    assert JobTemplate.from_json(t.to_json()) == t and (t.runtime, t.runtime_kind) == ("torch-distributed",
                                                                                      "ClusterTrainingRuntime")
    assert not {"kind", "runtime", "runtime_kind"} & set(JobTemplate().to_dict())
    assert isinstance(jobkinds.for_template(JobTemplate()), PyTorchJobKind)


def _sdk_trainjob() -> Any:
    from kubeflow_trainer_api import models as m

    return m.TrainerV1alpha1TrainJob(
        api_version="trainer.kubeflow.org/v1alpha1", kind="TrainJob",
        metadata={"name": "finetune", "labels": {"team": "ml"}, "annotations": {"owner": "me"}},
        spec=m.TrainerV1alpha1TrainJobSpec(
            runtime_ref=m.TrainerV1alpha1RuntimeRef(name="torch-distributed"),
            trainer=m.TrainerV1alpha1Trainer(image="ghcr.io/me/train:1", command=["torchrun", "train.py"],
                                             args=["--lr", "1e-4"], num_proc_per_node=8,
                                             env=[{"name": "HF_HOME", "value": "/cache"}])))


def test_a_kubeflow_sdk_trainjob_becomes_the_template() -> None:
    t = JobTemplate.build(job=_sdk_trainjob(), checkpoint_every=5)
    assert (t.kind, t.runtime, t.name, t.image) == ("trainjob", "torch-distributed", "finetune", "ghcr.io/me/train:1")
    assert t.command == ("torchrun", "train.py") and t.args == ("--lr", "1e-4") and t.nproc_per_node == "8"
    assert dict(t.env) == {"HF_HOME": "/cache"} and dict(t.labels) == {"team": "ml"}
    body = jobkinds.for_template(t).build(_req(t))
    assert body["spec"]["trainer"]["numProcPerNode"] == 8 and body["spec"]["trainer"]["numNodes"] == 3


@pytest.mark.parametrize("spec, field", [
    ({"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 4}}, "job.spec.trainer.numNodes"),
    ({"runtimeRef": {"name": "torch-distributed"}, "runtimePatches": [{"manager": "me.io/x"}]},
     "job.spec.runtimePatches"),
    ({"runtimeRef": {"name": "torch-distributed"}, "suspend": True}, "job.spec.suspend"),
])
def test_parts_of_a_trainjob_kfp_gpu_owns_are_refused(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpec) as err:
        JobTemplate.build(job={"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "spec": spec})
    assert err.value.fields["field"] == field


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": "us-central1-a"}}, "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}}


def _pod(name: str, node: str, attempt: str, phase: str = "Running", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {ownership.ATTEMPT: attempt},
                         "ownerReferences": [{"uid": "batch-job-uid"}]},  # a Job of the JobSet, not the TrainJob
            "spec": {"nodeName": node}, "status": {"phase": phase, **status}}


def test_the_gang_watch_follows_a_trainjob_attempt_by_its_attempt_label() -> None:
    kind = TrainJobKind()
    gw = kind.watch(client.ApiClient(), "ns", "j")
    for n in CAP.nodes:
        gw.apply(Event("node", "SYNC", _node(n), 1000.0))
    job = {"metadata": {"uid": "tj-uid", "annotations": {ownership.ATTEMPT: "a2"}}, "spec": {}}
    for i, n in enumerate(CAP.nodes):
        gw.apply(Event("pod", "ADDED", _pod(f"old{i}", n, "a1", "Failed"), 1000.0))  # the previous attempt
    gw.begin(job, CAP.nodes, 3)
    for i, n in enumerate(CAP.nodes):
        gw.apply(Event("pod", "ADDED", _pod(f"p{i}", n, "a2"), 1001.0))
    assert set(gw.pods) == {"p0", "p1", "p2"} and gw.running_at == 1001.0
    bad = _pod("p1", "n1", "a2", "Failed",
               containerStatuses=[{"state": {"terminated": {"exitCode": 3, "reason": "Error"}}}])
    gw.apply(Event("pod", "MODIFIED", bad, 1002.0))
    done = {**job, "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "FailedJobs"}]}}
    gw.apply(Event("job", "MODIFIED", done, 1002.0))
    v = gw.watch_attempt(admission_s=60, placement_s=60)
    assert isinstance(v, Verdict) and v.cause is Cause.APP_FAILURE and v.pods == ("p1",)


def test_job_kinds_never_import_the_steps() -> None:
    pkg = Path(__file__).resolve().parents[2] / "kfp_gpu" / "jobkinds"
    for path in pkg.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("kfp_gpu.steps"), f"jobkinds/{path.name} imports {node.module}"


def _runtime(pod_group: dict[str, Any] | None = None, job: str = "node", container: str = "node") -> dict[str, Any]:
    spec: dict[str, Any] = {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {"replicatedJobs": [
        {"name": "dataset-initializer", "template": {"spec": {"template": {"spec": {"containers": [
            {"name": "dataset-initializer"}]}}}}},
        {"name": job, "template": {"metadata": {"labels": {trainjob.ANCESTOR_LABEL: "trainer"}},
                                   "spec": {"template": {"spec": {"containers": [{"name": container}]}}}}}]}}}
    if pod_group is not None:
        spec["podGroupPolicy"] = pod_group
    return {"spec": spec}


def test_a_runtime_that_gang_schedules_gets_nothing_of_kfp_gpus_scheduling_on_top() -> None:
    rt = trainjob.runtime_of(_runtime({"coscheduling": {"scheduleTimeoutSeconds": 120}}, job="trainer"),
                             "gang-torch", "TrainingRuntime")
    assert rt.gang_scheduler == "coscheduling" and rt.replicated_job == "trainer"
    kind = TrainJobKind("gang-torch", "TrainingRuntime")
    kind.runtime = rt
    body = kind.build(_req(JobTemplate(**TPL, kind="trainjob")))
    patch = body["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert patch["name"] == "trainer"  # the runtime's trainer job, found by its ancestor label
    text = str(body)
    for ours in ("schedulerName", "minAvailable", "minMember", "pod-group", "schedulingPolicy"):
        assert ours not in text, ours  # the Trainer makes the PodGroup; kfp-gpu adds no gang scheduling of its own
    assert trainjob.runtime_of(_runtime(), "torch-distributed", "ClusterTrainingRuntime").gang_scheduler == ""


def test_a_runtime_without_a_node_container_is_refused_by_name() -> None:
    with pytest.raises(InvalidSpec) as err:
        trainjob.runtime_of(_runtime(container="launcher"), "mpi", "ClusterTrainingRuntime")
    assert err.value.fields["field"] == "train.runtime" and "'node' container" in str(err.value)


def _strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [x for v in node.values() for x in _strings(v)]
    if isinstance(node, list):
        return [x for v in node for x in _strings(v)]
    return [node] if isinstance(node, str) else []


def test_kfp_gpu_train_takes_the_kind_at_decoration_time(tmp_path: Path) -> None:
    import json

    import yaml
    from kfp import compiler

    import kfp_gpu
    from kfp_gpu.spec import ProvisioningSpec

    @kfp_gpu.provisioned(ProvisioningSpec("a100-80gb", 2))
    def tj():  # type: ignore[no-untyped-def]  # (a string "None" return annotation reads as an output)
        kfp_gpu.train(name="finetune", kind="trainjob", runtime="torch-distributed", nproc_per_node=8)

    compiler.Compiler().compile(tj, str(tmp_path / "tj.yaml"))
    texts = [x for d in yaml.safe_load_all((tmp_path / "tj.yaml").read_text()) for x in _strings(d)]
    job = next(json.loads(x) for x in texts if x.startswith("{") and '"kind": "trainjob"' in x)
    assert (job["kind"], job["runtime"], job["runtime_kind"], job["nproc_per_node"]) == (
        "trainjob", "torch-distributed", "ClusterTrainingRuntime", "8")
    with pytest.raises(InvalidSpec, match="train.pod_extra.priorityClassName"):
        @kfp_gpu.provisioned(ProvisioningSpec("a100-80gb", 2))
        def bad():  # type: ignore[no-untyped-def]
            kfp_gpu.train(name="finetune", kind="trainjob", pod_extra={"priorityClassName": "high"})


def test_a_gang_that_forms_at_admission_is_not_pinned_to_claims_it_never_made() -> None:
    """Kueue admission: the capacity has no nodes and nothing is claimed before the job's pods bind, so a claim-label
    pin would leave every pod Pending; the flavor's labels place it instead."""
    nodeless = Capacity("run-1", (), 8, "nvidia-h100-80gb", spot=True, extra={"pools": ["spot-a"]})
    for kind, pod in ((PyTorchJobKind(), lambda b: _ptj_pod(b)), (TrainJobKind(), lambda b: _tj_pod(b)[0])):
        tpl = JobTemplate(**TPL, **({"kind": "trainjob"} if kind.NAME == "trainjob" else {}))
        for pin in (True, False):
            sel = pod(kind.build(_req(tpl, capacity=nodeless, pin=pin)))["spec"]["nodeSelector"]
            assert "kfp-gpu.io/run-id" not in sel, (kind.NAME, pin, sel)
            assert sel == {"cloud.google.com/gke-nodepool": "spot-a"}
