"""Scale plan and rollback: absolute sizes, single-zone gangs, idempotent re-planning."""

from __future__ import annotations

from kfp_gpu.plan.scale import PoolObservation, plan_scale, rollback_sizes
from kfp_gpu.providers.base import PoolRef, PoolState


def obs(name: str, zone: str, size: int, max_size: int, nodes: int = 0) -> PoolObservation:
    return PoolObservation(PoolState(PoolRef(name, zone), size, max_size, "a100-80gb", 8, "m", False), nodes)


def test_whole_gang_in_first_zone_that_fits() -> None:
    pools = [obs("p", "z-a", 1, 3), obs("p", "z-b", 0, 8)]
    plan = plan_scale(4, pools)
    assert plan.feasible and plan.zones == ("z-b",)
    assert plan.targets == {PoolRef("p", "z-b"): 4}
    assert plan.nodes_added == 4


def test_existing_and_booting_nodes_count() -> None:
    pools = [obs("p", "z-a", 2, 8, nodes=3), obs("q", "z-a", 0, 2)]
    plan = plan_scale(6, pools)
    assert plan.existing == 3
    assert plan.targets == {PoolRef("p", "z-a"): 6}
    assert plan.found == {PoolRef("p", "z-a"): 2}


def test_fill_spills_into_second_pool_of_same_zone() -> None:
    plan = plan_scale(5, [obs("p", "z-a", 0, 3), obs("q", "z-a", 0, 3)])
    assert plan.targets == {PoolRef("p", "z-a"): 3, PoolRef("q", "z-a"): 2}


def test_replanning_after_resize_is_empty() -> None:
    first = plan_scale(4, [obs("p", "z-a", 1, 8)])
    size = first.targets[PoolRef("p", "z-a")]
    again = plan_scale(4, [obs("p", "z-a", size, 8)])
    assert again.feasible and again.targets == {} and again.existing == 4


def test_blocked_zones_skipped_and_infeasible_reason() -> None:
    pools = [obs("p", "z-a", 0, 8), obs("p", "z-b", 0, 2)]
    plan = plan_scale(4, pools, blocked_zones={"z-a"})
    assert not plan.feasible and "at most 2 of the 4" in plan.reason
    assert plan_scale(4, pools, blocked_zones={"z-a", "z-b"}).reason == "every candidate zone is blocked"
    assert plan_scale(4, []).reason == "no matching node pool in any candidate zone"


def test_zone_order_and_spread() -> None:
    pools = [obs("p", "z-a", 0, 3), obs("p", "z-b", 0, 3)]
    assert not plan_scale(5, pools).feasible
    plan = plan_scale(5, pools, allow_zone_spread=True, zones=["z-b", "z-a"])
    assert plan.feasible and plan.targets == {PoolRef("p", "z-b"): 3, PoolRef("p", "z-a"): 2}
    assert plan.zones == ("z-b", "z-a")


def test_rollback_restores_found_or_subtracts_ours() -> None:
    a, b, c = PoolRef("p", "z-a"), PoolRef("p", "z-b"), PoolRef("p", "z-c")
    found = {a: 1, b: 0, c: 2}
    targets = {a: 4, b: 3, c: 5}
    current = {a: 4, b: 5, c: 1}  # b grown further by another run; c shrunk by someone
    assert rollback_sizes(found, targets, current) == {a: 1, b: 2}
    assert rollback_sizes(found, targets, {a: 1, b: 0, c: 2}) == {}  # already rolled back: no-op
