"""The stand-in server's Python API and routing (its HTTP listener is :mod:`kfp_gpu_rehearsal.sim.http_server`).

    sim = SimServer(scenario_or_path, kubeconfig=None, port=0)
    url = sim.start()          # "http://127.0.0.1:PORT"; pass as api_endpoint to the google clients
    sim.preempt("gke-...")     # or POST /sim/v1/preempt
    sim.stop()

Without a kubeconfig nodes live only in memory (pure HTTP tests); with one, setSize creates KWOK
Node objects in that cluster.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kfp_gpu.rehearsal_seam import LOCAL_CLUSTER_LABEL
from kfp_gpu_rehearsal.sim import routes
from kfp_gpu_rehearsal.sim import scenario as scenario_mod
from kfp_gpu_rehearsal.sim.api import ApiGate, backend_error, project_of
from kfp_gpu_rehearsal.sim.clock import compress
from kfp_gpu_rehearsal.sim.computeclass import ComputeClassWorld
from kfp_gpu_rehearsal.sim.dws import DwsWorld, Key
from kfp_gpu_rehearsal.sim.dws_pools import refuse_set_size, render
from kfp_gpu_rehearsal.sim.gcp_iam import Principals
from kfp_gpu_rehearsal.sim.http_server import SimHttpServer
from kfp_gpu_rehearsal.sim.imagepull import NodeImages, PullWatcher
from kfp_gpu_rehearsal.sim.scenario import Scenario
from kfp_gpu_rehearsal.sim.shapes import http_error
from kfp_gpu_rehearsal.sim.state import NodeBackend, SimState

log = logging.getLogger(__name__)


class SimServer:
    """The GKE/Compute/Cloud Quotas stand-in.

    Args:
        scenario: a :class:`Scenario`, a path to a YAML scenario, or None for the bundled default.
        kubeconfig: path of the cluster whose Nodes setSize drives; None keeps nodes in memory.
        port: 0 picks a free port.
        backend: an explicit node backend (overrides ``kubeconfig``).

    Raises:
        InvalidSpec: the scenario does not validate.
    """

    def __init__(
        self,
        scenario: Scenario | str | Path | None = None,
        kubeconfig: str | Path | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        backend: NodeBackend | None = None,
    ) -> None:
        self.scenario = scenario if isinstance(scenario, Scenario) else scenario_mod.load(scenario)
        self.kubeconfig = str(kubeconfig) if kubeconfig else None
        if backend is None and self.kubeconfig:
            from kfp_gpu_rehearsal.sim.kube import KubeBackend

            backend = KubeBackend(self.kubeconfig)
        self.backend = backend
        self.host, self.port = host, port
        self.state = SimState(self.scenario, backend)
        self.gate = ApiGate(self.scenario.api)
        self._request_ids: dict[tuple[str, str], Any] = {}  # Compute requestId -> first answer
        self._httpd: SimHttpServer | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.dws_status: dict[Key, dict[str, Any]] = {}  # last status per request (any backend)
        self.dws = DwsWorld(self.state, self._publish)
        self._dws_controller: Any = None
        self.cc = ComputeClassWorld(self.state)  # GKE custom ComputeClasses (kfp_gpu_rehearsal.sim.computeclass)
        self._cc_controller: Any = None
        self.images = NodeImages(self.scenario.world.image_pull)  # image pulls (kfp_gpu_rehearsal.sim.imagepull)
        self._pull: PullWatcher | None = None
        self.progress_world: Any = None  # kfp_gpu_rehearsal.sim.progress.ProgressWorld when the scenario has `training`
        self.principals = Principals()  # bearer token -> role (kfp_gpu_rehearsal.sim.gcp_iam)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> str:
        """Serve in a background thread; returns the base URL.

        Raises: OSError when the port cannot be bound.
        """
        self._httpd = SimHttpServer((self.host, self.port), self)
        self.port = int(self._httpd.server_address[1])
        t = threading.Thread(target=self._httpd.serve_forever, name="sim-http", daemon=True)
        t.start()
        self._threads.append(t)
        self._schedule_preemptions()
        self._schedule_gpu_faults()
        self._start_dws()
        self._start_cc()
        api_client = getattr(self.backend, "api_client", None)
        if api_client is not None:  # nodes in a cluster: tell KWOK when each pod's image pull is done
            self._pull = PullWatcher(lambda: self.images, api_client,
                                     f"{LOCAL_CLUSTER_LABEL}={self.scenario.cluster}").start()
        if self.scenario.training is not None and self.backend is not None and hasattr(self.backend, "api_client"):
            from kfp_gpu_rehearsal.sim.progress import ProgressWorld

            self.progress_world = ProgressWorld(self.backend.api_client, self.scenario.training,
                                                cluster=self.scenario.cluster)
            self.progress_world.start()
        log.info("kfp-gpu sim serving %s (project %s, cluster %s)", self.url, self.scenario.project,
                 self.scenario.cluster)
        return self.url

    def stop(self) -> None:
        self._stop.set()
        gpu = getattr(self.backend, "gpu", None)
        if gpu is not None:
            gpu.stop()
        if self.progress_world is not None:
            self.progress_world.stop()
        if self._dws_controller is not None:
            self._dws_controller.stop()
        if self._cc_controller is not None:
            self._cc_controller.stop()
        if self._pull is not None:
            self._pull.stop()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        self.state.shutdown()

    def drop_nodes(self) -> list[str]:
        """Delete every node of the world's pools from the cluster (its backend), as the VMs of a project that is
        going away; returns their names. ``kfp-gpu run`` calls it once the run's own leak check is done: a
        scenario's pre-existing nodes (``initial_size``) are not the run's to release, and without it they stayed
        in the shared local cluster after the world that served them had stopped."""
        with self.state.lock:
            names = [n for p in self.state.pools.values() for n in p.nodes]
        if self.backend is not None:
            for name in names:
                self.backend.delete(name)
        return names

    def __enter__(self) -> SimServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- Python API ------------------------------------------------------------------------
    def grant(self, token: str, permissions: Iterable[str]) -> None:
        """Make ``token`` a principal holding exactly ``permissions`` (a reduced role, in tests)."""
        self.principals.grant(token, permissions)

    def preempt(self, node: str) -> dict[str, Any]:
        """Reclaim ``node`` as GCE would a spot VM. Raises: SimHttpError (404) for an unknown node."""
        return self.state.preempt(node)

    def preempt_pool(self, pool: str, count: int = 1) -> list[str]:
        """Reclaim the ``count`` newest nodes of ``pool``; returns their names. Raises: KeyError."""
        return self.state.preempt_pool(pool, count)

    def nodes(self, pool: str) -> list[str]:
        with self.state.lock:
            return list(self.state.pools[pool].nodes)

    def request_counts(self) -> dict[str, int]:
        with self.state.lock:
            return dict(self.state.routes)

    def reset(self, *, requests_only: bool = False) -> None:
        """Forget requests/fault counters; unless ``requests_only``, also delete every node and
        reservation and restart the scenario clock."""
        if requests_only:
            with self.state.lock:
                self.state.requests.clear()
                self.state.routes.clear()
            return
        old = self.state
        for p in old.pools.values():
            for name in list(p.nodes):
                if old.backend is not None:
                    old.backend.delete(name)
        old.shutdown()
        self.state = SimState(self.scenario, self.backend)
        self.gate = ApiGate(self.scenario.api)
        self._request_ids.clear()
        self.dws = DwsWorld(self.state, self._publish)
        self.cc = self.cc.moved_to(self.state)
        self.images = NodeImages(self.scenario.world.image_pull)
        self.dws_status.clear()
        self._schedule_revocations()

    def handle(self, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> tuple[int, Any]:
        if path == "/sim/v1/reset" and method == "POST":
            self.reset(requests_only=bool(body.get("requestsOnly")))
            return 200, {"reset": True}
        for m_, rx, name, fn in routes.ROUTES:
            if m_ != method:
                continue
            match = rx.match(path)
            if match is None:
                continue
            self.state.record(method, path, name)
            return self._answer(method, path, name, fn, match, query, body)
        self.state.record(method, path, "unrouted")
        raise http_error(404, f"The stand-in does not implement {method} {path}", reason="notFound")

    def _answer(self, method: str, path: str, name: str, fn: routes.Handler, match: re.Match[str],
                query: dict[str, str], body: dict[str, Any]) -> tuple[int, Any]:
        """The API layer around one routed request: budget, scenario faults, seeded 5xx, requestId.

        Raises: SimHttpError (the refusal or fault Google would answer).
        """
        refusal = self.gate.admit(path)
        if refusal is not None:
            raise refusal
        fault = self.state.injected_fault(method, path)
        if fault is not None:
            raise fault
        mutation = method != "GET" and not name.endswith(".wait") and not name.startswith("sim.")
        five = self.gate.fault(name)
        if five is not None and not (mutation and five[1]):
            self.gate.record("5xxBeforeEffect")
            raise backend_error(five[0])
        # Compute dedups a mutation retried with the same requestId: the first answer comes back
        key = (project_of(path), query.get("requestId", "")) if mutation and path.startswith("/compute/") else None
        if key is not None and key[1]:
            with self.state.lock:
                if key in self._request_ids:
                    return 200, self._request_ids[key]
        if name == "container.nodePools.setSize":
            refuse_set_size(self.state, match["np"])
        status, payload = fn(self.state, match, query, body)
        if name in ("container.nodePools.get", "container.nodePools.list"):
            render(self.scenario, payload)
        if key is not None and key[1] and status == 200:
            with self.state.lock:
                self._request_ids[key] = payload
        if five is not None:  # a mutation whose answer was lost after it took effect
            self.gate.record("5xxAfterEffect")
            raise backend_error(five[0])
        if name == "sim.requests" and isinstance(payload, dict):
            payload["api"] = self.gate.snapshot()
        return status, payload

    def _schedule_preemptions(self) -> None:
        for ev in self.scenario.preemptions:
            t = threading.Thread(target=self._preempt_at, args=(ev.at_s, ev.pool, ev.count), daemon=True)
            t.start()
            self._threads.append(t)

    def _schedule_gpu_faults(self) -> None:
        """``gpu_faults`` (kfp_gpu_rehearsal.sim.gpufaultspec): born-bad counts go to the Kube backend, Xid events are timed."""
        gpu = getattr(self.backend, "gpu", None)
        if gpu is None:
            return
        gpu.cloud = "aws" if self.scenario.world.cloud == "aws" else "gke"
        self.backend.born_bad = {b.pool: ([b.count], b.fault) for b in self.scenario.gpu_faults.born_bad}  # type: ignore[union-attr]
        for ev in self.scenario.gpu_faults.xid:
            t = threading.Thread(target=self._xid_at, args=(ev,), daemon=True)
            t.start()
            self._threads.append(t)

    def _xid_at(self, ev: Any) -> None:
        if self._stop.wait(max(0.0, compress(ev.at_s) - self.state.elapsed())):  # at_s: real-world seconds
            return
        for node in self.nodes(ev.pool)[-ev.count:]:
            try:
                self.backend.gpu.break_node(node, ev.fault)  # type: ignore[union-attr]
                log.info("sim: scheduled Xid on %s", node)
            except Exception:  # noqa: BLE001
                log.exception("sim: scheduled Xid on %s failed", node)

    def _preempt_at(self, at_s: float, pool: str, count: int) -> None:
        if self._stop.wait(max(0.0, compress(at_s) - self.state.elapsed())):  # at_s: real-world seconds
            return
        try:
            victims = self.state.preempt_pool(pool, count)
            log.info("sim: scheduled preemption of %s", victims)
        except Exception:  # noqa: BLE001
            log.exception("sim: scheduled preemption in pool %s failed", pool)

    # ---- queued provisioning (kfp_gpu_rehearsal.sim.dws) ---------------------------------------------------
    def revoke_provisioning(self, namespace: str, name: str) -> list[str]:
        """GKE reclaims the capacity of a provisioned queued-provisioning request: BookingExpired and
        CapacityRevoked become True, its nodes get the reclaim notice and are deleted after it. Returns the nodes.

        Raises: KeyError (this stand-in does not serve that request), ValueError (it is not provisioned).
        """
        return self.dws.revoke((namespace, name))

    def provisioning_requests(self) -> dict[str, dict[str, Any]]:
        """The requests this stand-in serves: ``{"ns/name": {"phase", "nodes", "busy", "conditions"}}``."""
        return self.dws.snapshot()

    def _publish(self, key: Key, status: dict[str, Any]) -> None:
        self.dws_status[key] = status
        if self._dws_controller is not None:
            self._dws_controller.publish(key, status)

    def _start_dws(self) -> None:
        self._schedule_revocations()
        if not any(p.queued_provisioning for p in self.scenario.pools):
            return
        api_client = getattr(self.backend, "api_client", None)
        if api_client is None:  # nodes in memory: no cluster to watch; tests drive self.dws directly
            return
        from kfp_gpu_rehearsal.sim.dws_controller import DwsController

        self.backend.extras = self._node_extras  # type: ignore[union-attr]
        self._dws_controller = DwsController(lambda: self.dws, api_client).start()

    def _schedule_revocations(self) -> None:
        for ev in self.scenario.provisioning_revocations:
            world, pool = self.dws, ev.pool
            self.state.timeline.at(compress(ev.at_s), lambda w=world, p=pool: w.revoke_pool(p))  # type: ignore[misc]

    # ---- ComputeClasses (kfp_gpu_rehearsal.sim.computeclass) ------------------------------------------------------
    def _node_extras(self, pool: str, node: str) -> tuple[dict[str, str], list[dict[str, str]]]:
        """Labels and taints GKE adds to a node at registration: queued provisioning's, then a ComputeClass's."""
        labels, taints = self.dws.node_extras(pool, node)
        more_labels, more_taints = self.cc.node_extras(pool, node)
        return {**labels, **more_labels}, [*taints, *more_taints]

    def _start_cc(self) -> None:
        """Serve ComputeClasses when the cluster has the API (installed at test time: kfp_gpu_rehearsal.devcluster.computeclass_crd)."""
        api_client = getattr(self.backend, "api_client", None)
        if api_client is None:  # nodes in memory: tests drive self.cc directly
            return
        from kubernetes import client

        from kfp_gpu_rehearsal.sim.computeclass_controller import ComputeClassController

        try:
            client.ApiextensionsV1Api(api_client).read_custom_resource_definition("computeclasses.cloud.google.com")
        except client.ApiException:
            return
        self.backend.extras = self._node_extras  # type: ignore[union-attr]
        self._cc_controller = ComputeClassController(lambda: self.cc, api_client,
                                                     cluster=self.scenario.cluster).start()
