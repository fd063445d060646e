"""GPU health probe pods: one per gang node, pinned to it, in the run's namespace; their answers as plain facts.

A probe pod runs the probe image (``images/gpu-probe``, docs/health.md): ``nvidia-smi`` device count vs the
node's allocatable ``nvidia.com/gpu`` (``KFP_GPU_EXPECTED_GPUS``), ``dcgmi diag -r <level>``, and optionally a
short NCCL all-reduce over the node's GPUs. Its exit code is the verdict (:data:`kfp_gpu.plan.health.
PROBE_EXIT_REASONS`). The pod asks for every GPU of the node (so the probe sees them all, and the scheduler
counts them), tolerates the run's taints like the job's pods (:meth:`Capacity.tolerations`), is pinned by node
affinity on the Node's name (:func:`kfp_gpu.cluster.podtemplate.node_affinity`, so the scheduler still checks
taints and resources), mounts no ServiceAccount token, and is bounded by ``activeDeadlineSeconds``.

:class:`ProbeRound` creates one round's pods and follows them with the one watch loop
(:func:`kfp_gpu.cluster.watch.pod_watcher`, label-selected on the run and round); the decision is
:func:`kfp_gpu.plan.health.gate`. Nothing here is rehearsal-specific: in the local world the stand-in answers a
probe pod on the nodes it made (:mod:`kfp_gpu_rehearsal.sim.gpuhealth`).
"""

from __future__ import annotations

import functools
import hashlib
import queue
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client

from kfp_gpu.cluster.apierrors import call
from kfp_gpu.cluster.capacity import Capacity
from kfp_gpu.cluster.facts import pod_fact
from kfp_gpu.cluster.listwatch import Event, Watcher
from kfp_gpu.cluster.podtemplate import node_affinity
from kfp_gpu.cluster.watch import pod_watcher
from kfp_gpu.job_fields import GPU_RESOURCE
from kfp_gpu.ownership import PROBE_LABEL, PROBED_NODE_ANNOTATION, label_safe
from kfp_gpu.ownership import PROBE_ROUND_LABEL as ROUND_LABEL
from kfp_gpu.plan.health import ProbeResult
from kfp_gpu.spec import Health

PROBE_IMAGE_REPO = "ghcr.io/kfp-gpu/gpu-probe"
ENV_EXPECTED_GPUS = "KFP_GPU_EXPECTED_GPUS"
ENV_DCGM_LEVEL = "KFP_GPU_DCGM_LEVEL"
ENV_NCCL = "KFP_GPU_NCCL"


def probe_image(health: Health) -> str:
    """The spec's ``health.image``, or the probe image of this kfp-gpu version (docs/health.md)."""
    from kfp_gpu.image import VERSION

    return health.image or f"{PROBE_IMAGE_REPO}:{VERSION}"


def pod_name(run_id: str, node: str, round_no: int) -> str:
    digest = hashlib.sha256(f"{run_id}/{node}".encode()).hexdigest()[:10]
    return f"gpu-probe-{label_safe(run_id)[:30].rstrip('-_.')}-{digest}-r{round_no}".lower()


def probe_pod(health: Health, capacity: Capacity, run_id: str, node: str, round_no: int,
              labels: Mapping[str, str]) -> dict[str, Any]:
    """The probe pod for ``node`` in round ``round_no``; ``labels``: the run's ownership labels."""
    gpus = str(capacity.gpus_per_node)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": pod_name(run_id, node, round_no), "namespace": capacity.namespace,
            "labels": {**labels, PROBE_LABEL: label_safe(run_id), ROUND_LABEL: str(round_no)},
            "annotations": {PROBED_NODE_ANNOTATION: node},
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": max(1, int(health.probe_timeout_s)),
            "automountServiceAccountToken": False,
            "tolerations": capacity.tolerations(),
            "affinity": {"nodeAffinity": node_affinity({}, [node])},
            "containers": [{
                "name": "gpu-probe", "image": probe_image(health),
                "env": [{"name": ENV_EXPECTED_GPUS, "value": gpus},
                        {"name": ENV_DCGM_LEVEL, "value": str(health.dcgm_level)},
                        {"name": ENV_NCCL, "value": "1" if health.nccl else "0"}],
                "resources": {"limits": {GPU_RESOURCE: gpus}},
            }],
        },
    }


class ProbeRound:
    """One round's probe pods: create, follow by watch, read the answers, delete."""

    def __init__(self, api: client.ApiClient, health: Health, capacity: Capacity, run_id: str,
                 nodes: Sequence[str], round_no: int, labels: Mapping[str, str]) -> None:
        self.api, self.core = api, client.CoreV1Api(api)
        self.namespace = capacity.namespace
        self.nodes = tuple(nodes)
        self.bodies = [probe_pod(health, capacity, run_id, n, round_no, labels) for n in self.nodes]
        self.by_pod = {b["metadata"]["name"]: n for b, n in zip(self.bodies, self.nodes, strict=True)}
        self.results: dict[str, ProbeResult] = {}
        self.q: queue.Queue[Event] = queue.Queue()
        selector = f"{PROBE_LABEL}={label_safe(run_id)},{ROUND_LABEL}={round_no}"
        self._watcher: Watcher = pod_watcher(api, self.q, self.namespace, selector)

    def start(self) -> None:
        """Watch, then create the pods (an existing pod of the same name, from a retried step, is kept)."""
        self._watcher.start()
        self._watcher.synced.wait(30.0)
        for body in self.bodies:
            call(functools.partial(self._create, body), f"create probe pod {body['metadata']['name']}")

    def _create(self, body: dict[str, Any]) -> None:
        try:
            self.core.create_namespaced_pod(self.namespace, body)
        except client.ApiException as exc:
            if exc.status != 409:  # AlreadyExists: a retried step re-attaches to its pod
                raise

    def poll(self, timeout_s: float) -> None:
        """Fold the watch's events into :attr:`results`, waiting up to ``timeout_s`` for the first."""
        try:
            ev: Event | None = self.q.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return
        while ev is not None:
            self._apply(ev)
            try:
                ev = self.q.get_nowait()
            except queue.Empty:
                ev = None

    def _apply(self, ev: Event) -> None:
        if ev.type == "ERROR":
            from kfp_gpu.cluster.apierrors import api_refusal
            from kfp_gpu.errors import PermissionDenied

            exc = ev.obj["error"]
            raise api_refusal(exc) or PermissionDenied(f"the Kubernetes API refused the probe pod watch: {exc}",
                                                       remediation="grant pods list/watch in the run's namespace")
        p = pod_fact(ev.obj, ev.at, deleted=ev.type == "DELETED")
        node = self.by_pod.get(p.name)
        if node is None or node in self.results and self.results[node].exit_code is not None:
            return
        if p.phase in ("Succeeded", "Failed"):
            # activeDeadlineSeconds ends a probe with phase Failed and no terminated container: no answer
            code = p.exit_code if p.exit_code is not None else (0 if p.phase == "Succeeded" else None)
            self.results[node] = ProbeResult(node, code, ev.at)

    def stop(self) -> None:
        """Stop watching and delete the round's pods (grace 0; a missing pod is fine)."""
        self._watcher.stop()
        for name in self.by_pod:
            try:
                self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
