"""Reservations in placement: pure decisions over observed pools (no I/O, no sleeps).

``capacity="reservation"`` takes only pools whose affinity names the reservation, and the reservation's free
VMs bound the placement; other capacity types never take such a pool.
"""

from __future__ import annotations

from dataclasses import replace

from kfp_gpu.plan.placement import consumes, matching_pools, place, reservation_capacity
from kfp_gpu.plan.quota import Verdict, evaluate
from kfp_gpu.providers.base import PoolRef, PoolState, QuotaAmount
from kfp_gpu.spec import ProvisioningSpec, Target, TargetKind

GKE = Target(kind=TargetKind.GKE, region="us-central1")
ZONE = "us-central1-a"


def pool(name: str, *, affinity: str = "", reservations: tuple[str, ...] = (), free: int | None = None,
         size: int = 0, max_size: int = 8, spot: bool = False) -> PoolState:
    return PoolState(PoolRef(name, ZONE, "us-central1"), size, max_size, "a100-80gb", 8, "a2-ultragpu-8g", spot,
                     reservation_affinity=affinity, reservations=reservations, reservation_free=free)


def spec(nodes: int = 2, capacity: str = "reservation", reservation: str = "team-res") -> ProvisioningSpec:
    return ProvisioningSpec("a100-80gb", nodes=nodes, target=GKE, capacity=capacity,  # type: ignore[arg-type]
                            reservation=reservation if capacity == "reservation" else "")


POOLS = [
    pool("open"),
    pool("any", affinity="any"),
    pool("none", affinity="none"),
    pool("team", affinity="specific", reservations=("team-res",), free=3),
    pool("other-team", affinity="specific", reservations=("other-res",), free=8),
    pool("team-spot", affinity="specific", reservations=("team-res",), free=3, spot=True),
]


def test_reservation_capacity_takes_only_the_pools_naming_it() -> None:
    assert [p.ref.pool for p in matching_pools(spec(), POOLS)] == ["team"]


def test_other_capacity_never_takes_a_specific_pool() -> None:
    on_demand = [p.ref.pool for p in matching_pools(spec(capacity="on-demand"), POOLS)]
    assert on_demand == ["open", "any", "none"]
    assert not consumes(spec(capacity="on-demand"), POOLS[3])


def test_the_free_reserved_vms_bound_the_placement() -> None:
    quota = [QuotaAmount("NVIDIA_A100_80GB_GPUS", "us-central1", 512, 0), QuotaAmount("GPUS_ALL_REGIONS", "global", 512, 0)]
    ok = place(spec(nodes=3), "us-central1", ZONE, evaluate(spec(nodes=3), "us-central1", quota), POOLS)
    assert ok.verdict is Verdict.FITS and ok.pool_capacity_nodes == 3 and not ok.reasons
    short = place(spec(nodes=4), "us-central1", ZONE, evaluate(spec(nodes=4), "us-central1", quota), POOLS)
    assert short.verdict is Verdict.SHORT and short.pool_capacity_nodes == 3
    assert short.reasons == ("reservation 'team-res' holds 3 of the 4 nodes in us-central1-a "
                             "(VMs its pools run + its free VMs)",)


def test_nodes_already_in_the_reservation_count_and_its_free_vms_count_once() -> None:
    two = [pool("team", affinity="specific", reservations=("team-res",), free=1, size=2),
           pool("team-b", affinity="specific", reservations=("team-res",), free=1, size=1)]
    assert reservation_capacity(spec(), two) == 4  # 3 running inside it + 1 free, not 3 + 1 + 1


def test_unknown_free_count_falls_back_to_the_pool_limits() -> None:
    unknown = [replace(POOLS[3], reservation_free=None)]
    assert reservation_capacity(spec(), unknown) is None
    assert place(spec(nodes=8), "us-central1", ZONE, [], unknown).pool_capacity_nodes == 8
    assert reservation_capacity(spec(capacity="on-demand"), POOLS) is None
