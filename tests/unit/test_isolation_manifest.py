"""The run's claim taint and its own toleration fit together, and the job's pods carry it."""

from __future__ import annotations

from kfp_gpu.cluster import pytorchjob
from kfp_gpu.cluster.nodes import claim_taint_key, run_taint, run_toleration
from kfp_gpu.errors import KfpGpuError
from kfp_gpu.job import JobTemplate
from kfp_gpu.steps.capacity import Capacity, Placement


def _tolerates(toleration: dict[str, str], taint: dict[str, str]) -> bool:
    """The scheduler's rule (k8s.io/api core/v1 Toleration.ToleratesTaint) for NoSchedule taints."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return toleration.get("value", "") == taint.get("value", "")


RUN = "Llm-Finetune/2024 run #7"
NS = "ml-team"


def test_a_runs_toleration_tolerates_its_own_taint_only():
    mine = run_taint(RUN, NS)
    assert mine["key"] == claim_taint_key(NS) and mine["effect"] == "NoSchedule"
    assert _tolerates(run_toleration(RUN, NS), mine)
    assert not _tolerates(run_toleration("another-run", NS), mine)
    # the same run id in another namespace is another claim
    assert not _tolerates(run_toleration(RUN, "other-team"), mine)
    # what a foreign GPU pod carries does not let it past the claim
    assert not _tolerates({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, mine)


def test_job_pods_tolerate_the_gpu_taint_and_their_own_runs_claim():
    cap = Capacity(RUN, (Placement("pool-a", "us-central1-a", ("n1", "n2")),), 8, "nvidia-h100-80gb", spot=True,
                   namespace=NS)
    body = pytorchjob.manifest("j", capacity=cap, template=JobTemplate(), labels={}, nodes=2, checkpoint_uri="",
                               resume_step=0, run_id=RUN, pin=True)
    for replica in body["spec"]["pytorchReplicaSpecs"].values():
        tols = replica["template"]["spec"]["tolerations"]
        assert any(_tolerates(t, run_taint(RUN, NS)) for t in tols)
        assert not any(_tolerates(t, run_taint("other", NS)) for t in tols)
        assert not any(_tolerates(t, run_taint(RUN, "other-team")) for t in tols)  # only its own namespace's
        assert any(_tolerates(t, {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}) for t in tols)


def test_errors_print_on_one_line_with_their_fix():
    err = KfpGpuError("the thing is broken", remediation="mend it")
    assert str(err) == "the thing is broken (fix: mend it)"
    assert pytorchjob.crd_missing().fields["crd"] == "pytorchjobs.kubeflow.org"
    assert "Training Operator" in pytorchjob.crd_missing().remediation
