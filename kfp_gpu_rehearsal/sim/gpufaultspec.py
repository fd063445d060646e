"""The scenario's ``gpu_faults:`` block: nodes born with a bad GPU, and Xid errors on running nodes (docs/sim.md,
"GPU health"; played by :mod:`kfp_gpu_rehearsal.sim.gpuhealth`)::

    gpu_faults:
      born_bad:                 # the first `count` nodes this pool registers have a bad GPU
        - {pool: h100-spot-a, count: 1, kind: dcgm, crash_after_s: 120, condition: false}
      xid:                      # at `at_s` (real-world seconds), `count` running nodes of the pool get an Xid
        - {at_s: 600, pool: h100-spot-a, count: 1, crash_after_s: 300}

``kind``: ``dcgm`` (fails ``dcgmi diag``), ``missing`` (a GPU fell off the bus: the ``nvidia-smi`` count), ``xid``.
``crash_after_s``: a GPU pod on the node dies this long after it met the fault. ``condition``: a detector publishes
the cloud's GPU node condition (default false at birth, true for an Xid).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kfp_gpu.errors import InvalidSpec
from kfp_gpu_rehearsal.sim.gpuhealth import FAULT_KINDS, GpuFault
from kfp_gpu_rehearsal.sim.worldspec import listing, num, obj


@dataclass(frozen=True)
class BornBad:
    pool: str
    count: int
    fault: GpuFault


@dataclass(frozen=True)
class XidEvent:
    at_s: float
    pool: str
    count: int
    fault: GpuFault


@dataclass(frozen=True)
class GpuFaults:
    born_bad: tuple[BornBad, ...] = ()
    xid: tuple[XidEvent, ...] = ()


def _fault(d: dict[str, Any], f: str, kind: str, condition: bool) -> GpuFault:
    k = str(d.get("kind", kind))
    if k not in FAULT_KINDS:
        raise InvalidSpec(f"{f}.kind", k, f"allowed: {', '.join(FAULT_KINDS)}")
    cond = d.get("condition", condition)
    if not isinstance(cond, bool):
        raise InvalidSpec(f"{f}.condition", cond, "must be true or false")
    return GpuFault(k, num(d.get("crash_after_s", 120.0), f"{f}.crash_after_s", 0.0), cond)


def _pool(d: dict[str, Any], f: str, pools: Iterable[str]) -> str:
    names = sorted(pools)
    if d.get("pool") not in names:
        raise InvalidSpec(f"{f}.pool", d.get("pool"), f"unknown pool; known: {names}")
    return str(d["pool"])


def parse_gpu_faults(data: Any, pools: Iterable[str], f: str = "gpu_faults") -> GpuFaults:
    """Raises: InvalidSpec naming the field (``gpu_faults.born_bad[0].kind``...)."""
    if data is None:
        return GpuFaults()
    d = obj(data, f, {"born_bad", "xid"})
    pools = tuple(pools)
    born = []
    for i, x in enumerate(listing(d.get("born_bad", []), f"{f}.born_bad")):
        g = f"{f}.born_bad[{i}]"
        b = obj(x, g, {"pool", "count", "kind", "crash_after_s", "condition"})
        born.append(BornBad(_pool(b, g, pools), int(num(b.get("count", 1), f"{g}.count", 1)),
                            _fault(b, g, "dcgm", False)))
    xid = []
    for i, x in enumerate(listing(d.get("xid", []), f"{f}.xid")):
        g = f"{f}.xid[{i}]"
        e = obj(x, g, {"at_s", "pool", "count", "crash_after_s", "condition"})
        xid.append(XidEvent(num(e.get("at_s", 0.0), f"{g}.at_s", 0.0), _pool(e, g, pools),
                            int(num(e.get("count", 1), f"{g}.count", 1)), _fault({**e, "kind": "xid"}, g, "xid", True)))
    return GpuFaults(tuple(born), tuple(xid))
