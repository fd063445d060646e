"""The preemption-notice row of docs/faults.md: the GKE stand-in's spot notice (graceful node shutdown, the pod
killed 15 s later) on two ranks; one saves an emergency checkpoint at the notice (kfp-gpu's handler, measured on
real trainers for every framework in tests/checkpoint/test_notice.py: 0.9-1.6 s), the other has no handler (a plain
Training Operator job: the process dies with the pod). Steps lost are counted against the newest checkpoint."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kfp_gpu.checkpoint import CheckpointStore, spot_grace_s
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim.clock import expand
from tests.integration.fault_rows import record
from tests.integration.test_spot_rank_loss import SpotTrainer, _trainer_pod, gke  # noqa: F401 - gke: a fixture
from tests.integration.test_train_support import wait_until

pytestmark = pytest.mark.integration
EMERGENCY_SAVE_S = 2.0  # world seconds: above the slowest emergency save measured in tests/checkpoint/test_notice.py
GPUS = 8


def test_notice_gke_spot_emergency_checkpoint_vs_no_handler(kube: Kube, namespace: str, gke: Any,  # noqa: F811
                                                           tmp_path: Path) -> None:
    sim, _, nodes = gke(2, scale=12.0)
    runs: dict[str, tuple[SpotTrainer, float]] = {}
    threads = []
    for node, side, save_s in zip(nodes, ("kfp_gpu", "training_operator"), (EMERGENCY_SAVE_S, 1e9), strict=True):
        pod = f"rank-{side.replace('_', '-')}"
        kube.core.create_namespaced_pod(namespace, _trainer_pod(namespace, pod, node))
        wait_until(f"{pod} Running", lambda pod=pod: kube.core.read_namespaced_pod(pod, namespace).status.phase
                   == "Running", timeout=30)
        tr = SpotTrainer(kube.core, namespace, pod, CheckpointStore(str(tmp_path / pod)), save_s)
        t0: list[float] = []
        th = threading.Thread(target=tr.run, args=(23, t0), daemon=True)
        th.start()
        wait_until("trainer at step 23", lambda t0=t0: bool(t0), timeout=30)
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
               f"checkpoint every {tr.every} steps, notice at step 23; wasted = lost steps x one node's {GPUS} GPUs "
               "(the rank preempted); detection: kfp_gpu = the rank saw the notice, training_operator = the pod was killed")
    assert lost["kfp_gpu"] == 0 and lost["training_operator"] > 0, lost
