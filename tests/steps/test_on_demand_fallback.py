"""The recovery's on-demand fallback picks on-demand pools of the same accelerator, or names what to add."""

from __future__ import annotations

import pytest

from kfp_gpu.errors import NotFound
from kfp_gpu.providers.base import PoolRef, PoolState
from kfp_gpu.provisioners.node_pool import on_demand_spec
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Recovery, Target


def pool(name: str, spot: bool, acc: str = "a100-80gb") -> PoolState:
    return PoolState(PoolRef(name, "us-central1-a", "us-central1"), 0, 16, acc, 8, "a2-ultragpu-8g", spot)


def spot_spec(pools: tuple[str, ...] = ()) -> ProvisioningSpec:
    return ProvisioningSpec("a100-80gb", 4, capacity=CapacityType.SPOT,
                            target=Target(kind="local", cluster="c", region="us-central1", pools=pools),
                            recovery=Recovery(max_preemptions=3, on_demand_after=1))


def test_spec_listing_only_spot_pools_still_falls_back_to_the_clusters_on_demand_pool() -> None:
    pools = [pool("a100-spot-a", True), pool("a100-od-a", False), pool("l4-od-a", False, "l4")]
    out = on_demand_spec(spot_spec(("a100-spot-a",)), pools)
    assert out.capacity is CapacityType.ON_DEMAND and out.target.pools == ()
    assert out.recovery.on_demand_after == 0 and out.recovery.max_preemptions == 3


def test_listed_on_demand_pools_are_kept_in_order() -> None:
    pools = [pool("a100-spot-a", True), pool("a100-od-a", False), pool("a100-od-b", False)]
    out = on_demand_spec(spot_spec(("a100-spot-a", "a100-od-b")), pools)
    assert out.target.pools == ("a100-spot-a", "a100-od-b")


def test_no_on_demand_pool_is_a_named_error_saying_what_to_add() -> None:
    with pytest.raises(NotFound) as e:
        on_demand_spec(spot_spec(), [pool("a100-spot-a", True), pool("l4-od-a", False, "l4")])
    assert "a100-80gb" in str(e.value) and "on-demand" in e.value.remediation
