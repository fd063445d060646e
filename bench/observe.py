"""The ONE external watch every side is measured by: all Nodes and every bench gang Pod, one clock.

No side is timed by its own timestamps. :class:`Observer` runs in the harness process for the whole bench: a raw
(JSON, no model classes) list+watch of Nodes and of Pods labelled :data:`GANG_LABEL` in every namespace. Times
are ``time.time()`` at the moment the harness sees the event. :func:`measure` turns the record of one side-run
into the issue's quantities.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from bench.common import BOOT_SAMPLE_ANNOTATION
from kfp_gpu.plan import readiness
from kfp_gpu_rehearsal.devcluster.nodes import READY_AT_ANNOTATION

GANG_LABEL = "kfp-gpu.io/bench-gang"


@dataclass
class NodeRec:
    name: str
    added: float
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    ready: float | None = None  # first seen Ready with nvidia.com/gpu allocatable > 0
    gone: float | None = None


@dataclass
class PodRec:
    uid: str
    name: str
    namespace: str
    tag: str
    added: float
    node: str = ""
    running: float | None = None
    gone: float | None = None


def _node_gpu_ready(obj: dict[str, Any]) -> bool:
    return readiness.is_ready(obj, gpus=1)  # kfp-gpu's one readiness predicate


class _RawWatch:
    """list + watch (relist on 410 / error) of one collection as plain dicts."""

    def __init__(self, api: client.ApiClient, path: str, selector: str, on: Callable[[str, dict[str, Any]], None]):
        self.api, self.path, self.selector, self.on = api, path, selector, on
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True, name=f"observe{path}")
        self.synced = threading.Event()
        self._resp: Any = None

    def _get(self, **q: Any) -> Any:
        query = [(k, v) for k, v in q.items()] + ([("labelSelector", self.selector)] if self.selector else [])
        return self.api.call_api(self.path, "GET", query_params=query, header_params={"Accept": "application/json"},
                                 auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                lst = json.loads(self._get().data)
                for item in lst.get("items") or []:
                    self.on("ADDED", item)
                self.synced.set()
                rv = lst["metadata"]["resourceVersion"]
                while not self.stop.is_set():
                    self._resp = self._get(watch="true", resourceVersion=rv, allowWatchBookmarks="true",
                                           timeoutSeconds=120)
                    for line in iter_resp_lines(self._resp):
                        ev = json.loads(line)
                        if ev.get("type") == "ERROR":
                            raise RuntimeError("watch expired")
                        obj = ev.get("object") or {}
                        rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                        if ev.get("type") != "BOOKMARK":
                            self.on(str(ev.get("type")), obj)
                        if self.stop.is_set():
                            return
            except Exception:  # noqa: BLE001 - relist
                if self.stop.is_set():
                    return
                time.sleep(0.2)

    def close(self) -> None:
        """Stop acting on events; the daemon thread ends with its watch's timeout or the process (closing a
        streaming urllib3 response from another thread blocks until the server sends)."""
        self.stop.set()


class Observer:
    """Nodes and gang Pods, as the harness sees them. ``on_node_added`` hooks (the boot injector) run in the
    watch thread."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.cond = threading.Condition()
        self.nodes: dict[str, NodeRec] = {}  # name -> latest incarnation
        self.old_nodes: list[NodeRec] = []  # earlier incarnations of a re-used name
        self.pods: dict[str, PodRec] = {}
        self.node_hooks: list[Callable[[dict[str, Any], float], None]] = []
        self._nw = _RawWatch(api, "/api/v1/nodes", "", self._node)
        self._pw = _RawWatch(api, "/api/v1/pods", GANG_LABEL, self._pod)

    def start(self, timeout_s: float = 30.0) -> Observer:
        self._nw.t.start()
        self._pw.t.start()
        if not (self._nw.synced.wait(timeout_s) and self._pw.synced.wait(timeout_s)):
            raise RuntimeError("the bench's node/pod watch did not sync")
        return self

    def close(self) -> None:
        self._nw.close()
        self._pw.close()

    def _node(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.time()
        md = obj.get("metadata") or {}
        name = str(md.get("name"))
        new = None
        with self.cond:
            rec = self.nodes.get(name)
            if kind == "DELETED":
                if rec is not None and rec.gone is None:
                    rec.gone = now
            else:
                if rec is None or rec.gone is not None:
                    if rec is not None:
                        self.old_nodes.append(rec)
                    rec = self.nodes[name] = NodeRec(name, now)
                    new = obj
                rec.labels = dict(md.get("labels") or {})
                rec.annotations = dict(md.get("annotations") or {})
                if rec.ready is None and _node_gpu_ready(obj):
                    rec.ready = now
            self.cond.notify_all()
        if new is not None:
            for hook in list(self.node_hooks):
                hook(new, now)

    def _pod(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.time()
        md = obj.get("metadata") or {}
        uid = str(md.get("uid"))
        with self.cond:
            rec = self.pods.get(uid)
            if rec is None:
                rec = self.pods[uid] = PodRec(uid, str(md.get("name")), str(md.get("namespace")),
                                              str((md.get("labels") or {}).get(GANG_LABEL, "")), now)
            rec.node = str((obj.get("spec") or {}).get("nodeName") or rec.node)
            live = kind != "DELETED" and not md.get("deletionTimestamp")
            if live and rec.running is None and (obj.get("status") or {}).get("phase") == "Running":
                rec.running = now
            if not live and rec.gone is None:
                rec.gone = now
            self.cond.notify_all()

    # ---- queries ---------------------------------------------------------------------------------

    def wait(self, pred: Callable[[], bool], timeout_s: float) -> bool:
        end = time.time() + timeout_s
        with self.cond:
            while not pred():
                left = end - time.time()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.25))
        return True

    def gang(self, tag: str) -> list[PodRec]:
        with self.cond:  # the watch thread adds pods meanwhile (re-entrant: callers may hold it already)
            return [p for p in self.pods.values() if p.tag == tag]

    def gang_running_at(self, tag: str, n: int) -> float | None:
        """The first moment n gang pods were Running at once, else None. A pod that ran and was then deleted
        (evicted: the taint-eviction controller removes a pod bound to a node with a NoExecute taint it does not
        tolerate) counts only while it lived, so a gang that fell apart as it started is not a gang."""
        with self.cond:
            spans = [(p.running, p.gone) for p in self.gang(tag) if p.running is not None]
        if len(spans) < n:
            return None
        # (time, +1 arrival / -1 departure): at a tie a departure sorts first, so the two never overlapped
        events = sorted([(r, 1) for r, _ in spans] + [(g, -1) for _, g in spans if g is not None])
        live = 0
        for t, step in events:
            live += step
            if live >= n:
                return t
        return None

    def matching(self, pred: Callable[[NodeRec], bool], since: float) -> list[NodeRec]:
        with self.cond:
            return [r for r in [*self.old_nodes, *self.nodes.values()] if r.added >= since - 1.0 and pred(r)]


def pods_before_ready(pods: list[PodRec], nodes: dict[str, NodeRec], slack_s: float = 0.05) -> int:
    """How many gang pods the watch saw Running before their node was Ready with GPUs (a world whose nodes let pods
    run before they booted; ``slack_s``: the order of events across the two watch streams)."""
    return sum(1 for p in pods if p.running is not None and p.node in nodes and
               (nodes[p.node].ready is None or p.running < nodes[p.node].ready - slack_s))


def drawn_boot(rec: NodeRec, plugin_s: float) -> float | None:
    """The boot the world drew for this node, from its side's request to GPUs usable, read from the node object:
    ``kfp-gpu.io/boot-sample`` (the stand-in's: its resize request -> the Node registering; the bench injector's:
    the same quantity from the same seeded sampler, for cluster-autoscaler and Karpenter nodes) plus the world's
    device-plugin delay ``plugin_s`` (the same for every side). None: the node carries no draw (a fixed-delay
    node, not of this world)."""
    raw = rec.annotations.get(BOOT_SAMPLE_ANNOTATION)
    if raw is None:
        return None
    try:
        return float(raw) + plugin_s
    except ValueError:
        return None


@dataclass
class Measured:
    total_s: float  # t0 -> the whole gang Running (external pod watch)
    nodes_ready_s: float  # t0 -> the N-th of the side's nodes Ready with GPUs
    limit_s: float  # the largest boot the world drew for the side's nodes (request -> GPUs usable), per node
    idle_before_gpu_s: float  # sum over nodes of (job start - node Ready) x GPUs, wall seconds
    idle_after_gpu_s: float  # sum over nodes of (node gone - job end) x GPUs, wall seconds
    after_capped: bool  # some node was still there when the wait ended (its idle counted up to then)
    nodes: int
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def overhead_s(self) -> float:
        return self.total_s - self.limit_s


def expected_ready(rec: NodeRec, plugin_s: float) -> float | None:
    """When the world says the node is Ready with GPUs (epoch seconds): the injector's ``kfp-gpu.io/ready-at`` (its
    request, as the watch saw it, + the draw + the device plugin), else, for the stand-in's nodes (created when
    the VM registers), the registration the watch saw + the device-plugin delay. None: no draw on the node."""
    if BOOT_SAMPLE_ANNOTATION not in rec.annotations:
        return None
    at = rec.annotations.get(READY_AT_ANNOTATION)
    if at:
        try:
            return datetime.strptime(at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            return None
    return rec.added + plugin_s


def measure(nodes: list[NodeRec], t0: float, t_job: float, t_end: float, t_cap: float, gpus: int,
            plugin_s: float, pull_s: float = 0.0) -> Measured:
    """One side-run's quantities from the external watch's record of its nodes. ``detail["undrawn_nodes"]``
    counts nodes that carry no draw of the world's sampler (the harness fails such a run: its limit would not be
    the world's). ``pull_s``: the world's image pull on a fresh node, which a pod can only start once its node is
    Ready with GPUs: the limit adds it once."""
    ready = sorted(r.ready for r in nodes if r.ready is not None)
    drawn = [d for d in (drawn_boot(r, plugin_s) for r in nodes) if d is not None]
    lags = [r.ready - e for r in nodes if r.ready is not None and (e := expected_ready(r, plugin_s)) is not None]
    before = sum(max(0.0, t_job - r.ready) for r in nodes if r.ready is not None) * gpus
    capped = any(r.gone is None or r.gone > t_cap for r in nodes)
    after = sum(max(0.0, min(r.gone if r.gone is not None else t_cap, t_cap) - t_end)
                for r in nodes if r.ready is not None) * gpus
    return Measured(total_s=t_job - t0, nodes_ready_s=(ready[-1] - t0) if ready else -1.0,
                    limit_s=max(drawn) + pull_s if drawn else 0.0,
                    idle_before_gpu_s=before, idle_after_gpu_s=after, after_capped=capped, nodes=len(nodes),
                    detail={"first_node_added_s": round(min((r.added for r in nodes), default=t0) - t0, 4),
                            "last_node_added_s": round(max((r.added for r in nodes), default=t0) - t0, 4),
                            "drawn_boot_min_s": round(min(drawn, default=0.0), 4),
                            "undrawn_nodes": len(nodes) - len(drawn),
                            # how late this machine made a node Ready after the world's ready time, worst node
                            "machine_lag_s": round(max(lags, default=0.0), 4)})
