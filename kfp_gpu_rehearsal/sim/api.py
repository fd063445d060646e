"""The stand-in's API layer: per-project request budgets (rate quotas) and seeded 5xx answers.

Pure Python, thread-safe, no HTTP; :mod:`kfp_gpu_rehearsal.sim.server` asks it before and after each request.
See docs/sim.md, "API layer", for the documented Google behaviour each rule follows.

* **Budget.** Each (project, API service) pair may make ``api.requests_per_minute`` requests per minute of
  **wall-clock** time, enforced per wall second: ``floor(rpm / 60)`` requests in each fixed one-second window
  (below 60 rpm: one request per ``60 / rpm`` s window), counted in synchronized windows that start with the
  server, as Compute refills "at the start of the next synchronized interval", not continuously. The requests
  are real requests made in real time, so the world's time compression does not apply to them (a budget per
  *compressed* minute, 1,500 requests per 0.5 s, never bound). Any sequence allowed in one-second windows
  stays within the per-minute figure in every aligned minute, so the stand-in is never kinder than the
  documented quota; it is harsher on bursts. A request over budget is refused (Compute: 403
  ``rateLimitExceeded``; GKE and Cloud Quotas: 429 ``RESOURCE_EXHAUSTED`` / ``RATE_LIMIT_EXCEEDED``) with
  ``Retry-After`` = seconds until the window refills (decimal). Once a window's budget is spent, every
  further request of that window is refused: retrying sooner does not help.
* **5xx.** A seeded ``api.error_rate`` of requests answers 500 or 503 ``backendError``. The decision is
  a hash of (seed, route, n-th call of that route), so a sequential client sees the same faults on every
  run. For a mutation, ``api.committed_5xx`` of those answers are sent *after* the change took effect
  (the response was lost); the others before it (nothing happened).
"""

from __future__ import annotations

import collections
import hashlib
import threading
import time
from collections.abc import Callable

from kfp_gpu_rehearsal.sim import clock
from kfp_gpu_rehearsal.sim.eventspec import ApiSpec
from kfp_gpu_rehearsal.sim.shapes import SimHttpError, http_error

COMPUTE, CONTAINER, QUOTAS = "compute.googleapis.com", "container.googleapis.com", "cloudquotas.googleapis.com"
# the quota metric / limit names Google puts into a rate-limit error, per service
_METRIC = {COMPUTE: ("Queries", "Queries per minute"),
           CONTAINER: ("Requests", "Requests per minute per project"),
           QUOTAS: ("Requests", "Requests per minute")}


def sim_time_scale() -> float:
    """:func:`kfp_gpu_rehearsal.sim.clock.scale`, the one compression factor of the stand-in."""
    return float(clock.scale())


def service_of(path: str) -> str:
    """The Google API service a REST path belongs to ("" for the stand-in's own /sim/ paths)."""
    if path.startswith("/compute/"):
        return COMPUTE
    if path.startswith("/sim/"):
        return ""
    if "/quotaInfos" in path or "/quotaPreferences" in path:
        return QUOTAS
    return CONTAINER


def project_of(path: str) -> str:
    parts = path.split("/")
    return parts[parts.index("projects") + 1] if "projects" in parts[:-1] else ""


def rate_limited(service: str, project: str, limit: int, retry_after_s: float) -> SimHttpError:
    """Google's rate-quota refusal for ``service``, with a ``Retry-After`` header (decimal seconds)."""
    metric, limit_name = _METRIC.get(service, ("Requests", "Requests per minute"))
    message = (f"Quota exceeded for quota metric '{metric}' and limit '{limit_name}' of service '{service}' "
               f"for consumer 'project_number:{project}'.")
    status = 403 if service == COMPUTE else 429
    err = http_error(status, message, reason="rateLimitExceeded", domain="usageLimits")
    body = err.body["error"]
    if status == 429:
        body["status"] = "RESOURCE_EXHAUSTED"
    body["details"] = [{
        "@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED",
        "domain": "googleapis.com", "metadata": {
            "service": service, "consumer": f"projects/{project}", "quota_metric": f"{service}/{metric.lower()}",
            "quota_limit": limit_name.replace(" ", ""), "quota_limit_value": str(limit)},
    }]
    err.headers["Retry-After"] = f"{retry_after_s:.3f}"
    return err


def budget_window(requests_per_minute: int) -> tuple[float, int]:
    """(window length in wall seconds, requests allowed per window) for a per-minute quota: one-second windows
    of ``floor(rpm / 60)`` requests; below 60 rpm, one request per ``60 / rpm`` s. (1.0, 0) for 0 = unlimited."""
    if requests_per_minute <= 0:
        return 1.0, 0
    if requests_per_minute < 60:
        return 60.0 / requests_per_minute, 1
    return 1.0, requests_per_minute // 60


def backend_error(status: int) -> SimHttpError:
    """Google's transient backend failure (500 INTERNAL / 503 UNAVAILABLE, reason backendError)."""
    return http_error(status, reason="backendError")


def _unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from ``parts``."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


class ApiGate:
    """Decides, per request, whether the API layer refuses it (budget) or fails it (5xx).

    Args:
        spec: the scenario's ``api:`` block.
        now: wall-clock monotonic seconds (injectable for tests).
    """

    def __init__(self, spec: ApiSpec, now: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self.clock = now
        self.window_s, self.budget = budget_window(spec.requests_per_minute)
        self.t0 = now()
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, str], tuple[int, int]] = {}  # (project, service) -> (window, used)
        self._calls: collections.Counter[str] = collections.Counter()
        self.counts: collections.Counter[str] = collections.Counter()  # rateLimited / 5xxBefore / 5xxAfter

    def admit(self, path: str) -> SimHttpError | None:
        """Spend one request of the budget of ``path``'s (project, service); the refusal when over budget."""
        service, limit = service_of(path), self.budget
        if not service or limit <= 0:
            return None
        project = project_of(path)
        with self._lock:
            elapsed = self.clock() - self.t0
            window = int(elapsed // self.window_s)
            seen, used = self._windows.get((project, service), (window, 0))
            used = used + 1 if seen == window else 1
            self._windows[(project, service)] = (window, used)
            if used <= limit:
                return None
            self.counts["rateLimited"] += 1
        wait = self.spec.retry_after_s
        if wait is None:
            wait = (window + 1) * self.window_s - elapsed
        return rate_limited(service, project, self.spec.requests_per_minute, max(0.001, wait))

    def fault(self, route: str) -> tuple[int, bool] | None:
        """(HTTP status, committed) when this call of ``route`` answers 5xx, else None.

        ``committed`` is only ever True for mutations (the caller decides what a mutation is).
        """
        if self.spec.error_rate <= 0 or route.startswith("sim."):
            return None
        with self._lock:
            self._calls[route] += 1
            n = self._calls[route]
        if _unit(self.spec.seed, route, n, "fail") >= self.spec.error_rate:
            return None
        status = 503 if _unit(self.spec.seed, route, n, "status") < 0.5 else 500
        committed = _unit(self.spec.seed, route, n, "committed") < self.spec.committed_5xx
        return status, committed

    def record(self, outcome: str) -> None:
        with self._lock:
            self.counts[outcome] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)
