"""What goes wrong in a scenario, and when: stockout windows, injected API faults, preemption events, and the API
layer's hardness (request budget, 5xx rate) - the ``stockouts:``, ``faults:``, ``preemptions:`` and ``api:`` blocks.

Contract: each ``parse_*`` validates its block of plain data into frozen dataclasses and raises
:class:`~kfp_gpu.errors.InvalidSpec` naming the offending field (``stockouts[1].zone``, ``faults[0].status``,
``api.error_rate``); :func:`kfp_gpu_rehearsal.sim.scenario.from_dict` calls them with the zones and pool names
it has already validated. Kept apart so scenario.py stays small.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kfp_gpu import accelerators
from kfp_gpu.errors import InvalidSpec
from kfp_gpu_rehearsal.sim.worldspec import listing as _list
from kfp_gpu_rehearsal.sim.worldspec import num as _num
from kfp_gpu_rehearsal.sim.worldspec import obj as _obj

__all__ = ["PROVISIONING_MODELS", "ApiSpec", "Fault", "PreemptionEvent", "Stockout", "parse_api", "parse_faults",
           "parse_preemptions", "parse_stockouts"]

PROVISIONING_MODELS = ("spot", "standard", "flex-start")  # Compute Engine provisioning models a stockout can hit


@dataclass(frozen=True)
class Stockout:
    """``zone`` has no stock between ``start_s`` and ``end_s`` (seconds since server start)."""

    zone: str
    start_s: float = 0.0
    end_s: float | None = None  # None = forever ("always")
    accelerator: str = ""  # empty = every accelerator
    with_details: bool = False  # use ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS
    capacity: int | None = None  # room for this many VMs (of the accelerator) in the zone; None = none at all
    provisioning: str = ""  # only VMs of this provisioning model: spot | standard | flex-start; "" = every model

    def active(self, t: float, accelerator: str, model: str = "") -> bool:
        if self.accelerator and self.accelerator != accelerator:
            return False
        if self.provisioning and model and self.provisioning != model:
            return False
        return self.start_s <= t and (self.end_s is None or t < self.end_s)


@dataclass(frozen=True)
class Fault:
    """The first ``count`` requests whose path matches ``path`` (regex, searched) fail with ``status``."""

    path: str
    status: int = 429
    count: int = 1
    method: str = ""  # empty = any method
    reason: str = ""  # errors[].reason override
    message: str = ""


@dataclass(frozen=True)
class PreemptionEvent:
    at_s: float
    pool: str
    count: int = 1


@dataclass(frozen=True)
class ApiSpec:
    """The API layer's hardness (docs/sim.md, "API layer"): a per-project, per-service request budget
    per compressed minute, and a seeded rate of 5xx answers.

    ``requests_per_minute`` 0 = unlimited; ``retry_after_s`` None = the real seconds until the budget
    refills; ``committed_5xx`` = fraction of mutation 5xx answers sent after the change took effect.
    """

    requests_per_minute: int = 1500
    error_rate: float = 0.01
    seed: int = 0
    committed_5xx: float = 0.5
    retry_after_s: float | None = None


def parse_stockouts(data: Any, zones: set[str]) -> list[Stockout]:
    """Validate the ``stockouts:`` list against the scenario's zones. Raises: InvalidSpec naming ``stockouts[i].<field>``."""
    stockouts = []
    for i, s in enumerate(_list(data, "stockouts")):
        f = f"stockouts[{i}]"
        so = _obj(s, f, {"zone", "start_s", "end_s", "window", "accelerator", "with_details", "capacity",
                         "provisioning"})
        zone = str(so.get("zone", ""))
        if zone not in zones:
            raise InvalidSpec(f"{f}.zone", zone, f"unknown zone; known: {sorted(zones)}")
        start, end = _num(so.get("start_s", 0.0), f"{f}.start_s", 0.0), so.get("end_s")
        if so.get("window", "") == "always":
            start, end = 0.0, None
        elif so.get("window") not in (None, "always"):
            raise InvalidSpec(f"{f}.window", so.get("window"), "only 'always' is allowed (or use start_s/end_s)")
        end_f = None if end is None else _num(end, f"{f}.end_s", start)
        acc = str(so.get("accelerator", ""))
        if acc:
            acc = accelerators.get(acc).name
        cap = so.get("capacity")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
            raise InvalidSpec(f"{f}.capacity", cap, "must be a whole number of VMs >= 0 (omit it for no room at all)")
        model = str(so.get("provisioning", ""))
        if model not in ("", *PROVISIONING_MODELS):
            raise InvalidSpec(f"{f}.provisioning", model, f"allowed: {', '.join(PROVISIONING_MODELS)} (omit it for "
                              "every provisioning model)")
        stockouts.append(Stockout(zone, start, end_f, acc, bool(so.get("with_details", False)), cap, model))
    return stockouts


def parse_faults(data: Any) -> list[Fault]:
    """Validate the ``faults:`` list (path regexes, HTTP error statuses). Raises: InvalidSpec naming ``faults[i].<field>``."""
    faults = []
    for i, x in enumerate(_list(data, "faults")):
        f = f"faults[{i}]"
        fo = _obj(x, f, {"path", "status", "count", "method", "reason", "message"})
        try:
            re.compile(str(fo.get("path", "")))
        except re.error as exc:
            raise InvalidSpec(f"{f}.path", fo.get("path"), f"not a regex ({exc})") from None
        status = int(_num(fo.get("status", 429), f"{f}.status", 400))
        if status > 599:
            raise InvalidSpec(f"{f}.status", status, "must be an HTTP error status 400..599")
        faults.append(Fault(
            str(fo.get("path", "")), status, int(_num(fo.get("count", 1), f"{f}.count", 0)),
            str(fo.get("method", "")).upper(), str(fo.get("reason", "")), str(fo.get("message", "")),
        ))
    return faults


def parse_preemptions(data: Any, pools: list[str]) -> list[PreemptionEvent]:
    """Validate the ``preemptions:`` list against the pool names. Raises: InvalidSpec naming ``preemptions[i].<field>``."""
    events = []
    for i, x in enumerate(_list(data, "preemptions")):
        f = f"preemptions[{i}]"
        eo = _obj(x, f, {"at_s", "pool", "count"})
        if eo.get("pool") not in pools:
            raise InvalidSpec(f"{f}.pool", eo.get("pool"), f"unknown pool; known: {pools}")
        events.append(PreemptionEvent(
            _num(eo.get("at_s", 0.0), f"{f}.at_s", 0.0), str(eo["pool"]),
            int(_num(eo.get("count", 1), f"{f}.count", 1)),
        ))
    return events


def parse_api(data: Any, f: str = "api") -> ApiSpec:
    """Validate the ``api:`` block. Raises: InvalidSpec naming the field (``api.error_rate``...)."""
    a = _obj(data, f, {"requests_per_minute", "error_rate", "seed", "committed_5xx", "retry_after_s"})
    d = ApiSpec()
    rate, committed = (_num(a.get(k, getattr(d, k)), f"{f}.{k}", 0.0) for k in ("error_rate", "committed_5xx"))
    for k, v in (("error_rate", rate), ("committed_5xx", committed)):
        if v > 1:
            raise InvalidSpec(f"{f}.{k}", v, "must be a fraction in [0, 1]")
    ra = a.get("retry_after_s")
    return ApiSpec(
        int(_num(a.get("requests_per_minute", d.requests_per_minute), f"{f}.requests_per_minute", 0.0)),
        rate, int(_num(a.get("seed", d.seed), f"{f}.seed", 0.0)), committed,
        None if ra is None else _num(ra, f"{f}.retry_after_s", 0.0),
    )
