"""GPU faults of the rehearsal world: nodes born with a bad GPU, and Xid errors that appear on a running node.

What a bad GPU does in the real world, and so here (docs/sim.md, "GPU health"):

* **The node still registers and reports its GPUs.** A GPU whose memory or links are failing still enumerates;
  the device plugin only withdraws a device after a fatal Xid it watches for. So scale-up and the readiness gate see
  a normal node.
* **Any GPU pod on it dies after launch**: the trainer's first kernels hit the fault (a CUDA error, exit 1)
  ``crash_after_s`` (real seconds) after the pod was bound. The Training Operator recreates the pod, on the same
  pinned node, where it dies again.
* **A health probe fails**: ``dcgmi diag -r 1`` fails on it (exit :data:`kfp_gpu.plan.health.EXIT_DCGM_DIAG`);
  ``missing`` (a GPU fallen off the bus, Xid 79) fails the ``nvidia-smi`` count instead. The probe takes its
  run level's duration (:data:`DIAG_S`, DCGM's documented levels) on every node, healthy or not.
* **A node condition**, when a detector runs (``condition: true``): the cloud's GPU condition (GKE/AKS
  node-problem-detector style ``GPUXIDErrors=True``; EKS node monitoring agent ``AcceleratedHardwareReady=False``).

The stand-in plays this on the KWOK pods of the nodes it knows (:meth:`GpuHealthWorld.adopt`): a watch of probe pods
(label-selected; the one loop, :class:`kfp_gpu.cluster.listwatch.Watcher`), and once a node is bad a watch of every
pod, annotate a probe pod with
``kfp-gpu.io/sim-duration`` + ``kfp-gpu.io/sim-exit-code`` (played by KWOK's existing ``kfp-gpu-pod-succeed`` /
``kfp-gpu-pod-fail`` stages) and a training pod on a bad node with its crash (exit code and an absolute
``kfp-gpu.io/sim-duration``, as :mod:`kfp_gpu_rehearsal.sim.ranks` does). No stage changes. Durations are real-world seconds,
compressed by :data:`kfp_gpu_rehearsal.devcluster.worldtime.TIME_SCALE`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from kfp_gpu.ownership import PROBE_LABEL
from kfp_gpu.plan.health import EXIT_DCGM_DIAG, EXIT_DEVICE_COUNT
from kfp_gpu_rehearsal.sim.clock import compress
from kfp_gpu_rehearsal.sim.ranks import rfc3339

log = logging.getLogger(__name__)

FAULT_ANNOTATION = "kfp-gpu.io/sim-gpu-fault"  # the world's record on the Node: what is wrong with its GPUs
EXIT_ANNOTATION = "kfp-gpu.io/sim-exit-code"
DURATION_ANNOTATION = "kfp-gpu.io/sim-duration"
CUDA_ERROR_EXIT = 1  # a Python trainer dies of an uncaught CUDA error (RuntimeError) with exit 1
# dcgmi diag run levels: 1 quick ("seconds"), 2 medium (~2 minutes), 3 long (~15+ minutes), 4 extended
# (docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html, "Run Levels")
DIAG_S: dict[int, float] = {1: 30.0, 2: 120.0, 3: 900.0, 4: 3600.0}
FAULT_KINDS = ("dcgm", "missing", "xid")
CONDITIONS = {"gke": ("GPUXIDErrors", "True"), "aws": ("AcceleratedHardwareReady", "False")}


@dataclass(frozen=True)
class GpuFault:
    kind: str = "dcgm"  # "dcgm": fails dcgmi diag; "missing": a GPU fell off the bus (nvidia-smi count); "xid": an
    # Xid error on a running node (e.g. Xid 94/95 contained/uncontained ECC): the job runs on until crash_after_s
    crash_after_s: float = 120.0  # a GPU pod on the node dies this long after it is bound (real seconds)
    condition: bool = False  # a detector publishes the node condition too

    @property
    def probe_exit(self) -> int:
        return EXIT_DEVICE_COUNT if self.kind == "missing" else EXIT_DCGM_DIAG


def _now() -> str:
    return rfc3339(time.time())


class GpuHealthWorld:
    """Plays GPU faults on the KWOK nodes it knows; answers health probes on them."""

    def __init__(self, api_client: Any, cloud: str = "gke") -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.cloud = cloud
        self.owned: set[str] = set()
        self.bad: dict[str, GpuFault] = {}
        self.answered: set[str] = set()  # pod uids already given their fate
        self._lock = threading.Lock()
        self._watchers: dict[str, Any] = {}

    def adopt(self, *nodes: str) -> None:
        """Answer probes on ``nodes`` (the stand-in's own nodes; a test's KWOK nodes)."""
        with self._lock:
            self.owned.update(nodes)
        self._ensure_watch("probes")

    def break_node(self, name: str, fault: GpuFault) -> None:
        """``name``'s GPU goes bad now: its GPU pods crash, its probes fail, and with ``fault.condition`` the node
        gets the cloud's GPU condition. Raises: ApiException other than 404."""
        from kubernetes.client import ApiException

        with self._lock:
            self.owned.add(name)
            self.bad[name] = fault
        note = f"{fault.kind};crash_after_s={fault.crash_after_s:g}"
        try:
            self.core.patch_node(name, {"metadata": {"annotations": {FAULT_ANNOTATION: note}}})
            if fault.condition:
                ctype, status = CONDITIONS.get(self.cloud, CONDITIONS["gke"])
                self.core.patch_node_status(name, {"status": {"conditions": [
                    {"type": ctype, "status": status, "reason": "GpuXidError" if ctype == "GPUXIDErrors"
                     else "NvidiaXID79Error", "message": f"kfp-gpu sim: GPU fault {fault.kind}",
                     "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}]}})
        except ApiException as exc:
            if exc.status != 404:
                raise
        self._ensure_watch("probes")
        self._ensure_watch("pods")
        for pod in self._pods_on(name):  # pods already running there meet the fault now
            self._fate(pod)

    def stop(self) -> None:
        for w in self._watchers.values():
            w.stop()

    # ---- the pod watches ----------------------------------------------------------------------------------
    def _ensure_watch(self, which: str) -> None:
        """``probes``: probe pods only (every world answers probes); ``pods``: every pod (once a node is bad)."""
        from kfp_gpu.cluster.listwatch import Watcher

        with self._lock:
            if which in self._watchers:
                return
            selector = PROBE_LABEL if which == "probes" else None
            self._watchers[which] = Watcher(f"sim-gpu-{which}", self.core.list_pod_for_all_namespaces,
                                            self._on_event, label_selector=selector).start()

    def _on_event(self, ev: Any) -> None:
        if ev.type in ("DELETED", "ERROR"):
            return
        try:
            self._fate(ev.obj)
        except Exception as exc:  # noqa: BLE001 - the world's watch must outlive one failed patch
            log.warning("sim: GPU fate of a pod not applied: %s", exc)

    def _pods_on(self, node: str) -> list[dict[str, Any]]:
        from kubernetes.client import ApiException

        try:
            resp = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
        except ApiException:
            return []
        out: list[dict[str, Any]] = self.core.api_client.sanitize_for_serialization(resp).get("items") or []
        return out

    def _fate(self, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if uid in self.answered:
            return
        patch = fate(pod, self.owned, self.bad, time.time())
        if patch is None:
            return
        with self._lock:
            if uid in self.answered:
                return
            self.answered.add(uid)
        from kubernetes.client import ApiException

        try:
            self.core.patch_namespaced_pod(meta["name"], meta["namespace"], {"metadata": {"annotations": patch}})
        except ApiException as exc:
            if exc.status != 404:
                raise
        log.info("sim: pod %s/%s on node %s: %s", meta.get("namespace"), meta.get("name"),
                 (pod.get("spec") or {}).get("nodeName"), patch)


def fate(pod: dict[str, Any], owned: set[str] | frozenset[str], bad: dict[str, GpuFault],
         now: float) -> dict[str, str] | None:
    """The annotations that play ``pod``'s GPU fate (pure): a probe's answer on a node of ``owned`` (its DCGM run
    level's duration; exit 0, or the fault's probe exit on a ``bad`` node), a GPU pod's crash on a bad node (exit 1
    at an absolute time), or None (not this world's node, not bound, finished, or nothing to play)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    node = str(spec.get("nodeName") or "")
    notes = meta.get("annotations") or {}
    if (not node or node not in owned or meta.get("deletionTimestamp")
            or status.get("phase") in ("Succeeded", "Failed")):
        return None
    fault = bad.get(node)
    if PROBE_LABEL in (meta.get("labels") or {}):
        level = 1
        for c in spec.get("containers") or []:
            for e in c.get("env") or []:
                if e.get("name") == "KFP_GPU_DCGM_LEVEL" and str(e.get("value", "")).isdigit():
                    level = int(e["value"])
        code = 0 if fault is None else fault.probe_exit
        return {DURATION_ANNOTATION: f"{compress(DIAG_S.get(level, DIAG_S[1])):.3f}s", EXIT_ANNOTATION: str(code)}
    if fault is not None and _wants_gpu(spec) and notes.get(EXIT_ANNOTATION, "0") == "0":
        return {EXIT_ANNOTATION: str(CUDA_ERROR_EXIT), DURATION_ANNOTATION: rfc3339(now + compress(fault.crash_after_s))}
    return None


def _wants_gpu(spec: dict[str, Any]) -> bool:
    return any("nvidia.com/gpu" in ((c.get("resources") or {}).get("limits") or {})
               for c in spec.get("containers") or [])
