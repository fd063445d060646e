"""Scenario 4 (recovery): one spot node of a 4 x 8-GPU gang preempted mid-run, ours vs plain Training Operator.

Both sides, per repeat, against the same local control plane + KWOK, each with its own GKE stand-in started
from the same scenario (one spot A100 pool, **fixed** boot latency ``BOOT_S`` for every node):

* the gang's 4 nodes come from the stand-in; a simulated trainer (:class:`Trainer`, in this process) advances
  ``RATE`` steps/s only while all 4 replicas of the job are Running and commits a checkpoint through
  :class:`kfp_gpu.checkpoint.CheckpointStore` every ``K`` steps;
* when the trainer reaches step ``2K + offset`` (offset varies per repeat, the same on both sides) it is frozen
  and the node running ``worker-1`` is preempted with ``SimServer.preempt`` (as GKE reclaims a spot VM: graceful
  node shutdown at the notice, the pods killed 15 s in, the VM gone at 30 s and recreated by its MIG); ``t0`` is
  the moment of that call. The killed rank's peers then hang in the collective until the process-group timeout
  (600 s, torch's default; kfp_gpu/sim/ranks.py) and exit 1, unless something restarts them first.

``ours``: the product as a pipeline runs it (bench/ours.py): the scale_up and train steps are
:func:`kfp_gpu.gang.client.request` calls with the tenant's ``kfp-gpu`` token; the bench's kfp-gpu controller
provisions the gang and runs and supervises the job in its work unit (``kfp_gpu.steps.train.run``, the node-pool
provisioner's replacement against the stand-in); the train request runs in a thread until the job ends and returns
the train step's own output (ledger, timeline), which the measurement reads as before; teardown is
``request("teardown")``. ``training_operator``: the same PyTorchJob pods
(``pytorchjob.manifest``, not pinned to node names) with ``restartPolicy: OnFailure`` and no kfp-gpu
supervision; the bench plays an instantly-reacting autoscaler: when it sees the operator's replacement pod it
calls setSize(N) on the stand-in (the pool's size is still N: a MIG keeps its target size through a preemption and
recreates the VM itself, so the request adds nothing; the replacement node is that recreated VM, with the same
injected boot latency).

Measured (same pod watch for both sides): detection = first reaction after ``t0`` (ours: the train step's
decision time from its ledger; operator: its replacement pod's ADDED event); time to running again = first time
after ``t0`` that 4 live pods of the job are Running, one of them created after ``t0`` and none of them a hung
peer (annotation ``kfp-gpu.io/stalled-since``: Running but blocked, so not training), minus the replacement
node's injected boot latency (its ``kfp-gpu.io/boot-sample``, counted from the setSize request). Steps lost =
trainer step at ``t0`` - step the job resumes from (ours: the recreated job's ``KFP_GPU_RESUME_STEP``).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from bench.common import (
    ReadyWatch,
    Result,
    delete_nodes,
    kubeconfig,
    new_api,
    sampled_boot_s,
    scenario_dict,
    uid,
)
from bench.world import API_LATENCY_MS
from kfp_gpu import accelerators, iam
from kfp_gpu.cluster import ledger, pytorchjob
from kfp_gpu.sim import scenario as scenario_mod
from kfp_gpu.sim.clock import compress
from kfp_gpu.sim.ranks import RESUMES_ANNOTATION, STALLED_ANNOTATION
from kfp_gpu.sim.server import SimServer

POOL = "bench-a100-spot-a"
ZONE = "us-central1-a"
ACCEL = "a100-80gb"
GPUS = 8
N = 4
BOOT_REAL_S = 210.0  # the bench world's median A100 boot (real-world s), fixed for every node
BOOT_S = round(compress(BOOT_REAL_S), 4)  # 1.75 s here
K = 10  # checkpoint interval (steps) = JobTemplate.checkpoint_every
VICTIM_POD = "worker-1"
BASELINE = "training_operator"


@dataclass(frozen=True)
class Params:
    rate: float = 20.0  # trainer steps/s while the whole gang is Running
    sim_duration_s: float = 2.5  # ours: how long KWOK keeps each attempt's pods Running (attempt 2 must finish)
    timeout_s: float = 120.0


FULL_PARAMS = Params()
QUICK_PARAMS = Params(rate=40.0, sim_duration_s=1.5, timeout_s=90.0)


def offset_for(repeat: int) -> int:
    """Where in the checkpoint interval the preemption lands: 3, 7, 1, 5, 9, ... (mean K/2 over 5 repeats)."""
    return (3 + 4 * repeat) % K or 1


@dataclass
class Sample:
    detect_s: float
    resume_s: float  # preemption -> 4 replicas Running again, minus the replacement's injected boot
    boot_s: float  # the subtracted boot latency
    progress: int  # trainer step at preemption
    resume_step: int  # step the job resumed from (0 = from scratch)
    extra: dict[str, Any] = field(default_factory=dict)


# ---- shared pieces -------------------------------------------------------------------------------

def _start_sim() -> tuple[SimServer, str]:
    cluster = uid("brec")
    data = scenario_dict("burst", cluster=cluster)
    data["regions"]["us-central1"]["quotas"]["PREEMPTIBLE_NVIDIA_A100_80GB_GPUS"] = {"limit": 4096, "usage": 0}
    data["api_latency_ms"] = API_LATENCY_MS  # the bench world's (bench/world.py)
    data["pools"] = [{"name": POOL, "zone": ZONE, "accelerator": ACCEL, "gpus_per_node": GPUS, "spot": True,
                      "max_nodes": 16, "initial_size": 0,
                      "boot": {"dist": "fixed", "median_s": BOOT_REAL_S, "sigma": 0.0, "seed": 0}}]
    sim = SimServer(scenario_mod.from_dict(data), kubeconfig())
    sim.start()
    return sim, cluster


def _set_size(sim: SimServer, cluster: str, size: int) -> None:
    url = (f"{sim.url}/v1/projects/{sim.scenario.project}/locations/{ZONE}/clusters/{cluster}"
           f"/nodePools/{POOL}:setSize")
    req = urllib.request.Request(url, data=json.dumps({"nodeCount": size}).encode(), method="POST",
                                 headers={"Content-Type": "application/json",  # the stand-in enforces IAM
                                          "Authorization": f"Bearer {iam.SIM_GCP_TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


class JobPods:
    """Watches the pods of one job (label ``kfp-gpu.io/job``); records when each pod UID was first seen and
    the first moment after :meth:`arm` that ``n`` live pods are Running, one of them created after arming."""

    def __init__(self, api: client.ApiClient, namespace: str, job: str, n: int) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace, self.selector, self.n = namespace, f"{pytorchjob.JOB_LABEL}={job}", n
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> {name, phase, node, live, seen}
        self.cond = threading.Condition()
        self.t0: float | None = None
        self.first_new_at: float | None = None
        self.first_new_pod: dict[str, Any] = {}
        self.running_again_at: float | None = None
        self.on_new_pod: Any = None
        self._stop = threading.Event()
        self._w = watch.Watch()
        self._t = threading.Thread(target=self._run, daemon=True, name=f"jobpods-{job}")

    def start(self) -> JobPods:
        lst = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
        now = time.time()
        for p in lst.items:
            self._observe(p, now, "ADDED")
        self._rv = lst.metadata.resource_version
        self._t.start()
        return self

    def arm(self, t0: float) -> None:
        with self.cond:
            self.t0 = t0

    def _observe(self, p: client.V1Pod, now: float, kind: str) -> None:
        u = p.metadata.uid
        callback = None
        with self.cond:
            rec = self.pods.get(u)
            if rec is None:
                rec = self.pods[u] = {"name": p.metadata.name, "seen": now}
                if self.t0 is not None and self.first_new_at is None:
                    self.first_new_at = now
                    self.first_new_pod = rec
                    callback = self.on_new_pod
            notes = p.metadata.annotations or {}
            rec.update(phase=p.status.phase if p.status else None, node=p.spec.node_name,
                       live=kind != "DELETED" and p.metadata.deletion_timestamp is None,
                       hung=bool(notes.get(STALLED_ANNOTATION)) and not notes.get(RESUMES_ANNOTATION))
            if self.t0 is not None and self.running_again_at is None:
                running = [r for r in self.pods.values() if r["live"] and r["phase"] == "Running"]
                if (len(running) >= self.n and any(r["seen"] > self.t0 for r in running)
                        and not any(r["hung"] for r in running)):
                    self.running_again_at = now
            self.cond.notify_all()
        if callback is not None:
            callback(rec)

    def _run(self) -> None:
        rv = self._rv
        while not self._stop.is_set():
            try:
                for ev in self._w.stream(self.core.list_namespaced_pod, self.namespace, label_selector=self.selector,
                                         resource_version=rv, timeout_seconds=300):
                    obj = ev["object"]
                    rv = obj.metadata.resource_version
                    self._observe(obj, time.time(), ev["type"])
                    if self._stop.is_set():
                        return
            except Exception:  # noqa: BLE001 - reconnect
                if self._stop.is_set():
                    return
                time.sleep(0.1)

    def live_running(self) -> list[dict[str, Any]]:
        with self.cond:
            return [dict(r) for r in self.pods.values() if r["live"] and r["phase"] == "Running"]

    def wait(self, what: str, pred: Any, timeout_s: float) -> None:
        end = time.time() + timeout_s
        with self.cond:
            while not pred():
                left = end - time.time()
                if left <= 0:
                    raise RuntimeError(f"timed out after {timeout_s:g}s waiting for {what}; pods: "
                                       f"{[(r['name'], r['phase'], r['node'], r['live']) for r in self.pods.values()]}")
                self.cond.wait(min(left, 0.5))

    def stop(self) -> None:
        self._stop.set()
        self._w.stop()


class Trainer:
    """Simulated trainer progress: ``rate`` steps/s while all replicas are Running, a checkpoint every ``k``."""

    def __init__(self, pods: JobPods, ckpt_uri: str, rate: float, k: int = K) -> None:
        from kfp_gpu.checkpoint.store import CheckpointStore

        self.pods, self.store, self.rate, self.k = pods, CheckpointStore(ckpt_uri), rate, k
        self.step = 0
        self.checkpoints: list[int] = []
        self.cond = threading.Condition()
        self._halt = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="bench-trainer")

    def start(self) -> Trainer:
        self._t.start()
        return self

    def _run(self) -> None:
        tick = 1.0 / self.rate
        nxt = time.monotonic()
        while not self._halt.is_set():
            nxt += tick
            time.sleep(max(0.0, nxt - time.monotonic()))
            if self._halt.is_set():
                return
            if len(self.pods.live_running()) < self.pods.n:
                nxt = time.monotonic()
                continue
            with self.cond:
                self.step += 1
                s = self.step
            if s % self.k == 0:
                self.store.save(s, {"model.pt": f"w{s}".encode()}, meta={"loss": round(10.0 / s, 4)})
                with self.cond:
                    self.checkpoints.append(s)
            with self.cond:
                self.cond.notify_all()

    def run_to(self, step: int, timeout_s: float) -> int:
        """Block until the trainer reached ``step``, then freeze it (the node is about to go). Returns the step."""
        end = time.time() + timeout_s
        with self.cond:
            while self.step < step:
                left = end - time.time()
                if left <= 0:
                    raise RuntimeError(f"trainer reached only step {self.step} of {step} in {timeout_s:g}s")
                self.cond.wait(min(left, 0.5))
            self._halt.set()
            return self.step

    def latest_checkpoint(self) -> int:
        c = self.store.latest()
        return int(c.step) if c is not None else 0

    def stop(self) -> None:
        self._halt.set()


OVERLAP_S = 0.1  # between two preemptions: inside the first one's 30 s (0.25 s here) notice, so they overlap


def _victims(pods: JobPods, k: int) -> list[str]:
    """Nodes of worker-1 .. worker-k."""
    out = []
    for i in range(1, k + 1):
        nodes = [str(r["node"]) for r in pods.live_running() if r["name"].endswith(f"worker-{i}")]
        if not nodes:
            raise RuntimeError(f"no running worker-{i} pod")
        out.append(nodes[0])
    return out


def _preempt(sim: SimServer, victims: list[str]) -> None:
    for i, v in enumerate(victims):
        if i:
            time.sleep(OVERLAP_S)
        sim.preempt(v)


def _replacement(pods: JobPods, before: Any, victims: list[str]) -> set[str]:
    """The replacement nodes: new names, or the victims' own names (a MIG recreates a preempted VM under its name,
    docs/sim.md rule 5)."""
    running = {r["node"] for r in pods.live_running()}
    return (running - set(before)) or (set(victims) & running)


def _boot_of(api: client.ApiClient, node: str) -> float:
    b = sampled_boot_s(client.CoreV1Api(api).read_node(node))
    if b is None:
        raise RuntimeError(f"replacement node {node} has no readable boot latency")
    return b


# ---- ours ----------------------------------------------------------------------------------------

def run_ours(repeat: int, namespace: str, p: Params, k: int = 1, step_kubeconfig: str | Path = "") -> Sample:
    from bench import ours
    from kfp_gpu.job import JobTemplate
    from kfp_gpu.spec import CapacityType, ProvisioningSpec, Recovery, Target, TargetKind

    sim, cluster = _start_sim()
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
                           annotations={pytorchjob.SIM_DURATION_ANNOTATION: f"{p.sim_duration_s:g}s"})
    job = pytorchjob.job_name(run_id, template.name)
    pods = JobPods(api, namespace, job, N).start()
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
        cap = ours.capacity_of(api, namespace, run_id)
        th = threading.Thread(target=step, daemon=True, name="bench-train-step")
        th.start()
        trainer = Trainer(pods, spec.checkpoint_uri, p.rate).start()
        progress = trainer.run_to(2 * K + offset_for(repeat), p.timeout_s)
        victims = _victims(pods, k)
        t0 = time.time()
        pods.arm(t0)
        _preempt(sim, victims)
        pods.wait("job running again", lambda: pods.running_again_at is not None, p.timeout_s)
        new_nodes = _replacement(pods, cap.nodes, victims)
        if len(new_nodes) != k:
            raise RuntimeError(f"expected {k} replacement node(s), got {new_nodes}")
        boot = max(_boot_of(api, n) for n in new_nodes)
        th.join(p.timeout_s)
        if th.is_alive():
            raise RuntimeError("train step still running after the resumed attempt")
        if "err" in result:
            raise result["err"]
        out = ours.job_output(api, namespace, run_id, template.name)
        pre = out["ledger"]["preemptions"][0]
        resume_step = int(out["ledger"]["preemptions"][-1]["checkpoint_step"])
        phases = _ours_phases(out, pre, t0)
        assert pods.running_again_at is not None
        return Sample(
            detect_s=float(pre["decided_at"]) - t0, resume_s=pods.running_again_at - t0 - boot, boot_s=boot,
            progress=progress, resume_step=resume_step,
            extra={"detect_from_watch_event_s": pre.get("detect_latency_s"), "reason": pre.get("reason"),
                   "ledger_time_to_resume_s": pre.get("time_to_resume_s"), "ledger_steps_lost": pre.get("steps_lost"),
                   "attempts": out["attempts"], "status": out["status"], "phases_from_t0_s": phases})
    finally:
        if trainer is not None:
            trainer.stop()
        pods.stop()
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
            client.CoreV1Api(api).delete_namespaced_config_map(cm.metadata.name, namespace)
    except Exception:  # noqa: BLE001 - leftovers are harmless
        pass


# ---- plain Training Operator ---------------------------------------------------------------------

def baseline_manifest(name: str, nodes: list[str], p: Params, namespace: str) -> dict[str, Any]:
    """Our job's pods (same image, resources, pool selector, tolerations), but the operator restarts them."""
    from kfp_gpu.job import JobTemplate
    from kfp_gpu.steps.capacity import Capacity, Placement

    cap = Capacity(name, (Placement(POOL, ZONE, tuple(nodes)),), GPUS, accelerators.get(ACCEL).gke_label, spot=True,
                   namespace=namespace)
    # long enough that no survivor completes before the replacement is Running (the bench deletes the job)
    template = JobTemplate(name="bench", image="busybox", command=("true",), checkpoint_every=K,
                           annotations={pytorchjob.SIM_DURATION_ANNOTATION: f"{max(60.0, p.timeout_s):g}s"})
    body = pytorchjob.manifest(name, capacity=cap, template=template, labels={"kfp-gpu.io/bench": "recovery"},
                               nodes=N, checkpoint_uri="", resume_step=0, run_id=name)
    body["spec"]["runPolicy"]["backoffLimit"] = 10
    for r in body["spec"]["pytorchReplicaSpecs"].values():
        r["restartPolicy"] = "OnFailure"
        r["template"]["spec"]["restartPolicy"] = "OnFailure"
    return body


def run_baseline(repeat: int, namespace: str, p: Params, k: int = 1) -> Sample:
    from kfp_gpu.devcluster.nodes import POOL_LABEL

    sim, cluster = _start_sim()
    api = new_api()
    custom = client.CustomObjectsApi(api)
    sel = f"kfp-gpu.io/sim-cluster={cluster}"
    tmp = tempfile.TemporaryDirectory(prefix="bench-rec-op-")
    name = uid("brec-op-")
    pods = JobPods(api, namespace, name, N).start()
    trainer: Trainer | None = None
    scaled: dict[str, float] = {}

    def autoscaler(rec: dict[str, Any]) -> None:  # reacts to the operator's replacement pod, instantly
        scaled["at"] = time.time()
        threading.Thread(target=_set_size, args=(sim, cluster, N), daemon=True).start()

    pods.on_new_pod = autoscaler
    rw = ReadyWatch(api, f"{POOL_LABEL}={POOL},{sel}")
    try:
        rw.start()
        _set_size(sim, cluster, N)
        if not rw.wait_ready(N, p.timeout_s):
            raise RuntimeError("baseline gang not Ready")
        with rw.cond:
            nodes = sorted(rw.ready)
        custom.create_namespaced_custom_object(pytorchjob.GROUP, pytorchjob.VERSION, namespace, pytorchjob.PLURAL,
                                               baseline_manifest(name, nodes, p, namespace))
        trainer = Trainer(pods, str(Path(tmp.name) / "ckpt"), p.rate).start()
        progress = trainer.run_to(2 * K + offset_for(repeat), p.timeout_s)
        latest = trainer.latest_checkpoint()
        victims = _victims(pods, k)
        t0 = time.time()
        pods.arm(t0)
        _preempt(sim, victims)
        pods.wait("operator job running again", lambda: pods.running_again_at is not None, p.timeout_s)
        new_nodes = _replacement(pods, nodes, victims)
        if len(new_nodes) != k:
            raise RuntimeError(f"expected {k} replacement node(s), got {new_nodes}")
        boot = max(_boot_of(api, n) for n in new_nodes)
        assert pods.first_new_at is not None and pods.running_again_at is not None
        return Sample(detect_s=pods.first_new_at - t0, resume_s=pods.running_again_at - t0 - boot, boot_s=boot,
                      progress=progress, resume_step=0,
                      extra={"latest_checkpoint": latest, "replacement_pod": pods.first_new_pod.get("name"),
                             "autoscaler_called_s": round(scaled.get("at", 0.0) - t0, 4)})
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
    notice). Repeats are interleaved across the two sides. Result names get a ``_<k>x`` suffix for k > 1.
    ``step_kubeconfig``: the tenant step identity (bench/ours.py) ours' steps use; the bench's controller serves
    ``namespace``."""
    p = QUICK_PARAMS if quick else FULL_PARAMS
    what = "1 spot preemption" if k == 1 else f"{k} overlapping spot preemptions ({OVERLAP_S:g} s apart)"
    title = (f"Recovery from {what} in a {N}x{GPUS}-GPU gang (fixed {BOOT_REAL_S:g} s real-world boot, "
             f"{BOOT_S:g} s here)")
    det = Result("recovery_detect", f"{title}: detection latency", baselines=(BASELINE,))
    res = Result("recovery", f"{title}: preemption -> all {N} replicas Running again, "
                 "minus the replacement's injected boot latency", baselines=(BASELINE,))
    lost = Result("recovery_steps_lost", f"{title}: steps lost (checkpoint interval {K} steps)", unit="steps",
                  baselines=(f"{BASELINE}_from_scratch", f"{BASELINE}_own_checkpoint"))
    lost.extra["checkpoint_every"] = K
    failed: set[str] = set()
    for rep in range(repeats):  # interleaved: ours r0, operator r0, ours r1, ...
        for side, fn in (("ours", lambda *a: run_ours(*a, step_kubeconfig=step_kubeconfig)),
                         (BASELINE, run_baseline)):
            if side in failed:
                continue
            try:
                s = fn(rep, namespace, p, k)
            except Exception as exc:  # noqa: BLE001 - a failed side is reported, never skipped silently
                why = f"FAILED: {type(exc).__name__}: {exc}"[:600]
                for r in (det, res):
                    r.errors[side] = why
                for key in (("ours",) if side == "ours" else lost.baselines):
                    lost.errors[key] = why
                log(f"  recovery{k}x rep={rep}: {side} {why}")
                failed.add(side)
                continue
            det.add(side, s.detect_s)
            res.add(side, s.resume_s)
            res.add(f"{side}_incl_boot", s.resume_s + s.boot_s)
            if side == "ours":
                lost.add("ours", s.progress - s.resume_step)
            else:
                lost.add(f"{BASELINE}_from_scratch", s.progress)
                lost.add(f"{BASELINE}_own_checkpoint", s.progress - int(s.extra["latest_checkpoint"]))
            res.extra.setdefault(f"detail_{side}", []).append(
                {"repeat": rep, "progress_at_preemption": s.progress, "resume_step": s.resume_step,
                 "boot_s": round(s.boot_s, 4), "detect_s": round(s.detect_s, 4), **s.extra})
            log(f"  recovery rep={rep}: {side} detect {s.detect_s * 1000:.0f} ms, running again "
                f"{s.resume_s:.2f}s + {s.boot_s:.2f}s boot, step {s.progress} -> resumes {s.resume_step}")
    phases = [d["phases_from_t0_s"] for d in res.extra.get("detail_ours", []) if d.get("phases_from_t0_s")]
    if phases:
        res.extra["phases_ours_median_from_t0_s"] = {
            k: round(statistics.median(ph[k] for ph in phases if k in ph), 4) for k in phases[0]}
    det.notes.append(
        "t0 = the stand-in's preempt call (GKE graceful node shutdown: notice, pods killed 15 s in, VM gone at "
        "30 s). ours: the train step's recovery decision "
        "(ledger decided_at); training_operator: the operator's replacement pod first seen by the bench's watch.")
    res.notes.append(
        "Same pod watch for both sides: first time 4 live pods of the job are Running, one created after t0, "
        f"minus the replacement node's injected boot ({BOOT_S:g} s, from its setSize request). ours recreates the "
        "whole job from the newest checkpoint (pods on the 3 survivors restart too); the operator only recreates "
        "the killed pod, and the survivors hang in the collective (Running, kfp-gpu.io/stalled-since) until the "
        "process-group timeout (600 s world), exit 1 and are restarted: a hung pod does not count as running. "
        "The baseline's autoscaler is the bench itself calling setSize(N) the moment the replacement pod appears "
        "(a no-op on a MIG that recreates the VM itself; a real cluster-autoscaler adds its scan interval and GPU "
        "batching buffer): it favours the baseline.")
    lost.notes.append(
        f"Simulated trainer: {p.rate:g} steps/s while all replicas Run, checkpoint every {K} steps; preempted at "
        f"step 2K + offset (offsets {[offset_for(r) for r in range(repeats)]}). ours = step at preemption - the "
        "recreated job's KFP_GPU_RESUME_STEP (measured). training_operator_from_scratch: a trainer with no resume "
        "logic (the operator passes no resume step) restarts at 0 (modelled). training_operator_own_checkpoint: a "
        "trainer that finds its own latest checkpoint (modelled from the same store).")
    suffix = "" if k == 1 else f"_{k}x"
    for r in (res, det, lost):
        r.name += suffix
    return {r.name: r for r in (res, det, lost)}
