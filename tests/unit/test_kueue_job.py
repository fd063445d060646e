"""The job's Kueue queue label and suspension, and Workload objects (as Kueue v0.17 writes them) -> facts."""

from __future__ import annotations

import pytest

from kfp_gpu.cluster import pytorchjob
from kfp_gpu.cluster.kueue_workload import owner_uid, workload_fact
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.job import JobTemplate
from kfp_gpu.steps.admission import check_timeout
from kfp_gpu.steps.capacity import Capacity, Placement

CAP = Capacity("run-1", (Placement("pool-a", "us-central1-a", ("n1", "n2")),), 8, "nvidia-h100-80gb", spot=False)


def _body(queue: str, template: JobTemplate | None = None) -> dict:  # type: ignore[type-arg]
    return pytorchjob.manifest("j", capacity=CAP, template=template or JobTemplate(), labels={}, nodes=2,
                               checkpoint_uri="", resume_step=0, run_id="run-1", pin=True, queue=queue)


def test_a_queued_job_carries_the_queue_label_and_is_created_suspended() -> None:
    body = _body("team-a")
    assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert body["spec"]["runPolicy"]["suspend"] is True
    for replica in body["spec"]["pytorchReplicaSpecs"].values():  # Kueue reads the job's label, not the pods'
        assert "kueue.x-k8s.io/queue-name" not in replica["template"]["metadata"]["labels"]


def test_without_a_queue_nothing_changes() -> None:
    body = _body("")
    assert "kueue.x-k8s.io/queue-name" not in body["metadata"]["labels"]
    assert "suspend" not in body["spec"]["runPolicy"]


def test_the_resolved_queue_wins_over_a_template_label() -> None:
    body = _body("team-a", JobTemplate(labels={"kueue.x-k8s.io/queue-name": "other"}))
    assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


PENDING = {
    "metadata": {"name": "pytorchjob-j-8e1c2", "labels": {"kueue.x-k8s.io/job-uid": "uid-1"},
                 "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "j",
                                      "uid": "uid-1", "controller": True}]},
    "spec": {"active": True, "queueName": "team-a"},
    "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                               "message": "couldn't assign flavors to pod set master: insufficient unused quota for "
                                          "nvidia.com/gpu in flavor a100, 8 more needed"}]},
}


def test_pending_workload() -> None:
    f = workload_fact(PENDING, 3.0)
    assert f.name == "pytorchjob-j-8e1c2" and f.owner_uid == "uid-1" and f.at == 3.0
    assert not f.admitted and not f.quota_reserved and not f.evicted
    assert f.pending.startswith("couldn't assign flavors to pod set master")


def test_admitted_then_evicted_workload() -> None:
    obj = {**PENDING, "status": {
        "admission": {"clusterQueue": "cq-a", "podSetAssignments": []},
        "conditions": [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
            {"type": "Admitted", "status": "True", "reason": "Admitted"},
        ]}}
    f = workload_fact(obj, 4.0)
    assert f.admitted and f.quota_reserved and f.cluster_queue == "cq-a" and not f.evicted
    obj["status"]["conditions"].append({"type": "Evicted", "status": "True", "reason": "Preempted",
                                        "message": "Preempted to accommodate a workload (UID: x) due to "
                                                   "prioritization in the ClusterQueue"})
    f = workload_fact(obj, 5.0)
    assert f.evicted == "Preempted" and f.evicted_message.startswith("Preempted to accommodate")
    obj["status"]["conditions"][-1]["status"] = "False"  # re-admitted: Kueue resets Evicted
    assert not workload_fact(obj, 6.0).evicted


def test_quota_reserved_waiting_for_admission_checks() -> None:
    obj = {**PENDING, "status": {
        "conditions": [{"type": "QuotaReserved", "status": "True"}],
        "admissionChecks": [{"name": "dws-prov", "state": "Pending", "message": "Waiting for resources"}]}}
    assert workload_fact(obj, 1.0).pending == "dws-prov: Pending (Waiting for resources)"


def test_deactivated_workload_is_evicted_and_owner_falls_back_to_the_label() -> None:
    obj = {"metadata": {"name": "w", "labels": {"kueue.x-k8s.io/job-uid": "uid-9"}}, "spec": {"active": False}}
    assert workload_fact(obj, 1.0).evicted == "InactiveWorkload"
    assert owner_uid(obj) == "uid-9"


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), True, "60"])
def test_queue_timeout_is_validated(bad: object) -> None:
    with pytest.raises(InvalidSpec, match="queue_timeout_s"):
        check_timeout(bad)  # type: ignore[arg-type]
    check_timeout(3600.0)


PIPELINE = '''
import kfp_gpu
from kfp_gpu.spec import ProvisioningSpec

@kfp_gpu.provisioned(ProvisioningSpec("a100-80gb", 2))
def queued() -> None:
    kfp_gpu.train(name="train", image="busybox", queue_timeout_s=QUEUE_TIMEOUT)
'''


def test_the_pipeline_sets_the_train_steps_queue_timeout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import yaml

    from kfp_gpu.compile import compile_pipeline

    src = tmp_path / "p.py"
    src.write_text(PIPELINE.replace("QUEUE_TIMEOUT", "7200"))
    out = compile_pipeline(src, tmp_path / "p.yaml")
    doc = next(yaml.safe_load_all(out.read_text()))
    task = doc["root"]["dag"]["tasks"]["exit-handler-1"]["componentRef"]["name"]
    tasks = doc["components"][task]["dag"]["tasks"]
    params = tasks["train-pytorchjob"]["inputs"]["parameters"]
    assert params["queue_timeout_s"]["runtimeValue"]["constant"] == 7200.0
    src.write_text(PIPELINE.replace("QUEUE_TIMEOUT", "-5"))
    with pytest.raises(InvalidSpec, match="queue_timeout_s"):
        compile_pipeline(src, tmp_path / "q.yaml")
