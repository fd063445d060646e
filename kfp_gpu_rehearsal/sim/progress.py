"""The rehearsal trainer: KWOK pods of a training job that report progress through the same API real trainers use.

A KWOK pod runs no code, so the world trains for it: every opted-in Running rank (annotation
:data:`STEP_ANNOTATION`, world seconds per step) of a PyTorchJob writes its step to ``_progress/`` beside the
checkpoints named by its ``KFP_GPU_CHECKPOINT_URI`` (ranks of a PyTorchJob, and of a JobSet: a TrainJob's too), with :meth:`kfp_gpu.checkpoint.progress.Progress.report` (the
trainers' own writer, throttled as theirs is, trailing write included; each step offered once, as a trainer's loop does), in world time (:data:`kfp_gpu_rehearsal.devcluster.worldtime.TIME_SCALE`: one clock).
The step count starts at the pod's ``KFP_GPU_RESUME_STEP``.

Synchronous data-parallel training (DDP, FSDP): every step ends in a collective, so the gang advances at its slowest
rank's pace; each rank reports its own compute time per step (what a trainer measures outside the collective), so a
slow rank (scenario ``training.slow``) shows as a straggler while the whole gang slows down.

The ranks of a job step in lockstep from the moment its last rank is up (the rendezvous: no rank steps while one of
the incarnation's pods is not Running yet), and, as a trainer does, report a step once it is done. A hang (scenario
``training.hang``, counted from that moment): the rank stops making progress while its process lives (its pod stays
Running); its peers finish the step they are in and block in the next collective, one step later. Nothing fails
until the process-group timeout (the pod's ``kfp-gpu.io/pg-timeout-seconds``, default torch's 10 minutes for NCCL,
https://pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group), when every rank exits 1
(KWOK's ``kfp-gpu-pod-fail`` stage, as :mod:`kfp_gpu_rehearsal.sim.ranks` plays a lost rank's peers). A peer stalled by a lost
rank (``kfp-gpu.io/stalled-since``) stops reporting from then, and resumes at ``kfp-gpu.io/resumes-at``.

:func:`step_at` is the pure rule (tests/sim/test_sim_progress.py); :class:`ProgressWorld` applies it.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any

from kfp_gpu.checkpoint.backends import Backend, open_backend
from kfp_gpu.checkpoint.progress import DEFAULT_INTERVAL_S, Progress
from kfp_gpu.checkpoint.store import CheckpointStore
from kfp_gpu_rehearsal.sim.clock import compress
from kfp_gpu_rehearsal.sim.dws import SIM_CLUSTER_LABEL
from kfp_gpu_rehearsal.sim.ranks import (
    DEFAULT_PG_TIMEOUT_S,
    HANG_EXIT_CODE,
    JOB_NAME_LABEL,
    PG_TIMEOUT_ANNOTATION,
    RESUMES_ANNOTATION,
    STALLED_ANNOTATION,
    rfc3339,
)
from kfp_gpu_rehearsal.sim.trainingspec import TrainingSpec

log = logging.getLogger(__name__)

STEP_ANNOTATION = "kfp-gpu.io/sim-step-seconds"  # opt-in: world seconds per step of this rank
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
JOBSET_RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def rank_of(labels: dict[str, str]) -> int | None:
    """A training pod's rank. PyTorchJob: the Master is 0, worker i is i + 1. JobSet (and so a Trainer v2 TrainJob):
    the Job's global index plus the pod's completion index (one pod per Job, or one indexed Job of N pods, as
    Trainer v2's ``node`` job is). None for other pods."""
    if JOBSET_LABEL in labels:
        try:
            return int(labels.get(JOBSET_GLOBAL_INDEX, "0")) + int(labels.get(COMPLETION_INDEX, "0"))
        except ValueError:
            return None
    kind = (labels.get(REPLICA_TYPE_LABEL) or "").lower()
    try:
        index = int(labels.get(REPLICA_INDEX_LABEL, ""))
    except ValueError:
        return None
    if kind == "master":
        return 0
    if kind == "worker":
        return index + 1
    return None


def incarnation(pod: Any) -> tuple[str, str, str] | None:
    """(namespace, job, incarnation) of a training pod: a PyTorchJob's pods by their owner (a recreated job is a new
    incarnation); a JobSet's by its restart attempt (a failure-policy restart recreates every Job)."""
    labels = pod.metadata.labels or {}
    if JOBSET_LABEL in labels:
        return pod.metadata.namespace, labels[JOBSET_LABEL], labels.get(JOBSET_RESTART_LABEL, "0")
    if JOB_NAME_LABEL in labels:
        owner = (pod.metadata.owner_references or [None])[0]
        return pod.metadata.namespace, labels[JOB_NAME_LABEL], owner.uid if owner else ""
    return None


def ours(pods: list[Any], nodes: set[str]) -> list[Any]:
    """The pods of this world's jobs: those on ``nodes``, and those not bound to any node yet. An unbound rank is still
    a member of its incarnation: its peers wait for it at the rendezvous (``init_process_group`` blocks until every
    rank joins), so they must not start stepping without it (they did, when a loaded scheduler bound two of four
    ranks late: the two never reported, and a stall detector rightly called them stopped). Another world's unbound
    pods only count for their own incarnation, which has no Running rank here."""
    return [p for p in pods if not p.spec.node_name or p.spec.node_name in nodes]


def step_at(now: float, *, started: float, resume: int, step_s: float, stopped_at: float | None = None,
            resumes_at: float | None = None) -> int:
    """The step a rank has reached at ``now`` (stand-in seconds): ``resume`` plus the whole steps of ``step_s``
    since ``started``, not counting the pause from ``stopped_at`` (to ``resumes_at``, or for good)."""
    end = now if stopped_at is None else min(now, stopped_at)
    ran = max(0.0, end - started)
    if stopped_at is not None and resumes_at is not None and now > resumes_at:
        ran += now - max(resumes_at, stopped_at)
    # a step done exactly at a boundary counts: compressed times (2 s / 120) are not exact in binary, and a peer that
    # stops one step after a hung rank must be one step ahead of it, not tied by a rounding error
    return resume + int(ran / step_s + 1e-6) if step_s > 0 else resume


def _time(value: Any) -> float | None:
    """An RFC 3339 annotation (as :func:`kfp_gpu_rehearsal.sim.ranks.rfc3339` writes it) as Unix seconds; None if unset/bad."""
    if not value:
        return None
    try:
        return datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def _env(pod: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for c in pod.spec.containers[:1]:
        for e in c.env or []:
            if e.value is not None:
                out[e.name] = e.value
    return out


class ProgressWorld:
    """Writes the progress of the world's opted-in training ranks; plays ``training.hang`` and ``training.slow``."""

    def __init__(self, api_client: Any, spec: TrainingSpec, *, cluster: str = "", interval_s: float = 0.05) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.spec, self.interval_s, self.cluster = spec, interval_s, cluster
        self.first_seen: dict[str, float] = {}  # pod uid -> when it was first seen Running
        self.reporters: dict[str, Progress] = {}
        self.reported: dict[str, int] = {}  # pod uid -> the newest step its rank offered to its reporter
        self.saved: dict[tuple[str, str, str], int] = {}  # incarnation -> the newest checkpoint step it saved
        self.hung: dict[tuple[str, str], set[str]] = {}  # (namespace, job) -> incarnations (owner uids) hung
        self.stopped: dict[str, float] = {}  # pod uid -> when it stopped (hangs this world played)
        self.bad_nodes: dict[tuple[str, str], str] = {}  # (namespace, job) -> the node a sticky hang follows
        self.slow_nodes: dict[tuple[str, str], str] = {}  # (namespace, job) -> the node a sticky slowdown follows
        self.backends: dict[str, Backend] = {}
        self.pods: list[Any] = []  # the newest listing (refresh)
        self.list_interval_s = max(interval_s, 0.25)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Two threads: one lists the world's training pods (API calls, slow under load), one writes progress from
        the newest listing (steps follow from time), so a slow listing never pauses the ranks' progress."""
        for name, fn, every in (("sim-progress-list", self.refresh, self.list_interval_s),
                                ("sim-progress", self.write, self.interval_s)):
            t = threading.Thread(target=self._loop, args=(fn, every), name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)

    def _loop(self, fn: Any, every: float) -> None:
        while not self._stop.wait(every):
            try:
                fn(time.time())
            except Exception as exc:  # noqa: BLE001 - the world keeps turning; the next tick retries
                log.warning("sim progress: %s failed: %s", getattr(fn, "__name__", fn), exc)

    def tick(self, now: float) -> None:
        """List, then write (both halves at once)."""
        self.refresh(now)
        self.write(now)

    def refresh(self, now: float) -> None:
        """List the training pods on this world's nodes; a pod first seen Running is stamped ``now``."""
        pods = list({p.metadata.uid: p for sel in (JOB_NAME_LABEL, JOBSET_LABEL)
                     for p in self.core.list_pod_for_all_namespaces(label_selector=sel).items}.values())
        if self.cluster:  # this world's ranks only: pods on its own nodes (another world may share the cluster)
            mine = {n.metadata.name for n in self.core.list_node(label_selector=f"{SIM_CLUSTER_LABEL}={self.cluster}").items}
            pods = ours(pods, mine)
        with self._lock:
            for p in pods:
                if p.status.phase == "Running":
                    self.first_seen.setdefault(p.metadata.uid, now)
            self.pods = pods

    def write(self, now: float) -> None:
        """Write every opted-in Running rank's progress at ``now`` from the newest listing."""
        with self._lock:
            pods = list(self.pods)
        jobs: dict[tuple[str, str, str], list[Any]] = {}
        members: dict[tuple[str, str, str], int] = {}  # the incarnation's live pods, Running or not
        for p in pods:
            k = incarnation(p)
            if k is not None and not p.metadata.deletion_timestamp and p.status.phase not in ("Succeeded", "Failed"):
                members[k] = members.get(k, 0) + 1
        for p in pods:
            notes = p.metadata.annotations or {}
            key = incarnation(p)
            if (key is None or STEP_ANNOTATION not in notes or p.status.phase != "Running"
                    or p.metadata.deletion_timestamp or rank_of(p.metadata.labels or {}) is None
                    or p.metadata.uid not in self.first_seen):
                continue
            jobs.setdefault(key, []).append(p)
        for key, ranks in jobs.items():
            if len(ranks) >= members.get(key, 0):  # the rendezvous needs every rank: no step before they all run
                self._job(key, ranks, now)

    def _factor(self, key: tuple[str, str], rank: int | None, pod: Any) -> float:
        slow = self.spec.slow
        if slow is None:
            return 1.0
        if slow.sticky:  # a slow node: whichever rank runs there
            return slow.factor if pod.spec.node_name == self.slow_nodes.get(key) else 1.0
        return slow.factor if slow.rank == rank else 1.0

    def _job(self, key: tuple[str, str, str], pods: list[Any], now: float) -> None:
        ns, job, owner = key
        by_rank = {rank_of(p.metadata.labels or {}): p for p in pods}
        world_step = float((pods[0].metadata.annotations or {})[STEP_ANNOTATION] or self.spec.step_s)
        slow = self.spec.slow
        if slow is not None and slow.sticky and (ns, job) not in self.slow_nodes and slow.rank in by_rank:
            self.slow_nodes[(ns, job)] = by_rank[slow.rank].spec.node_name
        gang_step = compress(world_step * max(self._factor((ns, job), r, p) for r, p in by_rank.items()))
        # lockstep: the first step starts once the last rank is up (the rendezvous), and every rank counts from there
        started = max(self.first_seen[p.metadata.uid] for p in pods)
        hang = self.spec.hang
        victim = None
        if hang is not None and owner not in self.hung.get((ns, job), set()) \
                and len(self.hung.get((ns, job), set())) < hang.times:
            bad = self.bad_nodes.get((ns, job))
            victim = (next((p for p in pods if p.spec.node_name == bad), None) if bad is not None
                      else by_rank.get(hang.rank))
        if victim is not None and hang is not None and now - started >= compress(hang.after_s):
            if hang.sticky:
                self.bad_nodes[(ns, job)] = victim.spec.node_name
            # at its time on the world's timeline, not at this (possibly late) tick: nothing was written past it
            self._hang(ns, job, owner, victim, pods, started + compress(hang.after_s), gang_step)
        ranks: list[tuple[int, Any, str, int, int]] = []  # (rank, pod, checkpoint uri, resume step, step reached)
        for rank, p in by_rank.items():
            notes = p.metadata.annotations or {}
            env = _env(p)
            uri = env.get("KFP_GPU_CHECKPOINT_URI", "")
            if rank is None or not uri:
                continue
            stopped = self.stopped.get(p.metadata.uid) or _time(notes.get(STALLED_ANNOTATION))
            resumes = _time(notes.get(RESUMES_ANNOTATION))
            try:
                resume = int(env.get("KFP_GPU_RESUME_STEP") or 0)
            except ValueError:
                resume = 0
            ranks.append((rank, p, uri, resume, step_at(now, started=started, resume=resume, step_s=gang_step,
                                                        stopped_at=stopped, resumes_at=resumes)))
        if ranks and self.spec.checkpoint_every:
            self._checkpoint(key, min(ranks, key=lambda r: r[0])[2], min(r[3] for r in ranks), min(r[4] for r in ranks))
        for rank, p, uri, resume, step in ranks:
            if step <= resume or self.reported.get(p.metadata.uid, resume) >= step:
                continue  # a trainer reports a step once, when it is done: nothing before the first one
            rep = self.reporters.get(p.metadata.uid)
            if rep is None:
                rep = Progress(self._backend(uri), rank, min_interval_s=compress(DEFAULT_INTERVAL_S),
                               node=p.spec.node_name or "", pod=p.metadata.name)
                self.reporters[p.metadata.uid] = rep
            # offered once, as a trainer's step(n) is: a step the throttle holds back reaches the store only by the
            # reporter's own trailing write (the world used to offer it again on every tick until it was written)
            self.reported[p.metadata.uid] = step
            rep.report(step, compress(world_step * self._factor((ns, job), rank, p)), now=now)

    def _annotate(self, ns: str, patches: list[tuple[str, dict[str, str]]]) -> None:
        from kubernetes.client import ApiException

        for name, notes in patches:
            try:
                self.core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": notes}})
            except ApiException as exc:
                if exc.status != 404:
                    log.warning("sim: hung pod %s/%s not annotated: %s", ns, name, exc)

    def _backend(self, uri: str) -> Backend:
        backend = self.backends.get(uri) or open_backend(uri)
        self.backends[uri] = backend
        return backend

    def _checkpoint(self, key: tuple[str, str, str], uri: str, resume: int, gang_step: int) -> None:
        """``training.checkpoint_every``: the gang saves a checkpoint (through the checkpoint library, as a trainer
        does) when every rank has done a multiple of that many steps; saved before any rank reports a step past
        it, in the same tick, so no reader sees progress beyond a checkpoint that is not there yet."""
        every = self.spec.checkpoint_every
        step = gang_step // every * every
        if step <= max(resume, self.saved.get(key, 0)):
            return
        CheckpointStore(uri, backend=self._backend(uri)).save(step, {"w": str(step).encode()},
                                                                {"writer": "kfp_gpu_rehearsal.sim.progress"})
        self.saved[key] = step

    def _hang(self, ns: str, job: str, owner: str, victim: Any, pods: list[Any], now: float, gang_step: float) -> None:
        """The hang, in memory at once (the ranks stop reporting from ``now``); the pods' annotations (their exit at
        the process-group timeout, played by KWOK) are written by a thread of their own. Written inline, four
        PATCHes on a loaded API server paused every rank's progress with the hung one (a 1.5 s slower PATCH made
        all four ranks look stopped at once: first_stopped [0, 1, 2, 3])."""
        self.hung.setdefault((ns, job), set()).add(owner)
        patches: list[tuple[str, dict[str, str]]] = []
        for p in pods:
            notes = p.metadata.annotations or {}
            timeout = compress(float(notes.get(PG_TIMEOUT_ANNOTATION) or DEFAULT_PG_TIMEOUT_S))
            stop = now if p is victim else now + gang_step  # the peers block in the next collective
            self.stopped[p.metadata.uid] = stop
            patches.append((p.metadata.name, {STALLED_ANNOTATION: rfc3339(stop),
                                              "kfp-gpu.io/sim-exit-code": str(HANG_EXIT_CODE),
                                              "kfp-gpu.io/sim-duration": rfc3339(now + timeout)}))
        t = threading.Thread(target=self._annotate, args=(ns, patches), name="sim-progress-hang", daemon=True)
        t.start()
        self._threads.append(t)
        log.info("sim: rank of %s/%s (%s) hangs; the gang exits at its process-group timeout", ns, job,
                 victim.metadata.name)
