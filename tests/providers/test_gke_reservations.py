"""GkeProvider and reservations, against the stand-in through the real google-cloud-* REST clients: the
pools report their reservation affinity and a SPECIFIC pool's free reserved VMs, a resize never grows a
SPECIFIC pool past them, and a reservation ``reserve`` creates is consumed by the VMs a resize adds."""

from __future__ import annotations

from typing import Any

import pytest
from google.cloud import compute_v1

from kfp_gpu.errors import CapacityUnavailable, Scope
from kfp_gpu.ownership import Owner
from kfp_gpu.providers.base import PoolRef, ReservationRequest
from kfp_gpu.providers.gke import GkeProvider
from tests.sim._helpers import CLUSTER, PROJECT, REGION, client_kwargs, running, scenario
from tests.waiting import wait_until

OWNER = Owner("run-res", "warm_pool", 2_000_000_000.0)
ZONE = "us-central1-a"
FAST_BOOT = {"value_s": 60}


def world(**changes: Any) -> dict[str, Any]:
    """Two a100 pools in zone a: ``team`` consumes only reservation team-res (2 VMs, 1 used elsewhere),
    ``open`` has no affinity set (Compute's default: any matching automatic reservation)."""
    pools = [
        {"name": "team", "zone": ZONE, "accelerator": "a100-80gb", "max_nodes": 8, "boot": FAST_BOOT,
         "reservation_affinity": {"consume": "specific", "values": ["team-res"]}},
        {"name": "open", "zone": ZONE, "accelerator": "a100-80gb", "max_nodes": 8, "boot": FAST_BOOT},
    ]
    res = [{"name": "team-res", "zone": ZONE, "accelerator": "a100-80gb", "gpus_per_node": 8, "count": 2,
            "specific": True, "in_use": 1}]
    return scenario(pools=pools, reservations=res, api={"error_rate": 0.0}, **changes)


def provider(url: str) -> GkeProvider:
    return GkeProvider(PROJECT, REGION, CLUSTER, endpoint=url)


def test_pools_report_affinity_and_the_free_reserved_vms() -> None:
    with running(world()) as sim:
        pools = {p.ref.pool: p for p in provider(sim.url).pools(REGION)}
        team, open_ = pools["team"], pools["open"]
        assert (team.reservation_affinity, team.reservations, team.reservation_free) == ("specific", ("team-res",), 1)
        assert (open_.reservation_affinity, open_.reservations, open_.reservation_free) == ("", (), None)
        assert provider(sim.url).pool(PoolRef("team", ZONE, REGION)).reservation_free == 1


def test_a_specific_pool_is_not_grown_past_its_reservation() -> None:
    with running(world()) as sim:
        p = provider(sim.url)
        with pytest.raises(CapacityUnavailable) as exc:
            p.resize(PoolRef("team", ZONE, REGION), 2, OWNER)
        err = exc.value
        assert err.scope is Scope.PROVIDER and "\n" not in str(err)
        assert "reservation team-res in us-central1-a has 1 VM(s) free" in str(err)
        assert sim.request_counts().get("container.nodePools.setSize", 0) == 0  # refused before any setSize
        p.resize(PoolRef("team", ZONE, REGION), 1, OWNER)  # what it holds is fine
        rc = compute_v1.ReservationsClient(**client_kwargs(sim.url))
        wait_until("team-res in use by 2", lambda: int(rc.get(project=PROJECT, zone=ZONE, reservation="team-res")
                                                      .specific_reservation.in_use_count) == 2, timeout=20)


def test_reserve_creates_an_automatic_reservation_the_resize_consumes() -> None:
    with running(world()) as sim:
        p = provider(sim.url)
        name = "kfp-gpu-run-res"
        p.reserve(ReservationRequest(name, ZONE, "a100-80gb", 8, 2), OWNER)
        rc = compute_v1.ReservationsClient(**client_kwargs(sim.url))
        r = rc.get(project=PROJECT, zone=ZONE, reservation=name)
        assert r.specific_reservation_required is False
        usage_before = next(q.usage for q in p.quota("a100-80gb", REGION, spot=False) if q.metric == "NVIDIA_A100_80GB_GPUS")
        p.resize(PoolRef("open", ZONE, REGION), 2, OWNER)
        wait_until("2 nodes in pool open", lambda: len(sim.nodes("open")) == 2, timeout=20)
        r = rc.get(project=PROJECT, zone=ZONE, reservation=name)
        assert (int(r.specific_reservation.count), int(r.specific_reservation.in_use_count)) == (2, 2)
        usage_after = next(q.usage for q in p.quota("a100-80gb", REGION, spot=False) if q.metric == "NVIDIA_A100_80GB_GPUS")
        assert usage_after == usage_before  # the nodes are the reservation's VMs: quota not counted twice
