"""A rank that hangs (no progress, its pod still Running) and a rank that runs slow, on the real control plane + KWOK,
with the rehearsal trainer writing per-rank progress through the progress API (kfp_gpu_rehearsal.sim.progress, scenario key
``training``).

* ``test_rank_hang_under_kfp_gpu_is_a_stall_and_the_gang_restarts_from_the_checkpoint``: the train step's stall
  detector reads the progress objects, names the rank that stopped first, collects every rank's log tail, and
  recreates the whole gang from the newest checkpoint (one restart of ``recovery.max_preemptions``).
* ``test_rank_hang_training_operator_alone_runs_until_the_process_group_timeout``: the same hang in a plain PyTorchJob
  (restartPolicy OnFailure, backoffLimit 10): nothing is failed, so nothing reacts until the ranks exit 1 at the
  process-group timeout.
* ``test_straggler_is_reported``: one rank 1.5 x slower: reported (ledger, timeline) while the gang keeps training.

World durations are real-world seconds, compressed by kfp_gpu_rehearsal.devcluster.worldtime.TIME_SCALE (120; 60 for the tests whose
restart races the process-group timeout, ``REPAIR_SCALE``). Each test records its
measured row in the fault table (tests/integration/fault_rows.py, docs/faults.md).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kfp_gpu.checkpoint import CheckpointStore
from kfp_gpu.checkpoint import progress as rank_progress
from kfp_gpu.checkpoint.backends import open_backend
from kfp_gpu.cluster import pytorchjob
from kfp_gpu.job import JobTemplate
from kfp_gpu.ownership import Owner
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Recovery, Target
from kfp_gpu.steps import scale_up, teardown
from kfp_gpu_rehearsal.devcluster import worldtime
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim import SimServer
from kfp_gpu_rehearsal.sim.clock import compress, expand
from kfp_gpu_rehearsal.sim.progress import STEP_ANNOTATION
from kfp_gpu_rehearsal.sim.ranks import PG_TIMEOUT_ANNOTATION
from tests.integration.fault_rows import record
from tests.integration.gke_world_support import (
    ZONE,
    GkeWorlds,
    create_pytorchjob,
    gang_manifest,
    operator_restarts,
    ranks_running,
    ready_gpu_nodes,
)
from tests.integration.test_spot_rank_loss import PodLog
from tests.integration.test_train_support import StepThread, job_pods, running_pods, wait_until
from tests.sim._helpers import REGION

pytestmark = pytest.mark.integration
OWNER = Owner("run-stall", "scale-up", 2_000_000_000.0)
STEP_S = 2.0  # world seconds per training step
HANG_AFTER_S = 240.0  # world seconds after the hung rank started
CKPT_EVERY = 50  # the rehearsal gang saves a checkpoint every 50 steps (training.checkpoint_every)
CKPT_STEP = int(HANG_AFTER_S / STEP_S) // CKPT_EVERY * CKPT_EVERY  # the newest checkpoint when rank 1 hangs: 100
HANGS = {"step_s": STEP_S, "checkpoint_every": CKPT_EVERY, "hang": {"rank": 1, "after_s": HANG_AFTER_S}}
# The tests where kfp-gpu must restart the hung gang before the process-group timeout run their world at 60, not 120:
# the restart's API calls take real seconds (1.5-4.3 s measured under load 4-7), which at 120 are 180-520 world
# seconds of the 600 s timeout. With the step thread held 3.5 s at the stall decision (an artificial delay) the
# gang came back 678 s (world) after the hang at 120; CI's loaded machine can hold it as long.
REPAIR_SCALE = 60.0
# The straggler tests' ranks train 8 s (960 s world, was 4-5 s): the report (found 183-308 s after the start, load 1-9)
# and the swap at the next checkpoint (464 s at load 9, of a 600 s job) must come before the job ends; with the step
# thread held 3.5 s once the ranks reported (an artificial delay) the 4 s job ended unreported.
STRAGGLER_RUN_S = 8.0
REPAIR_RUN_S = 9.0  # wall seconds a rank trains at REPAIR_SCALE (540 s world): the hang at 240 s falls in it
PG_TIMEOUT_S = 600.0  # torch's NCCL default, world seconds (5 s here)
GPUS = 4 * 8


@pytest.fixture
def world(kube: Kube, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., tuple[SimServer, GkeProvider,
                                                                                       list[str]]]]:
    """Factory: a GKE stand-in whose training ranks report progress (``training`` key); ``n`` Ready spot nodes.
    ``scale``: the world's time compression for this test (one factor for the world, its ranks, the product's stall
    policy and this test's ``compress``/``expand``)."""
    worlds = GkeWorlds(kube)

    def make(n: int, training: dict[str, Any], scale: float = worldtime.TIME_SCALE,
             ) -> tuple[SimServer, GkeProvider, list[str]]:
        monkeypatch.setattr(worldtime, "TIME_SCALE", scale)  # the one name: the world and the stand-in API read it
        return worlds.make(n, OWNER, boot_s=30.0, device_plugin_s=6.0, training=training)

    yield make
    worlds.stop()


def _template(run_s: float) -> JobTemplate:
    """Rehearsal ranks that train (``STEP_S`` world seconds a step) for ``run_s`` wall seconds."""
    return JobTemplate(name="train", image="busybox", command=("true",), checkpoint_every=50,
                       annotations={pytorchjob.SIM_DURATION_ANNOTATION: f"{run_s:g}s", STEP_ANNOTATION: f"{STEP_S:g}",
                                    PG_TIMEOUT_ANNOTATION: f"{PG_TIMEOUT_S:g}"})


def _spec(sim: SimServer, namespace: str, ckpt: Path, **kw: Any) -> ProvisioningSpec:
    return ProvisioningSpec(
        "h100-80gb", 4, capacity=CapacityType.SPOT,
        target=Target(kind="local", cluster=sim.state.scenario.cluster, region=REGION, endpoint=sim.url,
                      namespace=namespace),
        zones=(ZONE,), scale_up_deadline_s=60, checkpoint_uri=str(ckpt), recovery=Recovery(max_preemptions=2), **kw)


def _start(spec: ProvisioningSpec, prov: GkeProvider, step_api: client.ApiClient, run_s: float,
           ) -> tuple[str, StepThread]:
    """Scale-up for a new run id, then its train step started in a thread (ranks of ``_template(run_s)``)."""
    run = f"run-{uuid.uuid4().hex[:6]}"
    cap_json = scale_up.run(spec, run, "", api=step_api, provider=prov).output_json
    th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=_template(run_s).to_json(), api=step_api)
    th.start()
    return run, th


def _plain(namespace: str, nodes: list[str], ckpt: Path, prefix: str = "plain") -> tuple[str, dict[str, Any]]:
    """A PyTorchJob without kfp-gpu, its ranks training for 300 s on ``nodes``: (name, manifest)."""
    name = f"{prefix}-{uuid.uuid4().hex[:5]}"
    return name, gang_manifest(name, namespace, nodes, _template(300.0), checkpoint_uri=str(ckpt))


def _hang(sim: SimServer, victim: Any) -> tuple[float, int]:
    """Waits for the world to hang ``victim``: (when it stopped, the step it had finished: offered to its reporter
    once, stored by the trailing write). The world's gang saved its checkpoints itself (``training.checkpoint_every``), each before any rank reported a step past it: the test used to
    save step 60 once it saw the ranks past it, and a test 3 s late (an artificial sleep) let the stall be decided
    before that save (restarted from step 0)."""
    pw = sim.progress_world
    hung_at = wait_until("the world hangs rank 1", lambda: pw.stopped.get(victim.metadata.uid), timeout=30)
    return hung_at, pw.reported.get(victim.metadata.uid, 0)


def _hang_waste(until_s: float, hung_step: int) -> tuple[int, float]:
    """Steps lost past the newest checkpoint and the GPU-minutes of the gang from the hang to ``until_s``."""
    lost = max(0, hung_step - CKPT_STEP)
    return lost, GPUS * (until_s + lost * STEP_S) / 60.0


def _record_unnoticed_straggler(backend: str, test: str, factor: float, horizon_s: float, action: str) -> float:
    """The fault row of a slow rank nothing reacts to in ``horizon_s`` (world); returns the GPU-minutes lost."""
    wasted = GPUS * horizon_s * (1 - 1 / factor) / 60.0
    record("slow_node", backend, test=test, detection_s=None, action=action, steps_lost=0,
           gpu_minutes_wasted=round(wasted, 1),
           note=f"rank 2 x{factor:g} slower, 4x8 GPUs, watched {horizon_s:g}s (world); wasted = GPUs x horizon x "
                f"(1 - 1/{factor:g}), and it goes on for the whole run")
    return wasted


def _job_running(out: dict[str, Any], attempt: int = 1) -> float:
    """When the ``attempt``-th attempt's gang was Running, from the step's timeline (``job-running`` events)."""
    tl = json.loads(out["ledger"]["timeline"])
    return sorted(float(e["t"]) for e in tl["events"] if e["kind"] == "job-running")[attempt - 1]


def _newest(ckpt: Path) -> int:
    recs = rank_progress.read(open_backend(str(ckpt)))
    return min((r.step for r in recs.values()), default=0)


def test_rank_hang_under_kfp_gpu_is_a_stall_and_the_gang_restarts_from_the_checkpoint(
    kube: Kube, namespace: str, step_api: client.ApiClient, world: Any, tmp_path: Path,
) -> None:
    sim, prov, _ = world(0, HANGS, scale=REPAIR_SCALE)
    ckpt = tmp_path / "ckpt"
    spec = _spec(sim, namespace, ckpt)
    run, th = _start(spec, prov, step_api, REPAIR_RUN_S)
    job = pytorchjob.job_name(run, "train")
    try:
        first = wait_until("4 ranks running", lambda: running_pods(kube.core, namespace, job, 4), timeout=90)
        old_uid = first[0].metadata.owner_references[0].uid
        victim = next(p for p in first if p.metadata.name.endswith("worker-0"))  # rank 1
        hung_at, hung_step = _hang(sim, victim)

        def restarted() -> list[Any]:
            new = [p for p in job_pods(kube.core, namespace, job) if p.metadata.owner_references[0].uid != old_uid
                   and p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
            return new if len(new) == 4 else []

        new = wait_until("the whole gang running again", restarted, timeout=compress(PG_TIMEOUT_S) + 30)
        out = json.loads(th.outcome(120).output_json)
    finally:
        teardown.run(spec, run, "", api=step_api, provider=prov)
    assert out["status"] == "Succeeded", out
    (stall,) = out["ledger"]["stalls"]
    detected_s = expand(stall["decided_at"] - hung_at)
    assert stall["first_stopped"] == [1] and stall["checkpoint_step"] == CKPT_STEP, stall
    assert stall["first_stopped_nodes"] == {"1": victim.spec.node_name}, stall
    assert set(stall["logs"]) == {p.metadata.name for p in first}  # every rank's log tail (KWOK: none, said so)
    assert out["ledger"]["budget"]["preemptions"] == 1 and not out["ledger"].get("preemptions")
    assert {p.metadata.owner_references[0].uid for p in new} != {old_uid}
    env = {e.name: e.value for e in new[0].spec.containers[0].env or []}
    assert env[pytorchjob.ENV_RESUME_STEP] == str(CKPT_STEP)
    assert 120.0 * 0.9 <= detected_s < PG_TIMEOUT_S, detected_s  # the auto floor, well before the pg timeout
    back_s = expand(_job_running(out, attempt=2) - hung_at)  # the step's record, not when this test looked
    assert back_s < PG_TIMEOUT_S
    lost, wasted = _hang_waste(back_s, hung_step)
    print(f"\nrank hang under kfp-gpu: detected {detected_s:.0f}s (world) after the hang (stall timeout "
          f"{expand(stall['timeout_s']):.0f}s), gang running again after {back_s:.0f}s from step {CKPT_STEP}; hung at step "
          f"{hung_step}: {lost} steps lost, {wasted:.0f} GPU-minutes wasted")
    record("hang", "kfp_gpu", test="test_rank_hang_under_kfp_gpu_is_a_stall_and_the_gang_restarts_from_the_checkpoint",
           detection_s=round(detected_s, 1), action="stall: whole gang restarted from the newest checkpoint",
           steps_lost=lost, gpu_minutes_wasted=round(wasted, 1),
           note=f"4x8 GPUs, step {STEP_S:g}s, auto stall timeout (floor 120s); wasted = GPUs x (hang -> gang "
                f"running again + lost steps)")


def test_rank_hang_training_operator_alone_runs_until_the_process_group_timeout(
    kube: Kube, namespace: str, world: Any, tmp_path: Path,
) -> None:
    sim, _, nodes = world(4, HANGS)
    ckpt = tmp_path / "ckpt"
    name, body = _plain(namespace, nodes, ckpt)
    operator_restarts(body)
    log = PodLog(kube.core, namespace, name)
    log.start()
    create_pytorchjob(kube, namespace, body)
    placed = ranks_running(kube, namespace, name)
    uids = {p.metadata.uid: p.metadata.name for p in placed.values()}
    victim = next(p for p in placed.values() if p.metadata.name.endswith("worker-0"))
    hung_at, hung_step = _hang(sim, victim)
    wait_until("every rank exits", lambda: all(log.first(u, lambda ph, code, st: ph == "Failed") for u in uids),
               timeout=compress(PG_TIMEOUT_S) + 20)
    log.w.stop()
    exits = {u: log.first(u, lambda ph, code, st: ph == "Failed") for u in uids}
    # Running, stalled, the whole time: the operator sees no failure before the process-group timeout
    for uid, pod in uids.items():
        phases = {ph for t, _, u, ph, _, _ in log.events if u == uid and t < (exits[uid] or 0) - 0.05}
        assert phases <= {"Running", "Pending"}, (pod, phases)
    first_exit = min(t for t in exits.values() if t is not None)
    # the event's monotonic clock and the world's wall clock: measure from the hang on the wall clock
    detected_s = expand(first_exit - (time.monotonic() - (time.time() - hung_at)))
    codes = {code for _, _, u, ph, code, _ in log.events if u in uids and ph == "Failed"}
    assert codes == {1}, codes
    assert detected_s >= PG_TIMEOUT_S - 0.2 * 120, detected_s
    lost, wasted = _hang_waste(detected_s, hung_step)
    print(f"\nrank hang, Training Operator alone: first failure {detected_s:.0f}s (world) after the hang (pg timeout "
          f"{PG_TIMEOUT_S:g}s), exit codes {codes}; {lost} steps lost, at least {wasted:.0f} GPU-minutes wasted")
    record("hang", "training_operator",
           test="test_rank_hang_training_operator_alone_runs_until_the_process_group_timeout",
           detection_s=round(detected_s, 1), action="none until the pg timeout; then ranks exit 1 and the operator "
           "restarts the failed pods (restartPolicy OnFailure)", steps_lost=lost,
           gpu_minutes_wasted=round(wasted, 1),
           note=f"4x8 GPUs, torch NCCL default pg timeout {PG_TIMEOUT_S:g}s; wasted counts only until the first "
                "exit (the restart after it is extra)")


def test_straggler_is_reported_while_the_gang_keeps_training(
    kube: Kube, namespace: str, step_api: client.ApiClient, world: Any, tmp_path: Path,
) -> None:
    factor = 1.5
    sim, prov, _ = world(0, {"step_s": STEP_S, "slow": {"rank": 2, "factor": factor}})
    ckpt = tmp_path / "ckpt"
    spec = _spec(sim, namespace, ckpt, straggler_margin=0.2, straggler_window_s=120.0)
    run, th = _start(spec, prov, step_api, STRAGGLER_RUN_S)
    job = pytorchjob.job_name(run, "train")
    try:
        pods = wait_until("4 ranks running", lambda: running_pods(kube.core, namespace, job, 4), timeout=90)
        running_at = time.time()
        slow = next(p for p in pods if p.metadata.name.endswith("worker-1"))  # rank 2
        out = json.loads(th.outcome(120).output_json)
    finally:
        teardown.run(spec, run, "", api=step_api, provider=prov)
    assert out["status"] == "Succeeded" and out["attempts"] == 1, out  # reported, not restarted
    (entry,) = out["ledger"]["stragglers"]
    assert entry["ranks"] == [2] and entry["nodes"] == {"2": slow.spec.node_name}, entry
    detected_s = expand(entry["t"] - min(running_at, _job_running(out)))
    assert 120.0 <= detected_s < 600.0, detected_s  # not before the window has passed
    # the gang runs at the straggler's pace: the waste until detection (and on, under stragglers="report")
    wasted = GPUS * detected_s * (1 - 1 / factor) / 60.0
    print(f"\nslow rank (x{factor:g}) under kfp-gpu: reported {detected_s:.0f}s (world) after the gang started "
          f"(window 120s, margin 20%); {wasted:.0f} GPU-minutes lost to the slowdown by then")



JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"


def _jobset(name: str, pod_template: dict[str, Any], replicas: int) -> dict[str, Any]:
    """A JobSet of ``replicas`` one-pod Jobs (one rank each) with a failure policy: restart the whole JobSet up to
    3 times when any Job fails (jobset.sigs.k8s.io docs, "Failure Policy")."""
    template = json.loads(json.dumps(pod_template))
    template["spec"]["restartPolicy"] = "Never"
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
            "spec": {"failurePolicy": {"maxRestarts": 3},
                     "replicatedJobs": [{"name": "node", "replicas": replicas, "template": {"spec": {
                         "parallelism": 1, "completions": 1, "backoffLimit": 0, "template": template}}}]}}


def test_rank_hang_jobset_failure_policy_reacts_only_at_the_process_group_timeout(
    kube: Kube, namespace: str, world: Any, tmp_path: Path,
) -> None:
    sim, _, nodes = world(4, HANGS)
    ckpt = tmp_path / "ckpt"
    name, pt = _plain(namespace, nodes, ckpt, prefix="js")
    pod_template = pt["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    kube.custom.create_namespaced_custom_object(*JOBSET[:2], namespace, JOBSET[2], _jobset(name, pod_template, 4))
    sel = f"jobset.sigs.k8s.io/jobset-name={name}"

    def attempt_pods(attempt: str) -> list[Any]:
        return [p for p in kube.core.list_namespaced_pod(namespace, label_selector=sel).items
                if (p.metadata.labels or {}).get(RESTART_LABEL) == attempt]

    first = wait_until("4 ranks Running", lambda: (ps := [p for p in attempt_pods("0") if p.status.phase == "Running"])
                       and len(ps) == 4 and ps, timeout=60)
    victim = next(p for p in first if p.metadata.labels.get("jobset.sigs.k8s.io/job-global-index") == "1")
    hung_at, hung_step = _hang(sim, victim)
    phases: set[str] = set()

    def restarted() -> bool:
        phases.update(str(p.status.phase) for p in attempt_pods("0") if time.time() < hung_at + compress(PG_TIMEOUT_S)
                      - 0.3)
        return bool(attempt_pods("1"))

    wait_until("the failure policy restarts the JobSet", restarted, timeout=compress(PG_TIMEOUT_S) + 30)
    detected_s = expand(time.time() - hung_at)
    assert phases == {"Running"}, phases  # before the timeout nothing failed, so the policy had nothing to act on
    assert detected_s >= PG_TIMEOUT_S - 0.2 * 120, detected_s
    lost, wasted = _hang_waste(detected_s, hung_step)
    print(f"\nrank hang, JobSet failurePolicy (maxRestarts 3): restart {detected_s:.0f}s (world) after the hang "
          f"(pg timeout {PG_TIMEOUT_S:g}s); {lost} steps lost, {wasted:.0f} GPU-minutes wasted")
    record("hang", "jobset", test="test_rank_hang_jobset_failure_policy_reacts_only_at_the_process_group_timeout",
           detection_s=round(detected_s, 1), action="whole JobSet restarted by failurePolicy after the ranks exit 1 "
           "at the pg timeout", steps_lost=lost, gpu_minutes_wasted=round(wasted, 1),
           note=f"4x8 GPUs, one-pod Jobs, backoffLimit 0, torch NCCL default pg timeout {PG_TIMEOUT_S:g}s")


def test_straggler_training_operator_alone_is_never_noticed(
    kube: Kube, namespace: str, world: Any, tmp_path: Path,
) -> None:
    factor, horizon_s = 1.5, 480.0  # world seconds watched
    sim, _, nodes = world(4, {"step_s": STEP_S, "slow": {"rank": 2, "factor": factor}})
    ckpt = tmp_path / "ckpt"
    name, body = _plain(namespace, nodes, ckpt)
    operator_restarts(body, on_failure=False)
    log = PodLog(kube.core, namespace, name)
    log.start()
    create_pytorchjob(kube, namespace, body)
    ranks_running(kube, namespace, name)
    wait_until("every rank reports", lambda: len(rank_progress.read(open_backend(str(ckpt)))) == 4, timeout=30)
    t0 = time.time()
    time.sleep(compress(horizon_s))
    recs = rank_progress.read(open_backend(str(ckpt)))
    job = kube.custom.get_namespaced_custom_object(pytorchjob.GROUP, pytorchjob.VERSION, namespace,
                                                   pytorchjob.PLURAL, name)
    log.w.stop()
    conds = {c["type"] for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
    assert conds == {"Created", "Running"}, conds  # the operator sees nothing wrong
    assert {ph for _, _, _, ph, _, _ in log.events} <= {"Pending", "Running"}
    times = {r: rec.step_time_s for r, rec in recs.items()}
    assert times[2] == pytest.approx(compress(STEP_S * factor), abs=1e-5)
    assert times[0] == pytest.approx(compress(STEP_S), abs=1e-5)
    watched_s = expand(time.time() - t0)
    wasted = _record_unnoticed_straggler("training_operator", "test_straggler_training_operator_alone_is_never_noticed",
                                         factor, horizon_s, "none: the job runs at the straggler's pace")
    print(f"\nslow rank (x{factor:g}), Training Operator alone: nothing reacted in {watched_s:.0f}s "
          f"(world); conditions {sorted(conds)}; {wasted:.0f} GPU-minutes lost to the slowdown in that time")


def test_rank_hang_twice_on_one_node_cordons_and_replaces_that_node(
    kube: Kube, namespace: str, step_api: client.ApiClient, world: Any, tmp_path: Path,
) -> None:
    # a bad node: whichever rank runs there hangs (sticky), in every incarnation of the job
    sim, prov, _ = world(0, {"step_s": STEP_S, "hang": {"rank": 1, "after_s": HANG_AFTER_S, "times": 3,
                                                        "sticky": True}}, scale=REPAIR_SCALE)
    ckpt = tmp_path / "ckpt"
    spec = _spec(sim, namespace, ckpt).replace(recovery=Recovery(max_preemptions=3))
    run, th = _start(spec, prov, step_api, REPAIR_RUN_S)
    try:
        out = json.loads(th.outcome(180).output_json)
        bad = sim.progress_world.bad_nodes[(namespace, pytorchjob.job_name(run, "train"))]
        # released: the instance group deleted that VM (its slot given up), so its Node goes
        wait_until(f"{bad} released", lambda: bad not in ready_gpu_nodes(kube, sim.state.scenario.cluster)
                   and not [n for n in kube.core.list_node().items if n.metadata.name == bad], timeout=30)
    finally:
        teardown.run(spec, run, "", api=step_api, provider=prov)
    assert out["status"] == "Succeeded", out
    stalls = [{k: e.get(k) for k in ("reason", "first_stopped_nodes", "cordoned")} for e in out["ledger"]["stalls"]]
    assert len(stalls) == 2, stalls
    first, second = out["ledger"]["stalls"]
    assert set(first["first_stopped_nodes"].values()) == {bad} == set(second["first_stopped_nodes"].values())
    assert "cordoned" not in first and second["cordoned"] == [bad], second
    assert second["slot_released"] is True  # the node-pool backend deleted the VM from its group
    (new,) = second["replacement_nodes"]
    assert new != bad and bad not in out["capacity"]["placements"][0]["nodes"] and \
        new in [n for p in out["capacity"]["placements"] for n in p["nodes"]]
    assert out["ledger"]["budget"]["preemptions"] == 2  # two restarts; the third incarnation ran clean
    print(f"\nrank hang twice on {bad}: cordoned and replaced by {new}; the third attempt finished")


def test_straggler_replace_swaps_the_slow_node_at_the_next_checkpoint(
    kube: Kube, namespace: str, step_api: client.ApiClient, world: Any, tmp_path: Path,
) -> None:
    import threading

    factor = 1.5
    sim, prov, _ = world(0, {"step_s": STEP_S, "slow": {"rank": 2, "factor": factor, "sticky": True}})
    ckpt = tmp_path / "ckpt"
    spec = _spec(sim, namespace, ckpt, stragglers="replace", straggler_window_s=120.0)
    stop = threading.Event()

    def checkpointer() -> None:  # the simulated trainer checkpoints every 50 steps (every 100 s, world)
        store, saved = CheckpointStore(str(ckpt)), 0
        while not stop.wait(0.05):
            step = _newest(ckpt) // 50 * 50
            if step > saved:
                store.save(step, {"w": str(step).encode()})
                saved = step

    cp = threading.Thread(target=checkpointer, daemon=True)
    run, th = _start(spec, prov, step_api, STRAGGLER_RUN_S)
    cp.start()
    job = pytorchjob.job_name(run, "train")
    try:
        wait_until("4 ranks running", lambda: running_pods(kube.core, namespace, job, 4), timeout=90)
        running_at = time.time()
        out = json.loads(th.outcome(120).output_json)
        slow = sim.progress_world.slow_nodes[(namespace, pytorchjob.job_name(run, "train"))]
        wait_until(f"{slow} released", lambda: not [n for n in kube.core.list_node().items
                                                     if n.metadata.name == slow], timeout=30)
    finally:
        stop.set()
        cp.join(5)
        teardown.run(spec, run, "", api=step_api, provider=prov)
    assert out["status"] == "Succeeded", out
    (found,) = out["ledger"]["stragglers"]
    assert found["nodes"] == {"2": slow}, found
    (swap,) = out["ledger"]["stalls"]
    assert swap["cause"] == "straggler" and swap["stragglers_swapped"] == [slow] and swap["cordoned"] == [slow]
    (new,) = swap["replacement_nodes"]
    assert new != slow and swap["checkpoint_step"] > 0 and out["attempts"] == 2
    assert out["ledger"]["budget"]["preemptions"] == 1
    running_at = min(running_at, _job_running(out))  # the step's own record (the test's poll may see it late)
    detected_s, swapped_s = expand(found["t"] - running_at), expand(swap["decided_at"] - running_at)
    assert 120.0 <= detected_s <= swapped_s  # not before the window passed; the swap waits for a checkpoint
    wasted = GPUS * (swapped_s * (1 - 1 / factor) + swap["steps_lost"] * STEP_S * factor) / 60.0
    print(f"\nstraggler on {slow} (x{factor:g}), stragglers='replace': found {detected_s:.0f}s (world) after the gang "
          f"started, swapped for {new} at checkpoint step {swap['checkpoint_step']} ({swapped_s:.0f}s; "
          f"{swap['steps_lost']} steps lost); {wasted:.0f} GPU-minutes lost to the slowdown and the restart")
    record("slow_node", "kfp_gpu", test="test_straggler_replace_swaps_the_slow_node_at_the_next_checkpoint",
           detection_s=round(detected_s, 1), action=f"reported, then (stragglers='replace') node swapped at the next "
           f"checkpoint, {swapped_s:.0f}s after the start; whole gang restarted from it", steps_lost=swap["steps_lost"],
           gpu_minutes_wasted=round(wasted, 1),
           note=f"rank 2's node x{factor:g} slower, 4x8 GPUs, window 120s, margin 20%, checkpoint every 50 steps "
                f"(100s); wasted = GPUs x (time to swap x (1 - 1/{factor:g}) + lost steps); default "
                "stragglers='report' only reports (test_straggler_is_reported_while_the_gang_keeps_training)")


def test_straggler_jobset_failure_policy_is_never_triggered(
    kube: Kube, namespace: str, world: Any, tmp_path: Path,
) -> None:
    factor, horizon_s = 1.5, 480.0  # world seconds watched
    sim, _, nodes = world(4, {"step_s": STEP_S, "slow": {"rank": 2, "factor": factor}})
    ckpt = tmp_path / "ckpt"
    name, pt = _plain(namespace, nodes, ckpt, prefix="js")
    kube.custom.create_namespaced_custom_object(*JOBSET[:2], namespace, JOBSET[2], _jobset(
        name, pt["spec"]["pytorchReplicaSpecs"]["Master"]["template"], 4))
    sel = f"jobset.sigs.k8s.io/jobset-name={name}"
    wait_until("4 ranks Running", lambda: len([p for p in kube.core.list_namespaced_pod(
        namespace, label_selector=sel).items if p.status.phase == "Running"]) == 4, timeout=60)
    wait_until("every rank reports", lambda: len(rank_progress.read(open_backend(str(ckpt)))) == 4, timeout=30)
    t0 = time.time()
    time.sleep(compress(horizon_s))
    pods = kube.core.list_namespaced_pod(namespace, label_selector=sel).items
    js = kube.custom.get_namespaced_custom_object(*JOBSET[:2], namespace, JOBSET[2], name)
    assert {p.status.phase for p in pods} == {"Running"} and len(pods) == 4  # nothing failed, nothing restarted
    assert {(p.metadata.labels or {}).get(RESTART_LABEL) for p in pods} == {"0"}
    assert int((js.get("status") or {}).get("restarts") or 0) == 0, js.get("status")
    recs = rank_progress.read(open_backend(str(ckpt)))
    assert recs[2].step_time_s == pytest.approx(compress(STEP_S * factor), abs=1e-5)
    watched_s = expand(time.time() - t0)
    wasted = _record_unnoticed_straggler("jobset", "test_straggler_jobset_failure_policy_is_never_triggered", factor,
                                         horizon_s, "none: no Job fails, so the failure policy never applies")
    print(f"\nslow rank (x{factor:g}), JobSet failurePolicy: nothing reacted in {watched_s:.0f}s (world); "
          f"{wasted:.0f} GPU-minutes lost to the slowdown in that time")
