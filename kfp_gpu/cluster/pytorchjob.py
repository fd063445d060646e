"""The Training Operator v1 PyTorchJob the train step runs: manifest, create-or-attach, delete.

The pod is the one every job kind runs (:func:`kfp_gpu.cluster.podtemplate.pod_template`); create, get, delete and
wait-gone are the kind-neutral ones of :mod:`kfp_gpu.cluster.customjob`. The manifest is a plain dict rendered from
the JobTemplate (kubeflow-training SDK models are converted into
a JobTemplate first, see :mod:`kfp_gpu.training_models`). Gang safety:
``runPolicy.schedulingPolicy.minAvailable`` = nodes (honoured by a gang scheduler when the operator runs
with one), one Master + (nodes - 1) Workers each asking for the node's GPUs, pinned to the provisioned
pool by node selector *and* to the exact gang nodes by node affinity. ``restartPolicy: Never`` and
``backoffLimit: 0`` leave every restart decision to kfp-gpu's own budget (the operator does not count
preemptions, see docs/architecture.md). On a Kueue-gated namespace the job carries the LocalQueue's
``kueue.x-k8s.io/queue-name`` label and is created suspended: Kueue unsuspends it once its Workload is admitted.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client

from kfp_gpu.cluster import customjob, podtemplate
from kfp_gpu.cluster.capacity import Capacity
from kfp_gpu.cluster.podtemplate import (  # noqa: F401 - re-exported: the names callers know this module by
    ENV_CHECKPOINT_URI,
    ENV_DATASET_URI,
    ENV_RESUME_FORMAT,
    ENV_RESUME_PATH,
    ENV_RESUME_STEP,
    ENV_RUN_ID,
    REQUIRED,
    SIM_DURATION_ANNOTATION,
    node_affinity,
)
from kfp_gpu.errors import CrdMissing
from kfp_gpu.job import JobTemplate
from kfp_gpu.ownership import JOB_LABEL, RESUME_STEP_ANNOTATION, RUN_ID_RAW_ANNOTATION, label_safe
from kfp_gpu.plan import topology
from kfp_gpu.plan.kueue import QUEUE_LABEL

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"
RESOURCE = customjob.Resource(GROUP, VERSION, PLURAL, KIND)
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
CONTAINER = "pytorch"  # the operator requires this container name


def job_name(run_id: str, template: str) -> str:
    """Deterministic, DNS-1035-safe job name from the run id and template name (<= 50 chars).

    The operator derives pod and service names (``<job>-worker-12``) from it, so it stays short.
    """
    digest = hashlib.sha1(f"{run_id}/{template}".encode()).hexdigest()[:8]
    stem = "".join(c if c.isalnum() else "-" for c in label_safe(run_id).lower())[:20].strip("-")
    name = f"{stem}-{digest}-{label_safe(template)[:20]}".lower().replace("_", "-").replace(".", "-")
    if not name[0].isalpha():
        name = "r" + name
    return name.strip("-")[:50].rstrip("-")


def manifest(
    name: str, *, capacity: Capacity, template: JobTemplate, labels: Mapping[str, str], nodes: int,
    checkpoint_uri: str, resume_step: int = 0, run_id: str, dataset_uri: str = "",
    pin: bool = False, pod_annotations: Mapping[str, str] | None = None, local: bool = False,
    queue: str = "", resume: Any = None,
) -> dict[str, Any]:
    """The PyTorchJob body for one attempt: the user's template plus kfp-gpu's placement and bookkeeping.

    The pod is :func:`kfp_gpu.cluster.podtemplate.pod_template`'s (container ``pytorch``): kfp-gpu's parts win
    where they meet the user's. ``resume`` is the checkpoint record the job resumes from (None: a fresh start, or
    only ``resume_step`` known); it fills the resume env and appends the template's ``resume_args``. ``queue`` (a
    Kueue LocalQueue) labels the job with ``kueue.x-k8s.io/queue-name`` (over the template's) and creates it
    suspended.

    Raises: InvalidSpec (a ``resume_args`` entry names an unknown field).
    """
    if resume is None and resume_step:
        resume = _Step(resume_step)
    job_labels = {**dict(template.labels), **labels, JOB_LABEL: name}
    env = podtemplate.container_env(template, podtemplate.own_env(
        checkpoint_uri=checkpoint_uri, resume=resume, run_id=run_id, dataset_uri=dataset_uri))
    grouped = {**(pod_annotations or {}), **topology.group_annotations(pod_annotations or {}, name, min(nodes, 2))}
    pod = podtemplate.pod_template(
        template, capacity, container=CONTAINER, labels=job_labels, env=env,
        args=podtemplate.resume_args(template, resume), pin=pin, pod_annotations=grouped,
        local=local)

    # the restart policy is the replica's: the Training Operator sets it on each pod, and posts a Warning Event per
    # pod it creates when the template carries one too ("will be overwritten by restart policy in replica spec")
    pod_spec = {k: v for k, v in pod["spec"].items() if k != "restartPolicy"}

    def replica(count: int) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": "Never",
                "template": {"metadata": {"labels": dict(pod["metadata"]["labels"]),
                                          "annotations": dict(pod["metadata"]["annotations"])},
                             "spec": pod_spec}}

    specs: dict[str, Any] = {"Master": replica(1)}
    if nodes > 1:
        specs["Worker"] = replica(nodes - 1)
    run_policy: dict[str, Any] = {"cleanPodPolicy": "None", "backoffLimit": 0,
                                  "schedulingPolicy": {"minAvailable": nodes}}
    meta_labels = dict(job_labels)
    if queue:
        run_policy["suspend"] = True  # Kueue admits it; no pods before (its webhook would set this too)
        meta_labels[QUEUE_LABEL] = queue
    spec: dict[str, Any] = {"runPolicy": run_policy, "pytorchReplicaSpecs": specs}
    if template.nproc_per_node:
        spec["nprocPerNode"] = str(template.nproc_per_node)
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
        "metadata": {"name": name, "labels": meta_labels,
                     "annotations": {**dict(template.annotations), RUN_ID_RAW_ANNOTATION: run_id,
                                     RESUME_STEP_ANNOTATION: str(podtemplate.resume_step(resume))}},
        "spec": spec,
    }


class _Step:
    """A resume known only by its step (callers that pass ``resume_step``)."""

    def __init__(self, step: int) -> None:
        self.step = step


def get(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The job, or None when it does not exist. Raises: ApiException (non-404)."""
    return customjob.get(api, RESOURCE, namespace, name)


def create_or_get(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create the job, or return the existing one of that name (re-attach). Returns (job, created).

    Raises:
        CrdMissing: the cluster does not serve PyTorchJob kubeflow.org/v1 (Training Operator not installed).
        ApiException: any other API error.
    """
    return customjob.create_or_get(api, RESOURCE, namespace, body, crd_missing)


def served(api: client.ApiClient, group: str = GROUP, version: str = VERSION, plural: str = PLURAL) -> bool:
    """True when the API server serves ``plural`` in ``group/version`` (pytorchjobs in kubeflow.org/v1), by
    discovery. Raises: ApiException (other than 404)."""
    return customjob.served(api, group, version, plural)


def crd_missing() -> CrdMissing:
    return CrdMissing(
        f"the cluster has no {KIND} {GROUP}/{VERSION} resource (CustomResourceDefinition {PLURAL}.{GROUP} is not "
        "installed)",
        remediation="install the Kubeflow Training Operator v1: kubectl apply --server-side -k "
        "\"github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.3\" "
        "(the local dev cluster installs it on make cluster-up)",
        crd=f"{PLURAL}.{GROUP}",
    )


def delete(api: client.ApiClient, namespace: str, name: str) -> bool:
    """Foreground-delete the job (its pods go first). False when it was already gone. Raises: ApiException."""
    return customjob.delete(api, RESOURCE, namespace, name)


force_delete_pods = customjob.force_delete_pods


def wait_gone(
    api: client.ApiClient, namespace: str, name: str, *, timeout_s: float, clock: Callable[[], float] = time.time,
) -> bool:
    """Wait until the job and its pods are gone (:func:`kfp_gpu.cluster.customjob.wait_gone`). Raises: ApiException."""
    return customjob.wait_gone(api, RESOURCE, namespace, name, timeout_s=timeout_s, clock=clock)
