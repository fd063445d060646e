"""Where the warm pool's cloud reservation goes (pure :func:`kfp_gpu.steps.warm_pool.reservations_for`) and the
spec rules around it."""

from __future__ import annotations

import pytest

from kfp_gpu.errors import InvalidSpec
from kfp_gpu.providers.base import PoolRef, PoolState
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target, TargetKind, WarmPool
from kfp_gpu.steps.warm_pool import reservations_for

GKE = Target(kind=TargetKind.GKE, region="us-central1")


def pool(name: str, zone: str, machine: str = "a2-ultragpu-8g") -> PoolState:
    return PoolState(PoolRef(name, zone, "us-central1"), 0, 8, "a100-80gb", 8, machine, False)


def spec(warm: int = 2, **kw: object) -> ProvisioningSpec:
    return ProvisioningSpec("a100-80gb", 4, target=GKE, warm_pool=WarmPool(warm, cloud_reservation=True), **kw)  # type: ignore[arg-type]


def test_reserves_where_the_resize_grows_with_that_pools_machine() -> None:
    pools = [pool("a", "us-central1-a"), pool("b", "us-central1-b", "a2-custom-8g")]
    # the resize grew pool b (zone b) from 1 to 3; zone a is the first candidate but was not grown
    (req, grown), = reservations_for(spec(), "Run_1", pools, {"b|us-central1-b": 3, "a|us-central1-a": 0},
                                    {"b|us-central1-b": 1, "a|us-central1-a": 0})
    assert (req.zone, req.count, req.machine_type, grown) == ("us-central1-b", 2, "a2-custom-8g", ["b"])
    assert req.name == "kfp-gpu-run-1"


def test_one_reservation_per_zone_grown() -> None:
    pools = [pool("a", "us-central1-a"), pool("b", "us-central1-b")]
    out = reservations_for(spec(warm=3), "r", pools, {"a|us-central1-a": 2, "b|us-central1-b": 1}, {})
    assert [(r.name, r.zone, r.count) for r, _ in out] == [("kfp-gpu-r-0", "us-central1-a", 2),
                                                            ("kfp-gpu-r-1", "us-central1-b", 1)]
    assert sum(r.count for r, _ in out) == 3


def test_without_growth_it_reserves_in_the_first_candidate_zone() -> None:
    pools = [pool("a", "us-central1-a", "m-a"), pool("b", "us-central1-b")]
    (req, grown), = reservations_for(spec(warm=0), "r", pools, {}, {})
    assert (req.zone, req.count, req.machine_type, grown) == ("us-central1-a", 1, "m-a", ["a"])


@pytest.mark.parametrize("kw,needle", [
    ({"capacity": CapacityType.SPOT}, "spot VMs never consume reservations"),
    ({"capacity": CapacityType.RESERVATION, "reservation": "team-res"}, "consumes the existing reservation 'team-res'"),
])
def test_spec_refuses_a_reservation_nothing_would_consume(kw: dict[str, object], needle: str) -> None:
    with pytest.raises(InvalidSpec) as err:
        spec(**kw)
    text = str(err.value)
    assert "\n" not in text and "warm_pool.cloud_reservation=True" in text and needle in text
    assert "fix: set warm_pool.cloud_reservation=False" in text
