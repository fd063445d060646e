"""EKS managed-node-group instances as KWOK Nodes, labelled and tainted as EKS makes them.

Reuses the GKE stand-in's node machinery (:class:`kfp_gpu_rehearsal.sim.kube.KubeBackend`: registration through
``make_gpu_node``, the GPU device-plugin delay, deletion with the node's pods) and replaces the GKE labels
with EKS's. See docs/sim.md, "AWS stand-in", section A4.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from kfp_gpu import accelerators, rehearsal_seam
from kfp_gpu_rehearsal.devcluster.nodes import TERMINATE_AT_ANNOTATION
from kfp_gpu_rehearsal.sim.clock import compress
from kfp_gpu_rehearsal.sim.kube import KubeBackend

if TYPE_CHECKING:
    from kfp_gpu_rehearsal.sim.aws.records import Instance
    from kfp_gpu_rehearsal.sim.aws.scenario import NodegroupSpec

log = logging.getLogger(__name__)
EFFECT = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
AMI = "ami-0kfpgpu0eksnvidia"
DEFAULT_GRACE_S = 30  # a pod's terminationGracePeriodSeconds when unset (the Kubernetes API's default)


def eks_node_body(inst: Instance, ng: NodegroupSpec, cluster: str, region: str, *, gpus_ready: bool) -> dict[str, Any]:
    """The Node a managed node group's instance registers: EKS labels, the node group's taints, providerID."""
    from kfp_gpu_rehearsal.devcluster.nodes import make_gpu_node

    acc_name = next(n for n in accelerators.names()
                    if any(s.name == inst.instance_type for s in accelerators.get(n).aws_instances))
    shape = next(s for s in accelerators.get(acc_name).aws_instances if s.name == inst.instance_type)
    body = make_gpu_node(inst.dns, ng.name, acc_name, inst.zone, shape.gpus, inst.capacity_type == "SPOT", 0.0,
                         cpu=str(shape.vcpus), memory=f"{shape.vcpus * 12}Gi",
                         gpus_allocatable=None if gpus_ready else 0)
    labels = {k: v for k, v in body["metadata"]["labels"].items() if not k.startswith("cloud.google.com/")}
    labels.update({
        "node.kubernetes.io/instance-type": inst.instance_type,
        "topology.kubernetes.io/zone": inst.zone,
        "topology.kubernetes.io/region": region,
        "eks.amazonaws.com/nodegroup": ng.name,
        "eks.amazonaws.com/capacityType": inst.capacity_type,
        "eks.amazonaws.com/nodegroup-image": AMI,
        "k8s.io/cloud-provider-aws": "kfp-gpu-sim",
        rehearsal_seam.LOCAL_CLUSTER_LABEL: cluster,
        **inst.labels,  # topology.k8s.aws/network-node-layer-N (docs/sim.md, section 14)
        **ng.labels,
    })
    body["metadata"]["labels"] = labels
    body["metadata"]["annotations"]["kfp-gpu.io/created-by"] = "kfp-gpu-sim-aws"
    body["spec"] = {"providerID": inst.provider_id,
                    "taints": [{"key": t["key"], **({"value": t["value"]} if t.get("value") else {}),
                                "effect": EFFECT.get(t.get("effect", ""), t.get("effect", ""))} for t in ng.taints]}
    return body


class EksKubeNodes(KubeBackend):
    """Node backend for a real (local) API server, with EKS's labels and its cordon-and-drain."""

    def __init__(self, kubeconfig: str, region: str) -> None:
        super().__init__(kubeconfig)
        self.region = region

    def register(self, inst: Instance, ng: NodegroupSpec, cluster: str, gpus_ready: bool) -> None:
        """Create the Node of a booted instance (a leftover of this stand-in's cluster with that name is replaced).

        Raises: ApiException; RuntimeError when the name is taken by another stand-in cluster's Node."""
        from kubernetes.client import ApiException

        body = eks_node_body(inst, ng, cluster, self.region, gpus_ready=gpus_ready)
        try:
            self.core.create_node(body=body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            old = self._read(inst.dns)
            owner = (old.metadata.labels or {}).get(rehearsal_seam.LOCAL_CLUSTER_LABEL) if old is not None else cluster
            if owner != cluster:  # another stand-in's node: never take it over
                raise RuntimeError(f"Node {inst.dns} belongs to stand-in cluster {owner!r}, not {cluster!r}") from exc
            self.delete(inst.dns)
            self.core.create_node(body=body)

    def drain(self, name: str) -> None:
        """Cordon (``spec.unschedulable``; the node lifecycle controller adds the
        ``node.kubernetes.io/unschedulable:NoSchedule`` taint) and evict every pod through the Eviction API,
        as EKS does to a managed Spot node on an interruption notice and to a node it scales in. An evicted pod
        keeps running for its ``terminationGracePeriodSeconds`` (the API's default 30 s; in the world's time), as
        the kubelet SIGTERMs it and kills it when the grace runs out: the stand-in marks it
        ``kfp-gpu.io/terminate-at`` before the eviction (KWOK's stage kfp-gpu-pod-delete-graceful), and its
        training peers learn of the loss then (a node reclaimed sooner takes the pod with it).
        Raises: ApiException other than the node or pod being gone."""
        from kubernetes import client
        from kubernetes.client import ApiException

        try:
            self.core.patch_node(name, {"spec": {"unschedulable": True}})
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        evicted: dict[float, list[Any]] = {}
        for pod in self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items:
            if pod.status.phase in ("Succeeded", "Failed"):
                continue
            grace_s = compress(DEFAULT_GRACE_S if pod.spec.termination_grace_period_seconds is None
                               else pod.spec.termination_grace_period_seconds)
            at = datetime.now(timezone.utc) + timedelta(seconds=grace_s)
            try:
                self.core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace, {"metadata": {
                    "annotations": {TERMINATE_AT_ANNOTATION: at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}})
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod.metadata.name,
                                                                  namespace=pod.metadata.namespace))
            try:
                self.core.create_namespaced_pod_eviction(pod.metadata.name, pod.metadata.namespace, body)
            except ApiException as exc:
                if exc.status == 429:  # a PodDisruptionBudget refuses: EKS retries; the instance goes anyway
                    log.info("eviction of %s/%s refused by a disruption budget", pod.metadata.namespace,
                             pod.metadata.name)
                elif exc.status != 404:
                    raise
                continue  # not evicted: it dies with the instance, if at all (KubeBackend.delete)
            evicted.setdefault(grace_s, []).append(pod)
        for grace_s, pods in evicted.items():  # the kubelet kills an evicted rank when its grace runs out
            timer = threading.Timer(grace_s, self.ranks.lost, args=(pods,))
            timer.daemon = True
            timer.start()


class MemoryNodes:
    """Nodes kept in memory only (tests without a cluster); every call is recorded."""

    def __init__(self) -> None:
        self.bodies: dict[str, dict[str, Any]] = {}
        self.gpus: dict[str, int] = {}
        self.drained: list[str] = []
        self.deleted: list[str] = []
        self.region = "us-east-1"

    def register(self, inst: Instance, ng: NodegroupSpec, cluster: str, gpus_ready: bool) -> None:
        self.bodies[inst.dns] = eks_node_body(inst, ng, cluster, self.region, gpus_ready=gpus_ready)

    def gpus_ready(self, name: str, gpus: int) -> None:
        self.gpus[name] = gpus

    def drain(self, name: str) -> None:
        self.drained.append(name)

    def delete(self, name: str) -> None:
        self.deleted.append(name)
        self.bodies.pop(name, None)
