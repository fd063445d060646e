"""Quota arithmetic: what a spec needs, per metric, compared with provider quota rows.

GCP quotas count GPUs: the regional metric (``NVIDIA_A100_80GB_GPUS``; ``PREEMPTIBLE_*`` for spot,
falling back to the standard metric when no preemptible row exists, as GCP does), the Cloud Quotas
GPU-family quota where Compute omits the metric (H100/H200), and the project-wide
``GPUS_ALL_REGIONS``. AWS quotas count **vCPUs** of running instances per family (P or G, on-demand
or spot), so the need is ``nodes * instance vCPUs``.

A quota row that is missing or ``status="unknown"`` yields an UNKNOWN verdict: never "ok".

``capacity="reservation"``: a reservation already counts against the quotas for everything it reserves (GCP
counts max(reserved, used) per reservation; an EC2 Capacity Reservation holds its vCPUs of the On-Demand limit),
so nodes that land in the named reservation's free slots need no new quota: :func:`reserved_nodes` counts them
and :func:`needs` asks quota only for the rest.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kfp_gpu import accelerators
from kfp_gpu.providers.base import PoolState, QuotaAmount
from kfp_gpu.spec import CapacityType, ProvisioningSpec, TargetKind


class Verdict(str, enum.Enum):
    FITS = "fits"
    UNKNOWN = "unknown"
    SHORT = "short"


_ORDER = {Verdict.FITS: 0, Verdict.UNKNOWN: 1, Verdict.SHORT: 2}


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """SHORT beats UNKNOWN beats FITS; an empty set is UNKNOWN (nothing was checked)."""
    vs = list(verdicts)
    return max(vs, key=_ORDER.__getitem__) if vs else Verdict.UNKNOWN


def verdict_rank(v: Verdict) -> int:
    return _ORDER[v]


@dataclass(frozen=True)
class Need:
    """An amount the run needs of one quota. ``metrics`` are alternative names, preferred first."""

    metrics: tuple[str, ...]
    location: str  # region or "global"
    amount: float
    unit: str  # "gpus" | "vcpus"
    optional: bool = False  # not checked when the provider returns no row for it (a metric the cloud does not list)

    @property
    def metric(self) -> str:
        return self.metrics[0]


@dataclass(frozen=True)
class QuotaCheck:
    """One need compared with one quota row."""

    metric: str
    location: str
    unit: str
    needed: float
    verdict: Verdict
    limit: float | None = None
    usage: float | None = None
    free: float | None = None
    reason: str = ""
    raise_path: str = ""
    lead_time_days: float = 0.0

    @property
    def short_by(self) -> float:
        if self.verdict is not Verdict.SHORT or self.free is None:
            return 0.0
        return max(0.0, self.needed - self.free)

    @property
    def headroom(self) -> float | None:
        """(free - needed) / needed; None when unknown."""
        if self.free is None or self.needed <= 0:
            return None
        return (self.free - self.needed) / self.needed

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"] = self.verdict.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuotaCheck:
        return cls(**{**d, "verdict": Verdict(d["verdict"])})


def reservation_free(spec: ProvisioningSpec, pools: Sequence[PoolState] | None) -> int | None:
    """Free VMs of the reservation ``spec.reservation`` names (``capacity="reservation"``), read from the pools
    whose SPECIFIC affinity names it (one count per zone: the pools of a zone share the reservation, summed over
    zones); None when it is not a reservation run or no pool reports the count."""
    if spec.capacity is not CapacityType.RESERVATION or not spec.reservation or not pools:
        return None
    per_zone: dict[str, int] = {}
    for p in pools:
        if p.reservation_affinity == "specific" and spec.reservation in p.reservations and p.reservation_free is not None:
            per_zone[p.ref.zone] = max(per_zone.get(p.ref.zone, 0), p.reservation_free)
    return sum(per_zone.values()) if per_zone else None


def reserved_nodes(spec: ProvisioningSpec, pools: Sequence[PoolState] | None) -> int:
    """Nodes of the gang the named reservation covers (0 unless ``capacity="reservation"`` and its free count is
    known): they need no new quota."""
    free = reservation_free(spec, pools)
    return 0 if free is None else max(0, min(spec.nodes, free))


def needs(spec: ProvisioningSpec, region: str, *, reserved: int = 0) -> list[Need]:
    """Quota needs of ``spec`` if placed in ``region``; ``reserved`` nodes land in a reservation the project
    already holds (:func:`reserved_nodes`) and need none.

    Raises: InvalidSpec when the accelerator has no machine shape with ``spec.gpus_per_node``.
    """
    acc = accelerators.get(spec.accelerator)
    nodes = max(0, spec.nodes - reserved)
    if spec.target.kind is TargetKind.EKS:
        shape = acc.aws_instance_for(spec.gpus_per_node)
        code = acc.aws_quota_spot if spec.spot else acc.aws_quota_on_demand
        return [Need((code,), region, float(nodes * shape.vcpus), "vcpus")]
    gpus = float(nodes * spec.gpus_per_node)
    regional: tuple[str, ...] = (acc.gcp_quota_metric,)
    if spec.spot:
        regional = (acc.gcp_preemptible_metric, acc.gcp_quota_metric)
    if acc.gcp_gpu_family:
        regional += (acc.gcp_gpu_family, accelerators.GCP_GPU_FAMILY_QUOTA_ID)
    vcpus = float(nodes * acc.gce_machine_for(spec.gpus_per_node).vcpus)
    cpus = (GCP_PREEMPTIBLE_CPUS, GCP_CPUS) if spec.spot else (GCP_CPUS,)
    return [
        Need(regional, region, gpus, "gpus"),
        Need((accelerators.GCP_ALL_REGIONS_METRIC,), "global", gpus, "gpus"),
        Need(cpus, region, vcpus, "vcpus", optional=True),  # GCE checks the machine type's vCPUs per VM too
    ]


GCP_CPUS, GCP_PREEMPTIBLE_CPUS = "CPUS", "PREEMPTIBLE_CPUS"


def _row_for(need: Need, rows: Sequence[QuotaAmount]) -> QuotaAmount | None:
    for i, metric in enumerate(need.metrics):
        matches = [r for r in rows if r.metric == metric and r.location == need.location]
        if metric == GCP_PREEMPTIBLE_CPUS and i + 1 < len(need.metrics) and all(r.limit == 0 for r in matches):
            continue  # no preemptible CPU quota: Spot VMs use the standard CPUS quota
        if matches:
            known = [r for r in matches if r.free is not None]
            if known:
                return min(known, key=lambda r: r.free if r.free is not None else 0.0)
            return matches[0]
    return None


def check(need: Need, rows: Sequence[QuotaAmount]) -> QuotaCheck | None:
    """Compare one need with the rows the provider returned (None: an optional need with no row)."""
    row = _row_for(need, rows)
    if row is None and need.optional:
        return None
    if row is None:
        return QuotaCheck(
            need.metric, need.location, need.unit, need.amount, Verdict.UNKNOWN,
            reason=f"no quota row for {' / '.join(need.metrics)} in {need.location} was returned",
        )
    free = row.free
    if free is None:
        return QuotaCheck(
            row.metric, need.location, need.unit, need.amount, Verdict.UNKNOWN, row.limit, row.usage,
            None, row.reason or "quota could not be read", row.raise_path, row.lead_time_days,
        )
    verdict = Verdict.FITS if free >= need.amount else Verdict.SHORT
    reason = "" if verdict is Verdict.FITS else f"short by {need.amount - free:g} {need.unit}"
    return QuotaCheck(
        row.metric, need.location, need.unit, need.amount, verdict, row.limit, row.usage, free,
        reason, row.raise_path, row.lead_time_days,
    )


def evaluate(spec: ProvisioningSpec, region: str, rows: Sequence[QuotaAmount], *, reserved: int = 0,
             ) -> list[QuotaCheck]:
    """Every need of ``spec`` in ``region`` (less ``reserved`` nodes, see :func:`needs`) checked against ``rows``.

    Raises: InvalidSpec (see :func:`needs`).
    """
    return [c for n in needs(spec, region, reserved=reserved) if (c := check(n, rows)) is not None]
