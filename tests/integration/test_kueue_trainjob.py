"""The train step with ``kind="trainjob"`` on a Kueue-gated namespace, against the real Kueue (v0.17, its
``trainer.kubeflow.org/trainjob`` and ``jobset.x-k8s.io/jobset`` integrations on), Trainer v2.3 and JobSet v0.12
controllers, run as the controller's identity on KWOK GPU nodes.

One run: the TrainJob is created suspended with the LocalQueue's label while a bare Workload holds the queue's
quota; it waits (``[queue]`` progress, no pods, not a gang failure); freeing the quota admits it (Kueue writes its
flavor into a ``kueue.x-k8s.io/manager`` runtimePatch and unsuspends it) and the gang runs on the claimed nodes.
Then a higher-priority job takes the quota: Kueue evicts the TrainJob's Workload, the step records a
``queue-eviction``, deletes the TrainJob and creates the next attempt from the newest checkpoint, which waits in
the queue again and finishes once the quota is back. Afterwards the run's teardown leaves no TrainJob, JobSet,
Job, pod or Workload.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kfp_gpu import ownership
from kfp_gpu.checkpoint.store import CheckpointStore
from kfp_gpu.cluster import ledger, trainjob
from kfp_gpu.cluster.kueue_workload import owner_uid
from kfp_gpu.cluster.podtemplate import ENV_RESUME_STEP
from kfp_gpu.job import JobTemplate
from kfp_gpu.jobkinds import TrainJobKind
from kfp_gpu.plan.kueue import GROUP, QUEUE_LABEL, VERSION
from kfp_gpu.timeline import Timeline
from kfp_gpu_rehearsal.devcluster.client import Kube
from tests.integration import test_kueue_preflight
from tests.integration.test_kueue_preflight import Kueue
from tests.integration.test_kueue_train import (
    _block,
    _events,
    _free_quota,
    _high_priority_job,
    _one_queue_eviction,
    _queue,
    _start_gang,
    _urgent_class,
    _workloads,
)
from tests.integration.test_train_support import (
    ACCEL_LABEL,
    job_pods,
    wait_until,
)

pytestmark = pytest.mark.integration
kq = test_kueue_preflight.kq  # the Kueue-objects fixture (cluster-scoped ones unique per test, deleted afterwards)
NodeFactory = Callable[..., tuple[str, list[str]]]
TJ = trainjob.RESOURCE
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
KUEUE_PATCH = "kueue.x-k8s.io/manager"


def _job_json(seconds: float) -> str:
    return JobTemplate(name="train", image="busybox", command=("true",), checkpoint_every=10, kind="trainjob",
                       annotations={"kfp-gpu.io/sim-duration": f"{seconds:g}s"},
                       shm_size="1.5Gi").to_json()  # Kueue writes the quantity back as 1536Mi


def _get(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    return TrainJobKind().get(kube.api, ns, name)


def _running(kube: Kube, ns: str, job: dict[str, Any]) -> list[client.V1Pod]:
    attempt = job["metadata"]["annotations"][ownership.ATTEMPT]
    pods = kube.core.list_namespaced_pod(ns, label_selector=f"{ownership.ATTEMPT}={attempt}").items
    return [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]


def test_trainjob_queued_admitted_evicted_by_kueue_and_resumed_from_the_checkpoint(
    kube: Kube, trainer: Any, namespace: str, kq: Kueue, kwok_nodes: NodeFactory, tmp_path: Path,
    step_api: client.ApiClient, capsys: pytest.CaptureFixture[str],
) -> None:
    lq, cq = _queue(kq, preemption=True)  # 16 GPUs of the KWOK nodes' flavor
    wpc = _urgent_class(kq)
    _block(kq, lq)  # the queue's 16 GPUs, reserved
    run_id, ckpt = f"run-kj-{namespace}", tmp_path / "ckpt"
    names, th = _start_gang(kwok_nodes, namespace, ckpt, run_id, _job_json(8.0), step_api)
    name = TrainJobKind.job_name(run_id, "train")
    batch = client.BatchV1Api(kube.api)
    try:
        # 1. queued: suspended, labelled, its Workload (trainjob-<name>-<hash>, owned by it) pending; no pods
        def queued() -> dict[str, Any] | None:
            j = _get(kube, namespace, name)
            if j is None or not [w for w in _workloads(kq) if owner_uid(w) == j["metadata"]["uid"]]:
                return None
            led = ledger.read(kube.api, namespace, run_id, "train") or {}
            return j if (led.get("admission") or {}).get("state") == "waiting" else None
        wait_until("the TrainJob waiting in the queue", lambda: queued() is not None or th.error, timeout=60)
        assert th.error is None, th.error
        first = queued()
        assert first is not None
        assert first["metadata"]["labels"][QUEUE_LABEL] == lq and first["spec"]["suspend"] is True
        [wl] = [w for w in _workloads(kq) if owner_uid(w) == first["metadata"]["uid"]]
        assert wl["metadata"]["name"].startswith(f"trainjob-{name}-"), wl["metadata"]["name"]
        assert sum(int(ps["count"]) for ps in wl["spec"]["podSets"]) == 2  # the gang, as Kueue reads the runtime
        time.sleep(3.0)
        assert th.is_alive(), th.error
        assert not job_pods(kube.core, namespace, name)

        # 2. the quota frees: admitted, Kueue's runtimePatch carries the flavor, the gang runs on the claimed nodes
        kq.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "workloads", "blocker")
        freed = time.time()
        wait_until("the gang running", lambda: len(_running(kube, namespace, _get(kube, namespace, name) or first))
                   == 2 or th.error, timeout=60)
        assert th.error is None, th.error
        admitted = _get(kube, namespace, name)
        assert admitted is not None and admitted["metadata"]["uid"] == first["metadata"]["uid"]
        assert admitted["spec"]["suspend"] is False
        [kpatch] = [p for p in admitted["spec"]["runtimePatches"] if p["manager"] == KUEUE_PATCH]
        [rj] = kpatch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        assert rj["template"]["spec"]["template"]["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": ACCEL_LABEL}
        pods = _running(kube, namespace, admitted)
        assert sorted(p.spec.node_name for p in pods) == sorted(names)
        assert {v.empty_dir.size_limit for p in pods for v in p.spec.volumes if v.empty_dir} == {"1536Mi"}

        # 3. Kueue preempts it for a higher-priority job: recovery from the checkpoint, back in the queue
        CheckpointStore(str(ckpt)).save(15, {"w": b"15"}, meta={"loss": 2.5})
        urgent = _high_priority_job(kube, namespace, lq, wpc, gpus=16)
        wait_until("eviction recorded", lambda: bool(
            (ledger.read(kube.api, namespace, run_id, "train") or {}).get("preemptions")) or th.error, timeout=60)
        assert th.error is None, th.error

        def requeued() -> bool:
            j = _get(kube, namespace, name)
            return j is not None and j["metadata"]["uid"] != first["metadata"]["uid"] and j["spec"]["suspend"] is True
        wait_until("the next attempt created, suspended", requeued, timeout=60)
        freed2 = _free_quota(th, batch, namespace, urgent)
        out = json.loads(th.outcome(180).output_json)
    finally:
        th.join(1)
    p = _one_queue_eviction(out, lq)
    assert out["job_kind"] == "trainjob", out
    admissions = out["ledger"]["admissions"]
    assert len(admissions) == 2 and admissions[0]["admitted_at"] >= freed and admissions[1]["admitted_at"] >= freed2
    assert all(a["workload"].startswith(f"trainjob-{name}-") and a["cluster_queue"] == cq for a in admissions)
    second = _get(kube, namespace, name)
    assert second is not None and second["metadata"]["annotations"]["kfp-gpu.io/resume-step"] == "15"
    env = {e["name"]: e.get("value") for e in second["spec"]["trainer"]["env"]}
    assert env[ENV_RESUME_STEP] == "15", env
    assert [e["kind"] for e in Timeline.from_json(out["timeline"]).events].count("queue-eviction") == 1
    assert len(_events(out, "job-admitted")) == 2
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[queue]")]
    assert any("waiting for admission in LocalQueue " + lq in ln for ln in lines), lines
    assert sum("admitted by LocalQueue " + lq in ln for ln in lines) == 2, lines
    # only the finished attempt is left (its one Workload); teardown by run id then leaves nothing
    assert [owner_uid(w) for w in _workloads(kq)] == [second["metadata"]["uid"]]
    assert TrainJobKind().delete_for_run(kube.api, namespace, run_id) == [name]
    assert TrainJobKind().wait_gone(kube.api, namespace, name, timeout_s=60)
    wait_until("nothing left", lambda: not _workloads(kq) and not kube.core.list_namespaced_pod(namespace).items
               and not batch.list_namespaced_job(namespace).items and not kube.custom.list_namespaced_custom_object(
                   *JOBSET[:2], namespace, JOBSET[2])["items"], timeout=60)
    assert kube.custom.list_namespaced_custom_object(TJ.group, TJ.version, namespace, TJ.plural)["items"] == []
    print(f"\nkueue trainjob: quota freed -> admitted {admissions[0]['admitted_at'] - freed:.2f} s; eviction "
          f"detected {p['detect_latency_s']:.3f} s after the Evicted condition; re-admitted "
          f"{admissions[1]['admitted_at'] - freed2:.2f} s after the quota came back")
