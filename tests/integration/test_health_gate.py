"""The GPU health gate against the real control plane: a node born with a bad GPU is found by its probe pod and
replaced before the job starts; without the gate the job starts on it and dies after launch (the Training
Operator's fate for the job). Both record their row of docs/faults.md (fault "bad_gpu_launch")."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kfp_gpu.checkpoint.store import CheckpointStore
from kfp_gpu.cluster import ledger, pytorchjob
from kfp_gpu.errors import TrainingFailed
from kfp_gpu.plan.health import EXIT_DCGM_DIAG
from kfp_gpu.spec import Health
from kfp_gpu.steps import train
from kfp_gpu.steps.health_gate import UNHEALTHY_TAINT
from kfp_gpu.timeline import Timeline
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim.clock import compress, expand
from kfp_gpu_rehearsal.sim.gpuhealth import GpuFault, GpuHealthWorld
from tests.integration.fault_rows import record
from tests.integration.test_train_support import (
    Reprovisioner,
    StepThread,
    job_json,
    job_pods,
    make_capacity,
    make_spec,
    preempt,
    reprovisioners,
    wait_until,
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
    def make(pool: str) -> AdoptingReprovisioner:
        r = AdoptingReprovisioner(kube.core, pool)
        r.world = world
        return r

    yield from reprovisioners(make)


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
    # the gang is paid from the job's create until the fault killed it. Not from job-running: the world kills the
    # rank 1 s (wall) after its bind, and when the watch sees the whole gang Running within that second moved this
    # row from 24.5 to 261.5 world-seconds across runs
    lasted = failure["t"] - tl["job-created"]["t"]
    assert lasted > 0
    record("bad_gpu_launch", "training_operator",
           test="test_health_bad_gpu_without_the_gate_fails_after_launch_under_the_training_operator",
           detection_s=round(expand(lasted), 1), action="rank on the bad GPU exits 1 after launch; job Failed, "
           "the bad node stays in the gang (nothing probes or replaces it)", steps_lost=None,
           gpu_minutes_wasted=round(_world_min(lasted) * 2 * GPUS, 1),
           note="detection = job created until the job failed of the rank's CUDA error (world crash_after_s=120 s "
           "after bind); steps lost: the rehearsal trainer reports no progress here, so not measured")


# ---- mid-run Xid ------------------------------------------------------------------------------------------------
STEP_S = 0.1  # the rehearsal trainer's wall seconds per step (12 world seconds)
XID_CRASH_S = 360.0  # the GPU with the Xid kills the rank this long after the error (real seconds): 30 steps, so
# with the Xid at step ~5.5 the crash lands mid-way between two checkpoints (every 10 steps)


class Trainer(threading.Thread):
    """A rehearsal trainer: one step every STEP_S, a checkpoint every ``every`` steps into the run's store, and a
    log of (time, step) so the steps trained past a checkpoint are counted, not assumed. With ``alive`` (is the
    job's gang still running?) it stops stepping when its pods are killed or deleted (``stopped_step``), as a
    real rank does, until ``resume(step)`` (what a recreated job does)."""

    def __init__(self, ckpt: Path, every: int = 10, alive: Callable[[], bool] | None = None) -> None:
        super().__init__(daemon=True)
        self.store, self.every, self.alive = CheckpointStore(str(ckpt)), every, alive
        self.step, self.log = 0, [(time.time(), 0)]
        self.stopped_step: int | None = None
        self.halt = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.halt.wait(STEP_S):
            if self.stopped_step is not None:
                continue
            if self.alive is not None and not self.alive():
                self.stopped_step = self.step
                continue
            with self.lock:
                self.step += 1
                self.log.append((time.time(), self.step))
                if self.step % self.every == 0:
                    self.store.save(self.step, {"model.pt": f"w{self.step}".encode()})

    def at(self, t: float) -> int:
        """The step reached at time ``t``."""
        return max((s for ts, s in self.log if ts <= t), default=0)

    def resume(self, step: int) -> None:
        with self.lock:
            self.step, self.stopped_step = step, None


def _pods_running(kube: Kube, namespace: str, job: str, n: int, avoid: str = "") -> bool:
    ps = [p for p in job_pods(kube.core, namespace, job)
          if p.status.phase == "Running" and p.metadata.deletion_timestamp is None and p.spec.node_name != avoid]
    return len(ps) >= n


def test_health_xid_midrun_is_replaced_at_the_next_checkpoint(
    kube: Kube, namespace: str, step_api: client.ApiClient, kwok_nodes: NodeFactory, tmp_path: Path,
    world: GpuHealthWorld, reprov: Callable[[str], AdoptingReprovisioner],
) -> None:
    pool, names = kwok_nodes(2, gpus=GPUS, spot=True)
    world.adopt(*names)
    run_id = f"run-hx-{namespace}"
    ckpt = tmp_path / "ckpt"
    spec = make_spec(namespace, ckpt, nodes=2)
    rp = reprov(pool)
    th = StepThread(spec=spec, run_id=run_id, capacity_json=make_capacity(run_id, pool, names).to_json(),
                    job_json=job_json(4.0), api=step_api, reprovision=rp)
    th.start()
    job = pytorchjob.job_name(run_id, "train")
    wait_until("2 pods running", lambda: _pods_running(kube, namespace, job, 2), timeout=60)
    trainer = Trainer(ckpt, alive=lambda: _pods_running(kube, namespace, job, 2))
    trainer.start()
    time.sleep(0.55)  # mid-interval: the next checkpoint is ~0.45 s away
    t_xid = time.time()
    world.break_node(names[0], GpuFault("xid", crash_after_s=XID_CRASH_S, condition=True))
    wait_until("replacement", lambda: rp.calls, timeout=30)
    led = ledger.read(kube.api, namespace, run_id, "train")
    entry = led["preemptions"][0]
    stopped = wait_until("the trainer stopped with its pods", lambda: trainer.stopped_step, timeout=30)
    trainer.resume(int(entry["checkpoint_step"]))  # the recreated job resumes from the checkpoint it names
    out = json.loads(th.outcome(60).output_json)
    trainer.halt.set()
    assert out["status"] == "Succeeded", out
    assert entry["reason"].startswith("GPU health: node " + names[0]) and entry["lost_nodes"] == [names[0]]
    cond = led["health_conditions"][0]
    assert cond["node"] == names[0] and cond["condition"] == "GPUXIDErrors=True"
    # the boundary: the checkpoint resumed from is newer than the one when the condition was seen
    assert entry["checkpoint_step"] > cond["checkpoint_step"], (entry, cond)
    assert entry["decided_at"] - t_xid < compress(XID_CRASH_S), "replaced only after the GPU would have crashed"
    lost = int(stopped) - int(entry["checkpoint_step"])  # trained past the checkpoint before the pods stopped
    assert 0 <= lost < trainer.every, (stopped, entry)
    node = kube.core.read_node(names[0])
    assert node.spec.unschedulable and any(t.key == UNHEALTHY_TAINT for t in node.spec.taints or [])
    down = float(out["ledger"]["preemptions"][0].get("time_to_resume_s", 0.0))
    record("xid_midrun", "kfp_gpu", test="test_health_xid_midrun_is_replaced_at_the_next_checkpoint",
           detection_s=round(expand(cond["t"] - t_xid), 1),
           action=f"node condition seen; job stopped at the next checkpoint (step {entry['checkpoint_step']}), "
           "node released and replaced, resumed", steps_lost=lost,
           gpu_minutes_wasted=round(_world_min(lost * STEP_S + down) * 2 * GPUS, 1),
           note=f"checkpoint every 10 steps of {expand(STEP_S):g} s world; steps lost = the step the rehearsal "
           "trainer reached when its pods stopped running minus the checkpoint resumed from; wasted = lost steps + "
           "restart "
           f"({expand(down):.0f} s world) x whole gang; the GPU would have killed the rank {XID_CRASH_S:g} s after "
           "the Xid")


def test_health_xid_midrun_under_the_training_operator_alone_crashes_the_job(
    kube: Kube, namespace: str, step_api: client.ApiClient, kwok_nodes: NodeFactory, tmp_path: Path,
    world: GpuHealthWorld,
) -> None:
    """No reaction to the condition (health.midrun="report", no retries): the job trains on until the GPU kills
    its rank, and the Training Operator fails the job."""
    pool, names = kwok_nodes(2, gpus=GPUS, spot=True)
    world.adopt(*names)
    run_id = f"run-hxto-{namespace}"
    ckpt = tmp_path / "ckpt"
    spec = make_spec(namespace, ckpt, nodes=2, app_failure_retries=0).replace(health=Health(midrun="report"))
    th = StepThread(spec=spec, run_id=run_id, capacity_json=make_capacity(run_id, pool, names).to_json(),
                    job_json=job_json(30.0), api=step_api)
    th.start()
    job = pytorchjob.job_name(run_id, "train")
    wait_until("2 pods running", lambda: _pods_running(kube, namespace, job, 2), timeout=60)
    trainer = Trainer(ckpt)
    trainer.start()
    time.sleep(0.55)
    t_xid = time.time()
    world.break_node(names[0], GpuFault("xid", crash_after_s=XID_CRASH_S, condition=True))
    with pytest.raises(TrainingFailed):
        th.outcome(60)
    trainer.halt.set()
    led = ledger.read(kube.api, namespace, run_id, "train")
    failure = led["app_failures"][0]
    assert led["health_conditions"][0]["action"] == "report" and not led.get("preemptions")
    crashed = failure["t"]
    lost = trainer.at(crashed) - (trainer.at(crashed) // trainer.every) * trainer.every
    assert crashed - t_xid >= compress(XID_CRASH_S) * 0.9
    record("xid_midrun", "training_operator",
           test="test_health_xid_midrun_under_the_training_operator_alone_crashes_the_job",
           detection_s=round(expand(crashed - t_xid), 1), action="none until the GPU killed the rank; job Failed "
           "(the bad node stays in the gang)", steps_lost=lost,
           gpu_minutes_wasted=round(_world_min(lost * STEP_S) * 2 * GPUS, 1),
           note="detection = Xid to the rank's crash (the job failure); wasted counts only the lost steps, not "
           "the idle gang after the failure")


def test_health_probe_runs_again_only_on_a_preemptions_replacement(
    kube: Kube, namespace: str, step_api: client.ApiClient, kwok_nodes: NodeFactory, tmp_path: Path,
    world: GpuHealthWorld, reprov: Callable[[str], AdoptingReprovisioner],
) -> None:
    """A spot preemption mid-run: the replacement node is probed before the job is recreated; the survivor, which
    passed at launch, is not probed again."""
    pool, names = kwok_nodes(2, gpus=GPUS, spot=True)
    world.adopt(*names)
    run_id = f"run-hp-{namespace}"
    spec = make_spec(namespace, tmp_path / "ckpt", nodes=2).replace(health=Health(probe=True, probe_timeout_s=30.0))
    rp = reprov(pool)
    th = StepThread(spec=spec, run_id=run_id, capacity_json=make_capacity(run_id, pool, names).to_json(),
                    job_json=job_json(3.0), api=step_api, reprovision=rp)
    th.start()
    job = pytorchjob.job_name(run_id, "train")
    wait_until("2 pods running", lambda: _pods_running(kube, namespace, job, 2), timeout=60)
    preempt(kube.kubeconfig, kube.core, names[0])
    out = json.loads(th.outcome(60).output_json)
    assert out["status"] == "Succeeded" and out["preemptions"] == 1, out
    health = out["ledger"]["health"]
    assert [(r["action"], sorted(r["nodes"])) for r in health] == [("pass", sorted(names)),
                                                                   ("pass", rp.calls[0]["nodes"])], health
