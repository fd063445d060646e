"""Watch helpers: background Kubernetes watches feeding one event queue, plus fact extraction.

A :class:`Watcher` lists once (emitting the current objects as ``SYNC`` events, so a consumer starts from
the real state), then follows a ``kubernetes.watch.Watch`` stream from that resourceVersion, re-listing
when the version expires (HTTP 410). Every event carries the wall-clock time it was *received*, which is
what detection-latency metrics are measured against. Consumers block on the queue (``queue.get`` with a
deadline), so reacting to a node deletion costs one network hop, never a polling interval.

The ``*_fact`` functions turn raw object dicts into the plain dataclasses of
:mod:`kfp_gpu.plan.recovery`, keeping decision logic free of I/O and of the kubernetes client.
"""

from __future__ import annotations

import calendar
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from kfp_gpu.plan.recovery import DISRUPTION_CONDITION, NodeFact, PodFact

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
SYNC = "SYNC"


@dataclass(frozen=True)
class Event:
    source: str  # "node" | "pod" | "job" | "<watcher name>"
    type: str  # ADDED | MODIFIED | DELETED | SYNC
    obj: dict[str, Any]
    at: float  # unix seconds when the event was received


ListFn = Callable[..., Any]


class Watcher:
    """One list+watch loop in a daemon thread, pushing :class:`Event` s into ``sink``.

    ``list_fn`` is a kubernetes list call (``CoreV1Api.list_node``, ``CustomObjectsApi.list_namespaced_
    custom_object``...); ``args``/``kwargs`` are passed to it (selectors, namespace...).
    """

    def __init__(
        self, source: str, list_fn: ListFn, sink: queue.Queue[Event], *args: Any,
        window_s: int = 30, **kwargs: Any,
    ) -> None:
        self.source = source
        self._list = list_fn
        self._sink = sink
        self._args = args
        self._kwargs = kwargs
        self._window_s = window_s
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self.synced = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kfp-gpu-watch-{source}", daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the loop to end; it does at the next event or window end (daemon thread, never blocks)."""
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def _relist(self) -> str:
        resp = self._list(*self._args, **self._kwargs, _preload_content=False)
        body = json.loads(resp.data)
        now = time.time()
        for item in body.get("items") or []:
            self._sink.put(Event(self.source, SYNC, item, now))
        self.synced.set()
        return str((body.get("metadata") or {}).get("resourceVersion", ""))

    def _run(self) -> None:
        rv = ""
        backoff = 0.2
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._relist()
                self._watch = watch.Watch()
                for ev in self._watch.stream(
                    self._list, *self._args, resource_version=rv, timeout_seconds=self._window_s,
                    allow_watch_bookmarks=False, **self._kwargs,
                ):
                    raw = ev.get("raw_object") or {}
                    if ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self._sink.put(Event(self.source, str(ev["type"]), raw, time.time()))
                    rv = str((raw.get("metadata") or {}).get("resourceVersion", rv))
                    if self._stop.is_set():
                        return
                backoff = 0.2
            except ApiException as exc:
                if exc.status == 410:
                    rv = ""  # expired: list again from the current state
                    continue
                log.warning("watch %s failed (%s); retrying", self.source, exc.status)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception as exc:  # network blips: re-list and carry on
                log.warning("watch %s interrupted (%s); re-listing", self.source, exc)
                rv = ""
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)


def node_watcher(api: client.ApiClient, sink: queue.Queue[Event]) -> Watcher:
    return Watcher("node", client.CoreV1Api(api).list_node, sink)


def pod_watcher(api: client.ApiClient, sink: queue.Queue[Event], namespace: str, selector: str) -> Watcher:
    return Watcher("pod", client.CoreV1Api(api).list_namespaced_pod, sink, namespace, label_selector=selector)


def custom_watcher(
    api: client.ApiClient, sink: queue.Queue[Event], group: str, version: str, namespace: str, plural: str,
    name: str,
) -> Watcher:
    return Watcher(
        "job", client.CustomObjectsApi(api).list_namespaced_custom_object, sink, group, version, namespace,
        plural, field_selector=f"metadata.name={name}",
    )


# ---- facts ------------------------------------------------------------------------------------------

def parse_time(value: Any) -> float | None:
    """RFC 3339 (``2024-01-02T03:04:05Z``) -> unix seconds; None when absent or unparsable."""
    if not value or not isinstance(value, str):
        return None
    text = value.rstrip("Z").split(".")[0]
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def quantity(value: Any) -> float:
    """A Kubernetes quantity for countable resources ("8", "8k", "500m") as a number."""
    text = str(value or "0")
    mult = {"k": 1e3, "M": 1e6, "G": 1e9, "m": 1e-3}
    if text and text[-1] in mult:
        return float(text[:-1]) * mult[text[-1]]
    try:
        return float(text)
    except ValueError:
        return 0.0


def node_fact(obj: Mapping[str, Any], at: float, *, deleted: bool = False) -> NodeFact:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    return NodeFact(
        name=str(meta.get("name", "")), at=at, exists=not deleted and not meta.get("deletionTimestamp"),
        ready=ready, unschedulable=bool(spec.get("unschedulable")),
        taints=tuple(str(t.get("key", "")) for t in spec.get("taints") or []),
        gpus=quantity((status.get("allocatable") or {}).get(GPU_RESOURCE)),
        zone=str((meta.get("labels") or {}).get("topology.kubernetes.io/zone", "")),
    )


def pod_fact(obj: Mapping[str, Any], at: float, *, deleted: bool = False) -> PodFact:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    disruption = ""
    for c in status.get("conditions") or []:
        if c.get("type") == DISRUPTION_CONDITION and c.get("status") == "True":
            disruption = str(c.get("reason") or DISRUPTION_CONDITION)
    exit_code: int | None = None
    term_reason = ""
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if term and term.get("exitCode") is not None:
            code = int(term["exitCode"])
            if exit_code is None or code != 0:
                exit_code, term_reason = code, str(term.get("reason") or "")
    labels = meta.get("labels") or {}
    owners = meta.get("ownerReferences") or []
    return PodFact(
        name=str(meta.get("name", "")), node=str(spec.get("nodeName") or ""), at=at,
        phase=str(status.get("phase") or "Pending"), exit_code=exit_code, disruption=disruption,
        reason=str(status.get("reason") or term_reason), deleted=deleted,
        terminating=bool(meta.get("deletionTimestamp")),
        role=str(labels.get("training.kubeflow.org/replica-type", "")),
        owner_uid=str(owners[0].get("uid", "")) if owners else "",
    )
