"""The dev cluster end to end: real Training Operator + real scheduler + KWOK nodes.

PyTorchJobs are created the way the train step creates them: with the controller's identity (its rights from
kfp_gpu/manifests/controller-rbac.yaml, ``step_api``); nodes and plain pods are set up by the admin.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.devcluster.nodes import (
    GPU_RESOURCE,
    NOT_READY_TAINT,
    POOL_LABEL,
    SIM_DURATION_ANNOTATION,
    SIM_EXIT_CODE_ANNOTATION,
)
from tests.waiting import wait_until as _wait_until

NodeFactory = Callable[..., tuple[str, list[str]]]  # the kwok_nodes fixture (see conftest.py)

pytestmark = pytest.mark.integration

GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


wait_until = functools.partial(_wait_until, timeout=30.0)


def _replica(pool: str, annotations: dict[str, str], gpus: int, replicas: int) -> dict[str, Any]:
    return {
        "replicas": replicas,
        "restartPolicy": "Never",
        "template": {
            "metadata": {"annotations": annotations},
            "spec": {
                "nodeSelector": {POOL_LABEL: pool},
                "tolerations": [GPU_TOLERATION],
                "containers": [{
                    "name": "pytorch", "image": "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
                    "command": ["python", "-c", "print('simulated')"],
                    "resources": {"limits": {GPU_RESOURCE: str(gpus)}, "requests": {"cpu": "1"}},
                }],
            },
        },
    }


def pytorchjob(name: str, pool: str, workers: int, gpus: int, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": {
                "Master": _replica(pool, annotations, gpus, 1),
                "Worker": _replica(pool, annotations, gpus, workers),
            },
        },
    }


def job_conditions(kube: Kube, ns: str, name: str) -> dict[str, str]:
    job = kube.custom.get_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", name)
    return {c["type"]: c["status"] for c in job.get("status", {}).get("conditions", [])}


def test_pytorchjob_4x8_gpus_runs_to_success(kube: Kube, namespace: str, kwok_nodes: NodeFactory,
                                             step_api: client.ApiClient) -> None:
    pool, nodes = kwok_nodes(4, gpus=8)
    wait_until("nodes Ready", lambda: all(_ready(kube, n) for n in nodes))
    client.CustomObjectsApi(step_api).create_namespaced_custom_object(
        "kubeflow.org", "v1", namespace, "pytorchjobs",
        pytorchjob("train", pool, workers=3, gpus=8, annotations={SIM_DURATION_ANNOTATION: "2s"}))

    def running_pods() -> list[Any]:
        pods = kube.core.list_namespaced_pod(namespace, label_selector="training.kubeflow.org/job-name=train").items
        return pods if len(pods) == 4 and all(p.status.phase == "Running" for p in pods) else []

    pods = wait_until("4 pods Running", running_pods, timeout=30)
    bound = sorted(p.spec.node_name for p in pods)
    assert bound == sorted(nodes), "each 8-GPU pod must land on its own 8-GPU KWOK node"
    assert wait_until("Running condition", lambda: job_conditions(kube, namespace, "train").get("Running") == "True")

    conds = wait_until("job Succeeded",
                       lambda: (c := job_conditions(kube, namespace, "train")).get("Succeeded") == "True" and c,
                       timeout=30)
    assert conds["Succeeded"] == "True"
    # The job succeeds when the master does; the workers finish within the same KWOK tick or so.
    wait_until("all pods Succeeded", lambda: {p.status.phase for p in kube.core.list_namespaced_pod(namespace).items}
               == {"Succeeded"}, timeout=10)


def test_pytorchjob_fails_with_exit_code(kube: Kube, namespace: str, kwok_nodes: NodeFactory,
                                        step_api: client.ApiClient) -> None:
    pool, nodes = kwok_nodes(2, gpus=8)
    wait_until("nodes Ready", lambda: all(_ready(kube, n) for n in nodes))
    client.CustomObjectsApi(step_api).create_namespaced_custom_object(
        "kubeflow.org", "v1", namespace, "pytorchjobs",
        pytorchjob("boom", pool, workers=1, gpus=8,
                   annotations={SIM_DURATION_ANNOTATION: "1s", SIM_EXIT_CODE_ANNOTATION: "3"}))
    wait_until("job Failed", lambda: job_conditions(kube, namespace, "boom").get("Failed") == "True", timeout=30)
    master = kube.core.read_namespaced_pod("boom-master-0", namespace)
    assert master.status.phase == "Failed"
    term = master.status.container_statuses[0].state.terminated
    assert term.exit_code == 3 and term.reason == "Error"


def test_plain_pod_exit_code_and_unannotated_pod_keeps_running(
        kube: Kube, namespace: str, kwok_nodes: NodeFactory) -> None:
    pool, nodes = kwok_nodes(1, gpus=8)
    wait_until("node Ready", lambda: _ready(kube, nodes[0]))

    def pod(name: str, annotations: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"name": name, "annotations": annotations},
                "spec": {"restartPolicy": "Never", "nodeSelector": {POOL_LABEL: pool},
                         "tolerations": [GPU_TOLERATION],
                         "containers": [{"name": "main", "image": "busybox",
                                         "resources": {"limits": {GPU_RESOURCE: "1"}}}]}}

    kube.core.create_namespaced_pod(namespace, pod("fails", {SIM_EXIT_CODE_ANNOTATION: "137"}))
    kube.core.create_namespaced_pod(namespace, pod("forever", {}))
    failed = wait_until("pod Failed", lambda: (p := kube.core.read_namespaced_pod("fails", namespace))
                        .status.phase == "Failed" and p)
    assert failed.status.container_statuses[0].state.terminated.exit_code == 137
    wait_until("pod Running", lambda: kube.core.read_namespaced_pod("forever", namespace).status.phase == "Running")
    time.sleep(1.5)
    assert kube.core.read_namespaced_pod("forever", namespace).status.phase == "Running"


def _ready(kube: Kube, name: str) -> bool:
    try:
        node = kube.core.read_node(name)
    except ApiException:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def test_node_boot_delay_registered_then_ready(kube: Kube, kwok_nodes: NodeFactory) -> None:
    t0 = time.monotonic()
    _, (name,) = kwok_nodes(1, gpus=8, boot_delay_s=2.0)
    node = kube.core.read_node(name)
    assert not _ready(kube, name), "a booting node must start NotReady"
    assert any(t.key == NOT_READY_TAINT["key"] for t in node.spec.taints)
    wait_until("node Ready", lambda: _ready(kube, name), timeout=20)
    assert time.monotonic() - t0 >= 1.5, "Ready came before the boot delay"
    wait_until("not-ready taint removed",
               lambda: not any(t.key == NOT_READY_TAINT["key"] for t in kube.core.read_node(name).spec.taints or []),
               timeout=20)
    alloc = kube.core.read_node(name).status.allocatable
    assert alloc[GPU_RESOURCE] == "8"


def test_pytorchjob_validating_webhook_is_live(namespace: str, step_api: client.ApiClient) -> None:
    """The operator's webhook (out of cluster, https://127.0.0.1) rejects an invalid job (RBAC admits it)."""
    bad = pytorchjob("bad", "nowhere", workers=1, gpus=1, annotations={})
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "not-pytorch"
    with pytest.raises(ApiException) as err:
        client.CustomObjectsApi(step_api).create_namespaced_custom_object("kubeflow.org", "v1", namespace,
                                                                          "pytorchjobs", bad)
    assert err.value.status == 403 and "validator.pytorchjob.training-operator.kubeflow.org" in err.value.body
