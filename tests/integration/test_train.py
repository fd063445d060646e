"""The train step against the real control plane: Training Operator + scheduler + KWOK GPU nodes.

The step runs as the controller's identity (kfp_gpu/manifests/controller-rbac.yaml; ``step_api`` / ``step_identity``,
token only); ``kube`` (admin) sets up nodes and checks the outcome.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes.client import ApiClient
from kubernetes.client.rest import ApiException

from kfp_gpu import ownership
from kfp_gpu.cluster import ledger, pytorchjob
from kfp_gpu.errors import GangPlacementFailed
from kfp_gpu.ownership import label_safe
from kfp_gpu.steps import train
from kfp_gpu.timeline import Timeline
from kfp_gpu_rehearsal.devcluster.client import Kube
from tests.integration.rbac_support import Identity
from tests.integration.test_train_support import (
    StepThread,
    job_json,
    job_pods,
    make_capacity,
    make_spec,
    running_pods,
    wait_until,
)

pytestmark = pytest.mark.integration
NodeFactory = Callable[..., tuple[str, list[str]]]
ROOT = Path(__file__).resolve().parents[2]


def test_gang_of_4x8_runs_to_succeeded_after_capacity_is_ready(
    kube: Kube, namespace: str, kwok_nodes: NodeFactory, tmp_path: Path, step_api: ApiClient,
) -> None:
    pool, names = kwok_nodes(4, gpus=8, boot_delay_s=3.0, spot=True)  # NotReady for 3 s
    run_id = f"run-ok-{namespace}"
    spec = make_spec(namespace, tmp_path / "ckpt")
    t0 = time.time()
    res = train.run(spec, run_id, make_capacity(run_id, pool, names).to_json(), job_json=job_json(3.0),
                    api=step_api)
    out = json.loads(res.output_json)
    assert out["status"] == "Succeeded" and out["preemptions"] == 0 and out["attempts"] == 1

    # gated: the job was created only once all 4 nodes were Ready
    tl = Timeline.from_json(out["timeline"])
    created = [e["t"] for e in tl.events if e["kind"] == "job-created"]
    assert len(created) == 1 and created[0] >= t0 + 2.5
    kinds = [e["kind"] for e in tl.events]
    assert kinds.index("job-created") < kinds.index("job-running")

    job = kube.custom.get_namespaced_custom_object(pytorchjob.GROUP, pytorchjob.VERSION, namespace,
                                                   pytorchjob.PLURAL, out["job"])
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 3
    assert job["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] == 4
    pod = specs["Worker"]["template"]
    assert pod["metadata"]["labels"]["kfp-gpu.io/step"] == "train"
    assert pod["metadata"]["annotations"][pytorchjob.SIM_DURATION_ANNOTATION] == "3s"
    c = pod["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env[pytorchjob.ENV_RESUME_STEP] == "0" and env[pytorchjob.ENV_RUN_ID] == run_id
    assert env[pytorchjob.ENV_CHECKPOINT_URI] == str(tmp_path / "ckpt")
    assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-nodepool": pool,  # the pool, and the run's
                                           "kfp-gpu.io/run-id": label_safe(run_id)}  # claim label: the gang pin
    assert "affinity" not in pod["spec"]  # no term per gang node
    # every pod landed on a gang node, one per node
    nodes = sorted(p.spec.node_name for p in job_pods(kube.core, namespace, out["job"]))
    assert nodes == sorted(names)
    assert 0 < out["gpu_hours"] < 32 * 60 / 3600  # 32 GPUs for a few seconds
    assert res.metrics["gpu_hours"] > 0 and res.metrics["attempts"] == 1
    assert ledger.read(kube.api, namespace, run_id, "train")["status"] == "Succeeded"

    # idempotent: a retried step re-attaches to the finished job instead of creating a second one
    again = json.loads(train.run(spec, run_id, make_capacity(run_id, pool, names).to_json(),
                                 job_json=job_json(3.0), api=step_api).output_json)
    assert again["status"] == "Succeeded" and again["job"] == out["job"]
    events = [e["kind"] for e in Timeline.from_json(again["timeline"]).events]
    assert "job-attached" in events and "job-created" not in events


def test_gate_fails_fast_when_capacity_never_gets_ready(
    kube: Kube, namespace: str, kwok_nodes: NodeFactory, tmp_path: Path, step_api: ApiClient,
) -> None:
    """A gang node that exists but never turns Ready is waited for, then named in GangPlacementFailed. (A node
    that is *gone* is a loss and gets replaced: see tests/integration/test_lifecycle.py.)"""
    from kfp_gpu_rehearsal.devcluster.nodes import make_gpu_node

    pool, names = kwok_nodes(2, gpus=8, spot=True)
    stuck = f"{pool}-stuck"
    kube.core.create_node(make_gpu_node(stuck, pool, "nvidia-h100-80gb", "us-central1-a", gpus=8, spot=True,
                                        boot_delay_s=3600.0))
    run_id = f"run-gate-{namespace}"
    spec = make_spec(namespace, tmp_path, nodes=3)
    try:
        with pytest.raises(GangPlacementFailed, match=stuck):
            train.run(spec, run_id, make_capacity(run_id, pool, names + [stuck]).to_json(), job_json=job_json(3.0),
                      api=step_api, gate_timeout_s=3.0)
    finally:
        kube.core.delete_node(stuck)
    assert pytorchjob.get(kube.api, namespace, pytorchjob.job_name(run_id, "train")) is None


def test_partial_placement_watchdog(kube: Kube, namespace: str, kwok_nodes: NodeFactory, tmp_path: Path,
                                    step_api: ApiClient) -> None:
    pool, names = kwok_nodes(2, gpus=8, spot=True)
    run_id = f"run-wd-{namespace}"
    # a pod of another tenant takes all GPUs of node 1 after the gate passed: the gang cannot complete
    spec = make_spec(namespace, tmp_path, nodes=2)
    blocker = {
        "metadata": {"name": "blocker", "annotations": {}},
        "spec": {"nodeName": names[1], "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": "c", "image": "busybox",
                                 "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
    }
    kube.core.create_namespaced_pod(namespace, blocker)
    wait_until("blocker running", lambda: kube.core.read_namespaced_pod("blocker", namespace).status.phase
               == "Running")
    with pytest.raises(GangPlacementFailed, match="partial placement: 1/2"):
        train.run(spec, run_id, make_capacity(run_id, pool, names).to_json(), job_json=job_json(30.0),
                  api=step_api, placement_timeout_s=4.0)
    assert pytorchjob.get(kube.api, namespace, pytorchjob.job_name(run_id, "train")) is None


_CANCEL_SCRIPT = """
import sys
from kfp_gpu.controller.work import execute
raise SystemExit(execute("train", sys.argv[1], sys.argv[2], sys.argv[3], job_json=sys.argv[4]))
"""


def test_sigterm_during_training_deletes_the_job(
    kube: Kube, namespace: str, kwok_nodes: NodeFactory, tmp_path: Path, step_identity: Identity,
) -> None:
    pool, names = kwok_nodes(4, gpus=8, spot=True)
    run_id = f"run-cancel-{namespace}"
    spec = make_spec(namespace, tmp_path)
    env = {**os.environ, "KUBECONFIG": str(step_identity.kubeconfig), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CANCEL_SCRIPT, spec.to_json(), run_id,
         make_capacity(run_id, pool, names).to_json(), job_json(120.0)],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    job = pytorchjob.job_name(run_id, "train")
    try:
        wait_until("4 pods running", lambda: running_pods(kube.core, namespace, job, 4), timeout=90)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err  # Cancelled: never exits 0
    assert "cancelled" in err
    # nothing of the run's job remains: no PyTorchJob, no pods, no services
    assert pytorchjob.get(kube.api, namespace, job) is None
    assert job_pods(kube.core, namespace, job) == []
    svcs = kube.core.list_namespaced_service(namespace, label_selector=f"{ownership.JOB_LABEL}={job}").items
    assert [s for s in svcs if s.metadata.deletion_timestamp is None] == []
    assert ledger.read(kube.api, namespace, run_id, "train")["status"] == "cancelled"


def test_job_deleted_by_someone_else_fails_the_step(
    kube: Kube, namespace: str, kwok_nodes: NodeFactory, tmp_path: Path, step_api: ApiClient,
) -> None:
    pool, names = kwok_nodes(2, gpus=8, spot=True)
    run_id = f"run-cthread-{namespace}"
    spec = make_spec(namespace, tmp_path, nodes=2)
    th = StepThread(spec=spec, run_id=run_id, capacity_json=make_capacity(run_id, pool, names).to_json(),
                    job_json=job_json(120.0), api=step_api)
    th.start()
    job = pytorchjob.job_name(run_id, "train")
    wait_until("2 pods running", lambda: running_pods(kube.core, namespace, job, 2), timeout=90)
    try:
        kube.custom.delete_namespaced_custom_object(pytorchjob.GROUP, pytorchjob.VERSION, namespace,
                                                    pytorchjob.PLURAL, job)
    except ApiException:
        pass
    with pytest.raises(Exception, match="deleted by someone else"):
        th.outcome(60)
