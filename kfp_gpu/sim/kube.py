"""Where simulated VMs become KWOK Nodes: create, delete and preempt through the kubernetes client."""

from __future__ import annotations

import logging
import time
from typing import Any

from kfp_gpu import accelerators
from kfp_gpu.sim.scenario import PoolSpec

log = logging.getLogger(__name__)

# GKE taints a spot/preemptible node it is about to reclaim with this key (graceful node shutdown).
IMPENDING_TERMINATION_TAINT = "cloud.google.com/impending-node-termination"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


class KubeBackend:
    """Node backend for a real (local) API server.

    Args:
        kubeconfig: path of the kubeconfig file.
        pool_size: HTTP connections to keep open (concurrent node creations).

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

    def create(self, pool: PoolSpec, cluster: str, name: str, boot_delay_s: float,
               sampled_s: float | None = None) -> None:
        """Register one Node for ``pool``. An existing Node of that name is adopted.

        Raises: kubernetes.client.ApiException for anything but 409 Conflict.
        """
        from kubernetes.client import ApiException

        from kfp_gpu.devcluster.nodes import make_gpu_node

        acc = accelerators.get(pool.accelerator)
        labels = {
            "node.kubernetes.io/instance-type": pool.machine_type,
            "cloud.google.com/machine-family": pool.machine_type.split("-", 1)[0],
            "cloud.google.com/gke-provisioning": "spot" if pool.spot else "standard",
            "kfp-gpu.io/sim-cluster": cluster,
        }
        machine = acc.gce_machine_for(pool.gpus_per_node)
        body = make_gpu_node(
            name, pool.name, acc.gke_label, pool.zone, pool.gpus_per_node, pool.spot, boot_delay_s, labels,
            cpu=str(machine.vcpus), memory=f"{machine.vcpus * 8}Gi",
        )
        body["metadata"]["annotations"]["kfp-gpu.io/created-by"] = "kfp-gpu-sim"
        if sampled_s is not None:  # the whole sampled boot latency, counted from the setSize request
            body["metadata"]["annotations"]["kfp-gpu.io/boot-sample"] = f"{sampled_s:g}"
        try:
            self.core.create_node(body=body)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def delete(self, name: str) -> None:
        """Delete a Node; a missing one is a no-op. Raises: ApiException for other failures."""
        from kubernetes.client import ApiException

        try:
            self.core.delete_node(name, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def preempt(self, name: str, *, eviction_timeout_s: float = 10.0) -> None:
        """Reclaim a node as GCE reclaims a spot VM.

        Taints it ``cloud.google.com/impending-node-termination:NoSchedule`` and cordons it, evicts
        every pod on it through the Eviction API (the API server adds the ``DisruptionTarget``
        condition), waits briefly for the pods to go, then deletes the Node.

        Raises: ApiException for failures other than the node already being gone.
        """
        from kubernetes.client import ApiException

        try:
            node = self.core.read_node(name)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        taints = [t for t in (node.spec.taints or []) if t.key not in (IMPENDING_TERMINATION_TAINT,)]
        taints_json: list[dict[str, Any]] = [
            {"key": t.key, "value": t.value, "effect": t.effect} for t in taints
        ]
        taints_json.append({"key": IMPENDING_TERMINATION_TAINT, "value": "true", "effect": "NoSchedule"})
        self.core.patch_node(name, {"spec": {"unschedulable": True, "taints": taints_json}})
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items
        for pod in pods:
            self._evict(pod.metadata.namespace, pod.metadata.name)
        deadline = time.monotonic() + eviction_timeout_s
        while pods and time.monotonic() < deadline:
            left = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items
            if not [p for p in left if p.metadata.deletion_timestamp is None]:
                break
            time.sleep(0.2)
        self.delete(name)

    def _evict(self, namespace: str, pod: str) -> None:
        from kubernetes import client
        from kubernetes.client import ApiException

        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=pod, namespace=namespace),
            delete_options=client.V1DeleteOptions(grace_period_seconds=0),
        )
        try:
            self.core.create_namespaced_pod_eviction(pod, namespace, body)
        except ApiException as exc:
            if exc.status == 429:  # a PodDisruptionBudget blocks it: GCE does not wait, delete
                log.warning("sim: PDB blocks eviction of %s/%s; deleting it", namespace, pod)
                self.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
            elif exc.status != 404:
                raise
