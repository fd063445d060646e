"""ProvisioningRequests (autoscaling.x-k8s.io/v1) and their PodTemplates on the Kubernetes API.

A request is immutable once created, so "idempotent by run id" is a deterministic name
(:func:`kfp_gpu.plan.provreq.request_name`): creating twice finds the first (409 -> read it). The PodTemplate
is created *before* the request (a request whose template is missing fails at once: kueue#3957), and both
carry the run's ownership labels, so teardown and the janitor find them by label. Conditions are read
through :class:`RequestWatch`, which is the one list/watch loop (:mod:`kfp_gpu.cluster.listwatch`) on a
single request.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu.cluster.kube import get_custom, ignore_404
from kfp_gpu.cluster.listwatch import ERROR, Event, Watcher
from kfp_gpu.plan.provreq import CRD_NAME, GROUP, KIND, PLURAL, VERSION

AUTOSCALER_STATUS = ("kube-system", "cluster-autoscaler-status")  # written by cluster-autoscaler every loop
AUTOSCALER_FRESH_S = 300.0


def create(api: client.ApiClient, namespace: str, name: str, *, pod_spec: Mapping[str, Any], count: int,
           klass: str, parameters: Mapping[str, str], labels: Mapping[str, str]) -> dict[str, Any]:
    """Create the PodTemplate, then the request, both named ``name`` (an existing one is re-used: a retried
    step re-attaches). Returns the request as the API server has it.

    Raises: ApiException (non-409), e.g. 404 when the ProvisioningRequest API is not served.
    """
    meta = {"name": name, "namespace": namespace, "labels": dict(labels)}
    template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": meta,
                "template": {"metadata": {"labels": dict(labels)}, "spec": dict(pod_spec)}}
    try:
        client.CoreV1Api(api).create_namespaced_pod_template(namespace, template)
    except ApiException as exc:
        if exc.status != 409:
            raise
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": meta,
            "spec": {"provisioningClassName": klass, "parameters": dict(parameters),
                     "podSets": [{"podTemplateRef": {"name": name}, "count": int(count)}]}}
    custom = client.CustomObjectsApi(api)
    try:
        created: dict[str, Any] = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        return created
    except ApiException as exc:
        if exc.status != 409:
            raise
    got: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return got


def get(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The request, or None when it is gone. Raises: ApiException (non-404)."""
    return get_custom(api, GROUP, VERSION, namespace, PLURAL, name)


def delete(api: client.ApiClient, namespace: str, name: str) -> bool:
    """Delete the request and its PodTemplate. True when the request existed. Raises: ApiException (non-404)."""
    existed = ignore_404(lambda: client.CustomObjectsApi(api).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name))
    ignore_404(lambda: client.CoreV1Api(api).delete_namespaced_pod_template(name, namespace))
    return existed


def delete_labelled(api: client.ApiClient, namespace: str, selector: str) -> list[str]:
    """Delete every request and PodTemplate in ``namespace`` matching ``selector``. Returns ``namespace/name`` of
    the requests deleted; a cluster without the API has none.

    Raises: ApiException other than 404.
    """
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    gone: list[str] = []
    try:
        reqs = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, label_selector=selector)
    except ApiException as exc:
        if exc.status != 404:
            raise
        reqs = {"items": []}
    for r in reqs.get("items", []):
        name = str(r["metadata"]["name"])
        if ignore_404(functools.partial(custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                                         name)):
            gone.append(f"{namespace}/{name}")
    for t in core.list_namespaced_pod_template(namespace, label_selector=selector).items:
        ignore_404(functools.partial(core.delete_namespaced_pod_template, t.metadata.name, namespace))
    return gone


def api_served(api: client.ApiClient) -> bool:
    """True when the cluster serves ProvisioningRequests (the CRD exists). Raises: ApiException (non-404)."""
    try:
        client.ApiextensionsV1Api(api).read_custom_resource_definition(CRD_NAME)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


def autoscaler_node_groups(api: client.ApiClient, now: float | None = None) -> list[str] | None:
    """The node groups of a cluster-autoscaler running in the cluster, from the status ConfigMap it writes
    every loop (fresh: updated within 5 minutes); None when there is none (or it is stale, or the read is
    refused). A control-plane autoscaler (GKE) writes none: callers ask the cloud about its pools instead.

    Raises: ApiException other than 403/404.
    """
    import yaml

    ns, name = AUTOSCALER_STATUS
    if not _may_read_configmap(api, ns, name):  # ask first: a refused read is an audit-log alarm in many clusters
        return None
    try:
        cm = client.CoreV1Api(api).read_namespaced_config_map(name, ns)
    except ApiException as exc:
        if exc.status in (403, 404):
            return None
        raise
    stamp = (cm.metadata.annotations or {}).get("cluster-autoscaler.kubernetes.io/last-updated", "")
    try:  # "2026-12-01 10:00:00.123 +0000 UTC"
        at = datetime.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
        if (time.time() if now is None else now) - at > AUTOSCALER_FRESH_S:
            return None
    except ValueError:
        pass  # present but unstamped: trust it
    try:
        status = yaml.safe_load((cm.data or {}).get("status", "")) or {}
    except yaml.YAMLError:
        return []
    groups = status.get("nodeGroups") if isinstance(status, dict) else None
    return [str(g.get("name", "")) for g in groups or [] if isinstance(g, dict) and g.get("name")]


def _may_read_configmap(api: client.ApiClient, namespace: str, name: str) -> bool:
    """A SelfSubjectAccessReview (every authenticated user may create one). Raises: ApiException."""
    review = client.AuthorizationV1Api(api).create_self_subject_access_review(client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=client.V1ResourceAttributes(
            verb="get", resource="configmaps", namespace=namespace, name=name))))
    return bool(review.status.allowed)


class RequestWatch:
    """The latest version of one request, kept current by a watch; :meth:`wait` blocks until a predicate
    holds. A refused watch (401/403) is kept in ``error`` and wakes waiters."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self.obj: dict[str, Any] | None = None
        self.gone = False
        self.error: Exception | None = None
        self._cond = threading.Condition()
        self._watcher = Watcher(f"provreq-{name}", client.CustomObjectsApi(api).list_namespaced_custom_object,
                                self._on, GROUP, VERSION, namespace, PLURAL, field_selector=f"metadata.name={name}")

    def _on(self, ev: Event) -> None:
        with self._cond:
            if ev.type == ERROR:
                self.error = ev.obj.get("error") or RuntimeError("watch refused")
            elif ev.type == "DELETED":
                self.obj, self.gone = None, True
            else:
                self.obj, self.gone = ev.obj, False
            self._cond.notify_all()

    def start(self) -> RequestWatch:
        self._watcher.start()
        return self

    def stop(self) -> None:
        self._watcher.stop()

    def wait(self, done: Callable[[dict[str, Any] | None], bool], deadline: float, tick_s: float = 0.5,
             on_tick: Callable[[], None] | None = None) -> dict[str, Any] | None:
        """Block until ``done(obj)`` (obj None when deleted), the deadline, or a refused watch; ``on_tick``
        runs about every ``tick_s`` without the lock. Returns the latest object."""
        with self._cond:
            while True:
                if self.error is not None or done(self.obj):
                    return self.obj
                now = time.time()
                if now >= deadline:
                    return self.obj
                self._cond.wait(timeout=min(tick_s, deadline - now))
                if on_tick is not None:
                    self._cond.release()
                    try:
                        on_tick()
                    finally:
                        self._cond.acquire()
