"""The preemption-notice row of docs/faults.md: the GKE stand-in's spot notice (graceful node shutdown, the pod
killed 15 s later) on two ranks; one saves an emergency checkpoint at the notice (kfp-gpu's handler, measured on
real trainers for every framework in tests/checkpoint/test_notice.py: 0.9-1.6 s), the other has no handler (a plain
Training Operator job: the process dies with the pod). Steps lost are counted against the newest checkpoint."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kfp_gpu.checkpoint import CheckpointStore, spot_grace_s
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim.clock import expand
from tests.integration.fault_rows import record
from tests.integration.test_spot_rank_loss import (  # noqa: F401 - gke: a fixture
    CHECKPOINT_EVERY,
    NOTICE_SCALE,
    NOTICE_STEP,
    SpotTrainer,
    _trainer_pod,
    gke,
)
from tests.integration.test_train_support import wait_until

pytestmark = pytest.mark.integration
EMERGENCY_SAVE_S = 2.0  # world seconds: above the slowest emergency save measured in tests/checkpoint/test_notice.py
GPUS = 8


def test_notice_gke_spot_emergency_checkpoint_vs_no_handler(kube: Kube, namespace: str, gke: Any,  # noqa: F811
                                                           tmp_path: Path) -> None:
    sim, _, nodes = gke(2, scale=NOTICE_SCALE)
    runs: dict[str, tuple[SpotTrainer, float]] = {}
    threads = []
    for node, side, save_s in zip(nodes, ("kfp_gpu", "training_operator"), (EMERGENCY_SAVE_S, 1e9), strict=True):
        pod = f"rank-{side.replace('_', '-')}"
        kube.core.create_namespaced_pod(namespace, _trainer_pod(namespace, pod, node))
        wait_until(f"{pod} Running", lambda pod=pod: kube.core.read_namespaced_pod(pod, namespace).status.phase
                   == "Running", timeout=30)
        tr = SpotTrainer(kube.core, namespace, pod, CheckpointStore(str(tmp_path / pod)), save_s,
                         every=CHECKPOINT_EVERY)
        t0: list[float] = []
        th = threading.Thread(target=tr.run, args=(NOTICE_STEP, t0), daemon=True)
        th.start()
        wait_until(f"trainer at step {NOTICE_STEP}", lambda t0=t0: bool(t0), timeout=60)
        notice_at = time.monotonic()
        sim.preempt(node)
        threads.append(th)
        runs[side] = (tr, notice_at)
    for th in threads:
        th.join(30)
        assert not th.is_alive()
    lost = {}
    for side, (tr, notice_at) in runs.items():
        newest = tr.store.latest()
        lost[side] = tr.step - (newest.step if newest is not None else 0)
        assert tr.signalled_at is not None and tr.killed_at is not None, tr
        saved = side == "kfp_gpu"
        # kfp-gpu's handler acts on the notice itself; the Training Operator learns of it when the pod is killed
        detection = expand((tr.signalled_at if saved else tr.killed_at) - notice_at)
        record("preemption_notice", side, test="test_notice_gke_spot_emergency_checkpoint_vs_no_handler",
               detection_s=round(detection, 1),
               action=("emergency checkpoint at the notice (after the step in flight), exit 143; the train step "
                       "resumes the gang from it" if saved else "none: the process dies with the pod; what it "
                       "trained since the last periodic checkpoint is lost"),
               steps_lost=lost[side], gpu_minutes_wasted=round(lost[side] * tr.step_s * GPUS / 60.0, 1),
               note=f"GKE spot: pod grace {spot_grace_s('gke'):g} s; step {tr.step_s:g} s world, periodic "
               f"checkpoint every {tr.every} steps, notice at step {NOTICE_STEP}; wasted = lost steps x one node's {GPUS} GPUs "
               "(the rank preempted); detection: kfp_gpu = the rank saw the notice, training_operator = the pod was killed")
    assert lost["kfp_gpu"] == 0 and lost["training_operator"] > 0, lost


def test_notice_gke_spot_under_jobset_failure_policy(kube: Kube, namespace: str, gke: Any,  # noqa: F811
                                                    tmp_path: Path) -> None:
    """The same notice on a rank of a JobSet (one single-pod Job per gang node, pinned, ``failurePolicy``; see
    test_health_jobset.py): JobSet has no notice handler, so the rank's process dies with its pod 15 s (world) after
    the notice; its Job fails and the failure policy restarts every Job (the world's pod GC deletes the killed pod only
    once its Job counted it, as on GKE the kubelet reports it Failed before the VM goes; this test used to accept a
    new pod of the same Job instead, which the rehearsal made when its VM took the pod first). Steps since the last
    periodic checkpoint are lost."""
    from tests.integration.test_health_jobset import (
        GROUP,
        MAX_RESTARTS,
        PLURAL,
        VERSION,
        _jobset,
        _running,
        _status,
    )

    sim, _, nodes = gke(2, scale=NOTICE_SCALE)
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _jobset("js-notice", nodes, 60.0))
    wait_until("both ranks running", lambda: _running(kube, namespace, "js-notice", 2), timeout=30)
    pods = kube.core.list_namespaced_pod(namespace, label_selector="jobset.sigs.k8s.io/jobset-name=js-notice").items
    pod = next(p.metadata.name for p in pods if p.spec.node_name == nodes[0])
    tr = SpotTrainer(kube.core, namespace, pod, CheckpointStore(str(tmp_path / "js")), 1e9)  # no handler
    t0: list[float] = []
    th = threading.Thread(target=tr.run, args=(23, t0), daemon=True)
    th.start()
    wait_until("trainer at step 23", lambda: bool(t0), timeout=30)
    notice_at = time.monotonic()
    sim.preempt(nodes[0])
    th.join(30)
    assert not th.is_alive() and tr.killed_at is not None and tr.saved_at is None, tr  # nothing saved at the notice

    wait_until("the failure policy restarts the JobSet",
               lambda: int(_status(kube, namespace, "js-notice").get("restarts", 0)) >= 1, timeout=60)
    restarted_at = time.monotonic()
    newest = tr.store.latest()
    lost = tr.step - (newest.step if newest is not None else 0)
    # no handler: the newest checkpoint is a periodic one; the steps since it are lost (0 only when the kill lands
    # right after a periodic save, which a loaded machine can make happen: the row records what this run saw)
    assert newest is not None and newest.step % tr.every == 0 and lost >= 0, (lost, tr.step, newest)
    detection = expand(tr.killed_at - notice_at)
    record("preemption_notice", "jobset", test="test_notice_gke_spot_under_jobset_failure_policy",
           detection_s=round(detection, 1),
           action="none at the notice: the process dies with the pod; its Job fails and failurePolicy restarts every "
           f"Job (maxRestarts={MAX_RESTARTS}) {expand(restarted_at - tr.killed_at):.0f} s later; what it trained "
           "since the last periodic checkpoint is lost",
           steps_lost=lost, gpu_minutes_wasted=round(lost * tr.step_s * GPUS / 60.0, 1),
           note=f"GKE spot: pod grace {spot_grace_s('gke'):g} s; step {tr.step_s:g} s world, periodic checkpoint "
           f"every {tr.every} steps, notice at step 23; 2 single-pod Jobs pinned to 2 nodes; wasted = lost steps x "
           f"one node's {GPUS} GPUs; detection = the pod was killed (the JobSet learns of the notice only then); "
           "machine load average "
           f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at the end of the run (the world's timers and the "
           "trainer's polling lag under load, which lengthens detection)")
