"""A training job as a namespaced custom object, whatever its kind: create-or-attach, get, delete, wait gone.

One implementation for every job kind (PyTorchJob ``kubeflow.org/v1``, TrainJob ``trainer.kubeflow.org/v1alpha1``):
a :class:`Resource` names the kind's group, version and plural, and its pods are found by the job label
(:data:`kfp_gpu.cluster.podtemplate.JOB_LABEL`) kfp-gpu puts on every pod it renders.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu.cluster.kube import get_custom
from kfp_gpu.errors import CrdMissing
from kfp_gpu.ownership import JOB_LABEL


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


def get(api: client.ApiClient, res: Resource, namespace: str, name: str) -> dict[str, Any] | None:
    """The job, or None when it does not exist. Raises: ApiException (non-404)."""
    return get_custom(api, res.group, res.version, namespace, res.plural, name)


def create_or_get(api: client.ApiClient, res: Resource, namespace: str, body: dict[str, Any],
                  missing: Callable[[], CrdMissing]) -> tuple[dict[str, Any], bool]:
    """Create the job, or return the existing one of that name (re-attach). Returns (job, created).

    Raises:
        CrdMissing: ``missing()``, when the cluster does not serve the resource.
        ApiException: any other API error (an admission webhook's refusal is a 400/403/422 with its message).
    """
    name = body["metadata"]["name"]
    existing = get(api, res, namespace, name)
    if existing is not None and not existing["metadata"].get("deletionTimestamp"):
        return existing, False
    try:
        obj: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
            res.group, res.version, namespace, res.plural, body)
        return obj, True
    except ApiException as exc:
        if exc.status == 404 and not served(api, res.group, res.version, res.plural):
            raise missing() from None
        if exc.status != 409:
            raise
        again = get(api, res, namespace, name)
        if again is None:
            raise
        return again, False


def served(api: client.ApiClient, group: str, version: str, plural: str) -> bool:
    """True when the API server serves ``plural`` in ``group/version``, by discovery, which every authenticated
    user may read.

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


def delete(api: client.ApiClient, res: Resource, namespace: str, name: str) -> bool:
    """Foreground-delete the job (its pods go first). False when it was already gone. Raises: ApiException."""
    try:
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            res.group, res.version, namespace, res.plural, name,
            body=client.V1DeleteOptions(propagation_policy="Foreground"))
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


def list_for(api: client.ApiClient, res: Resource, namespace: str, selector: str) -> list[dict[str, Any]]:
    """Jobs of this kind matching ``selector``; none when the resource is not served. Raises: ApiException."""
    try:
        out = client.CustomObjectsApi(api).list_namespaced_custom_object(
            res.group, res.version, namespace, res.plural, label_selector=selector)
    except ApiException as exc:
        if exc.status == 404:
            return []
        raise
    return list(out.get("items") or [])


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
    api: client.ApiClient, res: Resource, namespace: str, name: str, *, timeout_s: float,
    clock: Callable[[], float] = time.time,
) -> bool:
    """Wait (by pod and job watches) until the job and its pods are gone, force-deleting (grace 0) pods
    stuck Terminating on a node that no longer exists. True when all is gone in ``timeout_s``.

    Raises: ApiException.
    """
    from kfp_gpu.cluster.watch import Event, custom_watcher, pod_watcher

    q: queue.Queue[Event] = queue.Queue()
    w_pods = pod_watcher(api, q, namespace, f"{JOB_LABEL}={name}").start()
    w_job = custom_watcher(api, q, res.group, res.version, namespace, res.plural, name).start()
    pods: dict[str, dict[str, Any]] = {}
    forced: set[str] = set()
    deadline = clock() + timeout_s
    try:
        w_pods.synced.wait(timeout_s)
        w_job.synced.wait(timeout_s)
        job_alive = get(api, res, namespace, name) is not None
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
                job_alive = job_alive and get(api, res, namespace, name) is not None
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
