"""The train step's cluster-free parts: manifest, names, capacity merge, and watch events -> verdicts.

No control plane needed (the unit tier): events are fed to a GangWatch by hand, in virtual time.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from kfp_gpu import ownership
from kfp_gpu.cluster import pytorchjob
from kfp_gpu.cluster.facts import node_fact, parse_time, pod_fact, quantity
from kfp_gpu.cluster.watch import Event, GangWatch
from kfp_gpu.job import JobTemplate
from kfp_gpu.plan.recovery import Cause, Verdict
from kfp_gpu.steps.capacity import Capacity, Placement
from kfp_gpu.steps.train import merge_capacity

CAP = Capacity("run-1", (Placement("spot-a", "us-central1-a", ("n0", "n1", "n2", "n3")),), 8,
               "nvidia-h100-80gb", spot=True)


def test_job_name_is_deterministic_and_dns_safe() -> None:
    a = pytorchjob.job_name("Run_ID.With/Odd:chars-" + "x" * 80, "finetune")
    assert a == pytorchjob.job_name("Run_ID.With/Odd:chars-" + "x" * 80, "finetune")
    assert len(a) <= 50 and a[0].isalpha() and all(c.isalnum() or c == "-" for c in a)
    assert a != pytorchjob.job_name("Run_ID.With/Odd:chars-" + "x" * 80, "eval")
    assert pytorchjob.job_name("123", "t")[0].isalpha()


def test_manifest_is_a_gang_on_the_capacity() -> None:
    tpl = JobTemplate(name="ft", env=(("A", "1"),), annotations={"kfp-gpu.io/sim-duration": "7s"})
    body = pytorchjob.manifest("j", capacity=CAP, template=tpl, labels={"kfp-gpu.io/run-id": "run-1"},
                               nodes=4, checkpoint_uri="gs://b/c", resume_step=40, run_id="run-1",
                               dataset_uri="gs://d", pin=True)
    assert body["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] == 4
    rs = body["spec"]["pytorchReplicaSpecs"]
    assert rs["Master"]["replicas"] == 1 and rs["Worker"]["replicas"] == 3
    pod = rs["Worker"]["template"]
    assert pod["metadata"]["labels"][ownership.JOB_LABEL] == "j"
    assert pod["metadata"]["annotations"] == {"kfp-gpu.io/sim-duration": "7s"}
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"cloud.google.com/gke-nodepool": "spot-a", "kfp-gpu.io/run-id": "run-1"}
    assert spec["tolerations"] == CAP.tolerations() and rs["Worker"]["restartPolicy"] == "Never"
    assert "restartPolicy" not in spec  # the replica's: the operator warns once per pod when the template has one
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    assert env == {"A": "1", "KFP_GPU_CHECKPOINT_URI": "gs://b/c", "KFP_GPU_RESUME_STEP": "40",
                   "KFP_GPU_RUN_ID": "run-1", "KFP_GPU_DATASET_URI": "gs://d"}
    assert "affinity" not in spec  # the pin is the claim label: the pod's size does not grow with the gang
    single = pytorchjob.manifest("j", capacity=CAP, template=tpl, labels={}, nodes=1, checkpoint_uri="",
                                 resume_step=0, run_id="r")
    assert "Worker" not in single["spec"]["pytorchReplicaSpecs"]


def test_merge_capacity_replaces_only_the_lost_nodes() -> None:
    new = Capacity("run-1", (Placement("od-b", "us-central1-b", ("m0",)),), 8, "nvidia-h100-80gb", spot=False)
    merged = merge_capacity(CAP, {"n2"}, new)
    assert merged.nodes == ("n0", "n1", "n3", "m0") and not merged.spot
    assert merged.node_selector() == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    # a reprovision that returns the whole gang does not duplicate survivors
    full = Capacity("run-1", (Placement("spot-a", "us-central1-a", ("n0", "n1", "n3", "m1")),), 8, "x", True)
    assert merge_capacity(CAP, {"n2"}, full).nodes == ("n0", "n1", "n3", "m1")


def _node(name: str, *, taints: tuple[str, ...] = (), ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": "us-central1-a"}},
            "spec": {"taints": [{"key": k, "effect": "NoSchedule"} for k in taints]},
            "status": {"allocatable": {"nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _pod(name: str, node: str, uid: str, phase: str = "Running", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "ownerReferences": [{"uid": uid}]}, "spec": {"nodeName": node},
            "status": {"phase": phase, **status}}


def test_facts_from_raw_objects() -> None:
    n = node_fact(_node("n0", taints=("nvidia.com/gpu",)), 1.0)
    assert n.ready and n.gpus == 8 and n.zone == "us-central1-a" and n.exists
    assert not node_fact(_node("n0"), 1.0, deleted=True).exists
    p = pod_fact(_pod("p", "n0", "u", "Failed", reason="Evicted", conditions=[
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}],
        containerStatuses=[{"state": {"terminated": {"exitCode": 137, "reason": "Error"}}}]), 2.0)
    assert (p.disruption, p.reason, p.exit_code, p.owner_uid) == ("EvictionByEvictionAPI", "Evicted", 137, "u")
    assert parse_time("2024-01-02T03:04:05Z") == 1704164645.0 and parse_time(None) is None
    assert quantity("8") == 8 and quantity("2k") == 2000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _watch() -> tuple[GangWatch, Clock]:
    clock = Clock()
    gw = GangWatch(client.ApiClient(), "ns", "j", "kubeflow.org", "v1", "pytorchjobs", "x=y", clock=clock)
    for n in CAP.nodes:
        gw.apply(Event("node", "SYNC", _node(n), clock.now))
    return gw, clock


def test_gang_watch_decides_preemption_on_the_taint() -> None:
    gw, clock = _watch()
    gw.gate(CAP.nodes, 8, timeout_s=0.1)
    gw.begin({"metadata": {"uid": "u1"}}, CAP.nodes, 4)
    for i, n in enumerate(CAP.nodes):
        gw.apply(Event("pod", "ADDED", _pod(f"p{i}", n, "u1"), clock.now))
        gw.apply(Event("pod", "ADDED", _pod(f"old{i}", n, "u0", "Failed"), clock.now))  # previous attempt
    assert gw.running_at == clock.now and set(gw.pods) == {"p0", "p1", "p2", "p3"}
    gw.q.put(Event("node", "MODIFIED", _node("n2", taints=("cloud.google.com/impending-node-termination",)),
                   clock.now + 1))
    clock.now += 1.01
    v = gw.watch_attempt(admission_s=60, placement_s=60)
    assert isinstance(v, Verdict) and v.cause is Cause.PREEMPTION and v.lost_nodes == ("n2",)
    assert gw.decided_at - v.at < 0.05
    gw.apply(Event("node", "DELETED", _node("n3"), clock.now))  # a second node goes during recovery
    assert gw.lost_nodes(v) == ["n2", "n3"]


def test_gang_watch_reattach_sees_succeeded_job_and_missing_nodes() -> None:
    gw, clock = _watch()
    for i, n in enumerate(CAP.nodes):
        gw.apply(Event("pod", "SYNC", _pod(f"p{i}", n, "u1", "Succeeded"), clock.now))
    job = {"metadata": {"uid": "u1"}, "status": {"conditions": [{"type": "Succeeded", "status": "True"}]}}
    gw.begin(job, CAP.nodes, 4)
    assert len(gw.pods) == 4
    assert gw.watch_attempt(admission_s=60, placement_s=60) == "Succeeded"
    gw.begin(job, (*CAP.nodes, "gone"), 5)  # a gang node that vanished before we attached
    v = gw.watch_attempt(admission_s=60, placement_s=60)
    assert isinstance(v, Verdict) and v.lost_nodes == ("gone",)
