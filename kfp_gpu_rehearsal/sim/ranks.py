"""Distributed-training semantics of the rehearsal world: what the other ranks of a job do when one rank is lost.

Real DDP/FSDP peers of a lost rank block in the collective they were in, make no progress, and exit non-zero when
the process-group timeout fires (torch ``init_process_group(timeout=...)``: 10 minutes by default for NCCL,
https://pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group). An elastic job (torchrun
``--nnodes MIN:MAX`` with ``--max-restarts``; a PyTorchJob's ``spec.elasticPolicy``) re-rendezvouses instead: "Node
departure (scale-down): the agent is notified of the departure, all existing workers are stopped, a new WorkerGroup
is formed, and all workers are started with a new RANK and WORLD_SIZE"
(https://pytorch.org/docs/stable/elastic/run.html, "Membership Changes"); the rendezvous completes
``last_call_timeout`` (30 s by default) after it has its minimum of nodes
(https://pytorch.org/docs/stable/elastic/rendezvous.html).

:func:`peer_fate` is the pure decision (virtual-time tests: ``tests/sim/test_sim_ranks.py``); :class:`RankWorld`
applies it to KWOK pods when the world kills a rank (:mod:`kfp_gpu_rehearsal.sim.kube`): the peers are annotated, and a hung
peer's failure is played by KWOK's ``kfp-gpu-pod-fail`` stage (``kfp-gpu.io/sim-exit-code`` +
``kfp-gpu.io/sim-duration`` as an absolute RFC 3339 time, kfp_gpu_rehearsal/devcluster/kwok/stages.yaml). The stand-in, not
a new stage, decides who is a peer and when: that needs the job's other pods and its PyTorchJob, which a stage's
selector over one pod cannot see (and stages.yaml records KWOK playing a job it queued from an older copy of an
object). The peers' annotations say when progress stopped (and resumes), which is what a simulated trainer reads.
Not modelled: a ``kfp-gpu.io/sim-duration`` completion KWOK queued before the loss may still play at its time. Durations are real-world seconds, compressed by :data:`kfp_gpu_rehearsal.devcluster.worldtime.TIME_SCALE`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from kfp_gpu_rehearsal.sim.clock import compress

log = logging.getLogger(__name__)

PG_TIMEOUT_ANNOTATION = "kfp-gpu.io/pg-timeout-seconds"  # per job (pod template or PyTorchJob), real-world seconds
RENDEZVOUS_ANNOTATION = "kfp-gpu.io/rendezvous-seconds"  # elastic: re-rendezvous time, real-world seconds
STALLED_ANNOTATION = "kfp-gpu.io/stalled-since"  # RFC 3339: this rank makes no progress from then
RESUMES_ANNOTATION = "kfp-gpu.io/resumes-at"  # RFC 3339: elastic rank trains again from then
RESTARTS_ANNOTATION = "kfp-gpu.io/rendezvous-restarts"  # elastic restarts used so far (this pod)
DEFAULT_PG_TIMEOUT_S = 600.0  # torch's default process-group timeout for NCCL
DEFAULT_RENDEZVOUS_S = 30.0  # c10d rendezvous last_call_timeout
HANG_EXIT_CODE = 1  # torchrun exits 1 when a worker failed (the watchdog took the worker down)
JOB_NAME_LABEL = "training.kubeflow.org/job-name"


@dataclass(frozen=True)
class JobShape:
    """What decides the peers' fate: the job's ranks (pods), its timeout, and its elastic policy."""

    replicas: int
    pg_timeout_s: float = DEFAULT_PG_TIMEOUT_S
    elastic_min: int | None = None  # elasticPolicy.minReplicas; None: not elastic
    max_restarts: int = 0
    restarts_used: int = 0
    rendezvous_s: float = DEFAULT_RENDEZVOUS_S


@dataclass(frozen=True)
class PeerFate:
    """``hang``: no progress from ``stalled_at``, exit ``exit_code`` at ``until``. ``rendezvous``: no progress from
    ``stalled_at``, training again at ``until`` (a new world size)."""

    kind: str
    stalled_at: float
    until: float
    exit_code: int = 0

    def progressing(self, now: float) -> bool:
        """Does a peer train at ``now``? (A hung peer never does again: it exits at ``until``.)"""
        if now < self.stalled_at:
            return True
        return self.kind == "rendezvous" and now >= self.until

    def exited(self, now: float) -> bool:
        return self.kind == "hang" and now >= self.until


def peer_fate(job: JobShape, *, lost: int, lost_at: float) -> PeerFate:
    """What the surviving ranks do after ``lost`` ranks died at ``lost_at``.

    An elastic job with restarts left and at least ``elastic_min`` ranks remaining re-rendezvouses after
    ``rendezvous_s``; any other job hangs in the collective until ``pg_timeout_s``, then exits non-zero.
    """
    left = job.replicas - lost
    if job.elastic_min is not None and job.restarts_used < job.max_restarts and left >= max(1, job.elastic_min):
        return PeerFate("rendezvous", lost_at, lost_at + job.rendezvous_s)
    return PeerFate("hang", lost_at, lost_at + job.pg_timeout_s, HANG_EXIT_CODE)


def rfc3339(t: float) -> str:
    """Unix seconds as RFC 3339 with microseconds (KWOK parses it as an absolute time)."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _owner(pod: Any) -> str:
    refs = pod.metadata.owner_references or []
    return str(refs[0].uid) if refs else ""


def _seconds(value: Any, default: float) -> float:
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        return default


class RankWorld:
    """Applies :func:`peer_fate` to a job's KWOK pods when the world kills one of its ranks."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        # one loss at a time: each reads the peers' annotations and writes their fate, and two losses of one job
        # (two nodes preempted 0.1 s apart, on two notice threads) must not overwrite each other's fate
        self._lock = threading.Lock()

    def lost(self, pods: list[Any]) -> None:
        """``pods`` (V1Pod) were killed together (one node); their jobs' other Running ranks get their fate.
        Pods of no training job are ignored. Raises: nothing for objects already gone (404)."""
        by_job: dict[tuple[str, str, str], list[Any]] = {}
        for p in pods:
            job = (p.metadata.labels or {}).get(JOB_NAME_LABEL)
            if job and p.status.phase == "Running":
                by_job.setdefault((p.metadata.namespace, job, _owner(p)), []).append(p)
        with self._lock:
            for (ns, job, owner), dead in by_job.items():
                self._job_lost(ns, job, owner, dead)

    def _job_lost(self, ns: str, job: str, owner: str, dead: list[Any]) -> None:
        from kubernetes.client import ApiException

        dead_names = {p.metadata.name for p in dead}
        dead_nodes = {p.spec.node_name for p in dead}
        pods = self.core.list_namespaced_pod(ns, label_selector=f"{JOB_NAME_LABEL}={job}").items
        peers = [p for p in pods if p.metadata.name not in dead_names and p.spec.node_name not in dead_nodes
                 and _owner(p) == owner  # the same incarnation of the job (a recreated job reuses its name)
                 and p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
        if not peers:
            return
        shape = self._shape(ns, job, dead[0], len(peers) + len(dead))
        now = time.time()
        for p in peers:
            notes = p.metadata.annotations or {}
            if notes.get(STALLED_ANNOTATION) and not notes.get(RESUMES_ANNOTATION):
                continue  # already hung on an earlier loss
            used = int(_seconds(notes.get(RESTARTS_ANNOTATION), 0.0))
            fate = peer_fate(JobShape(shape.replicas, shape.pg_timeout_s, shape.elastic_min, shape.max_restarts,
                                      used, shape.rendezvous_s), lost=len(dead), lost_at=0.0)
            patch: dict[str, str | None] = {STALLED_ANNOTATION: rfc3339(now)}
            if fate.kind == "rendezvous":
                patch[RESUMES_ANNOTATION] = rfc3339(now + compress(fate.until))
                patch[RESTARTS_ANNOTATION] = str(used + 1)
            else:  # KWOK's kfp-gpu-pod-fail stage fails it at that absolute time
                patch[RESUMES_ANNOTATION] = None  # an earlier loss's rendezvous no longer resumes it
                patch["kfp-gpu.io/sim-exit-code"] = str(fate.exit_code)
                patch["kfp-gpu.io/sim-duration"] = rfc3339(now + compress(fate.until))
            try:
                self.core.patch_namespaced_pod(p.metadata.name, ns, {"metadata": {"annotations": patch}})
            except ApiException as exc:
                if exc.status != 404:
                    raise
            log.info("sim: rank of %s/%s lost; peer %s: %s until %s", ns, job, p.metadata.name, fate.kind,
                     patch.get(RESUMES_ANNOTATION) or patch.get("kfp-gpu.io/sim-duration"))

    def _shape(self, ns: str, job: str, pod: Any, replicas: int) -> JobShape:
        """The job's timeout (pod annotation, else the PyTorchJob's) and elastic policy (the PyTorchJob's)."""
        from kubernetes.client import ApiException

        from kfp_gpu.cluster import pytorchjob

        obj: dict[str, Any] = {}
        try:
            obj = self.custom.get_namespaced_custom_object(pytorchjob.GROUP, pytorchjob.VERSION, ns,
                                                           pytorchjob.PLURAL, job)
        except ApiException as exc:
            if exc.status != 404:
                raise
        notes = {**((obj.get("metadata") or {}).get("annotations") or {}), **(pod.metadata.annotations or {})}
        elastic = (obj.get("spec") or {}).get("elasticPolicy") or None
        lo = None if elastic is None else int(elastic.get("minReplicas") or 1)
        restarts = 0 if elastic is None else int(elastic.get("maxRestarts") or 0)
        return JobShape(replicas, _seconds(notes.get(PG_TIMEOUT_ANNOTATION), DEFAULT_PG_TIMEOUT_S), lo, restarts, 0,
                        _seconds(notes.get(RENDEZVOUS_ANNOTATION), DEFAULT_RENDEZVOUS_S))
