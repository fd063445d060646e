"""The train step's view of the cluster: node, pod and job watches feeding one event queue.

The watches are :class:`kfp_gpu.cluster.listwatch.Watcher` loops (list, then watch, re-list on 410; raw JSON;
receive-time stamps) whose events go into one queue. Consumers block on the queue (``queue.get`` with a
deadline), so reacting to a node deletion costs one network hop, never a polling interval.

Each event becomes a fact (:mod:`kfp_gpu.cluster.facts`: raw object dicts as the plain dataclasses of
:mod:`kfp_gpu.plan.recovery`), keeping decision logic free of I/O and of the kubernetes client.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client

from kfp_gpu.cluster import kueue_workload
from kfp_gpu.cluster.facts import JobObserver, node_fact, pod_fact
from kfp_gpu.cluster.listwatch import ERROR, SYNC, Event, Watcher
from kfp_gpu.errors import GangPlacementFailed, TrainingFailed
from kfp_gpu.plan.admission import Admission, QueueState, WorkloadFact, admission
from kfp_gpu.plan.recovery import (
    Cause,
    NodeFact,
    NodeIncident,
    Placement,
    PodFact,
    Verdict,
    classify,
    gang_ready,
    node_shutdown_reason,
    watchdog,
)

__all__ = ["ERROR", "SYNC", "Event", "GangWatch", "Watcher", "custom_watcher", "node_watcher", "pod_watcher"]


def node_watcher(api: client.ApiClient, sink: queue.Queue[Event]) -> Watcher:
    return Watcher("node", client.CoreV1Api(api).list_node, sink.put)


def pod_watcher(api: client.ApiClient, sink: queue.Queue[Event], namespace: str, selector: str) -> Watcher:
    return Watcher("pod", client.CoreV1Api(api).list_namespaced_pod, sink.put, namespace, label_selector=selector)


def custom_watcher(
    api: client.ApiClient, sink: queue.Queue[Event], group: str, version: str, namespace: str, plural: str,
    name: str,
) -> Watcher:
    return Watcher(
        "job", client.CustomObjectsApi(api).list_namespaced_custom_object, sink.put, group, version, namespace,
        plural, field_selector=f"metadata.name={name}",
    )


# ---- one gang, one job: the train step's view of the cluster ---------------------------------------

class GangWatch:
    """Node, pod and job watches of one PyTorchJob feeding a single queue, plus the facts they built.

    ``nodes`` covers every node of the cluster; ``incidents`` the gang nodes that went away (or were
    missing) during the current attempt; ``pods`` the current attempt's pods (by job UID). With a Kueue
    ``local_queue`` (the job's LocalQueue), a fourth watch follows the namespace's Workloads; ``workload`` is the current attempt's, ``suspended`` the job's ``runPolicy.suspend`` and
    ``admitted_at`` when this attempt was first seen admitted (:meth:`admission`).
    """

    def __init__(self, api: client.ApiClient, namespace: str, job: str, group: str, version: str,
                 plural: str, pod_selector: str, clock: Callable[[], float] = time.time, *, local_queue: str = "",
                 observer: JobObserver | None = None) -> None:
        self.api, self.namespace, self.job = api, namespace, job
        self.observer = observer or JobObserver()
        self.q: queue.Queue[Event] = queue.Queue()
        self.clock = clock
        self._watchers = [
            node_watcher(api, self.q),
            pod_watcher(api, self.q, namespace, pod_selector),
            custom_watcher(api, self.q, group, version, namespace, plural, job),
        ]
        self.local_queue = local_queue
        if local_queue:
            self._watchers.append(kueue_workload.watcher(api, self.q, namespace))
        self._workloads: dict[str, WorkloadFact] = {}
        self.workload: WorkloadFact | None = None
        self.suspended = False
        self.suspended_at: float | None = None
        self.admitted_at: float | None = None
        self.nodes: dict[str, NodeFact] = {}
        self.gang: frozenset[str] = frozenset()
        self.incidents: dict[str, NodeIncident] = {}
        self.pods: dict[str, PodFact] = {}
        self._all_pods: dict[str, PodFact] = {}
        self.uid = ""
        self.key = ""  # the attempt's key (observer.job_key): pods with this pod_key are the attempt's
        self.conditions: dict[str, str] = {}
        self.job_deleted = False
        self.created_at = 0.0
        self.first_pod_at: float | None = None
        self.first_bound_at: float | None = None
        self.running_at: float | None = None
        self.decided_at = 0.0
        self.replicas = 0
        self.adopt = False

    def start(self, timeout_s: float = 30.0) -> None:
        for w in self._watchers:
            w.start()
        for w in self._watchers:
            w.synced.wait(timeout_s)
        self.drain()

    def stop(self) -> None:
        for w in self._watchers:
            w.stop()

    # ---- events -> facts ---------------------------------------------------------------------------
    def apply(self, ev: Event) -> None:
        """Fold one event into the facts. Raises: PermissionDenied when a watch was refused (RBAC)."""
        if ev.type == ERROR:
            from kfp_gpu.cluster.apierrors import api_refusal
            from kfp_gpu.errors import PermissionDenied

            exc = ev.obj["error"]
            raise api_refusal(exc) or PermissionDenied(
                f"the Kubernetes API refused the {ev.source} watch: {getattr(exc, 'status', '')} "
                f"{getattr(exc, 'reason', '')}", remediation="grant list and watch on it in kfp_gpu/manifests/controller-rbac.yaml")
        deleted = ev.type == "DELETED"
        if ev.source == "node":
            n = node_fact(ev.obj, ev.at, deleted=deleted)
            self.nodes[n.name] = n
            why = node_shutdown_reason(n)
            prev = self.incidents.get(n.name)
            # a node recreated under the same name (new uid) and lost again is a new incident
            if why and n.name in self.gang and (prev is None or (n.uid and prev.uid and n.uid != prev.uid)):
                self.incidents[n.name] = NodeIncident(n.name, ev.at, why, n.uid)
        elif ev.source == "pod":
            p = pod_fact(ev.obj, ev.at, deleted=deleted, owner=self.observer.pod_key(ev.obj))
            old = self._all_pods.get(p.name)
            if old is not None and deleted and old.owner_uid == p.owner_uid:
                p = dataclasses.replace(old, deleted=True)  # keep what the last update said
            self._all_pods[p.name] = p
            if self.key and p.owner_uid == self.key:
                self._track(p, ev.at)
        elif ev.source == "job":
            uid = str((ev.obj.get("metadata") or {}).get("uid", ""))
            if self.uid and uid != self.uid:
                return
            self.job_deleted = deleted
            self.conditions = self.observer.conditions(ev.obj)
            self._suspend(ev.obj, ev.at)
            if self.running_at is None and "Running" in self.conditions and self.pods:
                self.running_at = ev.at
        elif ev.source == "workload":
            w = kueue_workload.workload_fact(ev.obj, ev.at, deleted=deleted)
            self._workloads[w.name] = w
            if self.uid and w.owner_uid == self.uid:
                self.workload = w

    def _suspend(self, job: Mapping[str, Any], at: float) -> None:
        suspended = self.observer.suspended(job)
        if suspended and not self.suspended:
            self.suspended_at = at
        self.suspended = suspended

    def admission(self, now: float, *, waiting_since: float, timeout_s: float = float("inf")) -> Admission:
        """The attempt's queue state (:func:`kfp_gpu.plan.admission.admission`); notes the first admission."""
        adm = admission(queue=self.local_queue, suspended=self.suspended, workload=self.workload,
                        admitted_at=self.admitted_at, running=self.running_at is not None,
                        waiting_since=waiting_since, now=now, timeout_s=timeout_s, suspended_at=self.suspended_at)
        if adm.state is QueueState.ADMITTED and self.admitted_at is None:
            self.admitted_at = now
        return adm

    def _track(self, p: PodFact, at: float) -> None:
        self.pods[p.name] = p
        self.first_pod_at = self.first_pod_at or at
        if p.node:
            self.first_bound_at = self.first_bound_at or at
            if self.adopt and p.node not in self.gang and not p.deleted:
                self.gang = self.gang | {p.node}
        running = [q for q in self.pods.values() if q.phase == "Running" and not q.deleted]
        if self.running_at is None and self.replicas and len(running) >= self.replicas:
            self.running_at = at

    def drain(self) -> None:
        while True:
            try:
                self.apply(self.q.get_nowait())
            except queue.Empty:
                return

    def wait(self, timeout_s: float) -> bool:
        """Block for the next event (then apply it and any queued behind it). False on timeout."""
        try:
            ev = self.q.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return False
        self.apply(ev)
        self.drain()
        return True

    # ---- phases ------------------------------------------------------------------------------------
    def gate(self, gang: tuple[str, ...], gpus_per_node: int, timeout_s: float) -> float:
        """Wait until every gang node is Ready with ``gpus_per_node`` allocatable GPUs; returns seconds
        waited. Raises: GangPlacementFailed after ``timeout_s``."""
        start = self.clock()
        self.drain()
        while True:
            missing = gang_ready(gang, self.nodes, gpus_per_node)
            if not missing:
                return self.clock() - start
            left = start + timeout_s - self.clock()
            if left <= 0:
                raise GangPlacementFailed(
                    f"gang not Ready after {timeout_s:g}s: {len(missing)}/{len(gang)} nodes missing, NotReady "
                    f"or without {gpus_per_node} allocatable GPUs: {', '.join(missing)}",
                    remediation="check the scale-up output and the nodes (kubectl describe node ...)",
                    nodes=list(missing),
                )
            self.wait(min(left, 5.0))

    def begin(self, job: Mapping[str, Any], gang: tuple[str, ...], replicas: int, *, adopt: bool = False) -> None:
        """Start following a new attempt: the job's UID, the gang's nodes, a fresh incident record. ``adopt``: the
        gang is not known before admission (Kueue provisions it); the nodes the attempt's pods bind to become it."""
        self.uid = str(job["metadata"].get("uid", ""))
        self.key = self.observer.job_key(job)
        self.gang = frozenset(gang)
        self.adopt = adopt
        self.replicas = replicas
        self.pods, self.incidents, self.conditions = {}, {}, self.observer.conditions(job)
        self.job_deleted = False
        self.created_at = self.clock()
        self.first_pod_at = self.first_bound_at = self.running_at = self.admitted_at = self.suspended_at = None
        self.suspended = False
        self._suspend(job, self.created_at)
        self.drain()
        self.workload = next((w for w in self._workloads.values() if w.owner_uid == self.uid), None)
        for p in sorted(self._all_pods.values(), key=lambda p: p.at):  # re-attach: pods seen before
            if p.owner_uid == self.key:
                self._track(p, p.at)
        for name in gang:  # gone before we (re-)attached: no DELETED event will ever come
            n = self.nodes.get(name)
            why = "missing" if n is None else node_shutdown_reason(n)
            if why:
                self.incidents[name] = NodeIncident(name, self.clock(), why)

    def watch_attempt(self, *, admission_s: float, placement_s: float,
                      probe: Callable[[float], Verdict | None] | None = None, probe_every_s: float = 5.0,
                      ) -> str | Verdict:
        """Follow the attempt until it succeeds ("Succeeded") or a final failure verdict. ``probe(now)``, asked at
        least every ``probe_every_s`` once the whole gang runs, may return a verdict of its own (a stall).

        Raises: GangPlacementFailed (watchdog), TrainingFailed (the job was deleted by someone else).
        """
        size = self.replicas
        while True:
            now = self.clock()
            adm = self.admission(now, waiting_since=self.created_at)
            evicted = adm.state is QueueState.EVICTED
            verdict = classify(self.gang, self.incidents, self.pods.values(), now=now,
                               job_failed=self.conditions.get("Failed", ""), queue_evicted=adm.reason if evicted
                               else "", queue_evicted_at=adm.at if evicted else None)
            if verdict.cause is Cause.QUEUE_EVICTION or verdict.final(now):
                self.decided_at = now
                return verdict
            if "Succeeded" in self.conditions and verdict.cause is Cause.NONE:
                return "Succeeded"
            if self.job_deleted:
                raise TrainingFailed(f"job {self.job} was deleted by someone else while running",
                                     remediation="do not delete kfp-gpu jobs by hand; cancel the run instead")
            live = [p for p in self.pods.values() if not p.deleted]
            wd = watchdog(Placement(self.admitted_at or self.created_at, size, self.first_pod_at, self.first_bound_at,
                                    bound=sum(1 for p in live if p.node),
                                    running=sum(1 for p in live if p.phase in ("Running", "Succeeded"))),
                          now=now, admission_s=admission_s, placement_s=placement_s)
            if wd.expired:
                raise GangPlacementFailed(f"job {self.job}: {wd.expired}",
                                          remediation="check node taints, GPU requests and competing pods; "
                                          "the gang must fit on the provisioned nodes", job=self.job)
            if probe is not None and self.running_at is not None and verdict.cause is Cause.NONE:
                found = probe(now)
                if found is not None:
                    self.decided_at = now
                    return found
            deadlines = [d for d in (wd.next_deadline, verdict.settle_until) if d is not None]
            self.wait(min([d - now for d in deadlines] + [5.0 if probe is None else probe_every_s]))

    def lost_nodes(self, verdict: Verdict) -> list[str]:
        """Gang nodes to replace: the verdict's plus any that went away since (multi-node preemption)."""
        self.drain()
        lost = set(verdict.lost_nodes) | set(self.incidents)
        # a gang node cordoned when a preemption is decided is going too: EKS managed node groups answer a Spot
        # interruption notice by cordoning and draining the node, with no taint of their own
        lost |= {n for n in self.gang if n not in self.nodes or node_shutdown_reason(self.nodes[n])
                 or self.nodes[n].unschedulable}
        return sorted(lost)

    def log_tails(self, pods: tuple[str, ...], lines: int = 20) -> dict[str, str]:
        """Last log lines of ``pods``; KWOK pods (and vanished ones) have none, which is said, not raised."""
        out = {}
        core = client.CoreV1Api(self.api)
        for pod in pods:
            try:
                out[pod] = str(core.read_namespaced_pod_log(pod, self.namespace, tail_lines=lines,
                                                             _request_timeout=5))
            except Exception as exc:
                out[pod] = f"(no logs available: {type(exc).__name__}: {str(exc).splitlines()[0][:160]})"
        return out
