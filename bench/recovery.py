"""Scenario 4 (recovery): one spot node of a 4 x 8-GPU gang preempted mid-run; three sides in one world.

Every side, per repeat, against the same local control plane + KWOK, each with its own GKE stand-in started from
the same scenario (one spot A100 pool, **fixed** boot latency ``BOOT_S`` for every node, the same seed):

* a simulated trainer (:class:`bench.recovery_watch.Trainer`, in this process) advances ``RATE`` steps/s while the
  job trains (bench/recovery_metrics.py: enough ranks Running and not stalled) and commits a checkpoint through
  :class:`kfp_gpu.checkpoint.CheckpointStore` every ``K`` steps;
* when it reaches step ``2K + offset`` (offset varies per repeat, the same on every side) it is frozen and the node
  running ``worker-1`` is preempted with ``SimServer.preempt`` (GKE spot: graceful node shutdown at the notice, the
  pods killed 15 s in, the VM gone at 30 s and recreated by its MIG, docs/sim.md); ``t0`` is that call. The killed
  rank's peers then hang in the collective until the process-group timeout and exit 1, or, in an elastic job,
  re-rendezvous (kfp_gpu_rehearsal/sim/ranks.py);
* after the loss the trainer steps again only when the job trains again, from the newest committed checkpoint
  (every side's trainer script resumes from it: ours is told ``KFP_GPU_RESUME_STEP``, the cross-check is in the
  JSON; a torchrun elastic restart and an operator-restarted pod run the same script).

Sides. ``ours``: the product as a pipeline runs it (bench/ours.py): scale_up and train are
:func:`kfp_gpu.gang.client.request` calls with the tenant's token; the bench's kfp-gpu controller runs and
supervises the job (``kfp_gpu.steps.train.run``) and replaces the node with its node-pool provisioner.
``training_operator``: the same PyTorchJob pods (``pytorchjob.manifest``, not pinned to node names), no kfp-gpu,
replicas ``restartPolicy: OnFailure`` and ``backoffLimit`` 10: the operator recreates the killed pod, the survivors
hang until the timeout, exit 1, and are recreated. ``training_operator_elastic``: the same plus
``spec.elasticPolicy`` (minReplicas N-1, maxReplicas N, maxRestarts 3, rdzvBackend c10d: torchrun
``--nnodes 3:4 --max-restarts 3``): the survivors re-rendezvous and train on at world size N-1 until the
replacement rank runs. Node replacement in both baselines: **no autoscaler call** is made; the preempted VM's MIG
recreates it under its own name (its target size never dropped), the only replacement those worlds have.

Measured by the one pod watch (:class:`bench.recovery_watch.JobPods`, harness clock) for every side: detection =
the side's first reaction after ``t0`` (a new pod of the job, a surviving pod deleted, or a surviving pod
re-rendezvoused); time to training again = ``t0`` -> the trainer's first step after the loss; all ranks training =
``t0`` -> all N ranks train; steps lost = trainer step at ``t0`` - the step it resumed from; idle GPU-minutes =
the GPUs the job holds idle from the loss until they train again (survivors from ``t0`` to training again, the
replacement node from its Ready to all ranks training), in world minutes.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.common import ReadyWatch, Result, delete_nodes, new_api, ratio, uid
from bench.recovery_metrics import best_baseline, idle_gpu_s, lowest_without_overlap, steps_lost
from bench.recovery_watch import POLL_S, JobPods, Trainer
from bench.recovery_world import (
    ACCEL,
    BOOT_REAL_S,
    BOOT_S,
    GPUS,
    OVERLAP_S,
    POOL,
    ZONE,
    N,
    boot_of,
    pool_watch,
    preempt,
    set_size,
    start_sim,
    victims_of,
)
from kfp_gpu import accelerators
from kfp_gpu.cluster import ledger, pytorchjob
from kfp_gpu_rehearsal.devcluster.worldtime import TIME_SCALE
from kfp_gpu_rehearsal.sim.clock import compress, expand
from kfp_gpu_rehearsal.sim.ranks import DEFAULT_PG_TIMEOUT_S, DEFAULT_RENDEZVOUS_S, PG_TIMEOUT_ANNOTATION

K = 10  # checkpoint interval (steps) = JobTemplate.checkpoint_every
PG_TIMEOUT_S = DEFAULT_PG_TIMEOUT_S  # every side's process-group timeout: torch's NCCL default, 600 world s
RESUMED_STEPS = 5  # steps past the resume that show progress resuming
BASELINE = "training_operator"
ELASTIC = "training_operator_elastic"
SIDES = ("ours", BASELINE, ELASTIC)
ELASTIC_POLICY = {"minReplicas": N - 1, "maxReplicas": N, "maxRestarts": 3, "rdzvBackend": "c10d"}


@dataclass(frozen=True)
class Params:
    rate: float = 20.0  # trainer steps/s while the job trains
    sim_duration_s: float = 2.5  # ours: how long KWOK keeps each attempt's pods Running (attempt 2 must finish)
    timeout_s: float = 120.0


FULL_PARAMS = Params()
QUICK_PARAMS = Params(rate=40.0, sim_duration_s=1.5, timeout_s=90.0)


def offset_for(repeat: int) -> int:
    """Where in the checkpoint interval the preemption lands: 3, 7, 1, 5, 9, ... (mean K/2 over 5 repeats)."""
    return (3 + 4 * repeat) % K or 1


@dataclass
class Sample:
    detect_s: float  # t0 -> the side's first reaction (watch)
    train_s: float  # t0 -> training again
    full_s: float  # t0 -> all N ranks training
    progress: int  # trainer step at preemption
    resume_step: int  # step the trainer resumed from
    idle_gpu_s: float  # GPU-seconds (wall) held idle
    boot_s: float  # the replacement node's injected boot (for context; not subtracted)
    extra: dict[str, Any] = field(default_factory=dict)


def _measure(api: client.ApiClient, pods: JobPods, trainer: Trainer, rw: ReadyWatch, t0: float, progress: int,
             victims: list[str], p: Params) -> Sample:
    """The same measurement for every side, once the trainer made progress again with all ranks."""
    trainer.wait_resumed(RESUMED_STEPS, p.timeout_s)
    if pods.reaction_at is None or trainer.t_train is None or trainer.t_full is None or trainer.resume_step is None:
        raise RuntimeError("the watch saw no reaction to the loss, yet the job trains again")
    with rw.cond:
        repl = {n: t for n, t in rw.ready.items() if t > t0}
    idle = idle_gpu_s(t0=t0, gpus_per_node=GPUS, survivors=N - len(victims), t_train=trainer.t_train,
                      t_full=trainer.t_full, replacement_ready=list(repl.values()))
    return Sample(detect_s=pods.reaction_at - t0, train_s=trainer.t_train - t0, full_s=trainer.t_full - t0,
                  progress=progress, resume_step=trainer.resume_step, idle_gpu_s=idle,
                  boot_s=max((boot_of(api, n) for n in repl), default=0.0),
                  extra={"reaction": pods.reaction,
                         "rank_killed_s": None if pods.killed_at is None else round(pods.killed_at - t0, 4),
                         "replacement_ready_s": {n: round(t - t0, 4) for n, t in sorted(repl.items())}})


# ---- ours ----------------------------------------------------------------------------------------

def run_ours(repeat: int, namespace: str, p: Params, k: int = 1, step_kubeconfig: str | Path = "") -> Sample:
    from bench import ours
    from kfp_gpu.job import JobTemplate
    from kfp_gpu.spec import CapacityType, ProvisioningSpec, Recovery, Target, TargetKind

    sim, cluster = start_sim()
    api = new_api()  # admin: the bench's watches and reads
    steps = ours.step_api(step_kubeconfig)  # the tenant step identity: what the pipeline's steps have
    sel = f"kfp-gpu.io/sim-cluster={cluster}"
    tmp = tempfile.TemporaryDirectory(prefix="bench-rec-")
    spec = ProvisioningSpec(ACCEL, N, gpus_per_node=GPUS, capacity=CapacityType.SPOT, target=Target(
        kind=TargetKind.LOCAL, cluster=cluster, region="us-central1", endpoint=sim.url, namespace=namespace,
        pools=(POOL,), provisioner="node-pool"),
        zones=(ZONE,), scale_up_deadline_s=60.0, checkpoint_uri=str(Path(tmp.name) / "ckpt"),
        recovery=Recovery(max_preemptions=2))
    run_id = uid("brec-")
    template = JobTemplate(name="bench", image="busybox", command=("true",), checkpoint_every=K,
                           annotations={pytorchjob.SIM_DURATION_ANNOTATION: f"{p.sim_duration_s:g}s",
                                        PG_TIMEOUT_ANNOTATION: f"{PG_TIMEOUT_S:g}"})
    job = pytorchjob.job_name(run_id, template.name)
    pods = JobPods(api, namespace, job, N).start()
    rw = pool_watch(api, cluster).start()
    trainer: Trainer | None = None
    result: dict[str, Any] = {}

    train_api = ours.step_api(step_kubeconfig)

    def step() -> None:
        try:
            result["res"] = ours.request("train", spec, run_id, train_api, job_json=template.to_json(),
                                         dataset_uri="", queue_timeout_s=p.timeout_s)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the bench thread
            result["err"] = exc

    try:
        ours.request("scale_up", spec, run_id, steps)  # preflight and warm pool (none) run first, in the controller
        th = threading.Thread(target=step, daemon=True, name="bench-train-step")
        th.start()
        trainer = Trainer(pods, spec.checkpoint_uri, p.rate, K, need=N).start()
        progress = trainer.run_to(2 * K + offset_for(repeat), p.timeout_s)
        victims = victims_of(pods, k)
        t0 = time.time()
        pods.arm(t0, victims)
        trainer.lost(t0)
        preempt(sim, victims)
        s = _measure(api, pods, trainer, rw, t0, progress, victims, p)
        th.join(p.timeout_s)
        if th.is_alive():
            raise RuntimeError("train step still running after the resumed attempt")
        if "err" in result:
            raise result["err"]
        out = ours.job_output(api, namespace, run_id, template.name)
        pre = out["ledger"]["preemptions"][0]
        s.extra.update({"ledger_resume_step": int(out["ledger"]["preemptions"][-1]["checkpoint_step"]),
                        "ledger_decided_s": round(float(pre["decided_at"]) - t0, 4), "reason": pre.get("reason"),
                        "attempts": out["attempts"], "status": out["status"],
                        "phases_from_t0_s": _ours_phases(out, pre, t0)})
        return s
    finally:
        if trainer is not None:
            trainer.stop()
        pods.stop()
        rw.stop()
        try:
            ours.request("teardown", spec, run_id, steps)
        except Exception:  # noqa: BLE001 - best-effort; nodes are deleted below anyway
            pass
        sim.stop()
        delete_nodes(api, sel)
        ledger_cleanup(api, namespace, run_id)
        api.close()
        steps.close()
        train_api.close()
        tmp.cleanup()


def _ours_phases(out: dict[str, Any], pre: dict[str, Any], t0: float) -> dict[str, float]:
    """Where ours spends the recovery, seconds after t0, from the step's own timeline."""
    from kfp_gpu.timeline import NodeState, Timeline

    tl = Timeline.from_json(out["timeline"])
    ph: dict[str, float] = {"decided": float(pre["decided_at"]) - t0}
    repl = [tl.nodes[n] for n in pre.get("replacement_nodes", []) if n in tl.nodes]
    for key, state in (("replacement_requested", NodeState.REQUESTED), ("replacement_ready", NodeState.READY)):
        ts = [at for nt in repl if (at := nt.at(state)) is not None]
        if ts:
            ph[key] = max(ts) - t0
    created = [float(e["t"]) for e in tl.events if e["kind"] == "job-created" and e.get("attempt") == 2]
    if created:
        ph["job_recreated"] = created[0] - t0
    # a MIG recreates a preempted VM under its old name, so that name's earlier transitions (before t0) are not
    # the replacement's: only phases after t0 are kept
    return {k: round(v, 4) for k, v in ph.items() if v >= 0}


def ledger_cleanup(api: client.ApiClient, namespace: str, run_id: str) -> None:
    try:
        for cm in ledger.list_for_run(api, namespace, run_id):
            ledger.delete(api, cm)
    except Exception:  # noqa: BLE001 - leftovers are harmless
        pass


# ---- the Training Operator, alone and with an elastic torchrun restart ---------------------------

def baseline_manifest(name: str, nodes: list[str], p: Params, namespace: str, elastic: bool = False) -> dict[str, Any]:
    """Our job's pods (same image, resources, pool selector, tolerations, process-group timeout), but the operator
    restarts them; ``elastic``: with :data:`ELASTIC_POLICY`."""
    from kfp_gpu.job import JobTemplate
    from kfp_gpu.steps.capacity import Capacity, Placement

    cap = Capacity(name, (Placement(POOL, ZONE, tuple(nodes)),), GPUS, accelerators.get(ACCEL).gke_label, spot=True,
                   namespace=namespace)
    # long enough that no rank completes before the measurement ends (the bench deletes the job)
    template = JobTemplate(name="bench", image="busybox", command=("true",), checkpoint_every=K,
                           annotations={pytorchjob.SIM_DURATION_ANNOTATION: f"{max(60.0, p.timeout_s):g}s",
                                        PG_TIMEOUT_ANNOTATION: f"{PG_TIMEOUT_S:g}"})
    body = pytorchjob.manifest(name, capacity=cap, template=template, labels={"kfp-gpu.io/bench": "recovery"},
                               nodes=N, checkpoint_uri="", resume_step=0, run_id=name)
    body["spec"]["runPolicy"]["backoffLimit"] = 10
    for r in body["spec"]["pytorchReplicaSpecs"].values():
        r["restartPolicy"] = "OnFailure"
        r["template"]["spec"]["restartPolicy"] = "OnFailure"
    if elastic:
        body["spec"]["elasticPolicy"] = dict(ELASTIC_POLICY)
    return body


def run_baseline(repeat: int, namespace: str, p: Params, k: int = 1, elastic: bool = False) -> Sample:
    sim, cluster = start_sim()
    api = new_api()
    custom = client.CustomObjectsApi(api)
    sel = f"kfp-gpu.io/sim-cluster={cluster}"
    tmp = tempfile.TemporaryDirectory(prefix="bench-rec-op-")
    name = uid("brec-el-" if elastic else "brec-op-")
    pods = JobPods(api, namespace, name, N).start()
    rw = pool_watch(api, cluster)
    trainer: Trainer | None = None
    try:
        rw.start()
        set_size(sim, cluster, N)  # the gang's nodes (setup, before t0)
        if not rw.wait_ready(N, p.timeout_s):
            raise RuntimeError("baseline gang not Ready")
        with rw.cond:
            nodes = sorted(rw.ready)
        custom.create_namespaced_custom_object(pytorchjob.GROUP, pytorchjob.VERSION, namespace, pytorchjob.PLURAL,
                                               baseline_manifest(name, nodes, p, namespace, elastic))
        need = int(ELASTIC_POLICY["minReplicas"]) if elastic else N  # type: ignore[call-overload]
        trainer = Trainer(pods, str(Path(tmp.name) / "ckpt"), p.rate, K, need=need).start()
        progress = trainer.run_to(2 * K + offset_for(repeat), p.timeout_s)
        victims = victims_of(pods, k)
        t0 = time.time()
        pods.arm(t0, victims)
        trainer.lost(t0)
        preempt(sim, victims)
        return _measure(api, pods, trainer, rw, t0, progress, victims, p)
    finally:
        if trainer is not None:
            trainer.stop()
        pods.stop()
        rw.stop()
        try:
            pytorchjob.delete(api, namespace, name)
            pytorchjob.wait_gone(api, namespace, name, timeout_s=60.0)
        except Exception:  # noqa: BLE001 - best-effort
            pass
        sim.stop()
        delete_nodes(api, sel)
        api.close()
        tmp.cleanup()


# ---- the scenario --------------------------------------------------------------------------------

def run(repeats: int, namespace: str, step_kubeconfig: str | Path, log: Any = print, quick: bool = False,
        k: int = 1) -> dict[str, Result]:
    """``k`` = 1: one preemption; 2: two overlapping ones (the second :data:`OVERLAP_S` after the first, inside its
    notice). Repeats are interleaved across the three sides. Result names get a ``_<k>x`` suffix for k > 1.
    ``step_kubeconfig``: the tenant step identity (bench/ours.py) ours' steps use; the bench's controller serves
    ``namespace``."""
    p = QUICK_PARAMS if quick else FULL_PARAMS
    what = "1 spot preemption" if k == 1 else f"{k} overlapping spot preemptions ({OVERLAP_S:g} s apart)"
    title = (f"Recovery from {what} in a {N}x{GPUS}-GPU gang (fixed {BOOT_REAL_S:g} s real-world boot, "
             f"{BOOT_S:g} s here; process-group timeout {PG_TIMEOUT_S:g} s world, {compress(PG_TIMEOUT_S):g} s here)")
    base = (BASELINE, ELASTIC)
    det = Result("recovery_detect", f"{title}: detection (the side's first reaction the watch sees)", baselines=base)
    res = Result("recovery", f"{title}: preemption -> training again (trainer steps again)", baselines=base)
    full = Result("recovery_full", f"{title}: preemption -> all {N} ranks training", baselines=base)
    lost = Result("recovery_steps_lost", f"{title}: steps lost (checkpoint interval {K} steps)", unit="steps",
                  baselines=base)
    idle = Result("recovery_idle_gpu", f"{title}: GPUs held idle, loss -> training again", unit="GPU-min (world)",
                  baselines=base)
    results = (res, det, full, lost, idle)
    failed: set[str] = set()
    runners: dict[str, Callable[[int, str, Params, int], Sample]] = {
        "ours": lambda rep, ns, p, k: run_ours(rep, ns, p, k, step_kubeconfig=step_kubeconfig),
        BASELINE: run_baseline, ELASTIC: lambda rep, ns, p, k: run_baseline(rep, ns, p, k, elastic=True)}
    for rep in range(repeats):  # interleaved: ours r0, operator r0, elastic r0, ours r1, ...
        for side in SIDES:
            if side in failed:
                continue
            try:
                s = runners[side](rep, namespace, p, k)
                n_lost = steps_lost(s.progress, s.resume_step)
            except Exception as exc:  # noqa: BLE001 - a failed side is reported, never skipped silently
                why = f"FAILED: {type(exc).__name__}: {exc}"[:600]
                for r in results:
                    r.errors[side] = why
                log(f"  recovery{k}x rep={rep}: {side} {why}")
                failed.add(side)
                continue
            det.add(side, s.detect_s)
            res.add(side, s.train_s)
            full.add(side, s.full_s)
            lost.add(side, n_lost)
            idle.add(side, expand(s.idle_gpu_s) / 60.0)
            res.extra.setdefault(f"detail_{side}", []).append(
                {"repeat": rep, "progress_at_preemption": s.progress, "resume_step": s.resume_step,
                 "boot_s": round(s.boot_s, 4), "detect_s": round(s.detect_s, 4), "train_s": round(s.train_s, 4),
                 "full_s": round(s.full_s, 4), **s.extra})
            log(f"  recovery{k}x rep={rep}: {side} reacted {s.detect_s:.2f}s ({s.extra.get('reaction')}), training "
                f"again {s.train_s:.2f}s, all ranks {s.full_s:.2f}s, step {s.progress} -> {s.resume_step}, idle "
                f"{expand(s.idle_gpu_s) / 60.0:.1f} GPU-min (world)")
    _summarize(res, (det, full, lost, idle), repeats)
    for r in results:
        r.notes.append(_NOTE.format(scale=TIME_SCALE, pg=PG_TIMEOUT_S, pg_here=compress(PG_TIMEOUT_S),
                                    rdzv=DEFAULT_RENDEZVOUS_S, poll_ms=POLL_S * 1000, rate=p.rate, k=K,
                                    offsets=[offset_for(r) for r in range(repeats)], policy=ELASTIC_POLICY))
    suffix = "" if k == 1 else f"_{k}x"
    for r in results:
        r.name += suffix
    return {r.name: r for r in results}


def _summarize(res: Result, others: tuple[Result, ...], repeats: int) -> None:
    """The best realistic baseline (lowest median time to training again among the operator sides) and ours'
    ratio against it, per metric; "lowest" only where min-max ranges do not overlap."""
    best = best_baseline({b: res.median(b) for b in res.baselines}, res.baselines)
    for r in (res, *others):
        r.extra["repeats"] = repeats
        r.extra["best_realistic_baseline"] = best
        r.extra["ratio_vs_best_realistic_baseline"] = None if best is None else ratio(r.median("ours"), r.median(best))
        r.extra["lowest_non_overlapping"] = lowest_without_overlap({s: r.sides.get(s, []) for s in SIDES})
    phases = [d["phases_from_t0_s"] for d in res.extra.get("detail_ours", []) if d.get("phases_from_t0_s")]
    if phases:
        res.extra["phases_ours_median_from_t0_s"] = {
            k: round(statistics.median(ph[k] for ph in phases if k in ph), 4) for k in phases[0]}


_NOTE = (
    "World time scale {scale:g} (real-world seconds per second here). Every side: the same stand-in scenario and "
    "seed, the same pod watch and harness clock, process-group timeout {pg:g} s world ({pg_here:g} s here, torch's "
    "NCCL default), c10d re-rendezvous {rdzv:g} s world, trainer {rate:g} steps/s with a checkpoint every {k} steps, "
    "preempted at step 2K + offset (offsets {offsets}), resolution {poll_ms:g} ms. Detection = the side's first "
    "reaction the watch sees after t0 (ours: its job's pods deleted; training_operator: its replacement pod "
    "created; elastic: the survivors re-rendezvous). Training again = the trainer's first step after t0 (ours and "
    "training_operator: all ranks train; elastic {policy}: minReplicas ranks). Every side's trainer resumes from the "
    "newest committed checkpoint. Node replacement: ours' node-pool provisioner; both operator sides make no "
    "autoscaler call, the preempted VM's MIG recreates it (the pool keeps its target size). Not modelled by the "
    "world: the elastic job's second re-rendezvous when the replacement rank joins (scale-up), so its all-ranks "
    "time is a lower bound. Idle GPU-min: survivors' GPUs from t0 to training again plus the replacement node's "
    "from its Ready to all ranks training, in world minutes; the recomputation of lost steps is not in it.")
