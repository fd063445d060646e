"""Balloon pods: placeholder pods sized to whole GPU nodes in a negative-priority PriorityClass.

This is the cluster-autoscaler overprovisioning pattern: balloons hold warm GPU nodes, and any real pod
(priority >= 0) preempts them through the scheduler. Every balloon carries the run's ownership labels.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu import fanout
from kfp_gpu.cluster import node_labels
from kfp_gpu.cluster.kube import ignore_404
from kfp_gpu.cluster.nodes import GPU, run_toleration
from kfp_gpu.ownership import BALLOON_LABEL, LABEL_MANAGED, LABEL_RUN_ID, Owner, label_safe

PRIORITY_CLASS = "kfp-gpu-balloon"
PRIORITY_VALUE = -10
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


def ensure_priority_class(api: client.ApiClient) -> None:
    """Create the negative PriorityClass if missing (idempotent). Raises: ApiException (non-409)."""
    body = client.V1PriorityClass(
        metadata=client.V1ObjectMeta(name=PRIORITY_CLASS, labels={LABEL_MANAGED: "true"}),
        value=PRIORITY_VALUE, preemption_policy="Never", global_default=False,
        description="kfp-gpu warm-pool balloons: any real workload preempts them",
    )
    try:
        client.SchedulingV1Api(api).create_priority_class(body)
    except ApiException as exc:
        if exc.status != 409:
            raise


def balloon_name(run_id: str, index: int) -> str:
    return f"kfp-gpu-balloon-{label_safe(run_id)[:40]}-{index}".lower().replace("_", "-").replace(".", "-")


def create_balloons(api: client.ApiClient, namespace: str, owner: Owner, count: int, gpus_per_node: int,
                    accelerator: str, pools: list[str], scheme: str = "gke") -> list[str]:
    """Create ``count`` balloons (existing ones are kept: idempotent by name) on ``accelerator`` (catalog name) nodes
    of ``pools``, selected in the label keys of ``scheme`` (:mod:`kfp_gpu.cluster.node_labels`).

    Raises: ApiException, KeyError (unknown scheme), InvalidSpec (unknown accelerator).
    """
    core = client.CoreV1Api(api)
    sch = node_labels.get(scheme)
    exprs = [client.V1NodeSelectorRequirement(**r) for r in sch.accelerator_requirements(accelerator)]
    if pools:
        exprs.append(client.V1NodeSelectorRequirement(**sch.pool_requirement(pools)))
    affinity = client.V1Affinity(node_affinity=client.V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=client.V1NodeSelector(node_selector_terms=[
            client.V1NodeSelectorTerm(match_expressions=exprs)])))
    def create(i: int) -> str:
        name = balloon_name(owner.run_id, i)
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels={**owner.labels(), BALLOON_LABEL: "true"}),
            spec=client.V1PodSpec(
                priority_class_name=PRIORITY_CLASS, termination_grace_period_seconds=0,
                node_selector=sch.accelerator_selector(accelerator) or None, affinity=affinity if exprs else None,
                # its own run's claim taint too: a balloon still Pending when scale-up claims the warm node it
                # was meant for must not look unschedulable (a cluster-autoscaler would add a node for it)
                tolerations=[client.V1Toleration(key=GPU, operator="Exists", effect="NoSchedule"),
                             client.V1Toleration(**run_toleration(owner.run_id, namespace))],
                containers=[client.V1Container(
                    name="balloon", image=PAUSE_IMAGE,
                    resources=client.V1ResourceRequirements(requests={GPU: str(gpus_per_node)},
                                                            limits={GPU: str(gpus_per_node)}),
                )],
            ),
        )
        try:  # read raw, not deserialised: a profile of 512 balloons spent two thirds of this call there
            _ = core.create_namespaced_pod(namespace, pod, _preload_content=False).data
        except ApiException as exc:
            if exc.status != 409:
                raise
        return name

    return fanout.run_all([functools.partial(create, i) for i in range(count)])


def list_balloons(api: client.ApiClient, namespace: str, run_id: str | None) -> list[dict[str, Any]]:
    """The balloon pods of ``run_id`` (all runs when None) as raw JSON objects, read from etcd. Raises:
    ApiException.

    Pods travel as raw JSON here and in :func:`delete_pods` (``_preload_content=False``): the client would
    deserialise every pod it lists or deletes into models, CPU that grows with the gang and competes with the
    job's creation (a pass over a gang of hundreds spent seconds there)."""
    selector = f"{BALLOON_LABEL}=true" + (f",{LABEL_RUN_ID}={label_safe(run_id)}" if run_id else "")
    raw = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector, _preload_content=False).data
    return list(json.loads(raw).get("items") or [])


def delete_pods(api: client.ApiClient, namespace: str, names: Sequence[str]) -> list[str]:
    """Delete the pods ``names`` at once (concurrently, no grace); returns those deleted, missing ones are a
    no-op. Raises: ApiException but 404."""
    core = client.CoreV1Api(api)

    def delete(name: str) -> bool:  # the body read, so the connection goes back to the pool
        return ignore_404(lambda: core.delete_namespaced_pod(name, namespace, grace_period_seconds=0,
                                                             _preload_content=False).data)

    ran = fanout.run_all([functools.partial(delete, n) for n in names])
    return [n for n, ok in zip(names, ran, strict=True) if ok]


def delete_balloons(api: client.ApiClient, namespace: str, run_id: str | None) -> list[str]:
    """Delete the balloons of ``run_id`` (all runs when None), concurrently; returns the names deleted. Missing
    ones are a no-op. Raises: ApiException but 404."""
    return delete_pods(api, namespace, [str(p["metadata"]["name"]) for p in list_balloons(api, namespace, run_id)])
