"""The Kubernetes side of the stand-in's ComputeClasses: list/watch loops (kfp_gpu.cluster.listwatch) for
ComputeClasses, Pods and the classes' Nodes, and a scan every ``--scan-interval`` that hands the world the pods
waiting for each class. World decisions are :class:`kfp_gpu_rehearsal.sim.computeclass.ComputeClassWorld`'s.

A pod waits for a class when it selects the class (``nodeSelector: cloud.google.com/compute-class``), the scheduler
marked it unschedulable (condition PodScheduled=False, reason Unschedulable: cluster-autoscaler acts on nothing
else) and its priority is not below the expendable cutoff (``--expendable-pods-priority-cutoff``, -10).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kfp_gpu.cluster.listwatch import ERROR, Event, Watcher
from kfp_gpu.rehearsal_seam import LOCAL_CLUSTER_LABEL
from kfp_gpu_rehearsal.sim.clock import compress
from kfp_gpu_rehearsal.sim.computeclass import CLASS_LABEL, SCAN_S, ComputeClassWorld

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "cloud.google.com", "v1", "computeclasses"
EXPENDABLE_CUTOFF = -10
SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"


def waiting(pod: dict[str, Any], cluster: str = "") -> str:
    """The class a pod waits for ("" when it does not: bound, terminating, expendable, not marked unschedulable, or
    selecting another stand-in's nodes: ``kfp-gpu.io/sim-cluster`` naming a cluster other than ``cluster``, when
    several worlds share one control plane)."""
    spec, meta, status = pod.get("spec") or {}, pod.get("metadata") or {}, pod.get("status") or {}
    selector = spec.get("nodeSelector") or {}
    name = str(selector.get(CLASS_LABEL, ""))
    if cluster and selector.get(LOCAL_CLUSTER_LABEL, cluster) != cluster:
        return ""
    if not name or spec.get("nodeName") or meta.get("deletionTimestamp") or status.get("phase") != "Pending":
        return ""
    if int(spec.get("priority") or 0) < EXPENDABLE_CUTOFF:
        return ""
    unschedulable = any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                        and c.get("reason") == "Unschedulable" for c in status.get("conditions") or [])
    return name if unschedulable else ""


CONDITION_TAINT_PREFIX = "node.kubernetes.io/"  # not-ready and the other node-condition taints


def usable(node: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    """Could a waiting pod with ``tolerations`` land on ``node``, as CA's scheduling simulation asks before it
    scales up: not cordoned, and every NoSchedule/NoExecute taint tolerated (key and value, or ``Exists``). A node
    still booting is upcoming capacity: its node-condition taints (``node.kubernetes.io/not-ready``, the one a
    kubelet registers with) are not held against it, as CA sanitizes them from the nodes it simulates on."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return False

    hard = [t for t in spec.get("taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")
            and not str(t.get("key", "")).startswith(CONDITION_TAINT_PREFIX)]
    return all(any(_tolerates(o, t) for o in tolerations) for t in hard)


def _tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """The core/v1 Toleration rule: an empty key with ``Exists`` tolerates every taint; otherwise the keys match, the
    values match (or ``Exists``), and the effect matches (or is empty)."""
    if not toleration.get("key"):
        return toleration.get("operator") == "Exists"
    if toleration.get("key") != taint.get("key") or toleration.get("effect", "") not in ("", taint.get("effect")):
        return False
    return toleration.get("operator") == "Exists" or (toleration.get("value") or "") == (taint.get("value") or "")


class ComputeClassController:
    """Serve the cluster's ComputeClasses from ``world()`` (the stand-in replaces the world on reset)."""

    def __init__(self, world: Callable[[], ComputeClassWorld], api_client: Any, cluster: str = "") -> None:
        from kubernetes import client

        self.world = world
        self.cluster = cluster  # this world's nodes' kfp-gpu.io/sim-cluster: the pods and nodes it serves
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self._lock = threading.Lock()
        self._pods: dict[str, dict[str, Any]] = {}
        self._nodes: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._watchers: list[Watcher] = []
        self._thread = threading.Thread(target=self._run, name="sim-computeclass", daemon=True)

    def start(self) -> ComputeClassController:
        self._watchers = [
            Watcher("cc-class", self.custom.list_cluster_custom_object, self._on_class, GROUP, VERSION,
                    PLURAL).start(),
            Watcher("cc-pod", self.core.list_pod_for_all_namespaces, self._on_pod).start(),
            Watcher("cc-node", self.core.list_node, self._on_node, label_selector=CLASS_LABEL + (
                f",{LOCAL_CLUSTER_LABEL}={self.cluster}" if self.cluster else "")).start(),
        ]
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for w in self._watchers:
            w.stop()

    def _on_class(self, ev: Event) -> None:
        if ev.type == ERROR:
            log.warning("sim computeclass: watch refused: %s", ev.obj.get("error"))
            return
        name = str((ev.obj.get("metadata") or {}).get("name", ""))
        self.world().set_class(name, None if ev.type == "DELETED" else dict(ev.obj.get("spec") or {}))

    def _on_pod(self, ev: Event) -> None:
        uid = str((ev.obj.get("metadata") or {}).get("uid", ""))
        with self._lock:
            if ev.type == "DELETED" or ev.type == ERROR:
                self._pods.pop(uid, None)
            else:
                self._pods[uid] = ev.obj

    def _on_node(self, ev: Event) -> None:
        name = str((ev.obj.get("metadata") or {}).get("name", ""))
        with self._lock:
            if ev.type == "DELETED" or ev.type == ERROR:
                self._nodes.pop(name, None)
            else:
                self._nodes[name] = ev.obj

    def _run(self) -> None:
        while not self._stop.wait(max(0.05, compress(SCAN_S))):
            try:
                self.scan()
            except Exception:  # noqa: BLE001 - one bad pass must not stop the controller
                log.exception("sim computeclass: scan failed")

    def scan(self) -> None:
        world = self.world()
        with self._lock:
            pods, nodes = list(self._pods.values()), dict(self._nodes)
        pending: dict[str, int] = {}
        tolerations: dict[str, list[dict[str, Any]]] = {}
        busy: set[str] = set()
        for p in pods:
            cls = waiting(p, self.cluster)
            if cls:
                pending[cls] = pending.get(cls, 0) + 1
                tolerations.setdefault(cls, []).extend((p.get("spec") or {}).get("tolerations") or [])
            bound = str((p.get("spec") or {}).get("nodeName") or "")
            if bound and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                busy.add(bound)
        protected = {n for n, o in nodes.items()
                     if ((o.get("metadata") or {}).get("annotations") or {}).get(SCALE_DOWN_DISABLED) == "true"}
        for name in list(world.classes):
            tol = tolerations.get(name, [])
            closed = {n for n, o in nodes.items() if not usable(o, tol)}
            world.set_pods(name, pending.get(name, 0), busy, protected, closed)
        world.state.world.dispatch(world.scan())
