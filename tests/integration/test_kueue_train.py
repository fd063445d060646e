"""The train step on a Kueue-gated namespace, against the real Kueue controller (v0.17, the ``kueue`` fixture), run as
the controller's identity (``step_api``) on KWOK GPU nodes: the job goes through the namespace's LocalQueue and
finishes; a job held in a full queue far longer than the no-pods watchdog neither fails nor leaks; a queue that never
admits fails on the queue deadline and cleans up; Kueue preempting the job for a higher-priority workload is a
recovery from the newest checkpoint, on the same nodes.

Quota is held by what Kueue really admits: a bare Workload (nothing runs it; its reservation is what counts), or a
batch Job whose one pod asks for more GPUs than any node has (admitted by Kueue, never scheduled).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kfp_gpu.checkpoint.store import CheckpointStore
from kfp_gpu.cluster import ledger, pytorchjob
from kfp_gpu.cluster.kueue_workload import owner_uid
from kfp_gpu.errors import QueueTimeout
from kfp_gpu.plan.kueue import GROUP, QUEUE_LABEL, VERSION
from kfp_gpu.timeline import Timeline
from kfp_gpu_rehearsal.devcluster.client import Kube
from tests.integration import test_kueue_preflight
from tests.integration.test_kueue_preflight import GPU, Kueue
from tests.integration.test_train_support import (
    ACCEL_LABEL,
    StepThread,
    job_json,
    job_pods,
    make_capacity,
    make_spec,
    running_pods,
    wait_until,
)

pytestmark = pytest.mark.integration
kq = test_kueue_preflight.kq  # the Kueue-objects fixture (cluster-scoped ones unique per test, deleted afterwards)
NodeFactory = Callable[..., tuple[str, list[str]]]


def _queue(kq: Kueue, gpus: int = 16, preemption: bool = False) -> tuple[str, str]:
    """A flavor for the KWOK nodes' accelerator, a ClusterQueue with ``gpus`` of it, a LocalQueue. Returns (lq, cq)."""
    flavor = kq.flavor("h100", {"cloud.google.com/gke-accelerator": ACCEL_LABEL})
    spec: dict[str, Any] = {"namespaceSelector": {}, "resourceGroups": [
        {"coveredResources": [GPU], "flavors": [{"name": flavor, "resources": [
            {"name": GPU, "nominalQuota": str(gpus)}]}]}]}
    if preemption:
        spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
    cq = kq._cluster("clusterqueues", "ClusterQueue", "train", spec)
    kq.wait_active(cq)
    return kq.local_queue("team", cq), cq


def _workloads(kq: Kueue) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kq.custom.list_namespaced_custom_object(GROUP, VERSION, kq.ns, "workloads")["items"]
    return items


def _admitted(kq: Kueue, name: str) -> bool:
    wl = kq.custom.get_namespaced_custom_object(GROUP, VERSION, kq.ns, "workloads", name)
    return any(c["type"] == "Admitted" and c["status"] == "True" for c in (wl.get("status") or {}).get("conditions", []))


def _events(out: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in Timeline.from_json(out["timeline"]).events if e["kind"] == kind]


def test_job_admitted_through_the_local_queue_runs_to_succeeded(
    kube: Kube, namespace: str, kq: Kueue, kwok_nodes: NodeFactory, tmp_path: Path, step_api: client.ApiClient,
) -> None:
    lq, cq = _queue(kq)
    pool, names = kwok_nodes(2, gpus=8, spot=True)
    run_id = f"run-kq-{namespace}"
    spec = make_spec(namespace, tmp_path / "ckpt", nodes=2)  # target.queue "": the namespace's only LocalQueue
    from kfp_gpu.steps import train

    res = train.run(spec, run_id, make_capacity(run_id, pool, names).to_json(), job_json=job_json(3.0), api=step_api)
    out = json.loads(res.output_json)
    assert out["status"] == "Succeeded" and out["attempts"] == 1 and out["preemptions"] == 0, out

    job = kube.custom.get_namespaced_custom_object(pytorchjob.GROUP, pytorchjob.VERSION, namespace,
                                                   pytorchjob.PLURAL, out["job"])
    assert job["metadata"]["labels"][QUEUE_LABEL] == lq
    assert job["spec"]["runPolicy"].get("suspend") is False  # Kueue unsuspended it
    mine = [w for w in _workloads(kq) if owner_uid(w) == job["metadata"]["uid"]]
    assert len(mine) == 1 and mine[0]["status"]["admission"]["clusterQueue"] == cq
    assert mine[0]["metadata"]["name"].startswith(f"pytorchjob-{out['job']}-")
    led = ledger.read(kube.api, namespace, run_id, "train")
    assert led["kueue"]["queue"] == lq and led["kueue"]["cluster_queue"] == cq
    [adm] = led["admissions"]
    assert adm["workload"] == mine[0]["metadata"]["name"] and adm["cluster_queue"] == cq and adm["wait_s"] >= 0
    [ev] = _events(out, "job-admitted")
    [created] = _events(out, "job-created")
    [running] = _events(out, "job-running")
    assert created["t"] <= ev["t"] <= running["t"] and ev["queue"] == lq
    assert sorted(p.spec.node_name for p in job_pods(kube.core, namespace, out["job"])) == sorted(names)
    assert out["queue"] == lq and out["queue_wait_s"] == [adm["wait_s"]] and out["queue_evictions"] == 0
    assert res.metrics["queue_wait_s"] == adm["wait_s"] and f"Kueue LocalQueue `{lq}`" in res.markdown
    print(f"\nkueue admission: created -> admitted {ev['t'] - created['t']:.2f} s; "
          f"admitted -> gang running {running['t'] - ev['t']:.2f} s")


def test_job_waits_in_a_full_queue_longer_than_the_watchdog_then_runs(
    kube: Kube, namespace: str, kq: Kueue, kwok_nodes: NodeFactory, tmp_path: Path, step_api: client.ApiClient,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lq, cq = _queue(kq)
    _block(kq, lq)  # the queue's 16 GPUs, reserved
    pool, names = kwok_nodes(2, gpus=8, spot=True)
    run_id = f"run-kw-{namespace}"
    spec = make_spec(namespace, tmp_path / "ckpt", nodes=2)
    th = StepThread(spec=spec, run_id=run_id, capacity_json=make_capacity(run_id, pool, names).to_json(),
                    job_json=job_json(3.0), api=step_api)  # the default no-pods watchdog: admission_timeout_s=120
    th.start()
    job = pytorchjob.job_name(run_id, "train")
    held = 125.0
    try:
        time.sleep(held)  # longer than the old 120 s watchdog that failed a queued job, with the queue full
        assert th.is_alive(), th.error
        assert not job_pods(kube.core, namespace, job)
        obj = pytorchjob.get(kube.api, namespace, job)
        assert obj is not None and obj["spec"]["runPolicy"]["suspend"] is True
        kq.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "workloads", "blocker")
        freed = time.time()
        out = json.loads(th.outcome(120).output_json)
    finally:
        th.join(1)
    assert out["status"] == "Succeeded" and out["attempts"] == 1 and out["preemptions"] == 0, out
    [adm] = out["ledger"]["admissions"]
    assert adm["wait_s"] >= held and adm["admitted_at"] >= freed
    assert adm["admitted_at"] - freed < 10.0, adm
    [ev] = _events(out, "job-admitted")
    assert ev["wait_s"] == adm["wait_s"] and ev["workload"] == adm["workload"]
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[queue]")]
    assert any("waiting for admission in LocalQueue " + lq in ln and "insufficient" in ln for ln in lines), lines
    assert any("admitted by LocalQueue " + lq in ln for ln in lines), lines
    # no leak: one job, its one Workload, its two pods
    uid = pytorchjob.get(kube.api, namespace, job)["metadata"]["uid"]  # type: ignore[index]
    assert [owner_uid(w) for w in _workloads(kq)] == [uid]
    assert len(job_pods(kube.core, namespace, job)) == 2
    print(f"\nqueued {adm['wait_s']:.1f} s (queue full for {held:.0f} s, watchdog 120 s); quota freed -> admitted "
          f"{adm['admitted_at'] - freed:.2f} s; {len(lines)} progress lines")


def test_queue_deadline_fails_with_the_queue_and_the_workload_status_and_cleans_up(
    kube: Kube, namespace: str, kq: Kueue, kwok_nodes: NodeFactory, tmp_path: Path, step_api: client.ApiClient,
) -> None:
    lq, _ = _queue(kq, gpus=8)  # never enough for 2 x 8
    pool, names = kwok_nodes(2, gpus=8, spot=True)
    run_id = f"run-kt-{namespace}"
    from kfp_gpu.steps import train

    with pytest.raises(QueueTimeout) as err:
        train.run(make_spec(namespace, tmp_path / "ckpt", nodes=2), run_id,
                  make_capacity(run_id, pool, names).to_json(), job_json=job_json(3.0), api=step_api,
                  admission_timeout_s=2.0, queue_timeout_s=8.0)
    msg = err.value.message
    assert "\n" not in msg and f"LocalQueue {lq} within 8s" in msg and "pytorchjob-" in msg, msg
    assert "insufficient" in msg or "quota" in msg, msg
    job = pytorchjob.job_name(run_id, "train")
    assert pytorchjob.get(kube.api, namespace, job) is None
    wait_until("its Workload gone", lambda: not _workloads(kq), timeout=30)
    assert ledger.read(kube.api, namespace, run_id, "train")["status"] == "QueueTimeout"


def _block(kq: Kueue, lq: str) -> None:
    """A bare Workload ``blocker`` of 2 x 8 GPUs in ``lq``, admitted: it holds the queue's quota."""
    kq.workload("blocker", lq, pods=2, gpus=8)
    wait_until("blocker admitted", lambda: _admitted(kq, "blocker"), timeout=30)


def _urgent_class(kq: Kueue) -> str:
    """A WorkloadPriorityClass of value 1000 (deleted after the test): its name."""
    wpc = f"urgent-{kq.suffix}"
    kq.custom.create_cluster_custom_object(GROUP, VERSION, "workloadpriorityclasses", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "WorkloadPriorityClass", "metadata": {"name": wpc}, "value": 1000})
    kq.made.append(("workloadpriorityclasses", wpc))
    return wpc


def _start_gang(kwok_nodes: NodeFactory, namespace: str, ckpt: Path, run_id: str, job: str,
                step_api: client.ApiClient) -> tuple[list[str], StepThread]:
    """Two 8-GPU KWOK spot nodes and the train step (``job`` JSON, max_preemptions 2) on them, started:
    (node names, step thread)."""
    pool, names = kwok_nodes(2, gpus=8, spot=True)
    spec = make_spec(namespace, ckpt, nodes=2, max_preemptions=2)
    th = StepThread(spec=spec, run_id=run_id, capacity_json=make_capacity(run_id, pool, names).to_json(),
                    job_json=job, api=step_api)
    th.start()
    return names, th


def _free_quota(th: StepThread, batch: client.BatchV1Api, namespace: str, urgent: str) -> float:
    """After 3 s more of the job waiting (the step still alive), the urgent job goes: when its quota was freed."""
    time.sleep(3.0)
    assert th.is_alive(), th.error
    batch.delete_namespaced_job(urgent, namespace, propagation_policy="Foreground")
    return time.time()


def _one_queue_eviction(out: dict[str, Any], lq: str) -> dict[str, Any]:
    """Asserts the run succeeded on its second attempt after one eviction by Kueue (from step 15, no node lost,
    reason Preempted, queued twice in ``lq``); returns the preemption's ledger entry."""
    assert out["status"] == "Succeeded" and out["preemptions"] == 1 and out["attempts"] == 2, out
    [p] = out["ledger"]["preemptions"]
    assert p["cause"] == "queue-eviction" and p["lost_nodes"] == [] and p["checkpoint_step"] == 15, p
    assert out["queue_evictions"] == 1 and len(out["queue_wait_s"]) == 2
    assert "Preempted" in p["reason"] and p["queue"] == lq, p
    entry: dict[str, Any] = p
    return entry


def _high_priority_job(kube: Kube, namespace: str, lq: str, wpc: str, gpus: int) -> str:
    """A batch Job in ``lq`` with WorkloadPriorityClass ``wpc``; its pod fits no node (quota is all it takes)."""
    name = f"urgent-{uuid.uuid4().hex[:5]}"
    c = {"name": "c", "image": "busybox", "resources": {"requests": {GPU: str(gpus)}, "limits": {GPU: str(gpus)}}}
    client.BatchV1Api(kube.api).create_namespaced_job(namespace, {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: lq, "kueue.x-k8s.io/priority-class": wpc}},
        "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [c]}}}})
    return name


def test_kueue_preemption_recovers_from_the_checkpoint_on_the_same_nodes(
    kube: Kube, namespace: str, kq: Kueue, kwok_nodes: NodeFactory, tmp_path: Path, step_api: client.ApiClient,
) -> None:
    lq, cq = _queue(kq, preemption=True)
    wpc = _urgent_class(kq)
    run_id, ckpt = f"run-kp-{namespace}", tmp_path / "ckpt"
    names, th = _start_gang(kwok_nodes, namespace, ckpt, run_id, job_json(8.0), step_api)
    job = pytorchjob.job_name(run_id, "train")
    batch = client.BatchV1Api(kube.api)
    try:
        wait_until("gang running", lambda: running_pods(kube.core, namespace, job, 2), timeout=90)
        first_uid = pytorchjob.get(kube.api, namespace, job)["metadata"]["uid"]  # type: ignore[index]
        CheckpointStore(str(ckpt)).save(15, {"w": b"15"}, meta={"loss": 2.5})
        t0 = time.time()
        urgent = _high_priority_job(kube, namespace, lq, wpc, gpus=16)

        def evicted() -> bool:
            led = ledger.read(kube.api, namespace, run_id, "train") or {}
            return bool(led.get("preemptions"))
        wait_until("eviction recorded", evicted, timeout=60)
        # the job waits in the queue again (recreated from the checkpoint), while the urgent job holds the quota
        wait_until("recreated, suspended", lambda: (lambda j: j is not None and j["metadata"]["uid"] != first_uid
                   and j["spec"]["runPolicy"].get("suspend") is True)(pytorchjob.get(kube.api, namespace, job)),
                   timeout=60)
        freed = _free_quota(th, batch, namespace, urgent)
        out = json.loads(th.outcome(180).output_json)
    finally:
        th.join(1)
    p = _one_queue_eviction(out, lq)
    assert sorted(out["capacity"]["placements"][0]["nodes"]) == sorted(names)  # same nodes, nothing replaced
    assert out["on_demand"] is False
    again = pytorchjob.get(kube.api, namespace, job)
    assert again is not None and again["metadata"]["annotations"]["kfp-gpu.io/resume-step"] == "15"
    env = {e["name"]: e["value"] for e in
           again["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]}
    assert env[pytorchjob.ENV_RESUME_STEP] == "15"
    admissions = out["ledger"]["admissions"]
    assert len(admissions) == 2 and admissions[1]["admitted_at"] >= freed
    assert [e["kind"] for e in Timeline.from_json(out["timeline"]).events].count("queue-eviction") == 1
    running = [e["t"] for e in _events(out, "job-running")]
    assert len(running) == 2
    print(f"\nkueue preemption: urgent job -> eviction decided {p['decided_at'] - t0:.2f} s "
          f"(detect {p['detect_latency_s']:.3f} s after the Evicted condition); quota freed -> re-admitted "
          f"{admissions[1]['admitted_at'] - freed:.2f} s -> gang running again {running[1] - freed:.2f} s; "
          f"second wait in queue {admissions[1]['wait_s']:.1f} s")


def test_a_retried_train_pod_re_attaches_to_the_job_still_waiting_in_the_queue(
    kube: Kube, namespace: str, kq: Kueue, kwok_nodes: NodeFactory, tmp_path: Path, step_identity: Any,
) -> None:
    """SIGKILL the train step's process while its job waits in a full queue; the retry re-attaches to the same
    suspended job (no second job, no second Workload) and keeps the first try's start of the wait."""
    import os
    import signal
    import subprocess
    import sys

    lq, _ = _queue(kq)
    _block(kq, lq)
    pool, names = kwok_nodes(2, gpus=8, spot=True)
    run_id = f"run-kr-{namespace}"
    spec = make_spec(namespace, tmp_path / "ckpt", nodes=2)
    args, out = tmp_path / "args.json", tmp_path / "out.json"
    args.write_text(json.dumps({"spec": spec.to_json(), "run_id": run_id, "job_json": job_json(3.0), "out": str(out),
                                "capacity_json": make_capacity(run_id, pool, names).to_json()}))
    env = {**os.environ, "KUBECONFIG": str(step_identity.kubeconfig)}
    cmd = [sys.executable, "-m", "tests.integration.train_proc", str(args)]
    root = Path(__file__).resolve().parents[2]
    job = pytorchjob.job_name(run_id, "train")
    first = subprocess.Popen(cmd, cwd=root, env=env)
    try:
        def waiting() -> bool:
            return ((ledger.read(kube.api, namespace, run_id, "train") or {}).get("admission") or {}).get(
                "state") == "waiting"
        wait_until("first try waiting in the queue", waiting, timeout=60)
        uid = pytorchjob.get(kube.api, namespace, job)["metadata"]["uid"]  # type: ignore[index]
        first.send_signal(signal.SIGKILL)  # no cleanup runs: the pod is gone
        first.wait(10)
        retry = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(4.0)
        assert retry.poll() is None  # still waiting, not failed
        kq.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "workloads", "blocker")
        stdout, stderr = retry.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert retry.returncode == 0, stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["status"] == "Succeeded" and result["attempts"] == 2, result
    events = [e["kind"] for e in Timeline.from_json(result["timeline"]).events]
    assert "job-attached" in events and "job-created" not in events and events.count("job-admitted") == 1, events
    again = pytorchjob.get(kube.api, namespace, job)
    assert again is not None and again["metadata"]["uid"] == uid
    assert [owner_uid(w) for w in _workloads(kq)] == [uid]
    [adm] = result["ledger"]["admissions"]
    assert adm["attempt"] == 1 and adm["wait_s"] >= 4.0 and adm["job_uid"] == uid, adm
    assert f"admitted by LocalQueue {lq}" in stdout, stdout[-2000:]


def test_gang_provisioned_at_admission_is_adopted_and_a_lost_node_is_a_preemption(
    kube: Kube, namespace: str, kq: Kueue, tmp_path: Path, step_api: client.ApiClient,
) -> None:
    """The kueue-admission backend: the capacity has no nodes (Kueue provisions the gang when it admits the job).
    Here the "provisioned" nodes are KWOK nodes of an accelerator label unique to the test; the nodes the pods bind
    to become the gang, so a lost one is a preemption; the recreated job is re-admitted and lands on a new node."""
    from kfp_gpu.steps.capacity import Capacity
    from kfp_gpu_rehearsal.devcluster.nodes import make_gpu_node
    from tests.integration.test_train_support import ZONE

    label = f"nvidia-h100-80gb-{kq.suffix}"
    flavor = kq.flavor("adm", {"cloud.google.com/gke-accelerator": label})
    cq = kq._cluster("clusterqueues", "ClusterQueue", "adm", {"namespaceSelector": {}, "resourceGroups": [
        {"coveredResources": [GPU], "flavors": [{"name": flavor, "resources": [{"name": GPU, "nominalQuota": "16"}]}]}]})
    kq.wait_active(cq)
    lq = kq.local_queue("team", cq)
    made: list[str] = []

    def node(i: str) -> str:
        name = f"adm-{kq.suffix}-{i}"
        kube.core.create_node(make_gpu_node(name, f"adm-{kq.suffix}", label, ZONE, gpus=8, spot=True))
        made.append(name)
        return name

    first = [node("0"), node("1")]
    run_id = f"run-ka-{namespace}"
    cap = Capacity(run_id, (), 8, label, True, "", {"provisioner": "kueue-admission", "queue": lq, "cluster_queue": cq})
    spec = make_spec(namespace, tmp_path / "ckpt", nodes=2, max_preemptions=2)
    th = StepThread(spec=spec, run_id=run_id, capacity_json=cap.to_json(), job_json=job_json(6.0), api=step_api)
    th.start()
    job = pytorchjob.job_name(run_id, "train")
    try:
        wait_until("gang running", lambda: running_pods(kube.core, namespace, job, 2), timeout=60)
        from tests.integration.test_train_support import preempt

        victim = first[0]
        preempt(kube.kubeconfig, kube.core, victim)
        wait_until("preemption recorded",
                   lambda: bool((ledger.read(kube.api, namespace, run_id, "train") or {}).get("preemptions")), timeout=60)
        fresh = node("2")  # the autoscaler's answer to the re-admitted job's request
        out = json.loads(th.outcome(120).output_json)
    finally:
        th.join(1)
        for n in made:
            try:
                kube.core.delete_node(n)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
    assert out["status"] == "Succeeded" and out["preemptions"] == 1 and out["attempts"] == 2, out
    [p] = out["ledger"]["preemptions"]
    assert p["cause"] == "preemption" and p["lost_nodes"] == [victim], p
    assert out["ledger"]["adopted_nodes"] == [sorted(first), sorted([first[1], fresh])], out["ledger"]
    assert out["capacity"]["placements"] == []  # nothing for kfp-gpu to release: Kueue's requests go with the job
