"""Spot shutdown as GKE documents it, and what a lost rank does to its peers, on the real control plane + KWOK.

* ``test_gke_spot_notice_emergency_save_fits_15_s``: the GKE stand-in's notice (graceful node shutdown: the pod
  Running with ``DisruptionTarget``, killed 15 s later); a simulated trainer in this process saves within the
  per-cloud budget (``spot_grace_s("gke")``) or not; the steps lost are measured against the world's kill.
* ``test_rank_loss_training_operator_alone_peers_hang_until_the_timeout``: a plain PyTorchJob, no kfp-gpu: the
  peers of the killed rank stay Running, stalled, and exit 1 only after the job's process-group timeout.
* ``test_rank_loss_under_kfp_gpu_restarts_the_whole_gang_before_the_timeout``: the same loss under the train step:
  the whole gang is recreated from the newest checkpoint while the old peers would still hang.

World durations are real-world seconds, compressed by kfp_gpu_rehearsal.devcluster.worldtime.TIME_SCALE (120: 15 s = 0.125 s here). The
spot test runs its world at 12 (15 s = 1.25 s): at 120 one API call (10-30 ms on this machine) is 1-4 world
seconds, as long as the emergency save it measures.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from kfp_gpu.checkpoint import CheckpointStore, PreemptionGuard, spot_grace_s
from kfp_gpu.cluster import pytorchjob
from kfp_gpu.job import JobTemplate
from kfp_gpu.ownership import Owner
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Recovery, Target
from kfp_gpu.steps import scale_up, teardown
from kfp_gpu.steps.capacity import Capacity
from kfp_gpu_rehearsal.devcluster import worldtime
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim import SimServer
from kfp_gpu_rehearsal.sim.clock import compress, expand
from kfp_gpu_rehearsal.sim.ranks import (
    PG_TIMEOUT_ANNOTATION,
    RENDEZVOUS_ANNOTATION,
    RESTARTS_ANNOTATION,
    RESUMES_ANNOTATION,
    STALLED_ANNOTATION,
)
from tests.integration.gke_world_support import (
    JOB_NAME,
    ZONE,
    GkeWorlds,
    create_pytorchjob,
    gang_manifest,
    operator_restarts,
    ranks_running,
)
from tests.integration.test_train_support import StepThread, job_pods, running_pods, wait_until
from tests.sim._helpers import REGION

pytestmark = pytest.mark.integration
OWNER = Owner("run-spot", "scale-up", 2_000_000_000.0)


@pytest.fixture
def gke(kube: Kube, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., tuple[SimServer, GkeProvider,
                                                                                       list[str]]]]:
    """Factory: a GKE stand-in (default spot timing: 30 s notice, 15 s pod grace) with ``n`` Ready spot nodes;
    ``scale`` sets the world's time compression for this test (one factor for the whole world)."""
    worlds = GkeWorlds(kube)

    def make(n: int, scale: float = worldtime.TIME_SCALE, boot_s: float = 0.25) -> tuple[SimServer, GkeProvider,
                                                                                      list[str]]:
        monkeypatch.setattr(worldtime, "TIME_SCALE", scale)  # the one name: the world and the stand-in API read it
        return worlds.make(n, OWNER, boot_s=boot_s * scale, device_plugin_s=0.05 * scale)

    yield make
    worlds.stop()


def _world_s(t_wall: float) -> float:
    return round(expand(t_wall), 1)


# ---- (a) the GKE spot notice and the emergency save -----------------------------------------------

# For the notice tests: the notice lands one step after a periodic checkpoint, and the next periodic one is further
# off than the VM lives after a notice (< 30 s world = 30 steps). A loaded world that delivers the notice late (CI on
# 0411ce5: the rank saw it 9.8-11 s world after, at step 30 with a checkpoint every 10) then cannot let the rank reach
# a periodic save before the kill, which hid the steps lost and failed the test.
CHECKPOINT_EVERY = 40
NOTICE_STEP = CHECKPOINT_EVERY + 1
# The notice tests' world runs at 6x (15 s of pod grace = 2.5 s here). The rank learns of the notice by polling its
# pod, and the stand-in tells the pods through the API: under load each costs real seconds, which a faster world
# turns into world seconds the rank never had (on GKE the kubelet's SIGTERM is immediate). These tests asked for 12x
# but ran at the default 120x (15 s = 0.125 s here): the fixture set clock.TIME_SCALE, which compress() no longer
# reads (it reads worldtime's). CI's full run on ea4e20d then saw the notice so late that the emergency save missed
# the kill (8 steps lost, asserted 0).
NOTICE_SCALE = 6.0


@dataclass
class SpotTrainer:
    """A rank of a job, simulated in this process: one step every ``step_s`` (world seconds) while its pod runs, a
    checkpoint every ``every`` steps. On the notice (its pod's ``DisruptionTarget``, the SIGTERM of the rehearsal
    world) it finishes the step in flight, then saves for ``save_s``; the watchdog's budget is the product's
    (:class:`PreemptionGuard` over ``spot_grace_s("gke")``). The save commits only if the world has not killed the
    pod by then (a killed process commits nothing)."""

    core: client.CoreV1Api
    namespace: str
    pod: str
    store: CheckpointStore
    save_s: float
    step_s: float = 1.0
    every: int = 10
    step: int = 0
    signalled_at: float | None = None
    killed_at: float | None = None
    saved_at: float | None = None
    log: list[str] = field(default_factory=list)

    def _phase(self) -> tuple[str, bool]:
        try:
            p = self.core.read_namespaced_pod(self.pod, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return "Gone", False
            raise
        told = any(c.type == "DisruptionTarget" and c.status == "True" for c in (p.status.conditions or []))
        return str(p.status.phase), told

    def run(self, stop_at_step: int, t0: list[float]) -> None:
        budget = PreemptionGuard(lambda: None, spot_grace_s("gke"), exit_code=None, signals=()).remaining_s()
        while True:
            time.sleep(compress(self.step_s))  # one training step
            self.step += 1
            if self.step % self.every == 0:
                self.store.save(self.step, {"w": str(self.step).encode()})
            if self.step == stop_at_step:
                t0.append(time.monotonic())  # the test preempts now
            phase, told = self._phase()
            if phase != "Running":
                self.killed_at = time.monotonic()
                return
            if told:
                break
        self.signalled_at = time.monotonic()
        if self.save_s > budget:  # the product's watchdog exits 143 first: nothing is committed
            self.log.append(f"save of {self.save_s:g}s exceeds the {budget:g}s budget: watchdog exit")
        else:
            time.sleep(compress(self.save_s))
            phase, _ = self._phase()
            if phase == "Running":
                self.store.save(self.step, {"w": str(self.step).encode()}, meta={"emergency": True})
                self.saved_at = time.monotonic()
        while self._phase()[0] == "Running":
            time.sleep(0.005)
        self.killed_at = time.monotonic()


def _trainer_pod(namespace: str, name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "c", "image": "busybox",
                                     "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}


def test_gke_spot_notice_emergency_save_fits_15_s(
    kube: Kube, namespace: str, gke: Any, tmp_path: Path,
) -> None:
    sim, _, nodes = gke(2, scale=NOTICE_SCALE)
    results = {}
    for node, save_s in zip(nodes, (5.0, 20.0), strict=True):  # world seconds: fits GKE's 15 s, and does not
        pod = f"rank-{int(save_s)}s"
        kube.core.create_namespaced_pod(namespace, _trainer_pod(namespace, pod, node))
        wait_until(f"{pod} Running", lambda pod=pod: kube.core.read_namespaced_pod(pod, namespace).status.phase
                   == "Running", timeout=30)
        store = CheckpointStore(str(tmp_path / pod))
        tr = SpotTrainer(kube.core, namespace, pod, store, save_s, every=CHECKPOINT_EVERY)
        t0: list[float] = []
        th = threading.Thread(target=tr.run, args=(NOTICE_STEP, t0), daemon=True)
        th.start()
        wait_until(f"trainer at step {NOTICE_STEP}", lambda t0=t0: bool(t0), timeout=60)
        notice_at = time.monotonic()
        sim.preempt(node)
        th.join(30)
        assert not th.is_alive() and tr.killed_at is not None and tr.signalled_at is not None, tr
        newest = store.latest()
        resumed = newest.step if newest is not None else 0
        lost = tr.step - resumed
        results[save_s] = lost
        print(f"\nGKE spot notice, emergency save of {save_s:g}s (budget {spot_grace_s('gke'):g}s): "
              f"trainer saw the notice at +{_world_s(tr.signalled_at - notice_at)}s (world), "
              f"saved at {'+' + str(_world_s(tr.saved_at - notice_at)) + 's' if tr.saved_at else 'never'}, "
              f"killed at +{_world_s(tr.killed_at - notice_at)}s; step {tr.step}, resumes from {resumed}: "
              f"{lost} steps lost {tr.log}")
        # the world keeps the pod running for GKE's 15 s, and no longer than the VM's 30 s
        assert 15.0 <= expand(tr.killed_at - notice_at) < 30.0, tr
        if save_s <= 15.0:
            assert tr.saved_at is not None and tr.saved_at < tr.killed_at and lost == 0, tr
        else:
            assert tr.saved_at is None and 0 < lost <= tr.every, tr  # back to the periodic checkpoint (40)
    assert results[5.0] == 0 and results[20.0] > 0


# ---- (b), (c) rank loss ---------------------------------------------------------------------------

def _template(pg_timeout_s: float, run_s: float = 300.0) -> JobTemplate:
    """Pods KWOK keeps Running for ``run_s`` wall seconds, with the job's process-group timeout (world seconds)."""
    return JobTemplate(name="train", image="busybox", command=("true",), checkpoint_every=10,
                       annotations={pytorchjob.SIM_DURATION_ANNOTATION: f"{run_s:g}s",
                                    PG_TIMEOUT_ANNOTATION: f"{pg_timeout_s:g}"})


class PodLog(threading.Thread):
    """Every pod event of a job, timed: (monotonic time, pod name, uid, phase, first container exit code, stalled)."""

    def __init__(self, core: client.CoreV1Api, namespace: str, job: str) -> None:
        super().__init__(daemon=True)
        self.core, self.namespace, self.job = core, namespace, job
        self.events: list[tuple[float, str, str, str, int | None, bool]] = []
        self.w = watch.Watch()

    def run(self) -> None:
        for ev in self.w.stream(self.core.list_namespaced_pod, self.namespace, label_selector=f"{JOB_NAME}={self.job}",
                                timeout_seconds=120):
            p = ev["object"]
            term = [cs.state.terminated for cs in (p.status.container_statuses or []) if cs.state.terminated]
            self.events.append((time.monotonic(), p.metadata.name, p.metadata.uid, str(p.status.phase),
                                term[0].exit_code if term else None,
                                bool((p.metadata.annotations or {}).get(STALLED_ANNOTATION))))

    def first(self, uid: str, pred: Callable[[str, int | None, bool], bool]) -> float | None:
        return next((t for t, _, u, ph, code, st in list(self.events) if u == uid and pred(ph, code, st)), None)


def test_rank_loss_training_operator_alone_peers_hang_until_the_timeout(
    kube: Kube, namespace: str, gke: Any,
) -> None:
    """The baseline of bench/recovery.py: the operator restarts failed pods (restartPolicy OnFailure, backoffLimit
    10) and nothing else reacts. The peers of the killed rank hang: Running, stalled, then exit 1 at the timeout."""
    sim, _, nodes = gke(4)
    name = f"plain-{uuid.uuid4().hex[:5]}"
    timeout_s = 240.0  # the job's process-group timeout, world seconds (2 s here)
    body = operator_restarts(gang_manifest(name, namespace, nodes, _template(timeout_s)))
    log = PodLog(kube.core, namespace, name)
    log.start()
    create_pytorchjob(kube, namespace, body)
    placed = ranks_running(kube, namespace, name)
    victim = next(n for n, p in placed.items() if p.metadata.name.endswith("worker-0"))
    peers = {p.metadata.uid: p.metadata.name for n, p in placed.items() if n != victim}
    victim_uid = placed[victim].metadata.uid
    t_notice = time.monotonic()
    sim.preempt(victim)
    wait_until("peers exit", lambda: all(log.first(u, lambda ph, code, st: ph == "Failed") for u in peers),
               timeout=compress(timeout_s) + 20)
    killed = log.first(victim_uid, lambda ph, code, st: ph == "Failed" and code == 137)
    assert killed is not None
    for uid, pod in peers.items():
        stalled = log.first(uid, lambda ph, code, st: st and ph == "Running")
        exited = log.first(uid, lambda ph, code, st: ph == "Failed")
        codes = {code for t, _, u, ph, code, _ in log.events if u == uid and ph == "Failed"}
        assert stalled is not None and exited is not None and codes == {1}, (pod, codes)
        # Running (stalled) the whole time, no other phase in between, exit only after the timeout
        between = {ph for t, _, u, ph, _, _ in log.events if u == uid and stalled <= t < exited}
        assert between == {"Running"}, (pod, between)
        hung_s = expand(exited - killed)
        print(f"\nrank loss, Training Operator alone: {pod} stalled {expand(stalled - killed):.0f}s after the victim "
              f"was killed ({expand(killed - t_notice):.0f}s after the notice), hung {hung_s:.0f}s (world), "
              f"exited {codes} (pg timeout {timeout_s:g}s)")
        assert hung_s >= timeout_s - 0.2 * worldtime.TIME_SCALE  # not before the timeout (0.2 s of observation slack)
    log.w.stop()


def test_rank_loss_under_kfp_gpu_restarts_the_whole_gang_before_the_timeout(
    kube: Kube, namespace: str, step_api: client.ApiClient, gke: Any, tmp_path: Path,
) -> None:
    sim, prov, _ = gke(0)
    timeout_s = 600.0  # torch's default, world seconds (5 s here)
    ckpt = tmp_path / "ckpt"
    spec = ProvisioningSpec(
        "h100-80gb", 4, capacity=CapacityType.SPOT,
        target=Target(kind="local", cluster=sim.state.scenario.cluster, region=REGION, endpoint=sim.url,
                      namespace=namespace),
        zones=(ZONE,), scale_up_deadline_s=60, checkpoint_uri=str(ckpt), recovery=Recovery(max_preemptions=2),
    )
    run = f"run-{uuid.uuid4().hex[:6]}"
    cap_json = scale_up.run(spec, run, "", api=step_api, provider=prov).output_json
    cap = Capacity.from_json(cap_json)
    th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=_template(timeout_s, 8.0).to_json(),
                    api=step_api)
    th.start()
    job = pytorchjob.job_name(run, "train")
    try:
        first = wait_until("4 ranks running", lambda: running_pods(kube.core, namespace, job, 4), timeout=90)
        old_uid = first[0].metadata.owner_references[0].uid
        CheckpointStore(str(ckpt)).save(20, {"w": b"20"})
        victim = cap.nodes[1]
        podlog = PodLog(kube.core, namespace, job)
        podlog.start()
        t_notice, t_notice_wall = time.monotonic(), time.time()
        sim.preempt(victim)
        failed_peers: list[str] = []

        def resumed() -> list[Any]:
            pods = job_pods(kube.core, namespace, job)
            failed_peers.extend(p.metadata.name for p in pods if p.metadata.owner_references[0].uid == old_uid
                                and p.status.phase == "Failed" and p.spec.node_name != victim)
            new = [p for p in pods if p.metadata.owner_references[0].uid != old_uid and p.status.phase == "Running"
                   and p.metadata.deletion_timestamp is None]
            return new if len(new) == 4 else []

        try:
            new = wait_until("the whole gang running again", resumed, timeout=compress(timeout_s) + 30)
        except AssertionError as exc:  # when each pod changed phase, and where KWOK says it is (found the lease bug)
            phases = [(round(t - t_notice, 2), n, ph) for t, n, _, ph, _, _ in podlog.events]
            pods = [(p.metadata.name, p.status.phase, p.spec.node_name, (p.metadata.annotations or {}).get(
                "kfp-gpu.io/pulled-at")) for p in job_pods(kube.core, namespace, job)]
            raise AssertionError(f"{exc}; phases after the notice: {phases}; pods (name, phase, node, pulled-at): "
                                 f"{pods}") from None
        back_after = expand(time.monotonic() - t_notice)
        out = json.loads(th.outcome(120).output_json)
    finally:
        teardown.run(spec, run, "", api=step_api, provider=prov)
    p = out["ledger"]["preemptions"][0]
    print(f"\nrank loss under kfp-gpu: decided {_world_s(p['decided_at'] - t_notice_wall)}s, whole gang Running again {back_after:.0f}s (world) after the notice, from step "
          f"{p['checkpoint_step']}; pg timeout {timeout_s:g}s")
    assert out["status"] == "Succeeded" and p["checkpoint_step"] == 20
    assert {q.metadata.owner_references[0].uid for q in new} != {old_uid} and len(new) == 4  # every rank is new
    assert not failed_peers, f"old peers hung until the timeout: {failed_peers}"
    assert back_after < timeout_s, f"the gang came back {back_after:.0f}s after the notice, past the timeout"


def test_rank_loss_elastic_job_peers_re_rendezvous_instead_of_hanging(
    kube: Kube, namespace: str, gke: Any,
) -> None:
    """An elastic PyTorchJob (spec.elasticPolicy: torchrun --nnodes 2:4 --max-restarts 3): the peers of the killed
    rank stop, re-rendezvous (``kfp-gpu.io/resumes-at``) and keep running past the process-group timeout."""
    sim, _, nodes = gke(4)
    name = f"elastic-{uuid.uuid4().hex[:5]}"
    timeout_s, rdzv_s = 120.0, 60.0  # world seconds: 1 s and 0.5 s here
    # the operator restarts the killed rank (backoffLimit 10, OnFailure); the job lives on
    body = operator_restarts(gang_manifest(name, namespace, nodes, _template(timeout_s)))
    body["spec"]["elasticPolicy"] = {"minReplicas": 2, "maxReplicas": 4, "maxRestarts": 3, "rdzvBackend": "c10d"}
    body["metadata"]["annotations"][RENDEZVOUS_ANNOTATION] = f"{rdzv_s:g}"
    create_pytorchjob(kube, namespace, body)
    placed = ranks_running(kube, namespace, name)
    victim = next(n for n, p in placed.items() if p.metadata.name.endswith("worker-0"))
    peers = [p.metadata.name for n, p in placed.items() if n != victim]
    sim.preempt(victim)
    regrouped = wait_until("peers re-rendezvous", lambda: (ps := [kube.core.read_namespaced_pod(n, namespace)
                                                                  for n in peers])
                           and all((p.metadata.annotations or {}).get(RESUMES_ANNOTATION) for p in ps) and ps,
                           timeout=10)
    for p in regrouped:
        notes = p.metadata.annotations
        assert notes[RESTARTS_ANNOTATION] == "1" and "kfp-gpu.io/sim-exit-code" not in notes, notes
        pause = (parse_time(notes[RESUMES_ANNOTATION]) - parse_time(notes[STALLED_ANNOTATION]))
        assert abs(pause - compress(rdzv_s)) < 0.01, pause  # the rendezvous, in world time
    time.sleep(compress(timeout_s) + 1.0)  # past the process-group timeout: still training, nobody exited
    later = [kube.core.read_namespaced_pod(n, namespace) for n in peers]
    assert all(p.status.phase == "Running" for p in later), [p.status.phase for p in later]
    print(f"\nrank loss, elastic job: {len(peers)} peers re-rendezvoused after {rdzv_s:g}s (world) and were still "
          f"Running {expand(compress(timeout_s) + 1.0):.0f}s later (pg timeout {timeout_s:g}s)")


def parse_time(text: str) -> float:
    from datetime import datetime

    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


def test_rank_loss_elastic_job_below_its_minimum_after_a_second_loss_hangs(
    kube: Kube, namespace: str, gke: Any,
) -> None:
    """Two ranks of a 4-rank elastic job (minReplicas 3) lost one after the other: the first loss re-rendezvouses the
    other three; the second leaves two, below the minimum, so they hang: the first rendezvous's resumes-at is
    gone and they are set to exit 1 at the process-group timeout (bench/recovery.py counted them as training)."""
    # the MIG repairs a preempted VM under its name and the operator restarts its rank there: a repair that booted
    # before the second loss would leave three ranks (the minimum) and rightly re-rendezvous them again. CI on
    # 05b9525 saw that under load (the second kill landed after the repaired node's 30 s world boot). VMs that boot
    # in 5 s here (600 s world) keep the repair out of the test's window.
    sim, _, nodes = gke(4, boot_s=5.0)
    name = f"elastic2-{uuid.uuid4().hex[:5]}"
    body = operator_restarts(gang_manifest(name, namespace, nodes, _template(120.0)))
    body["spec"]["elasticPolicy"] = {"minReplicas": 3, "maxReplicas": 4, "maxRestarts": 3, "rdzvBackend": "c10d"}
    create_pytorchjob(kube, namespace, body)
    placed = ranks_running(kube, namespace, name)
    by_name = {p.metadata.name: n for n, p in placed.items()}
    first = next(n for nm, n in by_name.items() if nm.endswith("worker-0"))
    second = next(n for nm, n in by_name.items() if nm.endswith("worker-1"))
    survivors = [nm for nm, n in by_name.items() if n not in (first, second)]
    sim.preempt(first)
    # the second loss comes once the world has begun the first re-rendezvous (its restart counted on every other
    # rank), not a fixed 0.1 s later: CI on 0411ce5 saw the two losses at once under load and never counted the first
    others = [nm for nm, n in by_name.items() if n != first]
    wait_until("the first re-rendezvous", lambda: all(
        (kube.core.read_namespaced_pod(nm, namespace).metadata.annotations or {}).get(RESTARTS_ANNOTATION) == "1"
        for nm in others), timeout=10, every=0.005)
    sim.preempt(second)

    def hung() -> list[Any]:
        ps = [kube.core.read_namespaced_pod(n, namespace) for n in survivors]
        ok = all((p.metadata.annotations or {}).get("kfp-gpu.io/sim-exit-code") == "1" for p in ps)
        return ps if ok else []

    for p in wait_until("the two survivors hang", hung, timeout=10):
        notes = p.metadata.annotations
        assert RESUMES_ANNOTATION not in notes and notes.get(RESTARTS_ANNOTATION) == "1", notes
        assert p.status.phase == "Running"
    print(f"\nrank loss, elastic job, 2 of 4 lost one after the other (minReplicas 3): {len(survivors)} survivors "
          "re-rendezvoused once, then hang until the process-group timeout")
