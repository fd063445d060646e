"""The scale plan: absolute per-pool target sizes for a gang, and the rollback plan.

Sizes are *absolute* and derived from observed state, so re-planning after a retry converges
instead of adding twice: once a pool's target size already covers the gang, the plan is empty.

A pool's "have" count is ``max(target size, observed nodes)``: nodes that exist or are on their way.
The whole gang goes into one zone (the first unblocked zone, in the given order, whose pools can
hold it) unless ``allow_zone_spread``, in which case zones are filled in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kfp_gpu.providers.base import PoolRef, PoolState


@dataclass(frozen=True)
class PoolObservation:
    """A pool as the cloud reports it plus the nodes the cluster shows for it (Ready or booting)."""

    state: PoolState
    nodes: int = 0

    @property
    def ref(self) -> PoolRef:
        return self.state.ref

    @property
    def have(self) -> int:
        return max(self.state.size, self.nodes)

    @property
    def headroom(self) -> int:
        return max(0, self.state.max_size - self.have)


@dataclass(frozen=True)
class ScalePlan:
    """``targets`` holds only pools whose size must change; ``found`` their sizes before the change."""

    gang: int
    targets: dict[PoolRef, int] = field(default_factory=dict)
    found: dict[PoolRef, int] = field(default_factory=dict)
    zones: tuple[str, ...] = ()
    existing: int = 0
    feasible: bool = True
    reason: str = ""

    @property
    def added(self) -> dict[PoolRef, int]:
        return {ref: size - self.found.get(ref, 0) for ref, size in self.targets.items()}

    @property
    def nodes_added(self) -> int:
        return sum(self.added.values())


def _fill(gang: int, pools: Sequence[PoolObservation]) -> tuple[dict[PoolRef, int], dict[PoolRef, int], int]:
    """Greedy fill in pool order. Returns (targets, found, existing)."""
    existing = sum(p.have for p in pools)
    deficit = max(0, gang - existing)
    targets: dict[PoolRef, int] = {}
    found: dict[PoolRef, int] = {}
    for p in pools:
        if deficit <= 0:
            break
        add = min(deficit, p.headroom)
        if add > 0:
            targets[p.ref] = p.have + add
            found[p.ref] = p.state.size
            deficit -= add
    return targets, found, existing


def plan_scale(
    gang: int,
    pools: Sequence[PoolObservation],
    *,
    zones: Sequence[str] | None = None,
    blocked_zones: Iterable[str] = (),
    allow_zone_spread: bool = False,
) -> ScalePlan:
    """Per-pool absolute target sizes so that ``gang`` nodes exist.

    ``pools`` must already be filtered to pools that match the spec (see
    :func:`kfp_gpu.plan.placement.matching_pools`). ``zones`` gives the order to try (default: the
    order zones first appear in ``pools``); zones in ``blocked_zones`` are skipped.
    An infeasible plan has ``feasible=False``, empty ``targets`` and a ``reason``.
    """
    blocked = set(blocked_zones)
    order = list(zones) if zones is not None else list(dict.fromkeys(p.ref.zone for p in pools))
    order = [z for z in order if z not in blocked]
    by_zone = {z: [p for p in pools if p.ref.zone == z] for z in order}
    best = 0
    for z in order:
        zp = by_zone[z]
        cap = sum(p.have + p.headroom for p in zp)
        best = max(best, cap)
        if cap >= gang:
            targets, found, existing = _fill(gang, zp)
            return ScalePlan(gang, targets, found, (z,), existing)
    if allow_zone_spread:
        allp = [p for z in order for p in by_zone[z]]
        cap = sum(p.have + p.headroom for p in allp)
        if cap >= gang:
            targets, found, existing = _fill(gang, allp)
            used = tuple(dict.fromkeys(r.zone for r in targets)) or tuple(
                dict.fromkeys(p.ref.zone for p in allp if p.have)
            )
            return ScalePlan(gang, targets, found, used, existing)
        best = cap
    if not order:
        reason = "every candidate zone is blocked" if blocked else "no matching node pool in any candidate zone"
    else:
        where = "all unblocked zones together" if allow_zone_spread else "any single unblocked zone"
        reason = f"{where} can hold at most {best} of the {gang} nodes (pool max sizes)"
    return ScalePlan(gang, feasible=False, reason=reason)


def rollback_sizes(
    found: Mapping[PoolRef, int],
    targets: Mapping[PoolRef, int],
    current: Mapping[PoolRef, int],
) -> dict[PoolRef, int]:
    """Sizes to restore for the pools this run grew. Pools already at the restore size are omitted.

    * pool still at our target -> back to the size we found;
    * pool above our target (another run also grew it) -> current minus what we added;
    * pool below our target (someone shrank it) -> never grow on rollback: min(current, found).
    A pool missing from ``current`` is assumed to still be at our target.
    """
    out: dict[PoolRef, int] = {}
    for ref, target in targets.items():
        was = found.get(ref, 0)
        added = max(0, target - was)
        now = current.get(ref, target)
        restore = now - added if now >= target else min(now, was)
        restore = max(0, restore)
        if restore != now:
            out[ref] = restore
    return out
