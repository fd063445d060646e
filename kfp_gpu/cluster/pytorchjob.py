"""The Training Operator v1 PyTorchJob the train step runs: manifest, create-or-attach, delete.

The manifest is a plain dict rendered from the JobTemplate (kubeflow-training SDK models are converted into
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
import queue
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu.cluster.capacity import Capacity
from kfp_gpu.cluster.kube import get_custom
from kfp_gpu.errors import CrdMissing
from kfp_gpu.job import JobTemplate
from kfp_gpu.job_fields import GPU_RESOURCE, SHM_PATH, SHM_VOLUME
from kfp_gpu.plan.kueue import QUEUE_LABEL
from kfp_gpu.providers.base import label_safe

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"
JOB_LABEL = "kfp-gpu.io/job"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
SIM_DURATION_ANNOTATION = "kfp-gpu.io/sim-duration"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
ENV_CHECKPOINT_URI = "KFP_GPU_CHECKPOINT_URI"
ENV_RESUME_STEP = "KFP_GPU_RESUME_STEP"
ENV_RUN_ID = "KFP_GPU_RUN_ID"
ENV_DATASET_URI = "KFP_GPU_DATASET_URI"
_OWN_ENV = (ENV_CHECKPOINT_URI, ENV_RESUME_STEP, ENV_RUN_ID, ENV_DATASET_URI)


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
    checkpoint_uri: str, resume_step: int, run_id: str, dataset_uri: str = "",
    gang_nodes: Sequence[str] = (), pod_annotations: Mapping[str, str] | None = None, local: bool = False,
    queue: str = "",
) -> dict[str, Any]:
    """The PyTorchJob body for one attempt: the user's template plus kfp-gpu's placement and bookkeeping.

    kfp-gpu's parts win where they meet the user's: ownership labels, the node's GPUs, the gang's node
    selector and affinity (ANDed with the user's node affinity), the run's toleration (the user's are added),
    the checkpoint/resume env. ``pod_annotations`` are added to every pod template, over the template's;
    ``local`` (the local rehearsal) adds the default ``kfp-gpu.io/sim-duration`` under both. ``queue`` (a Kueue
    LocalQueue) labels the job with ``kueue.x-k8s.io/queue-name`` (over the template's) and creates it suspended.
    """
    env = [{"name": k, **v} if isinstance(v, dict) else {"name": k, "value": v}
           for k, v in template.env if k not in _OWN_ENV]
    env += [
        {"name": ENV_CHECKPOINT_URI, "value": checkpoint_uri},
        {"name": ENV_RESUME_STEP, "value": str(resume_step)},
        {"name": ENV_RUN_ID, "value": run_id},
        {"name": ENV_DATASET_URI, "value": dataset_uri},
    ]
    job_labels = {**dict(template.labels), **labels, JOB_LABEL: name}
    resources: dict[str, Any] = {k: dict(v) for k, v in template.resources.items()}
    resources.setdefault("limits", {})[GPU_RESOURCE] = str(capacity.gpus_per_node)
    mounts = [dict(m) for m in template.volume_mounts]
    volumes = [dict(v) for v in template.volumes]
    if template.shm_size:
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": template.shm_size}})
        mounts.append({"name": SHM_VOLUME, "mountPath": SHM_PATH})
    container: dict[str, Any] = {
        **template.container_extra,
        "name": "pytorch",  # the operator requires this container name
        "image": template.image,
        "command": list(template.command),
        "args": list(template.args),
        "env": env,
        "resources": resources,
    }
    if mounts:
        container["volumeMounts"] = mounts
    tolerations = list(capacity.tolerations())
    tolerations += [t for t in template.tolerations if t not in tolerations]
    pod_spec: dict[str, Any] = {
        **template.pod_extra,
        "restartPolicy": "Never",
        "nodeSelector": capacity.node_selector(),
        "tolerations": tolerations,
        "containers": [container],
    }
    if volumes:
        pod_spec["volumes"] = volumes
    if template.service_account:
        pod_spec["serviceAccountName"] = template.service_account
    if template.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in template.image_pull_secrets]
    affinity = node_affinity(template.node_affinity, gang_nodes)
    if affinity:
        pod_spec["affinity"] = {"nodeAffinity": affinity}
    annotations = {**({SIM_DURATION_ANNOTATION: "2s"} if local else {}), **dict(template.annotations),
                   **(pod_annotations or {})}

    def replica(count: int) -> dict[str, Any]:
        return {
            "replicas": count, "restartPolicy": "Never",
            "template": {"metadata": {"labels": dict(job_labels), "annotations": dict(annotations)},
                         "spec": pod_spec},
        }

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
                     "annotations": {**dict(template.annotations), "kfp-gpu.io/run-id-raw": run_id,
                                     "kfp-gpu.io/resume-step": str(resume_step)}},
        "spec": spec,
    }


def node_affinity(user: Mapping[str, Any], gang_nodes: Sequence[str]) -> dict[str, Any]:
    """The user's node affinity ANDed with the gang pin: the Node's ``metadata.name`` is one of the gang's (a field
    match, since the ``kubernetes.io/hostname`` label need not equal the Node name and autoscaler-made nodes may
    lack it). A field match takes one value, so the pin is one term per gang node.

    Node selector terms are ORed, so every user term is repeated with each node's field match; preferred terms
    are kept.
    """
    out = {k: v for k, v in user.items() if k != REQUIRED}
    terms = [dict(t) for t in (user.get(REQUIRED) or {}).get("nodeSelectorTerms") or [{}]]
    if gang_nodes:
        terms = [{**t, "matchFields": [*(t.get("matchFields") or []),
                                       {"key": "metadata.name", "operator": "In", "values": [n]}]}
                 for t in terms for n in sorted(gang_nodes)]
    if any(terms):
        out[REQUIRED] = {"nodeSelectorTerms": terms}
    return out


def get(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The job, or None when it does not exist. Raises: ApiException (non-404)."""
    return get_custom(api, GROUP, VERSION, namespace, PLURAL, name)


def create_or_get(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create the job, or return the existing one of that name (re-attach). Returns (job, created).

    Raises:
        CrdMissing: the cluster does not serve PyTorchJob kubeflow.org/v1 (Training Operator not installed).
        ApiException: any other API error.
    """
    name = body["metadata"]["name"]
    existing = get(api, namespace, name)
    if existing is not None and not existing["metadata"].get("deletionTimestamp"):
        return existing, False
    try:
        obj: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body)
        return obj, True
    except ApiException as exc:
        if exc.status == 404 and not served(api):
            raise crd_missing() from None
        if exc.status != 409:
            raise
        again = get(api, namespace, name)
        if again is None:
            raise
        return again, False


def served(api: client.ApiClient, group: str = GROUP, version: str = VERSION, plural: str = PLURAL) -> bool:
    """True when the API server serves ``plural`` in ``group/version`` (pytorchjobs in kubeflow.org/v1), by
    discovery, which every authenticated user may read.

    Raises: ApiException (other than 404).
    """
    try:
        doc = api.call_api(f"/apis/{group}/{version}", "GET", response_type="object", auth_settings=["BearerToken"],
                           _return_http_data_only=True, _request_timeout=10)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return any(r.get("name") == plural for r in (doc or {}).get("resources") or [])


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
    try:
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name,
            body=client.V1DeleteOptions(propagation_policy="Foreground"))
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


def force_delete_pods(api: client.ApiClient, namespace: str, names: Sequence[str]) -> list[str]:
    """Delete pods with grace 0 (pods stuck Terminating on a vanished node). Raises: ApiException."""
    core = client.CoreV1Api(api)
    done = []
    for n in names:
        try:
            core.delete_namespaced_pod(n, namespace, grace_period_seconds=0,
                                       body=client.V1DeleteOptions(grace_period_seconds=0))
            done.append(n)
        except ApiException as exc:
            if exc.status != 404:
                raise
    return done


def wait_gone(
    api: client.ApiClient, namespace: str, name: str, *, timeout_s: float, clock: Callable[[], float] = time.time,
) -> bool:
    """Wait (by pod and job watches) until the job and its pods are gone, force-deleting (grace 0) pods
    stuck Terminating on a node that no longer exists. True when all is gone in ``timeout_s``.

    Raises: ApiException.
    """
    from kfp_gpu.cluster.watch import Event, custom_watcher, pod_watcher

    q: queue.Queue[Event] = queue.Queue()
    w_pods = pod_watcher(api, q, namespace, f"{JOB_LABEL}={name}").start()
    w_job = custom_watcher(api, q, GROUP, VERSION, namespace, PLURAL, name).start()
    pods: dict[str, dict[str, Any]] = {}
    forced: set[str] = set()
    deadline = clock() + timeout_s
    try:
        w_pods.synced.wait(timeout_s)
        w_job.synced.wait(timeout_s)
        job_alive = get(api, namespace, name) is not None
        while True:
            if not job_alive and not pods:
                return True
            stuck = [n for n, p in pods.items() if n not in forced and (p.get("metadata") or {}).get(
                "deletionTimestamp") and _node_gone(api, str((p.get("spec") or {}).get("nodeName") or ""))]
            if stuck:
                force_delete_pods(api, namespace, stuck)
                forced.update(stuck)
            left = deadline - clock()
            if left <= 0:
                return False
            try:
                ev = q.get(timeout=min(left, 2.0))
            except queue.Empty:
                job_alive = job_alive and get(api, namespace, name) is not None
                continue
            oname = str((ev.obj.get("metadata") or {}).get("name", ""))
            if ev.source == "pod":
                if ev.type == "DELETED":
                    pods.pop(oname, None)
                else:
                    pods[oname] = ev.obj
            elif ev.source == "job":
                job_alive = ev.type != "DELETED"
    finally:
        w_pods.stop()
        w_job.stop()


def _node_gone(api: client.ApiClient, node: str) -> bool:
    """True when ``node`` is empty (never bound) or no longer exists. Raises: ApiException (non-404)."""
    if not node:
        return True
    try:
        client.CoreV1Api(api).read_node(node)
        return False
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
