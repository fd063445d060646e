"""Where simulated VMs become KWOK Nodes: register, get GPUs, receive a preemption notice, go away.

Every call is one short burst of API requests (no waiting on the world): the stand-in's timeline
decides *when* each happens (kfp_gpu_rehearsal.sim.mig).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from kfp_gpu import accelerators, rehearsal_seam
from kfp_gpu_rehearsal.sim.clock import expand
from kfp_gpu_rehearsal.sim.gpuhealth import GpuFault, GpuHealthWorld
from kfp_gpu_rehearsal.sim.ranks import RankWorld
from kfp_gpu_rehearsal.sim.scenario import PoolSpec

log = logging.getLogger(__name__)

SHUTTING_DOWN_ANNOTATION = "kfp-gpu.io/shutting-down"  # KWOK's node stages leave such a node NotReady
BOOT_SAMPLE_ANNOTATION = "kfp-gpu.io/boot-sample"  # stand-in seconds from the request to the Node
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."  # the kubelet's nodeShutdownMessage


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
NODE_LEASE_NAMESPACE = "kube-node-lease"  # the kubelet's (and KWOK's) node heartbeat Leases
COUNT_WAIT_S = 30.0  # wall seconds the pod GC leaves a terminal Job pod for the Job controller to count


def _collect(core: Any, pods: list[Any], wait_s: float = COUNT_WAIT_S) -> None:
    """The pod GC for terminal pods of a deleted Node that a Job tracks: each is deleted once the Job controller
    removed its ``batch.kubernetes.io/job-tracking`` finalizer (it has counted the pod), or after ``wait_s``
    (a Job controller that is not running). Kubernetes: pods of a deleted node are orphans the pod GC deletes
    (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-garbage-collection); the Job controller
    keeps its finalizer on a pod until the pod is accounted for
    (https://kubernetes.io/docs/concepts/workloads/controllers/job/#job-tracking-with-finalizers)."""
    from kubernetes.client import ApiException

    deadline = time.monotonic() + wait_s
    left = list(pods)
    while left:
        for pod in list(left):
            try:
                cur = core.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
                if cur.metadata.uid == pod.metadata.uid and JOB_TRACKING_FINALIZER in (cur.metadata.finalizers or []) \
                        and time.monotonic() < deadline:
                    continue
                if cur.metadata.uid == pod.metadata.uid:
                    core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)
            except ApiException as exc:
                if exc.status != 404:
                    log.warning("sim pod GC: %s/%s: %s", pod.metadata.namespace, pod.metadata.name, exc)
            left.remove(pod)
        if left:
            time.sleep(0.05)


class KubeBackend:
    """Node backend for a real (local) API server.

    Args:
        kubeconfig: path of the kubeconfig file.
        pool_size: HTTP connections to keep open.

    Raises:
        kubernetes.config.ConfigException: the kubeconfig cannot be loaded.
    """

    def __init__(self, kubeconfig: str, *, pool_size: int = 64) -> None:
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        cfg.connection_pool_maxsize = pool_size
        self.api_client = client.ApiClient(cfg)
        self.core = client.CoreV1Api(self.api_client)
        self.ranks = RankWorld(self.api_client)  # what a killed rank's peers do (kfp_gpu_rehearsal.sim.ranks)
        self.gpu = GpuHealthWorld(self.api_client)  # GPU faults and health probes (kfp_gpu_rehearsal.sim.gpuhealth)
        self.born_bad: dict[str, tuple[list[int], GpuFault]] = {}  # pool -> ([nodes still to be born bad], fault)
        # (pool, node name) -> (extra labels, extra taints) a node gets at registration (queued pools: kfp_gpu_rehearsal.sim.dws)
        self.extras: Callable[[str, str], tuple[dict[str, str], list[dict[str, str]]]] | None = None

    def create(self, pool: PoolSpec, cluster: str, name: str, boot_delay_s: float,
               sampled_s: float | None = None, *, gpus_ready: bool = True,
               labels: dict[str, str] | None = None) -> None:
        """Register one Node for ``pool`` (a VM that has booted). ``gpus_ready=False`` registers it
        with ``nvidia.com/gpu`` 0 until :meth:`gpus_ready`; ``labels`` are its host's topology labels. An existing
        Node of that name is adopted, unless it is a shut-down incarnation still being deleted (then it is replaced).

        Raises: kubernetes.client.ApiException for anything but 409 Conflict.
        """
        from kubernetes.client import ApiException

        from kfp_gpu_rehearsal.devcluster.nodes import make_gpu_node

        acc = accelerators.get(pool.accelerator)
        labels = {
            **(labels or {}),
            "node.kubernetes.io/instance-type": pool.machine_type,
            "cloud.google.com/machine-family": pool.machine_type.split("-", 1)[0],
            "cloud.google.com/gke-provisioning": "spot" if pool.spot else "standard",
            rehearsal_seam.LOCAL_CLUSTER_LABEL: cluster,
        }
        machine = acc.gce_machine_for(pool.gpus_per_node)
        body = make_gpu_node(
            name, pool.name, acc.gke_label, pool.zone, pool.gpus_per_node, pool.spot, boot_delay_s, labels,
            cpu=str(machine.vcpus), memory=f"{machine.vcpus * 8}Gi", gpus_allocatable=None if gpus_ready else 0,
        )
        notes = body["metadata"]["annotations"]
        notes["kfp-gpu.io/created-by"] = "kfp-gpu-sim"
        if self.extras is not None:
            more_labels, more_taints = self.extras(pool.name, name)
            body["metadata"]["labels"].update(more_labels)
            if more_taints:
                body.setdefault("spec", {}).setdefault("taints", []).extend(more_taints)
        if sampled_s is not None:  # the whole latency, from the request to this registration
            notes[BOOT_SAMPLE_ANNOTATION] = f"{sampled_s:g}"
            notes["kfp-gpu.io/boot-sample-real-s"] = f"{expand(sampled_s):g}"
        for _ in range(3):
            try:
                self.core.create_node(body=body)
                self._gpu_birth(pool.name, name)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
            old = self._read(name)
            if old is None:
                continue
            if not (old.metadata.annotations or {}).get(SHUTTING_DOWN_ANNOTATION):
                return  # adopt
            self.delete(name)

    def _gpu_birth(self, pool: str, name: str) -> None:
        """The world answers this node's probes; the scenario's ``gpu_faults.born_bad`` may make its GPU bad."""
        self.gpu.adopt(name)
        left, fault = self.born_bad.get(pool, ([0], None))
        if fault is not None and left[0] > 0:
            left[0] -= 1
            self.gpu.break_node(name, fault)

    def _delete_lease(self, name: str, node_uid: str) -> None:
        """Delete the node Lease that Node incarnation ``node_uid`` owns, as the garbage collector does once its owner
        is gone (only that one: a Lease of a VM already recreated under the name belongs to the new Node). Left
        behind, KWOK took a VM recreated under the name for a node it already leased and ran none of its pods until
        its lease renewal (10 s here: a resumed gang's last rank Running ~1000 world seconds late). Raises:
        ApiException other than 404/409."""
        from kubernetes import client
        from kubernetes.client import ApiException

        leases = client.CoordinationV1Api(self.core.api_client)
        try:
            lease = leases.read_namespaced_lease(name, NODE_LEASE_NAMESPACE)
            if not any(o.uid == node_uid for o in lease.metadata.owner_references or []):
                return
            leases.delete_namespaced_lease(name, NODE_LEASE_NAMESPACE, body=client.V1DeleteOptions(
                grace_period_seconds=0, preconditions=client.V1Preconditions(uid=lease.metadata.uid)))
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def delete(self, name: str) -> None:
        """Delete a Node and the pods bound to it (what the pod GC does for a VM that is gone, without
        its 40 s quarantine, which the stand-in's compressed time would stretch). A pod the kubelet already reported
        terminal that a Job still tracks (finalizer ``batch.kubernetes.io/job-tracking``) is deleted only once the
        Job controller has counted it and removed that finalizer (:func:`_collect`): KWOK's pod-delete stage strips a
        deleted pod's finalizers, so a Failed pod deleted at once was never counted (measured: a Job with
        backoffLimit 0 made a new pod instead of failing; with the pod left 1 s it failed). A missing Node is a
        no-op. Raises: ApiException for other failures."""
        from kubernetes.client import ApiException

        try:
            uid = self.core.read_node(name).metadata.uid
            self.core.delete_node(name, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise
            uid = None
        if uid is not None:
            self._delete_lease(name, uid)
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items
        held = [p for p in pods if p.status.phase in ("Failed", "Succeeded")
                and JOB_TRACKING_FINALIZER in (p.metadata.finalizers or [])]
        kept = {p.metadata.uid for p in held}
        for pod in pods:
            if pod.metadata.uid in kept:
                continue
            try:
                self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        if held:
            threading.Thread(target=_collect, args=(self.core, held), name="sim-pod-gc", daemon=True).start()
        self.ranks.lost(pods)  # ranks still Running when their VM vanished

    def notice(self, name: str, taint_key: str = "") -> None:
        """The start of the kubelet's graceful node shutdown (GKE: the Spot VM's 30 s ACPI notice): the Node turns
        ``Ready=False`` ("node is shutting down") and every pod on it gets the ``DisruptionTarget`` condition
        (reason ``TerminationByKubelet``) while it keeps running: the kubelet reports a pod terminal only once its
        containers stopped (:meth:`kill` ends them when the grace runs out). ``taint_key``: a taint another actor
        adds at the notice (aws-node-termination-handler's); GKE adds none.

        Raises: ApiException for failures other than the node already being gone.
        """
        from kubernetes.client import ApiException

        # the pods first: the kubelet's SIGTERM is what a trainer's emergency save starts from
        for pod in self._live_pods(name):
            self._patch_status(pod, {"conditions": self._conditions(pod, running=True)})
        patch: dict[str, Any] = {"metadata": {"annotations": {SHUTTING_DOWN_ANNOTATION: "true"}}}
        try:
            if taint_key:
                node = self._read(name)
                if node is None:
                    return
                taints: list[dict[str, Any]] = [{"key": t.key, "value": t.value, "effect": t.effect}
                                                for t in (node.spec.taints or []) if t.key != taint_key]
                taints.append({"key": taint_key, "value": "true", "effect": "NoSchedule"})
                patch["spec"] = {"taints": taints}
            self.core.patch_node(name, patch)
            # a strategic merge on conditions (keyed by type): only Ready changes
            self.core.patch_node_status(name, {"status": {"conditions": [
                {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "node is shutting down",
                 "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}]}})
        except ApiException as exc:
            if exc.status != 404:
                raise

    def kill(self, name: str) -> None:
        """The grace of the node's pods ran out (GKE: 15 s for non-system pods): their containers are killed
        (exit 137), the pods turn ``Failed`` (reason ``Terminated``), and the peers of every killed training rank
        get their fate (:mod:`kfp_gpu_rehearsal.sim.ranks`). Raises: ApiException other than 404."""
        killed = []
        for pod in self._live_pods(name):
            statuses = [{"name": c.name, "image": c.image, "ready": False, "restartCount": 0,
                         "state": {"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": _now()}}}
                        for c in pod.spec.containers]
            if self._patch_status(pod, {"phase": "Failed", "reason": "Terminated", "message": SHUTDOWN_MESSAGE,
                                        "conditions": self._conditions(pod, running=False),
                                        "containerStatuses": statuses}):
                killed.append(pod)
        self.ranks.lost(killed)

    def _live_pods(self, name: str) -> list[Any]:
        return [p for p in self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items
                if p.status.phase not in ("Succeeded", "Failed")]

    def _conditions(self, pod: Any, *, running: bool) -> list[dict[str, Any]]:
        drop = ("DisruptionTarget",) if running else ("DisruptionTarget", "Ready", "ContainersReady")
        conds = [self.api_client.sanitize_for_serialization(c) for c in (pod.status.conditions or [])
                 if c.type not in drop]
        conds.append({"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                      "message": SHUTDOWN_MESSAGE, "lastTransitionTime": _now()})
        if not running:
            conds += [{"type": t, "status": "False", "reason": "PodFailed", "lastTransitionTime": _now()}
                      for t in ("Ready", "ContainersReady")]
        return conds

    def _patch_status(self, pod: Any, status: dict[str, Any]) -> bool:
        from kubernetes.client import ApiException

        try:
            self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": status})
        except ApiException as exc:
            if exc.status != 404:
                raise
            return False
        return True

    def gpus_ready(self, name: str, gpus: int) -> None:
        """The GPU device plugin registered: ``nvidia.com/gpu`` capacity/allocatable becomes ``gpus`` (one
        status patch, whether or not KWOK has initialized the Node yet: the dev cluster's node-initialize stage
        never writes resources a Node already has, kfp_gpu_rehearsal/devcluster/kwok/stages.yaml). Raises: ApiException
        for failures other than the node being gone."""
        from kubernetes.client import ApiException

        amount = {"nvidia.com/gpu": str(gpus)}
        try:
            self.core.patch_node_status(name, {"status": {"capacity": amount, "allocatable": amount}})
        except ApiException as exc:
            if exc.status != 404:
                raise

    def preempt(self, name: str) -> None:
        """Notice, kill and reclaim at once (no notice period): for tests that drive a cluster without a
        stand-in world. Raises: ApiException for failures other than the node already being gone."""
        self.notice(name)
        self.kill(name)
        self.delete(name)

    def _read(self, name: str) -> Any:
        from kubernetes.client import ApiException

        try:
            return self.core.read_node(name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
