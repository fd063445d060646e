"""Image pull on a fresh node (docs/sim.md rule 2b): the world's model of each node's image cache, and the Kubernetes
side that tells KWOK when a pod's pull is done.

A KWOK pod stage cannot see the pod's node, so the world that owns the node says it: a pod annotated
``kfp-gpu.io/image-pull=world`` is held by KWOK's ``kfp-gpu-pod-pulled`` stage until its ``kfp-gpu.io/pulled-at``
(RFC3339). :class:`NodeImages` decides that time (pure, stand-in seconds, so tests run it on virtual time):

* the pull is paid once per (node, image): a second pod with the same image on the same node (IfNotPresent, e.g. a
  restarted rank on a surviving node) starts at once, or when the first pull of that image ends;
* the kubelet pulls one image at a time (``serializeImagePulls`` defaults to true), and never in parallel for one pod;
* a node that is deleted takes its cache with it (a VM recreated under the same name has a fresh disk);
* with GKE Image streaming a container starts once part of its image is read, but only for an image the streaming
  backend has cached: the first pull of an image in the world is a full one ("you might not notice the benefits of
  Image streaming during the first pull of an eligible image").

:class:`PullWatcher` watches the pods bound to the nodes a label selector picks (a stand-in's
``kfp-gpu.io/sim-cluster=<cluster>``, the bench's nodes) and writes ``pulled-at`` on each marked pod once.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from kfp_gpu_rehearsal.devcluster.nodes import IMAGE_PULL_ANNOTATION, PULLED_AT_ANNOTATION
from kfp_gpu_rehearsal.sim.clock import compress
from kfp_gpu_rehearsal.sim.worldspec import PullSpec

if TYPE_CHECKING:  # the kubernetes client (and through it google.auth) is imported only when a watch starts
    from kfp_gpu.cluster.listwatch import Event, Watcher

log = logging.getLogger(__name__)

MARKER = "world"  # the IMAGE_PULL_ANNOTATION value KWOK's kfp-gpu-pod-pulled stage waits on


class NodeImages:
    """Each node's image cache and serial pull queue, in stand-in seconds (``scale`` compresses the spec's
    real-world seconds: :func:`kfp_gpu_rehearsal.sim.clock.compress`)."""

    def __init__(self, spec: PullSpec, scale: Callable[[float], float] = compress) -> None:
        self.spec = spec
        self._pull_s = scale(spec.pull_s())
        self._full_s = scale(dataclasses.replace(spec, streaming=False).pull_s())
        self._streamable: dict[str, float] = {}  # image -> when Image streaming has it (its first pull ended)
        self._lock = threading.Lock()
        self._cached: dict[tuple[str, str], float] = {}  # (node, image) -> when its pull ends (or ended)
        self._busy: dict[str, float] = {}  # node -> when its current pull ends

    def ready_at(self, node: str, images: Iterable[str], now: float) -> float:
        """When a pod bound to ``node`` at ``now`` can start its containers ``images`` (in pull order)."""
        t = now
        with self._lock:
            for image in dict.fromkeys(images):
                key = (node, image)
                if key in self._cached:
                    t = max(t, self._cached[key])
                    continue
                start = max(t, self._busy.get(node, 0.0))
                streamed = self.spec.streaming and self._streamable.get(image, math.inf) <= start
                done = start + (self._pull_s if streamed else self._full_s)
                if self.spec.streaming:
                    self._streamable.setdefault(image, done)
                self._busy[node] = self._cached[key] = done
                t = done
        return t

    def forget(self, node: str) -> None:
        """The node is gone: its disk and its cache with it."""
        with self._lock:
            self._busy.pop(node, None)
            for key in [k for k in self._cached if k[0] == node]:
                del self._cached[key]


def pod_images(pod: dict[str, Any]) -> list[str]:
    """The images a pod's kubelet pulls, in order: init containers, then containers."""
    spec = pod.get("spec") or {}
    return [str(c.get("image") or "") for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]]


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class PullWatcher:
    """Write ``kfp-gpu.io/pulled-at`` on the marked pods bound to the nodes ``node_selector`` picks, from
    ``images()`` (the world's :class:`NodeImages`; the stand-in replaces it on reset)."""

    def __init__(self, images: Callable[[], NodeImages], api_client: Any, node_selector: str) -> None:
        from kubernetes import client

        self.images = images
        self.core = client.CoreV1Api(api_client)
        self.node_selector = node_selector
        self._lock = threading.Lock()
        self._nodes: set[str] = set()
        self._waiting: dict[str, dict[str, Any]] = {}  # uid -> a marked pod bound to a node not yet seen
        self._done: set[str] = set()  # uids already answered
        self._t0 = time.time()
        self._watchers: list[Watcher] = []
        self._error = ""  # listwatch.ERROR once started

    def start(self) -> PullWatcher:
        from kfp_gpu.cluster.listwatch import ERROR, Watcher

        self._error = ERROR
        self._watchers = [
            Watcher("pull-node", self.core.list_node, self._on_node, label_selector=self.node_selector).start(),
            Watcher("pull-pod", self.core.list_pod_for_all_namespaces, self._on_pod,
                    field_selector="status.phase=Pending").start(),
        ]
        return self

    def stop(self) -> None:
        for w in self._watchers:
            w.stop()

    def _on_node(self, ev: Event) -> None:
        if ev.type == self._error:
            return
        name = str((ev.obj.get("metadata") or {}).get("name", ""))
        with self._lock:
            if ev.type == "DELETED":
                self._nodes.discard(name)
            else:
                self._nodes.add(name)
            waiting = [p for p in self._waiting.values() if (p.get("spec") or {}).get("nodeName") == name]
        if ev.type == "DELETED":
            self.images().forget(name)
            return
        for pod in waiting:
            self._answer(pod, ev.at)

    def _on_pod(self, ev: Event) -> None:
        if ev.type == self._error:
            return
        meta = ev.obj.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        if ev.type == "DELETED":
            with self._lock:
                self._waiting.pop(uid, None)
                self._done.discard(uid)
            return
        notes = meta.get("annotations") or {}
        node = str((ev.obj.get("spec") or {}).get("nodeName") or "")
        if notes.get(IMAGE_PULL_ANNOTATION) != MARKER or PULLED_AT_ANNOTATION in notes or not node \
                or meta.get("deletionTimestamp"):
            return
        with self._lock:
            if uid in self._done:
                return
            if node not in self._nodes:
                self._waiting[uid] = ev.obj  # the node's watch may be behind the pod's
                return
        self._answer(ev.obj, ev.at)

    def _answer(self, pod: dict[str, Any], seen: float) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        with self._lock:
            if uid in self._done:
                return
            self._done.add(uid)
            self._waiting.pop(uid, None)
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        now = seen - self._t0
        at = self._t0 + self.images().ready_at(node, pod_images(pod), now)
        body = {"metadata": {"annotations": {PULLED_AT_ANNOTATION: rfc3339(at)}}}
        threading.Thread(target=self._patch, args=(meta, body), daemon=True).start()

    def _patch(self, meta: dict[str, Any], body: dict[str, Any]) -> None:
        from kubernetes import client

        try:
            self.core.patch_namespaced_pod(meta["name"], meta["namespace"], body)
        except client.ApiException as exc:
            if exc.status != 404:
                log.warning("sim image pull: %s/%s not annotated: %s", meta.get("namespace"), meta.get("name"),
                            exc.reason)
