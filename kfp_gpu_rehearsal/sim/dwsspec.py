"""Scenario parts for GKE's queued provisioning (Dynamic Workload Scheduler, class ``queued-provisioning.gke.io``).

Durations are **real-world seconds**, compressed by :data:`kfp_gpu_rehearsal.devcluster.worldtime.TIME_SCALE` when the world runs.
Defaults and their sources: docs/sim.md, section 12 ("Queued provisioning").

Scenario keys::

    dws:                        # all optional
      accept_s: 10              # request seen -> Accepted=True (one autoscaler loop)
      queue: {dist: lognormal, median_s: 600, sigma: 1.0, seed: 0, min_s: 60}   # wait in the queue
      queue_timeout_s: 604800   # still queued this long after creation -> Failed (WaitTimeExceeded)
      booking_s: 600            # Provisioned -> BookingExpired
      retry_s: 60               # a stocked-out / full pool is looked at again this often
    provisioning_revocations:   # GKE reclaims the capacity of every provisioned request of the pool at at_s
      - {at_s: 300, pool: h100-80gb-dws-a}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kfp_gpu.errors import InvalidSpec
from kfp_gpu_rehearsal.sim.worldspec import BootLatency, listing, num, obj

SEVEN_DAYS_S = 7 * 24 * 3600.0  # GKE's default and maximum maxRunDurationSeconds


def default_queue() -> BootLatency:
    """Queue wait: minutes typically, with a long tail (field reports measured hours to days)."""
    return BootLatency("lognormal", 600.0, 1.0, 0, 60.0)


@dataclass(frozen=True)
class DwsSpec:
    accept_s: float = 10.0
    queue: BootLatency = field(default_factory=default_queue)
    queue_timeout_s: float = SEVEN_DAYS_S
    booking_s: float = 600.0
    retry_s: float = 60.0


@dataclass(frozen=True)
class Revocation:
    """At ``at_s`` (real-world seconds since the world started) GKE reclaims every provisioned request of ``pool``."""

    at_s: float
    pool: str


def parse_dws(data: Any, f: str = "dws") -> DwsSpec:
    """The ``dws:`` block. Raises: InvalidSpec naming the field (``dws.queue.median_s``...)."""
    d = obj(data if data is not None else {}, f, {"accept_s", "queue", "queue_timeout_s", "booking_s", "retry_s"})
    base = DwsSpec()
    q = obj(d.get("queue", {}), f"{f}.queue", {"dist", "median_s", "sigma", "seed", "min_s"})
    dq = base.queue
    dist = str(q.get("dist", "lognormal" if "sigma" in q or not q else "fixed"))
    if dist not in ("fixed", "lognormal"):
        raise InvalidSpec(f"{f}.queue.dist", dist, "allowed: 'fixed', 'lognormal'")
    queue = BootLatency(
        dist, num(q.get("median_s", dq.median_s), f"{f}.queue.median_s", 0.0),
        num(q.get("sigma", dq.sigma if dist == "lognormal" else 0.0), f"{f}.queue.sigma", 0.0),
        int(num(q.get("seed", dq.seed), f"{f}.queue.seed", 0.0)),
        num(q.get("min_s", dq.min_s if dist == "lognormal" and "median_s" not in q else 0.0),
            f"{f}.queue.min_s", 0.0),
    )
    return DwsSpec(
        num(d.get("accept_s", base.accept_s), f"{f}.accept_s", 0.0), queue,
        num(d.get("queue_timeout_s", base.queue_timeout_s), f"{f}.queue_timeout_s", 0.0),
        num(d.get("booking_s", base.booking_s), f"{f}.booking_s", 0.0),
        num(d.get("retry_s", base.retry_s), f"{f}.retry_s", 0.001),
    )


def parse_revocations(data: Any, pools: dict[str, bool], f: str = "provisioning_revocations") -> tuple[Revocation, ...]:
    """``provisioning_revocations``; ``pools`` maps pool name -> queued provisioning enabled.

    Raises: InvalidSpec naming the field (unknown pool, a pool without queued provisioning, bad time).
    """
    out = []
    for i, x in enumerate(listing(data if data is not None else [], f)):
        e = obj(x, f"{f}[{i}]", {"at_s", "pool"})
        pool = str(e.get("pool", ""))
        if not pools.get(pool):
            queued = sorted(n for n, q in pools.items() if q)
            raise InvalidSpec(f"{f}[{i}].pool", pool, f"not a queued-provisioning pool; those are {queued}")
        out.append(Revocation(num(e.get("at_s", 0.0), f"{f}[{i}].at_s", 0.0), pool))
    return tuple(out)


def parse_queued(data: Any, f: str) -> bool:
    """A pool's ``queued_provisioning`` (GKE ``queuedProvisioning.enabled``): ``true`` or ``{enabled: true}``.

    Raises: InvalidSpec naming the field.
    """
    if data is None:
        return False
    if isinstance(data, dict):
        data = obj(data, f, {"enabled"}).get("enabled", True)
        f = f"{f}.enabled"
    if not isinstance(data, bool):
        raise InvalidSpec(f, data, "must be true or false")
    return data
