"""The controller's Prometheus metrics, in the text exposition format, on ``--metrics-port`` (default 8080).

- ``kfp_gpu_gangs{phase}``: gangs by phase (gauge);
- ``kfp_gpu_request_to_ready_seconds``: GpuGang created -> Provisioned=True (histogram);
- ``kfp_gpu_preemptions_total``: preemptions the train work recovered from (counter);
- ``kfp_gpu_gpus_held``: GPUs on nodes of gangs that are provisioned and not released (gauge);
- ``kfp_gpu_idle_gpu_minutes_total``: idle GPU-minutes of released gangs, from their cost reports (counter).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BUCKETS = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
_lock = threading.Lock()
_gangs: dict[tuple[str, str], tuple[str, int]] = {}  # (namespace, name) -> (phase, GPUs held)
_latency: list[float] = []
_counters = {"preemptions": 0.0, "idle_gpu_minutes": 0.0}


def observe_gang(namespace: str, name: str, status: Mapping[str, Any], obj: Mapping[str, Any]) -> None:
    spec = obj.get("spec") or {}
    held = len(status.get("gangNodes") or []) * int(spec.get("gpusPerNode") or 0)
    with _lock:
        _gangs[(namespace, name)] = (str(status.get("phase") or "Pending"), held)


def forget(namespace: str, name: str) -> None:
    with _lock:
        _gangs.pop((namespace, name), None)


def observe_ready_latency(seconds: float) -> None:
    with _lock:
        _latency.append(max(0.0, seconds))


def count_preemptions(step_metrics: Mapping[str, float]) -> None:
    with _lock:
        _counters["preemptions"] += float(step_metrics.get("preemptions", 0.0))


def add_idle_minutes(cost: Mapping[str, Any]) -> None:
    with _lock:
        _counters["idle_gpu_minutes"] += float(cost.get("idle_gpu_minutes", 0.0) or 0.0)


def render() -> str:
    with _lock:
        phases: dict[str, int] = {}
        for ph, _ in _gangs.values():
            phases[ph] = phases.get(ph, 0) + 1
        held = sum(h for ph, h in _gangs.values() if ph not in ("Released", "Releasing"))
        lat = list(_latency)
        counters = dict(_counters)
    lines = ["# HELP kfp_gpu_gangs GpuGangs by phase.", "# TYPE kfp_gpu_gangs gauge"]
    lines += [f'kfp_gpu_gangs{{phase="{ph}"}} {n}' for ph, n in sorted(phases.items())]
    lines += ["# HELP kfp_gpu_request_to_ready_seconds GpuGang created to Provisioned.",
              "# TYPE kfp_gpu_request_to_ready_seconds histogram"]
    lines += [f'kfp_gpu_request_to_ready_seconds_bucket{{le="{b}"}} {sum(1 for x in lat if x <= b)}'
              for b in BUCKETS]
    lines += [f'kfp_gpu_request_to_ready_seconds_bucket{{le="+Inf"}} {len(lat)}',
              f"kfp_gpu_request_to_ready_seconds_sum {sum(lat)}", f"kfp_gpu_request_to_ready_seconds_count {len(lat)}",
              "# HELP kfp_gpu_preemptions_total Preemptions recovered from.", "# TYPE kfp_gpu_preemptions_total counter",
              f"kfp_gpu_preemptions_total {counters['preemptions']}",
              "# HELP kfp_gpu_gpus_held GPUs on the nodes of live gangs.", "# TYPE kfp_gpu_gpus_held gauge",
              f"kfp_gpu_gpus_held {held}",
              "# HELP kfp_gpu_idle_gpu_minutes_total Idle GPU-minutes of released gangs.",
              "# TYPE kfp_gpu_idle_gpu_minutes_total counter",
              f"kfp_gpu_idle_gpu_minutes_total {counters['idle_gpu_minutes']}"]
    return "\n".join(lines) + "\n"


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404)
            return
        body = render().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        return


def serve(port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:  # noqa: S104 - a pod's metrics port
    srv = ThreadingHTTPServer((host, port), _Handler)
    threading.Thread(target=srv.serve_forever, name="kfp-gpu-metrics", daemon=True).start()
    return srv
