"""Fake GPU nodes for the dev cluster (managed by KWOK).

:func:`make_gpu_node` returns a plain ``V1Node``-shaped dict (JSON-ready, usable with
``CoreV1Api.create_node(body=...)``).  The signature is a stable contract used by the GKE
stand-in and the scale-up code; add new keyword arguments only with defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
BOOT_DELAY_ANNOTATION = "kfp-gpu.io/boot-delay"  # informative, e.g. "45s"
READY_AT_ANNOTATION = "kfp-gpu.io/ready-at"  # RFC3339 time KWOK makes the node Ready (wins over boot-delay)
# "pending": KWOK keeps the node NotReady until an injector (bench/burst.py) has set its boot-delay / ready-at
BOOT_INJECTION_LABEL = "kfp-gpu.io/boot-injection"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT: dict[str, str] = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
NOT_READY_TAINT: dict[str, str] = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
POOL_LABEL = "cloud.google.com/gke-nodepool"
ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
SPOT_LABEL = "cloud.google.com/gke-spot"
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"

# Pod annotations understood by the dev cluster's KWOK stages (kfp_gpu_rehearsal/devcluster/kwok/stages.yaml).
SIM_DURATION_ANNOTATION = "kfp-gpu.io/sim-duration"
SIM_EXIT_CODE_ANNOTATION = "kfp-gpu.io/sim-exit-code"
# "world": KWOK holds the bound pod Pending until PULLED_AT (its node's world says when the kubelet's image pull is
# done), or IMAGE_PULL_TIMEOUT (Go duration, default 1s: about the default pull) when no world serves the node (docs/sim.md rule 2b).
IMAGE_PULL_ANNOTATION = "kfp-gpu.io/image-pull"
PULLED_AT_ANNOTATION = "kfp-gpu.io/pulled-at"
IMAGE_PULL_TIMEOUT_ANNOTATION = "kfp-gpu.io/image-pull-timeout"
# RFC3339: a pod being deleted gracefully (deletionTimestamp set) stays until then, as a kubelet gives it its
# terminationGracePeriodSeconds (in the world's time), then KWOK deletes it (stage kfp-gpu-pod-delete-graceful).
TERMINATE_AT_ANNOTATION = "kfp-gpu.io/terminate-at"


def region_of(zone: str) -> str:
    """``us-central1-a`` -> ``us-central1`` (GCE zone naming)."""
    head, sep, _ = zone.rpartition("-")
    return head if sep else zone


def make_gpu_node(
    name: str,
    pool: str,
    accelerator: str,
    zone: str,
    gpus: int = 8,
    spot: bool = False,
    boot_delay_s: float = 0.0,
    labels: Mapping[str, str] | None = None,
    *,
    cpu: str = "208",
    memory: str = "1872Gi",
    pods: str = "110",
    gpus_allocatable: int | None = None,
) -> dict[str, Any]:
    """A KWOK-managed GPU node.

    KWOK's ``node-initialize`` stage makes the node Ready ``boot_delay_s`` seconds after this
    call (annotation ``kfp-gpu.io/ready-at``, an absolute RFC3339 time, so the delay does not
    restart when the node object is updated meanwhile; ``kfp-gpu.io/boot-delay`` records the
    duration).  When the delay is positive the node is created
    with ``Ready=False`` and the ``node.kubernetes.io/not-ready:NoSchedule`` taint a kubelet
    registers with; kube-controller-manager removes the taint once the node is Ready, so
    nothing schedules onto a still-booting node.

    ``gpus_allocatable`` (default ``gpus``) is the ``nvidia.com/gpu`` capacity/allocatable the node
    registers with: 0 until the GPU device plugin has registered (the GKE stand-in patches it later).
    """
    if gpus < 0:
        raise ValueError(f"gpus must be >= 0, got {gpus}")
    if boot_delay_s < 0:
        raise ValueError(f"boot_delay_s must be >= 0, got {boot_delay_s}")
    node_labels: dict[str, str] = {
        "type": "kwok",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": f"{accelerator}-x{gpus}",
        POOL_LABEL: pool,
        ACCELERATOR_LABEL: accelerator,
        ZONE_LABEL: zone,
        REGION_LABEL: region_of(zone),
    }
    if spot:
        node_labels[SPOT_LABEL] = "true"
    node_labels.update(labels or {})
    annotations = {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"}
    taints: list[dict[str, str]] = [dict(GPU_TAINT)] if gpus > 0 else []
    if boot_delay_s > 0:
        annotations[BOOT_DELAY_ANNOTATION] = f"{boot_delay_s:g}s"
        ready_at = datetime.now(timezone.utc) + timedelta(seconds=boot_delay_s)
        annotations[READY_AT_ANNOTATION] = ready_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        taints.append(dict(NOT_READY_TAINT))
    gpu_now = gpus if gpus_allocatable is None else gpus_allocatable
    resources = {"cpu": cpu, "memory": memory, "pods": pods, "ephemeral-storage": "1Ti", GPU_RESOURCE: str(gpu_now)}
    spec: dict[str, Any] = {"taints": taints} if taints else {}
    status: dict[str, Any] = {"capacity": dict(resources), "allocatable": dict(resources)}
    if boot_delay_s > 0:
        # Registered but not Ready yet, like a kubelet that is still starting.
        status["conditions"] = [{
            "type": "Ready", "status": "False", "reason": "KubeletNotReady",
            "message": f"simulated boot, Ready in {boot_delay_s:g}s",
        }]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": node_labels, "annotations": annotations},
        "spec": spec,
        "status": status,
    }
