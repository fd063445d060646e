"""The GPU health gate against the real control plane: a node born with a bad GPU is found by its probe pod and
replaced before the job starts; without the gate the job starts on it and dies after launch (the Training
Operator's fate for the job). Both record their row of docs/faults.md (fault "bad_gpu_launch")."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kfp_gpu.cluster import ledger, pytorchjob
from kfp_gpu.devcluster.client import Kube
from kfp_gpu.errors import TrainingFailed
from kfp_gpu.plan.health import EXIT_DCGM_DIAG
from kfp_gpu.sim.clock import expand
from kfp_gpu.sim.gpuhealth import GpuFault, GpuHealthWorld
from kfp_gpu.spec import Health
from kfp_gpu.steps import train
from kfp_gpu.steps.health_gate import UNHEALTHY_TAINT
from kfp_gpu.timeline import Timeline
from tests.integration.fault_rows import record
from tests.integration.test_train_support import (
    Reprovisioner,
    StepThread,
    job_json,
    job_pods,
    make_capacity,
    make_spec,
)

pytestmark = pytest.mark.integration
NodeFactory = Callable[..., tuple[str, list[str]]]
GPUS = 8
CRASH_S = 120.0  # real-world seconds from bind to the CUDA error on the bad GPU


@pytest.fixture
def world(kube: Kube) -> Iterator[GpuHealthWorld]:
    w = GpuHealthWorld(kube.api)
    yield w
    w.stop()


class AdoptingReprovisioner(Reprovisioner):
    """The recovery stand-in whose new nodes the world knows (it answers their probes)."""

    world: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        cap = super().__call__(*args, **kwargs)
        self.world.adopt(*self.calls[-1]["nodes"])
        return cap


@pytest.fixture
def reprov(kube: Kube, world: GpuHealthWorld) -> Iterator[Callable[[str], AdoptingReprovisioner]]:
    made: list[AdoptingReprovisioner] = []

    def make(pool: str) -> AdoptingReprovisioner:
        r = AdoptingReprovisioner(kube.core, pool)
        r.world = world
        made.append(r)
        return r

    yield make
    for r in made:
        r.cleanup()


def _world_min(wall_s: float) -> float:
    return expand(wall_s) / 60.0


def test_health_bad_gpu_at_launch_is_replaced_before_the_job_starts(
    kube: Kube, namespace: str, step_api: client.ApiClient, kwok_nodes: NodeFactory, tmp_path: Path,
    world: GpuHealthWorld, reprov: Callable[[str], AdoptingReprovisioner],
) -> None:
    pool, names = kwok_nodes(2, gpus=GPUS, spot=True)
    world.adopt(*names)
    bad = names[0]
    world.break_node(bad, GpuFault("dcgm", crash_after_s=CRASH_S))
    run_id = f"run-hg-{namespace}"
    spec = make_spec(namespace, tmp_path / "ckpt", nodes=2).replace(health=Health(probe=True, probe_timeout_s=30.0))
    rp = reprov(pool)
    t0 = time.time()
    th = StepThread(spec=spec, run_id=run_id, capacity_json=make_capacity(run_id, pool, names).to_json(),
                    job_json=job_json(2.0), api=step_api, reprovision=rp)
    th.start()
    out = json.loads(th.outcome(60).output_json)
    assert out["status"] == "Succeeded", out
    health = ledger.read(kube.api, namespace, run_id, "train")["health"]
    assert [r["action"] for r in health] == ["replace", "pass"], health
    first, second = health
    assert first["bad"] == [{"node": bad, "reason": "dcgmi diag failed"}]
    assert first["exit_codes"] == {bad: EXIT_DCGM_DIAG, names[1]: 0}
    assert len(rp.calls) == 1 and rp.calls[0]["lost"] == 1, rp.calls
    replacement = rp.calls[0]["nodes"][0]
    assert second["nodes"] == [replacement], second  # only the new node is probed again
    assert first["replacement_nodes"] == [replacement]
    # the job never ran on the bad node: every pod of its only attempt is on the survivor or the replacement
    assert out["attempts"] == 1 and out["preemptions"] == 0
    assert sorted(p.spec.node_name for p in job_pods(kube.core, namespace, pytorchjob.job_name(run_id, "train"))) \
        == sorted([names[1], replacement])
    node = kube.core.read_node(bad)
    assert node.spec.unschedulable and any(t.key == UNHEALTHY_TAINT for t in node.spec.taints or [])
    assert not (node.metadata.labels or {}).get("kfp-gpu.io/run-id")  # released: the run's claim is gone
    tl = Timeline.from_json(out["timeline"])
    kinds = [e["kind"] for e in tl.events]
    assert kinds.index("health-bad") < kinds.index("health-passed") < kinds.index("job-created"), kinds
    created_at = next(e["t"] for e in tl.events if e["kind"] == "job-created")
    detection = first["decided_at"] - first["started_at"]
    held = created_at - first["started_at"]  # the gang held, not training, from the first probe to the job
    record("bad_gpu_launch", "kfp_gpu", test="test_health_bad_gpu_at_launch_is_replaced_before_the_job_starts",
           detection_s=round(expand(detection), 1), action="probe failed (dcgmi diag); node released and replaced "
           "before the job started", steps_lost=0,
           gpu_minutes_wasted=round(_world_min(held) * 2 * GPUS, 1),
           note=f"2 nodes x {GPUS} GPUs; wasted = whole gang from the first probe to job creation (includes the "
           f"healthy probe both rounds pay: dcgmi diag -r 1 = 30 s world); wall {time.time() - t0:.1f}s")


def test_health_bad_gpu_without_the_gate_fails_after_launch_under_the_training_operator(
    kube: Kube, namespace: str, step_api: client.ApiClient, kwok_nodes: NodeFactory, tmp_path: Path,
    world: GpuHealthWorld,
) -> None:
    """No probe: the PyTorchJob starts on the bad node, its rank dies of the GPU fault, the Training Operator fails
    the job (restartPolicy Never). kfp-gpu's step only watches (app_failure_retries=0)."""
    pool, names = kwok_nodes(2, gpus=GPUS, spot=True)
    world.adopt(*names)
    bad = names[0]
    world.break_node(bad, GpuFault("dcgm", crash_after_s=CRASH_S))
    run_id = f"run-hto-{namespace}"
    spec = make_spec(namespace, tmp_path / "ckpt", nodes=2, app_failure_retries=0)
    with pytest.raises(TrainingFailed) as info:
        train.run(spec, run_id, make_capacity(run_id, pool, names).to_json(), job_json=job_json(600.0),
                  api=step_api)
    assert "exited 1" in str(info.value), info.value
    led = ledger.read(kube.api, namespace, run_id, "train")
    tl = {e["kind"]: e for e in Timeline.from_json(led["timeline"]).events}
    failure = led["app_failures"][0]
    assert "health" not in led and "job-running" in tl, tl
    running = tl["job-running"]["t"]
    lasted = failure["t"] - running  # the gang ran (paid) from the job's start until the fault killed it
    assert lasted > 0
    record("bad_gpu_launch", "training_operator",
           test="test_health_bad_gpu_without_the_gate_fails_after_launch_under_the_training_operator",
           detection_s=round(expand(lasted), 1), action="rank on the bad GPU exits 1 after launch; job Failed, "
           "the bad node stays in the gang (nothing probes or replaces it)", steps_lost=None,
           gpu_minutes_wasted=round(_world_min(lasted) * 2 * GPUS, 1),
           note="detection = job running until the rank's CUDA error (world crash_after_s=120 s after bind); steps "
           "lost: the rehearsal trainer reports no progress here, so not measured")
