"""The GPU faults under JobSet's failure policy alone (no kfp-gpu): a JobSet of two single-pod jobs, one per gang
node (pinned, as a gang placement pins them), ``failurePolicy.maxRestarts``. The JobSet controller restarts every
job when one fails; the pods come back on the same nodes, so the bad GPU fails them again until the restarts are
used up. Records the "jobset" rows of docs/faults.md for bad_gpu_launch and xid_midrun."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim.clock import compress, expand
from kfp_gpu_rehearsal.sim.gpuhealth import GpuFault, GpuHealthWorld
from tests.integration.fault_rows import record
from tests.integration.test_health_gate import CRASH_S, GPUS, STEP_S, XID_CRASH_S, Trainer
from tests.integration.test_train_support import wait_until

pytestmark = pytest.mark.integration
NodeFactory = Callable[..., tuple[str, list[str]]]
GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
MAX_RESTARTS = 1


@pytest.fixture
def world(kube: Kube) -> Iterator[GpuHealthWorld]:
    w = GpuHealthWorld(kube.api)
    yield w
    w.stop()


def _jobset(name: str, nodes: list[str], run_s: float) -> dict[str, Any]:
    def rank(i: int, node: str) -> dict[str, Any]:
        pod = {"metadata": {"annotations": {"kfp-gpu.io/sim-duration": f"{run_s:g}s"}},
               "spec": {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": node},
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                        "containers": [{"name": "trainer", "image": "busybox",
                                        "resources": {"limits": {"nvidia.com/gpu": str(GPUS)}}}]}}
        return {"name": f"rank{i}", "replicas": 1,
                "template": {"spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0, "template": pod}}}

    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "JobSet", "metadata": {"name": name},
            "spec": {"failurePolicy": {"maxRestarts": MAX_RESTARTS},
                     "replicatedJobs": [rank(i, n) for i, n in enumerate(nodes)]}}


def _status(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    return obj.get("status") or {}


def _failed(kube: Kube, ns: str, name: str) -> bool:
    return any(c.get("type") == "Failed" and c.get("status") == "True"
               for c in _status(kube, ns, name).get("conditions") or [])


def _running(kube: Kube, ns: str, name: str, n: int) -> bool:
    pods = kube.core.list_namespaced_pod(ns, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}").items
    return sum(1 for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None) >= n


def _first_failure(kube: Kube, ns: str, name: str) -> float | None:
    pods = kube.core.list_namespaced_pod(ns, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}").items
    ends = [cs.state.terminated.finished_at.timestamp() for p in pods for cs in (p.status.container_statuses or [])
            if cs.state.terminated is not None and cs.state.terminated.exit_code != 0]
    return min(ends) if ends else None


def test_health_bad_gpu_at_launch_under_jobset_failure_policy(
    kube: Kube, namespace: str, kwok_nodes: NodeFactory, world: GpuHealthWorld,
) -> None:
    _, names = kwok_nodes(2, gpus=GPUS, spot=True)
    world.adopt(*names)
    world.break_node(names[0], GpuFault("dcgm", crash_after_s=CRASH_S))
    t0 = time.time()
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _jobset("js-bad", names, 60.0))
    wait_until("both ranks running", lambda: _running(kube, namespace, "js-bad", 2), timeout=30)
    started = time.time()
    wait_until("JobSet Failed", lambda: _failed(kube, namespace, "js-bad"), timeout=60)
    failed_at = time.time()
    st = _status(kube, namespace, "js-bad")
    assert int(st.get("restarts", 0)) == MAX_RESTARTS, st
    record("bad_gpu_launch", "jobset", test="test_health_bad_gpu_at_launch_under_jobset_failure_policy",
           detection_s=round(expand(failed_at - started), 1),
           action=f"every job restarted {MAX_RESTARTS}x on the same pinned nodes, the bad GPU failed it each time; "
           "JobSet Failed", steps_lost=None,
           gpu_minutes_wasted=round(expand(failed_at - started) / 60.0 * 2 * GPUS, 1),
           note=f"failurePolicy.maxRestarts={MAX_RESTARTS}; detection = both ranks running to JobSet Failed (the "
           f"rank dies {CRASH_S:g} s world after bind, every attempt); wall {failed_at - t0:.1f}s; steps lost: the "
           "rehearsal ranks report no progress here")


def test_health_xid_midrun_under_jobset_failure_policy(
    kube: Kube, namespace: str, kwok_nodes: NodeFactory, world: GpuHealthWorld, tmp_path: Path,
) -> None:
    _, names = kwok_nodes(2, gpus=GPUS, spot=True)
    world.adopt(*names)
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _jobset("js-xid", names, 60.0))
    wait_until("both ranks running", lambda: _running(kube, namespace, "js-xid", 2), timeout=30)
    trainer = Trainer(tmp_path / "ckpt")
    trainer.start()
    time.sleep(0.55)
    t_xid = time.time()
    world.break_node(names[0], GpuFault("xid", crash_after_s=XID_CRASH_S, condition=True))
    first = wait_until("a rank fails", lambda: _first_failure(kube, namespace, "js-xid"), timeout=30)
    crashed = time.time()
    trainer.halt.set()
    lost = trainer.at(crashed) % trainer.every  # steps past the last periodic checkpoint when the rank died
    wait_until("JobSet Failed", lambda: _failed(kube, namespace, "js-xid"), timeout=60)
    assert crashed - t_xid >= compress(XID_CRASH_S) * 0.9 and first is not None
    record("xid_midrun", "jobset", test="test_health_xid_midrun_under_jobset_failure_policy",
           detection_s=round(expand(crashed - t_xid), 1),
           action=f"none until the GPU killed the rank; all jobs restarted {MAX_RESTARTS}x on the same nodes, "
           "failed again; JobSet Failed", steps_lost=lost,
           gpu_minutes_wasted=round(expand(lost * STEP_S) / 60.0 * 2 * GPUS, 1),
           note="detection = Xid to the first rank failure (seen by polling pods every 0.1 s); wasted counts only "
           "the lost steps, not the restarts on the bad node")
