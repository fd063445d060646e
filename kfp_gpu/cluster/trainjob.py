"""The Kubeflow Trainer v2 TrainJob (``trainer.kubeflow.org/v1alpha1``) the train step runs: runtime, manifest.

A TrainJob names a runtime (``runtimeRef``: a ClusterTrainingRuntime, or a TrainingRuntime of the namespace) whose
JobSet template the Trainer fills in; the replicated job labelled ``trainer.kubeflow.org/trainjob-ancestor-step:
trainer`` runs ``trainer.numNodes`` pods of the container named ``node``. kfp-gpu renders the same pod as for a
PyTorchJob (:func:`kfp_gpu.cluster.podtemplate.pod_template`) and splits it the way Trainer v2.3 takes it:

- ``spec.trainer``: image, command, args (with the resume arguments), env (the user's + the resume variables),
  ``numNodes`` = the gang, ``resourcesPerNode`` (the node's GPUs), ``numProcPerNode``;
- ``spec.runtimePatches[manager=kfp-gpu.io/train]``: the pod's labels (ownership, job, attempt) and annotations
  (the template's, the provisioner's), node selector, the gang pin (node affinity on the gang's Node names),
  tolerations (incl. the run's claim taint), volumes, service account, pull secrets, security context, and the
  container's volume mounts; the JobSet's labels too.

Gang safety: the job is created only once every gang node is Ready and claimed, and each pod is pinned to the gang,
so the gang forms without a gang scheduler. Where the runtime declares a ``podGroupPolicy`` (coscheduling or
Volcano), the Trainer makes the PodGroup and sets the scheduler: kfp-gpu adds nothing of its own on top (no
scheduler name, no PodGroup, no minAvailable) and records the policy (:class:`Runtime`). On a Kueue-gated namespace
the TrainJob carries the LocalQueue label and is created with ``spec.suspend: true``.

Attempts: the Trainer's pods are owned by Jobs of a JobSet, not by the TrainJob, so every attempt carries a fresh
``kfp-gpu.io/attempt`` value on the TrainJob (annotation) and its pods (label); the watch matches them on it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu import ownership
from kfp_gpu.cluster import podtemplate
from kfp_gpu.cluster.capacity import Capacity
from kfp_gpu.cluster.customjob import Resource, served
from kfp_gpu.errors import CrdMissing, InvalidSpec
from kfp_gpu.job import JobTemplate
from kfp_gpu.ownership import ATTEMPT, RESUME_STEP_ANNOTATION, RUN_ID_RAW_ANNOTATION
from kfp_gpu.plan.kueue import QUEUE_LABEL

RESOURCE = Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob")
PATCH_MANAGER = "kfp-gpu.io/train"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
NODE_CONTAINER = "node"
RUNTIME_PLURALS = {"ClusterTrainingRuntime": "clustertrainingruntimes", "TrainingRuntime": "trainingruntimes"}
SUCCEEDED, FAILED = "Complete", "Failed"
#: the PodGroup API a runtime's podGroupPolicy needs served (scheduler-plugins' coscheduling, Volcano)
POD_GROUP_APIS = {"coscheduling": ("scheduling.x-k8s.io", "v1alpha1", "podgroups"),
                  "volcano": ("scheduling.volcano.sh", "v1beta1", "podgroups")}


@dataclass(frozen=True)
class Runtime:
    """What kfp-gpu reads from the TrainJob's runtime: where the trainer runs and how the runtime gang-schedules."""

    name: str
    kind: str = "ClusterTrainingRuntime"
    replicated_job: str = "node"  # the replicated job labelled as the trainer ancestor
    containers: tuple[str, ...] = (NODE_CONTAINER,)
    pod_group_policy: dict[str, Any] = field(default_factory=dict)  # {"coscheduling": {...}} | {"volcano": {...}}

    @property
    def gang_scheduler(self) -> str:
        """"coscheduling", "volcano" or "" (none: the gang pin alone keeps the gang together)."""
        return next(iter(self.pod_group_policy), "")


def read_runtime(api: client.ApiClient, namespace: str, name: str, kind: str) -> Runtime:
    """The runtime a TrainJob references, from the cluster.

    Raises:
        InvalidSpec: the runtime does not exist, or has no replicated job with a ``node`` container for the trainer.
        CrdMissing: the cluster does not serve the Trainer's runtimes (Trainer v2 not installed), or the PodGroup
            API the runtime's ``podGroupPolicy`` needs (scheduler-plugins' coscheduling, Volcano).
        ApiException: any other API error.
    """
    plural = RUNTIME_PLURALS[kind]
    api_obj = client.CustomObjectsApi(api)
    try:
        if kind == "ClusterTrainingRuntime":
            rt = api_obj.get_cluster_custom_object(RESOURCE.group, RESOURCE.version, plural, name)
        else:
            rt = api_obj.get_namespaced_custom_object(RESOURCE.group, RESOURCE.version, namespace, plural, name)
    except ApiException as exc:
        if exc.status != 404:
            raise
        if not served(api, RESOURCE.group, RESOURCE.version, plural):
            raise crd_missing() from None
        where = "the cluster" if kind == "ClusterTrainingRuntime" else f"namespace {namespace}"
        raise InvalidSpec("train.runtime", name, f"names no {kind} in {where}",
                          remediation=f"kubectl get {plural} -A lists them; pass runtime= (and runtime_kind=)") from None
    out = runtime_of(rt, name, kind)
    api_group = POD_GROUP_APIS.get(out.gang_scheduler)
    if api_group is not None and not served(api, *api_group):
        g, v, plural = api_group
        raise CrdMissing(f"{kind} {name} declares podGroupPolicy {out.gang_scheduler}, but the cluster has no "
                         f"{plural}.{g} ({g}/{v})", remediation=f"install the {out.gang_scheduler} scheduler and its "
                         "PodGroup CRD, or use a runtime without podGroupPolicy", crd=f"{plural}.{g}")
    return out


def runtime_of(rt: Mapping[str, Any], name: str, kind: str) -> Runtime:
    """A runtime object (ClusterTrainingRuntime / TrainingRuntime, as the API returns it) as a :class:`Runtime`.

    Raises: InvalidSpec when it has no trainer replicated job with a ``node`` container.
    """
    spec = rt.get("spec") or {}
    jobs = ((spec.get("template") or {}).get("spec") or {}).get("replicatedJobs") or []
    trainer = next((j for j in jobs if ((j.get("template") or {}).get("metadata") or {}).get("labels", {}).get(
        ANCESTOR_LABEL) == "trainer"), None) or next((j for j in jobs if j.get("name") == NODE_CONTAINER), None)
    containers = tuple(str(c.get("name")) for c in (((((trainer or {}).get("template") or {}).get("spec") or {})
                                                      .get("template") or {}).get("spec") or {}).get("containers") or [])
    if trainer is None or NODE_CONTAINER not in containers:
        raise InvalidSpec("train.runtime", name, f"{kind} has no trainer replicated job with a '{NODE_CONTAINER}' "
                          "container", remediation="use a torch runtime such as torch-distributed")
    return Runtime(name, kind, str(trainer.get("name")), containers, dict(spec.get("podGroupPolicy") or {}))


def attempt_id(name: str, now: float | None = None) -> str:
    """A fresh value for one attempt's ``kfp-gpu.io/attempt`` (a label value)."""
    return hashlib.sha1(f"{name}/{time.time() if now is None else now}".encode()).hexdigest()[:12]


def manifest(
    name: str, *, capacity: Capacity, template: JobTemplate, runtime: Runtime, labels: Mapping[str, str], nodes: int,
    checkpoint_uri: str, resume: Any, run_id: str, attempt: str, dataset_uri: str = "",
    pin: bool = False, pod_annotations: Mapping[str, str] | None = None, local: bool = False,
    queue: str = "",
) -> dict[str, Any]:
    """The TrainJob body for one attempt (see the module docstring).

    Raises: InvalidSpec (a ``resume_args`` entry names an unknown field).
    """
    job_labels = {**dict(template.labels), **labels, ownership.JOB_LABEL: name}
    env = podtemplate.container_env(template, podtemplate.own_env(
        checkpoint_uri=checkpoint_uri, resume=resume, run_id=run_id, dataset_uri=dataset_uri))
    pod = podtemplate.pod_template(
        template, capacity, container=NODE_CONTAINER, labels={**job_labels, ATTEMPT: attempt}, env=env,
        args=podtemplate.resume_args(template, resume), pin=pin, pod_annotations=pod_annotations,
        local=local)
    c = pod["spec"]["containers"][0]
    trainer: dict[str, Any] = {"image": c["image"], "command": c["command"], "env": c["env"], "numNodes": nodes,
                               "resourcesPerNode": c["resources"]}
    if c["args"]:
        trainer["args"] = c["args"]
    nproc = template.nproc_per_node
    if nproc == "gpu":
        trainer["numProcPerNode"] = capacity.gpus_per_node
    elif isinstance(nproc, str) and nproc.isdigit():
        trainer["numProcPerNode"] = int(nproc)
    pod_spec = {k: v for k, v in pod["spec"].items() if k not in ("containers", "restartPolicy")}
    patch_c = {"name": NODE_CONTAINER, **{k: c[k] for k in ("volumeMounts", "securityContext") if k in c}}
    if len(patch_c) > 1:
        pod_spec["containers"] = [patch_c]
    patch = {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {
        "metadata": {"labels": dict(job_labels)},
        "spec": {"replicatedJobs": [{"name": runtime.replicated_job, "template": {"spec": {"template": {
            "metadata": pod["metadata"], "spec": pod_spec}}}}]}}}}
    meta_labels = dict(job_labels)
    spec: dict[str, Any] = {"runtimeRef": {"apiGroup": RESOURCE.group, "kind": runtime.kind, "name": runtime.name},
                            "trainer": trainer, "runtimePatches": [patch]}
    if queue:
        spec["suspend"] = True  # Kueue admits it; no pods before
        meta_labels[QUEUE_LABEL] = queue
    return {
        "apiVersion": RESOURCE.api_version, "kind": RESOURCE.kind,
        "metadata": {"name": name, "labels": meta_labels,
                     "annotations": {**dict(template.annotations), RUN_ID_RAW_ANNOTATION: run_id,
                                     RESUME_STEP_ANNOTATION: str(podtemplate.resume_step(resume)),
                                     ATTEMPT: attempt}},
        "spec": spec,
    }


def conditions(job: Mapping[str, Any]) -> dict[str, str]:
    """The TrainJob's true conditions in the watch's words: ``Complete`` is ``Succeeded``; ``Failed`` stays."""
    out: dict[str, str] = {}
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") == "True":
            kind = "Succeeded" if c.get("type") == SUCCEEDED else str(c.get("type"))
            out[kind] = str(c.get("reason") or c.get("message") or "")
    return out


def crd_missing() -> CrdMissing:
    return CrdMissing(
        f"the cluster has no {RESOURCE.kind} {RESOURCE.api_version} resource (CustomResourceDefinition "
        f"{RESOURCE.plural}.{RESOURCE.group} is not installed)",
        remediation="install Kubeflow Trainer v2 (and JobSet): kubectl apply --server-side -k "
        "\"github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.0\" (the local dev cluster installs "
        "it with make cluster-up), or use kind='pytorchjob'",
        crd=f"{RESOURCE.plural}.{RESOURCE.group}",
    )
