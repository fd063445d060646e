"""Claimed nodes are isolated: the real scheduler keeps another team's GPU pod off a run's gang.

The gang is claimed with the real ``claim()`` as the controller's identity (``step_api``), released with the
real ``unclaim()`` as the janitor's; the run's pods come from the PyTorchJob the train step builds
(``pytorchjob.manifest`` with ``Capacity.tolerations()``), scheduled by the real kube-scheduler.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from kfp_gpu import ownership
from kfp_gpu.cluster import pytorchjob
from kfp_gpu.cluster.nodes import claim, is_claim_taint, labels_of, read_node, run_taint, unclaim
from kfp_gpu.job import JobTemplate
from kfp_gpu.ownership import LABEL_RUN_ID, label_safe
from kfp_gpu.steps.capacity import Capacity, Placement
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.devcluster.nodes import GPU_RESOURCE, GPU_TAINT, POOL_LABEL
from tests.waiting import wait_until

NodeFactory = Callable[..., tuple[str, list[str]]]

pytestmark = pytest.mark.integration

ACCEL = "nvidia-h100-80gb"
ZONE = "us-central1-a"


def _ready(kube: Kube, name: str) -> bool:
    conds = kube.core.read_node(name).status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conds)


def _taints(kube: Kube, name: str) -> list[dict[str, Any]]:
    return [{"key": t.key, "value": t.value or "", "effect": t.effect} for t in kube.core.read_node(name).spec.taints or []]


def _foreign_pod(name: str, pool: str) -> dict[str, Any]:
    """Another team's whole-node GPU pod: it tolerates the GPU taint, as every GPU workload does."""
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"team": "other"}},
        "spec": {
            "nodeSelector": {POOL_LABEL: pool},
            "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {GPU_RESOURCE: "8"}}}],
        },
    }


def _unschedulable_message(pod: client.V1Pod) -> str:
    for c in (pod.status.conditions if pod.status else None) or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return str(c.message or "")
    return ""


def test_foreign_gpu_pod_stays_off_the_claimed_gang_and_the_runs_own_pods_land(
        kube: Kube, namespace: str, kwok_nodes: NodeFactory, step_api: client.ApiClient,
        janitor_api: client.ApiClient) -> None:
    pool, names = kwok_nodes(3, gpus=8, accelerator=ACCEL, zone=ZONE)
    wait_until("nodes Ready", lambda: all(_ready(kube, n) for n in names), timeout=30)
    gang, free = names[:2], names[2]
    run_id = f"Iso-Run/{uuid.uuid4().hex[:8]}"  # label_safe maps it; the taint value must be the same mapping

    for n in gang:
        node = read_node(kube.api, n)
        assert node is not None and claim(step_api, node, run_id, time.time() + 600, namespace=namespace)
    for n in gang:
        taints = _taints(kube, n)
        assert run_taint(run_id, namespace) in taints, taints
        assert GPU_TAINT in taints  # the claim kept the node's own taints
        assert labels_of(read_node(kube.api, n) or {})[LABEL_RUN_ID] == label_safe(run_id)
    other = read_node(kube.api, gang[0])
    assert other is not None and not claim(step_api, other, "another-run", time.time() + 600, namespace=namespace)
    assert [t for t in _taints(kube, gang[0]) if is_claim_taint(t)] == [run_taint(run_id, namespace)]

    # Another team submits two whole-node GPU pods to the pool while the gang is claimed and Ready.
    for i in range(2):
        kube.core.create_namespaced_pod(namespace, _foreign_pod(f"foreign-{i}", pool))

    def placed() -> tuple[client.V1Pod, client.V1Pod] | None:
        pods = [kube.core.read_namespaced_pod(f"foreign-{i}", namespace) for i in range(2)]
        bound = [p for p in pods if p.spec.node_name]
        refused = [p for p in pods if _unschedulable_message(p)]
        return (bound[0], refused[0]) if len(bound) == 1 and len(refused) == 1 else None

    landed, refused = wait_until("one foreign pod bound, the other refused by the scheduler", placed, timeout=30)
    assert landed.spec.node_name == free
    # the gang's nodes have all their GPUs free: only the claim taint keeps the pod away (the scheduler's
    # message counts untolerated taints without naming them; releasing the node below proves which one)
    assert "untolerated taint" in _unschedulable_message(refused)

    # The run's own job: the manifest the train step creates, as the controller's identity.
    cap = Capacity(run_id, (Placement(pool, ZONE, tuple(gang)),), 8, ACCEL, spot=False, namespace=namespace)
    name = pytorchjob.job_name(run_id, "iso")
    tpl = JobTemplate(name="iso", annotations={pytorchjob.SIM_DURATION_ANNOTATION: "600s"})
    body = pytorchjob.manifest(name, capacity=cap, template=tpl,
                               labels={LABEL_RUN_ID: label_safe(run_id)}, nodes=2, checkpoint_uri="",
                               resume_step=0, run_id=run_id, pin=True)
    pytorchjob.create_or_get(step_api, namespace, body)

    def job_nodes() -> list[str]:
        pods = kube.core.list_namespaced_pod(namespace, label_selector=f"{ownership.JOB_LABEL}={name}").items
        return sorted(p.spec.node_name for p in pods if p.spec.node_name) if len(pods) == 2 else []

    assert wait_until("the run's pods bound", lambda: len(job_nodes()) == 2 and job_nodes(), timeout=60) == sorted(gang)
    assert not kube.core.read_namespaced_pod(refused.metadata.name, namespace).spec.node_name

    # Release: the job goes, the janitor's unclaim removes the taint, and the waiting pod may have the node.
    pytorchjob.delete(step_api, namespace, name)
    assert pytorchjob.wait_gone(step_api, namespace, name, timeout_s=60)
    assert unclaim(janitor_api, gang[0])
    assert not any(is_claim_taint(t) for t in _taints(kube, gang[0]))
    assert GPU_TAINT in _taints(kube, gang[0])
    assert LABEL_RUN_ID not in labels_of(read_node(kube.api, gang[0]) or {})
    bound = wait_until("the waiting foreign pod lands on the released node",
                       lambda: kube.core.read_namespaced_pod(refused.metadata.name, namespace).spec.node_name,
                       timeout=30)
    assert bound == gang[0]
    assert unclaim(janitor_api, gang[1]) and not unclaim(janitor_api, "no-such-node-" + uuid.uuid4().hex[:6])
