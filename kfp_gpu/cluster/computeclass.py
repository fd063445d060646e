"""The Kubernetes side of GKE's custom ComputeClass (``cloud.google.com/v1``, cluster-scoped): is the API served,
create/read/delete a class, and a list/watch of the class's nodes (:class:`ClassNodes`, one
:class:`kfp_gpu.cluster.listwatch.Watcher`). Decisions are :mod:`kfp_gpu.plan.computeclass`'s."""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu.cluster.kube import crd_version_served
from kfp_gpu.cluster.listwatch import ERROR, Event, Watcher
from kfp_gpu.plan import computeclass as plan

Obj = dict[str, Any]


def crd_served(api: client.ApiClient) -> bool:
    """True when the cluster serves ComputeClasses at cloud.google.com/v1. Raises: ApiException (non-404)."""
    return crd_version_served(api, plan.CRD_NAME, plan.VERSION)


def _custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def get_class(api: client.ApiClient, name: str) -> Obj | None:
    """The ComputeClass ``name``, None when absent. Raises: ApiException (non-404)."""
    try:
        out: Obj = _custom(api).get_cluster_custom_object(plan.GROUP, plan.VERSION, plan.PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return out


def ensure_class(api: client.ApiClient, body: Mapping[str, Any]) -> Obj:
    """Create the class; an existing one of the same name gets ``body``'s spec (a retried step converges).
    Raises: ApiException (404: the API is not served)."""
    try:
        out: Obj = _custom(api).create_cluster_custom_object(plan.GROUP, plan.VERSION, plan.PLURAL, dict(body))
        return out
    except ApiException as exc:
        if exc.status != 409:
            raise
    name = str(body["metadata"]["name"])
    patched: Obj = _custom(api).patch_cluster_custom_object(plan.GROUP, plan.VERSION, plan.PLURAL, name,
                                                             {"spec": body["spec"]})
    return patched


def list_classes(api: client.ApiClient, selector: str) -> list[Obj]:
    """Classes matching ``selector``; [] when the API is not served. Raises: ApiException (non-404)."""
    try:
        body = _custom(api).list_cluster_custom_object(plan.GROUP, plan.VERSION, plan.PLURAL, label_selector=selector)
    except ApiException as exc:
        if exc.status == 404:
            return []
        raise
    return list(body.get("items") or [])


def delete_class(api: client.ApiClient, name: str) -> bool:
    """Delete the class; False when it was gone. Raises: ApiException (non-404)."""
    try:
        _custom(api).delete_cluster_custom_object(plan.GROUP, plan.VERSION, plan.PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


class ClassNodes:
    """The nodes GKE brought for the class ``name`` (label ``cloud.google.com/compute-class``), kept current by one
    list/watch loop; ``wait`` blocks until the next change. A refused watch is kept in ``error``."""

    def __init__(self, api: client.ApiClient, name: str) -> None:
        self.nodes: dict[str, Obj] = {}
        self.error: Any = None
        self._lock = threading.Lock()
        self._changed: queue.Queue[None] = queue.Queue()
        self._watcher = Watcher(f"cc-nodes-{name}", client.CoreV1Api(api).list_node, self._on,
                                label_selector=f"{plan.CLASS_LABEL}={name}")

    def start(self) -> ClassNodes:
        self._watcher.start()
        return self

    def stop(self) -> None:
        self._watcher.stop()

    def _on(self, ev: Event) -> None:
        with self._lock:
            if ev.type == ERROR:
                self.error = ev.obj.get("error")
            else:
                name = str((ev.obj.get("metadata") or {}).get("name", ""))
                if ev.type == "DELETED":
                    self.nodes.pop(name, None)
                elif name:
                    self.nodes[name] = ev.obj
        self._changed.put(None)

    def snapshot(self) -> list[Obj]:
        with self._lock:
            return list(self.nodes.values())

    def wait(self, timeout_s: float) -> None:
        try:
            self._changed.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return
        while not self._changed.empty():  # coalesce a burst
            self._changed.get_nowait()
