"""The Kubernetes side of the stand-in's queued provisioning: one list/watch loop (kfp_gpu.cluster.listwatch) each
for ProvisioningRequests and Pods, PodTemplate reads, and status writes through the ``status`` subresource.

Events are handled on one worker thread; world decisions are :class:`kfp_gpu_rehearsal.sim.dws.DwsWorld`'s.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from kfp_gpu.cluster.listwatch import ERROR, Event, Watcher
from kfp_gpu_rehearsal.sim.dws import DwsWorld, Key, Refusal
from kfp_gpu_rehearsal.sim.dws_request import active_node, consumer, demand

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"
DELETED = "DELETED"
TEMPLATE_WAIT_S = 30.0  # a referenced PodTemplate may be created just after its request: look again this long
READY_WAIT_S = 10.0  # Provisioned is written once the nodes read Ready with GPUs (bounded wait)


class DwsController:
    """Serve this stand-in's queued-provisioning requests in the cluster of ``api_client``.

    ``world()`` returns the current :class:`DwsWorld` (the stand-in replaces it on reset).
    """

    def __init__(self, world: Callable[[], DwsWorld], api_client: Any) -> None:
        from kubernetes import client

        self.world = world
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self._events: queue.Queue[Event | None] = queue.Queue()
        self._watchers: list[Watcher] = []
        self._ignored: set[str] = set()  # uids that are not this stand-in's
        self._pods: dict[str, tuple[Key, str]] = {}  # pod uid -> (request it consumes, node it holds)
        self._provisioned: set[Key] = set()  # requests whose Provisioned write waited for their nodes
        self._retry: dict[str, float] = {}  # uid -> wall time of first sight with a missing PodTemplate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-dws", daemon=True)

    def start(self) -> DwsController:
        self._thread.start()
        self._watchers = [
            Watcher("dws-provreq", self.custom.list_cluster_custom_object, self._events.put, GROUP, VERSION,
                    PLURAL).start(),
            Watcher("dws-pod", self.core.list_pod_for_all_namespaces, self._events.put).start(),
        ]
        return self

    def stop(self) -> None:
        self._stop.set()
        for w in self._watchers:
            w.stop()
        self._events.put(None)

    # ---- status writes (called by the world, outside its lock) -------------------------------------
    def publish(self, key: Key, status: dict[str, Any]) -> None:
        """Write ``status`` through the status subresource (a deleted request is skipped)."""
        from kubernetes.client import ApiException

        true = {c["type"] for c in status["conditions"] if c["status"] == "True"}
        if true == {"Accepted", "Provisioned"} and key not in self._provisioned:  # the first Provisioned write
            self._provisioned.add(key)
            self._await_nodes(key)
        try:
            self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, key[0], PLURAL, key[1],
                                                              {"status": status})
        except ApiException as exc:
            if exc.status != 404:
                log.warning("sim dws: status write for %s/%s failed: %s", key[0], key[1], exc.status)

    def _await_nodes(self, key: Key) -> None:
        nodes = self.world().snapshot().get(f"{key[0]}/{key[1]}", {}).get("nodes", [])
        deadline = time.monotonic() + READY_WAIT_S
        for name in nodes:
            while time.monotonic() < deadline and not self._ready(name):
                time.sleep(0.05)

    def _ready(self, name: str) -> bool:
        from kubernetes.client import ApiException

        try:
            node = self.core.read_node(name)
        except ApiException:
            return False
        ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
        return ready and int((node.status.allocatable or {}).get("nvidia.com/gpu", "0")) > 0

    # ---- events ------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                ev = self._events.get(timeout=0.5)
            except queue.Empty:
                self._retry_templates()
                continue
            if ev is None:
                return
            try:
                if ev.type == ERROR:
                    log.warning("sim dws: watch %s refused: %s", ev.source, ev.obj.get("error"))
                elif ev.source == "dws-provreq":
                    self._request(ev.type, ev.obj)
                else:
                    self._pod(ev.type, ev.obj)
            except Exception:  # noqa: BLE001 - one bad object must not stop the controller
                log.exception("sim dws: handling %s %s failed", ev.source, ev.type)

    def _request(self, etype: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key, uid = (str(meta.get("namespace", "")), str(meta.get("name", ""))), str(meta.get("uid", ""))
        world = self.world()
        if etype == DELETED:
            world.withdraw(key, uid)
            self._ignored.discard(uid)
            self._retry.pop(uid, None)
            return
        if uid in self._ignored or f"{key[0]}/{key[1]}" in world.snapshot():
            return
        claimed = ((obj.get("status") or {}).get("provisioningClassDetails") or {}).get("NodeGroupName")
        if claimed or (obj.get("status") or {}).get("conditions"):  # another server's (or a previous life's)
            self._ignored.add(uid)
            return
        names = [str((ps.get("podTemplateRef") or {}).get("name", "")) for ps in (obj.get("spec") or {}).get("podSets") or []]
        templates = {n: self._template(key[0], n) for n in names}
        want = demand(obj, templates, world.state.scenario)
        if want is None:
            if any(t is None for t in templates.values()) and self._retry.setdefault(
                    uid, time.monotonic()) + TEMPLATE_WAIT_S > time.monotonic():
                return  # look again when its PodTemplate may exist (_retry_templates)
            self._ignored.add(uid)
            return
        self._retry.pop(uid, None)
        if world.submit(key, uid, int(meta.get("generation") or 1), want):
            what = f"refused: {want.reason}" if isinstance(want, Refusal) else f"{want.count} nodes"
            log.info("sim dws: serving %s/%s in pool %s (%s)", key[0], key[1], want.pool, what)
            self._resync_pods(key)

    def _retry_templates(self) -> None:
        if not self._retry:
            return
        try:
            body = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        except Exception:  # noqa: BLE001 - retried on the next idle tick
            return
        for item in body.get("items") or []:
            if str((item.get("metadata") or {}).get("uid", "")) in self._retry:
                self._request("SYNC", item)

    def _template(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client import ApiException

        try:
            tmpl = self.core.read_namespaced_pod_template(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        out: dict[str, Any] = self.core.api_client.sanitize_for_serialization(tmpl)
        return out

    def _pod(self, etype: str, pod: dict[str, Any]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        key = consumer(pod)
        old = self._pods.pop(uid, None)
        if key is not None and etype != DELETED:
            self._pods[uid] = (key, active_node(pod))
        for k in {x for x in (key, old[0] if old else None) if x is not None}:
            self._resync_pods(k)

    def _resync_pods(self, key: Key) -> None:
        nodes = {node for k, node in self._pods.values() if k == key and node}
        self.world().set_busy(key, nodes)
