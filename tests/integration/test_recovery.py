"""Preemption recovery against the real control plane: detect, re-provision the lost node, resume."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kfp_gpu.checkpoint.store import CheckpointStore
from kfp_gpu.cluster import ledger, pytorchjob
from kfp_gpu.errors import RecoveryBudgetExhausted, TrainingFailed
from kfp_gpu.steps import train
from kfp_gpu.timeline import Timeline
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.devcluster.nodes import SIM_EXIT_CODE_ANNOTATION
from tests.integration.test_train_support import (
    Reprovisioner,
    StepThread,
    job_json,
    job_pods,
    make_capacity,
    make_spec,
    preempt,
    reprovisioners,
    running_pods,
    wait_until,
)

pytestmark = pytest.mark.integration
NodeFactory = Callable[..., tuple[str, list[str]]]


@pytest.fixture
def reprov(kube: Kube) -> Iterator[Callable[[str], Reprovisioner]]:
    yield from reprovisioners(lambda pool: Reprovisioner(kube.core, pool))


def _job(kube: Kube, namespace: str, name: str) -> dict:  # type: ignore[type-arg]
    obj: dict = kube.custom.get_namespaced_custom_object(  # type: ignore[type-arg]
        pytorchjob.GROUP, pytorchjob.VERSION, namespace, pytorchjob.PLURAL, name)
    return obj


def _resume_env(job: dict) -> str:  # type: ignore[type-arg]
    env = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
    return str({e["name"]: e["value"] for e in env}[pytorchjob.ENV_RESUME_STEP])


def test_preempt_one_of_four_resumes_from_checkpoint(
    kube: Kube, namespace: str, step_api: client.ApiClient, kwok_nodes: NodeFactory, tmp_path: Path,
    reprov: Callable[[str], Reprovisioner],
) -> None:
    pool, names = kwok_nodes(4, gpus=8, spot=True)
    run_id = f"run-pre1-{namespace}"
    ckpt = tmp_path / "ckpt"
    spec = make_spec(namespace, ckpt, max_preemptions=3)
    rp = reprov(pool)
    th = StepThread(spec=spec, run_id=run_id, capacity_json=make_capacity(run_id, pool, names).to_json(),
                    job_json=job_json(6.0), api=step_api, reprovision=rp)
    th.start()
    job = pytorchjob.job_name(run_id, "train")
    wait_until("4 pods running", lambda: running_pods(kube.core, namespace, job, 4), timeout=90)
    store = CheckpointStore(str(ckpt))  # the "trainer" makes progress
    store.save(10, {"model.pt": b"w10"}, meta={"loss": 2.5})
    store.save(20, {"model.pt": b"w20"}, meta={"loss": 2.1})
    victim = names[2]
    t0 = preempt(kube.kubeconfig, kube.core, victim)
    wait_until("replacement", lambda: rp.calls, timeout=60)
    wait_until("resumed gang running", lambda: [p for p in running_pods(kube.core, namespace, job, 4)
                                                if p.spec.node_name in rp.calls[0]["nodes"]], timeout=60)
    store.save(30, {"model.pt": b"w30"}, meta={"loss": 1.9})  # written by the resumed job
    res = th.outcome(180)
    out = json.loads(res.output_json)
    assert out["status"] == "Succeeded", out
    assert out["preemptions"] == 1 and out["attempts"] == 2
    assert len(rp.calls) == 1 and rp.calls[0]["lost"] == 1 and rp.calls[0]["zone_hint"] == "us-central1-a"
    assert rp.calls[0]["on_demand"] is False
    p = out["ledger"]["preemptions"][0]
    assert p["lost_nodes"] == [victim] and p["checkpoint_step"] == 20
    assert p["replacement_nodes"] == rp.calls[0]["nodes"]
    assert p["time_to_resume_s"] > 0 and p["steps_lost"] >= 0
    latency = p["decided_at"] - t0
    assert latency < 1.0, f"detection took {latency:.3f}s"
    # the recreated job resumes from step 20 on the 3 survivors + the replacement
    recreated = _job(kube, namespace, job)
    assert _resume_env(recreated) == "20"
    placed = sorted(pd.spec.node_name for pd in job_pods(kube.core, namespace, job))
    assert placed == sorted([n for n in names if n != victim] + rp.calls[0]["nodes"])
    assert out["final_step"] == 30 and out["final_loss"] == 1.9
    assert ledger.read(kube.api, namespace, run_id, "train")["budget"]["preemptions"] == 1
    kinds = [e["kind"] for e in Timeline.from_json(out["timeline"]).events]
    for k in ("job-created", "job-running", "preemption", "resumed", "job-finished"):
        assert k in kinds, kinds
    _record_latency("sim-preempt (notice+kill+delete)", latency, p["detect_latency_s"])


def test_repeated_preemptions_fall_back_to_on_demand_then_exhaust(
    kube: Kube, namespace: str, step_api: client.ApiClient, kwok_nodes: NodeFactory, tmp_path: Path,
    reprov: Callable[[str], Reprovisioner],
) -> None:
    pool, names = kwok_nodes(4, gpus=8, spot=True)
    run_id = f"run-budget-{namespace}"
    spec = make_spec(namespace, tmp_path / "ckpt", max_preemptions=2, on_demand_after=2)
    rp = reprov(pool)
    th = StepThread(spec=spec, run_id=run_id, capacity_json=make_capacity(run_id, pool, names).to_json(),
                    job_json=job_json(300.0), api=step_api, reprovision=rp)
    th.start()
    job = pytorchjob.job_name(run_id, "train")
    for i in range(3):
        pods = wait_until(f"attempt {i + 1} running", lambda: running_pods(kube.core, namespace, job, 4),
                          timeout=120)
        victim = sorted(p.spec.node_name for p in pods)[0]
        preempt(kube.kubeconfig, kube.core, victim)
        if i < 2:  # wait for the recovery to replace the node before the next preemption
            wait_until(f"replacement {i + 1}", lambda i=i: len(rp.calls) > i, timeout=60)
    with pytest.raises(RecoveryBudgetExhausted) as info:
        th.outcome(120)
    assert [c["on_demand"] for c in rp.calls] == [False, True]
    assert len(info.value.fields["preemptions"]) == 3
    assert "max_preemptions=2" in str(info.value)
    led = ledger.read(kube.api, namespace, run_id, "train")
    assert led["status"] == "RecoveryBudgetExhausted" and led["budget"]["on_demand"] is True
    assert pytorchjob.get(kube.api, namespace, job) is None  # nothing left running


def test_node_deletion_detected_under_a_second(
    kube: Kube, namespace: str, step_api: client.ApiClient, kwok_nodes: NodeFactory, tmp_path: Path,
    reprov: Callable[[str], Reprovisioner],
) -> None:
    """A node that vanishes with no notice: the pods on it are stuck and get force-deleted."""
    pool, names = kwok_nodes(4, gpus=8, spot=True)
    run_id = f"run-lat-{namespace}"
    spec = make_spec(namespace, tmp_path / "ckpt", max_preemptions=1)
    rp = reprov(pool)
    th = StepThread(spec=spec, run_id=run_id, capacity_json=make_capacity(run_id, pool, names).to_json(),
                    job_json=job_json(5.0), api=step_api, reprovision=rp, cleanup_timeout_s=60.0)
    th.start()
    job = pytorchjob.job_name(run_id, "train")
    wait_until("4 pods running", lambda: running_pods(kube.core, namespace, job, 4), timeout=90)
    t0 = time.time()
    kube.core.delete_node(names[1], grace_period_seconds=0)
    out = json.loads(th.outcome(180).output_json)
    p = out["ledger"]["preemptions"][0]
    latency = p["decided_at"] - t0
    assert p["lost_nodes"] == [names[1]] and p["reason"].endswith("deleted")
    assert latency < 1.0, f"detection took {latency:.3f}s"
    assert out["status"] == "Succeeded" and out["preemptions"] == 1
    assert "preemption_detect_latency_max_s" in th.result.metrics  # type: ignore[union-attr]
    _record_latency("node deleted (no notice)", latency, p["detect_latency_s"])


def test_app_failure_retried_then_training_failed(
    kube: Kube, namespace: str, step_api: client.ApiClient, kwok_nodes: NodeFactory, tmp_path: Path,
) -> None:
    pool, names = kwok_nodes(2, gpus=8, spot=True)
    run_id = f"run-app-{namespace}"
    spec = make_spec(namespace, tmp_path / "ckpt", nodes=2, app_failure_retries=1)
    with pytest.raises(TrainingFailed) as info:
        train.run(spec, run_id, make_capacity(run_id, pool, names).to_json(), job_json=job_json(1.0),
                  api=step_api, pod_annotations={SIM_EXIT_CODE_ANNOTATION: "1"})
    assert "exited 1" in str(info.value) and "no logs available" in str(info.value)
    led = ledger.read(kube.api, namespace, run_id, "train")
    assert led["budget"]["app_failures"] == 2 and led["budget"]["preemptions"] == 0
    assert led["attempts"] == 2 and "logs" in led["app_failures"][-1]


def _record_latency(kind: str, measured: float, internal: float) -> None:
    print(f"\npreemption detection latency [{kind}]: {measured * 1000:.1f} ms from the disruptive call, "
          f"{internal * 1000:.1f} ms from the watch event")
