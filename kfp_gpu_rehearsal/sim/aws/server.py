"""AwsSimServer: the HTTP front of the AWS stand-in (EKS, Auto Scaling, EC2, Service Quotas on one port).

Every AWS request passes the throttle first (a token bucket per service and API action, refilled in wall-clock
time: requests are real requests in real time), then is routed by the SigV4 credential scope's service name.
``/sim/v1/...`` are the stand-in's own control paths (interrupt, state, requests, reset-requests).
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kfp_gpu.rehearsal_seam import LOCAL_CLUSTER_LABEL
from kfp_gpu_rehearsal.sim.aws import api, wire
from kfp_gpu_rehearsal.sim.aws.iam import Principals, Refusal
from kfp_gpu_rehearsal.sim.aws.records import AwsError, EksNodeBackend
from kfp_gpu_rehearsal.sim.aws.scenario import AwsScenario, load
from kfp_gpu_rehearsal.sim.aws.world import AwsWorld
from kfp_gpu_rehearsal.sim.clock import Timeline
from kfp_gpu_rehearsal.sim.imagepull import NodeImages, PullWatcher

THROTTLE = {"ec2": ("RequestLimitExceeded", "Request limit exceeded.", 503),
            "autoscaling": ("Throttling", "Rate exceeded", 400),
            "eks": ("ThrottlingException", "Rate exceeded", 429),
            "servicequotas": ("TooManyRequestsException", "Rate exceeded", 400)}
_READ = ("Describe", "List", "Get")


class Buckets:
    """One token bucket per (service, API action), as EC2 evaluates "each API individually"; its size and refill
    rate are the scenario's read (Describe/List/Get) or write figures. Refilled at the documented rate per
    **wall-clock** second (``now``, injectable): the clients' requests are real requests made in real time, so the
    world's time compression does not apply (refilled per compressed second, 20 tokens/s became 2,400/s and the
    bucket never bound beyond its burst)."""

    def __init__(self, scenario: AwsScenario, now: Callable[[], float] = time.monotonic) -> None:
        self.t, self.clock = scenario.throttle, now
        self.level: dict[tuple[str, str], tuple[float, float]] = {}  # (service, action) -> (tokens, at)
        self.lock = threading.Lock()
        self.refused = 0

    def take(self, service: str, action: str) -> bool:
        kind = "read" if action.startswith(_READ) else "write"
        burst = self.t.read_burst if kind == "read" else self.t.write_burst
        rate = self.t.read_refill_per_s if kind == "read" else self.t.write_refill_per_s
        if burst <= 0:
            return True
        now = self.clock()
        with self.lock:
            tokens, at = self.level.get((service, action), (float(burst), now))
            tokens = min(float(burst), tokens + (now - at) * rate)
            if tokens < 1.0:
                self.level[(service, action)] = (tokens, now)
                self.refused += 1
                return False
            self.level[(service, action)] = (tokens - 1.0, now)
            return True


def _unsigned_service(body: bytes, target: str) -> str:
    if target:
        return "servicequotas"
    version = wire.form(body).get("Version", "") if body else ""
    return {"2016-11-15": "ec2", "2011-01-01": "autoscaling"}.get(version, "eks")


def _eks_action(method: str, path: str) -> str:
    if path.endswith("/update-config"):
        return "UpdateNodegroupConfig"
    return "DescribeNodegroup" if "/node-groups/" in path else ("ListNodegroups" if path.endswith("node-groups")
                                                                  else "DescribeCluster")


class AwsSimServer:
    """The AWS stand-in. ``kubeconfig`` None keeps nodes in memory (:class:`~kfp_gpu_rehearsal.sim.aws.nodes.MemoryNodes`).

    Raises: InvalidSpec (bad scenario), OSError (port in use) from :meth:`start`.
    """

    def __init__(self, scenario: AwsScenario | str | Path | dict[str, Any] | None = None,
                 kubeconfig: str | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 backend: EksNodeBackend | None = None, timeline: Timeline | None = None) -> None:
        self.scenario = load(scenario)
        if backend is None:
            if kubeconfig:
                from kfp_gpu_rehearsal.sim.aws.nodes import EksKubeNodes

                backend = EksKubeNodes(kubeconfig, self.scenario.region)
            else:
                from kfp_gpu_rehearsal.sim.aws.nodes import MemoryNodes

                backend = MemoryNodes()
        self.backend = backend
        self.world = AwsWorld(self.scenario, backend, timeline=timeline)
        self.buckets = Buckets(self.scenario)
        self.requests: collections.Counter[str] = collections.Counter()
        self.host, self.port = host, port
        self._httpd: ThreadingHTTPServer | None = None
        self.url = ""
        self.principals = Principals()  # access key id -> allowed actions (kfp_gpu_rehearsal.sim.aws.iam)
        self.images = NodeImages(self.scenario.image_pull)  # image pulls (kfp_gpu_rehearsal.sim.imagepull)
        self._pull: PullWatcher | None = None

    def grant(self, key_id: str, actions: Iterable[str]) -> None:
        """Make access key ``key_id`` a principal allowed exactly ``actions`` (a reduced policy, in tests)."""
        self.principals.grant(key_id, actions)

    def start(self) -> str:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall (docs/sim.md)

            def log_message(self, *_: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def _serve(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                status, headers, out = server.handle(method, self.path, self.headers, body)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self._httpd = ThreadingHTTPServer((self.host, self.port), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, name="aws-sim-http", daemon=True).start()
        self.url = f"http://{self.host}:{self._httpd.server_address[1]}"
        api_client = getattr(self.backend, "api_client", None)
        if api_client is not None:  # nodes in a cluster: tell KWOK when each pod's image pull is done
            self._pull = PullWatcher(lambda: self.images, api_client,
                                     f"{LOCAL_CLUSTER_LABEL}={self.scenario.cluster}").start()
        return self.url

    def stop(self) -> None:
        if self._pull is not None:
            self._pull.stop()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        self.world.timeline.stop()
        self.world.close()

    def __enter__(self) -> AwsSimServer:
        self.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop()

    # ---- routing ----------------------------------------------------------------------------
    def handle(self, method: str, raw_path: str, headers: Any, body: bytes) -> wire.Answer:
        parts = urlsplit(raw_path)
        path, query = parts.path, {k: v[0] for k, v in parse_qs(parts.query).items()}
        if path.startswith("/sim/v1/"):
            return self._control(method, path, body)
        _region, service = wire.scope(headers)
        target = headers.get("X-Amz-Target", "") or ""
        q = wire.form(body) if service in ("ec2", "autoscaling") else {}
        action = (q.get("Action") if q else target.rsplit(".", 1)[-1] if target else _eks_action(method, path)) or ""
        self.requests[f"{service}:{action}"] += 1
        if self.scenario.api_latency_ms:
            time.sleep(self.scenario.api_latency_ms / 1000)
        auth = headers.get("Authorization", "") or ""
        if not auth:  # AWS refuses an unsigned call in the service's own shape
            service = _unsigned_service(body, target)
        elif service not in THROTTLE:
            return wire.json11_error("UnrecognizedClientException", "The request is not signed for a service the "
                                     "stand-in serves (eks, autoscaling, ec2, servicequotas).", 400)
        try:  # authentication and authorization come before throttling
            self.principals.check(service, action, auth, region=_region or self.scenario.region,
                                  tagged=any(k.startswith("TagSpecification") for k in q))
        except Refusal as exc:
            return wire.error(service, exc.code, exc.message, exc.status)
        if not self.buckets.take(service, action):
            return wire.error(service, *THROTTLE[service])
        try:
            if service == "eks":
                return api.eks(self.world, method, path, query, body)
            if service == "autoscaling":
                return api.autoscaling(self.world, q)
            if service == "ec2":
                return api.ec2(self.world, q)
            return api.servicequotas(self.world, target, body)
        except AwsError as exc:
            return wire.error(service, exc.code, exc.message, exc.status)

    def _control(self, method: str, path: str, body: bytes) -> wire.Answer:
        req = json.loads(body or b"{}") if method == "POST" else {}
        try:
            if path == "/sim/v1/interrupt" and method == "POST":
                if req.get("nodegroup"):
                    return wire.rest_ok({"interrupted": self.world.interrupt_group(req["nodegroup"],
                                                                                   int(req.get("count", 1)))})
                iid = req.get("instance") or ""
                if req.get("node"):
                    inst = self.world.by_node(req["node"])
                    iid = inst.id if inst else req["node"]
                return wire.rest_ok(self.world.interrupt(iid))
            if path == "/sim/v1/state":
                return wire.rest_ok(self.world.snapshot())
            if path == "/sim/v1/requests":
                return wire.rest_ok({"total": sum(self.requests.values()), "byAction": dict(self.requests),
                                     "throttled": self.buckets.refused})
            if path == "/sim/v1/reset-requests" and method == "POST":
                self.requests.clear()
                return wire.rest_ok({})
        except AwsError as exc:
            return wire.rest_error(exc.code, exc.message, exc.status)
        return wire.rest_error("NotFound", f"no stand-in path {method} {path}", 404)

    # ---- Python helpers (tests) ---------------------------------------------------------------
    def interrupt(self, node_or_instance: str) -> dict[str, Any]:
        """Send a Spot interruption notice to an instance (by id or node name). Raises: AwsError."""
        inst = self.world.by_node(node_or_instance)
        return self.world.interrupt(inst.id if inst else node_or_instance)
