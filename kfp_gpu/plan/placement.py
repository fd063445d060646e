"""Rank candidate placements (region, zone) for a spec from observed quota rows and pools.

Ordering: placements that fit first, then unknown, then short. Among equals, the user's explicit
``spec.zones`` priority wins; when the spec names no zones, the placement with the most free
quota headroom (relative to the need) comes first. Ties keep discovery order (stable sort).
Quotas are regional, so every zone of a region shares its region's quota checks; the zone-level
difference is node-pool capacity (sum of ``max_size`` of pools that match the spec).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kfp_gpu.plan.quota import QuotaCheck, Verdict, verdict_rank, worst
from kfp_gpu.providers.base import PoolState
from kfp_gpu.spec import CapacityType, ProvisioningSpec


def zone_region(zone: str) -> str:
    """``us-central1-a`` -> ``us-central1``; ``us-east-1a`` -> ``us-east-1``."""
    if len(zone) > 1 and zone[-1].isalpha() and zone[-2].isdigit():
        return zone[:-1]
    return zone.rsplit("-", 1)[0] if "-" in zone else zone


def consumes(spec: ProvisioningSpec, pool: PoolState) -> bool:
    """Whether ``pool``'s reservation affinity fits the spec's capacity type. ``capacity="reservation"`` takes
    only pools whose affinity is "specific" and names ``spec.reservation``; any other capacity never takes a
    "specific" pool (its VMs exist only inside the reservations it names, which the spec did not ask for)."""
    if spec.capacity is CapacityType.RESERVATION:
        return pool.reservation_affinity == "specific" and spec.reservation in pool.reservations
    return pool.reservation_affinity != "specific"


def matching_pools(spec: ProvisioningSpec, pools: Sequence[PoolState]) -> list[PoolState]:
    """Pools that can host the spec's nodes: same accelerator, GPUs per node and spot-ness, a reservation
    affinity that fits (:func:`consumes`), and - when ``spec.target.pools`` is set - one of the named pools
    (kept in that priority order). A queued-provisioning pool (GKE DWS) serves only ``capacity="flex-start"``."""
    want_spot = spec.capacity is CapacityType.SPOT
    out = [
        p for p in pools
        if p.accelerator == spec.accelerator and p.gpus_per_node == spec.gpus_per_node and p.spot == want_spot
        and consumes(spec, p) and (not spec.target.pools or p.ref.pool in spec.target.pools)
        and (not p.queued_provisioning or spec.capacity is CapacityType.FLEX_START)
    ]
    if spec.target.pools:
        out.sort(key=lambda p: spec.target.pools.index(p.ref.pool))
    return out


def candidate_zones(spec: ProvisioningSpec, region: str, pools: Sequence[PoolState] | None) -> list[str]:
    """Zones to consider in ``region``: ``spec.zones`` (in order) when given, else the zones of the
    matching pools (sorted), else ``[""]`` meaning "the region as a whole"."""
    explicit = [z for z in spec.zones if zone_region(z) == region]
    if explicit:
        return explicit
    zones = sorted({p.ref.zone for p in matching_pools(spec, pools or []) if zone_region(p.ref.zone) == region})
    return zones or [""]


@dataclass(frozen=True)
class Placement:
    region: str
    zone: str
    verdict: Verdict
    checks: tuple[QuotaCheck, ...] = ()
    pool_capacity_nodes: int | None = None
    reasons: tuple[str, ...] = ()
    priority: int = 0

    @property
    def headroom(self) -> float | None:
        """Smallest relative quota headroom of the checks; None when any is unknown."""
        hs = [c.headroom for c in self.checks]
        if not hs or any(h is None for h in hs):
            return None
        return min(h for h in hs if h is not None)

    @property
    def shortfalls(self) -> list[QuotaCheck]:
        return [c for c in self.checks if c.verdict is Verdict.SHORT]

    @property
    def label(self) -> str:
        return self.zone or self.region

    def to_dict(self) -> dict[str, Any]:
        return {
            "region": self.region, "zone": self.zone, "verdict": self.verdict.value,
            "checks": [c.to_dict() for c in self.checks], "pool_capacity_nodes": self.pool_capacity_nodes,
            "reasons": list(self.reasons), "priority": self.priority,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Placement:
        return cls(
            str(d["region"]), str(d["zone"]), Verdict(d["verdict"]),
            tuple(QuotaCheck.from_dict(c) for c in d.get("checks", [])),
            d.get("pool_capacity_nodes"), tuple(d.get("reasons", [])), int(d.get("priority", 0)),
        )


def place(
    spec: ProvisioningSpec,
    region: str,
    zone: str,
    checks: Sequence[QuotaCheck],
    pools: Sequence[PoolState] | None,
    *,
    priority: int = 0,
    extra_reasons: Sequence[str] = (),
    pool_bound: bool = True,
) -> Placement:
    """Verdict for one (region, zone): worst of its quota checks and its pool capacity.

    ``pools=None`` means the pools could not be observed: the placement is at best UNKNOWN. ``pool_bound=False``:
    the backend launches instances without pools (``Provisioner.launches_without_pools``): quota alone decides.
    """
    verdicts = [c.verdict for c in checks]
    reasons = [f"{c.metric}: {c.reason}" for c in checks if c.reason]
    reasons += list(extra_reasons)
    if extra_reasons:
        verdicts.append(Verdict.UNKNOWN)
    capacity: int | None = None
    if not pool_bound:
        pass
    elif pools is None:
        verdicts.append(Verdict.UNKNOWN)
        reasons.append("node pools could not be listed")
    else:
        in_scope = [
            p for p in matching_pools(spec, pools)
            if zone_region(p.ref.zone) == region and (not zone or spec.allow_zone_spread or p.ref.zone == zone)
        ]
        capacity = sum(p.max_size for p in in_scope)
        held = reservation_capacity(spec, in_scope)
        capacity = capacity if held is None else min(capacity, held)
        if capacity < spec.nodes:
            verdicts.append(Verdict.SHORT)
            where = region if (not zone or spec.allow_zone_spread) else zone
            reasons.append(
                f"reservation {spec.reservation!r} holds {held} of the {spec.nodes} nodes in {where} "
                "(VMs its pools run + its free VMs)" if held is not None and held == capacity else
                f"matching node pools in {where} hold at most {capacity} of the {spec.nodes} nodes "
                f"({spec.accelerator} x{spec.gpus_per_node}{', spot' if spec.spot else ''})"
            )
    return Placement(region, zone, worst(verdicts), tuple(checks), capacity, tuple(reasons), priority)


def reservation_capacity(spec: ProvisioningSpec, pools: Sequence[PoolState]) -> int | None:
    """Nodes the named reservation lets ``pools`` (its "specific" consumers) hold: the VMs they already run
    (they consume it) plus its free count. None when the spec consumes no reservation or the free count is
    unknown. The reservation is shared by its pools, so its free count is counted once."""
    if spec.capacity is not CapacityType.RESERVATION:
        return None
    frees = [p.reservation_free for p in pools if p.reservation_free is not None]
    if not frees:
        return None
    return sum(max(0, p.size) for p in pools) + min(frees)


def rank(placements: Sequence[Placement], *, by_headroom: bool) -> list[Placement]:
    """Fitting first, then unknown, then short; then priority (or headroom when ``by_headroom``)."""

    def key(p: Placement) -> tuple[int, float, int]:
        h = p.headroom
        second = -(h if h is not None else float("-inf")) if by_headroom else float(p.priority)
        return (verdict_rank(p.verdict), second, p.priority)

    return sorted(placements, key=key)


def plan_placements(
    spec: ProvisioningSpec,
    checks_by_region: Mapping[str, Sequence[QuotaCheck]],
    pools_by_region: Mapping[str, Sequence[PoolState] | None],
    *,
    unknown_by_region: Mapping[str, Sequence[str]] | None = None,
    pool_bound: bool = True,
) -> list[Placement]:
    """All candidate placements of the regions in ``checks_by_region`` (in that order), ranked; ``pool_bound``:
    as :func:`place`."""
    out: list[Placement] = []
    for region, checks in checks_by_region.items():
        pools = pools_by_region.get(region)
        extra = list((unknown_by_region or {}).get(region, ()))
        for zone in candidate_zones(spec, region, pools):
            out.append(place(spec, region, zone, checks, pools, priority=len(out), extra_reasons=extra,
                             pool_bound=pool_bound))
    return rank(out, by_headroom=not spec.zones)
