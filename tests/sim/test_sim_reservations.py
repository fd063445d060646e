"""The stand-in's reservations are consumed as Compute consumes them (docs/sim.md, "Reservations").

Virtual time (no sleeps); the real google-cloud-compute and google-cloud-container REST clients read
``reservations.get`` (count, inUseCount), ``nodePools.get`` (config.reservationAffinity),
``instanceGroupManagers.listErrors`` and ``regions.get`` (quota usage).
"""

from __future__ import annotations

from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import compute_v1, container_v1

from kfp_gpu.errors import InvalidSpec
from kfp_gpu_rehearsal.sim import from_dict
from kfp_gpu_rehearsal.sim.clock import Timeline
from tests.sim._helpers import PARENT, PROJECT, REGION, client_kwargs, scenario
from tests.sim.test_sim_world import igm, pools, real, set_size, world

ZONE = "us-central1-a"
METRIC = "NVIDIA_A100_80GB_GPUS"
SPECIFIC = {"reservation_affinity": {"consume": "specific", "values": ["team-res"]}}
TEAM_RES = [{"name": "team-res", "zone": ZONE, "accelerator": "a100-80gb", "gpus_per_node": 8, "count": 2,
             "specific": True}]


def clients(url: str) -> tuple[Any, Any, Any, Any]:
    kw = client_kwargs(url)
    return (container_v1.ClusterManagerClient(**kw), compute_v1.ReservationsClient(**kw),
            compute_v1.RegionsClient(**kw), compute_v1.InstanceGroupManagersClient(**kw))


def in_use(rc: Any, name: str) -> tuple[int, int]:
    r = rc.get(project=PROJECT, zone=ZONE, reservation=name).specific_reservation
    return int(r.count), int(r.in_use_count)


def usage(regions: Any) -> float:
    return next(q.usage for q in regions.get(project=PROJECT, region=REGION).quotas if q.metric == METRIC)


def settle(tl: Timeline, minutes: float = 20) -> None:
    tl.advance(real(minutes * 60))


def reserve(rc: Any, name: str, count: int, *, specific: bool) -> None:
    rc.insert(project=PROJECT, zone=ZONE, reservation_resource=compute_v1.Reservation(
        name=name, specific_reservation_required=specific,
        specific_reservation=compute_v1.AllocationSpecificSKUReservation(
            count=count, instance_properties=compute_v1.AllocationSpecificSKUAllocationReservedInstanceProperties(
                machine_type="a2-ultragpu-8g", guest_accelerators=[compute_v1.AcceleratorConfig(
                    accelerator_count=8, accelerator_type="nvidia-a100-80gb")]))))


def test_specific_pool_renders_its_affinity_and_stops_at_the_reservation() -> None:
    with world(pools=pools(**{"a100-80gb-a": SPECIFIC}), reservations=TEAM_RES) as (sim, tl, backend):
        cm, rc, regions, igms = clients(sim.url)
        aff = cm.get_node_pool(name=f"{PARENT}/nodePools/a100-80gb-a").config.reservation_affinity
        assert aff.consume_reservation_type.name == "SPECIFIC_RESERVATION"
        assert (aff.key, list(aff.values)) == ("compute.googleapis.com/reservation-name", ["team-res"])
        assert cm.get_node_pool(name=f"{PARENT}/nodePools/a100-80gb-b").config.reservation_affinity \
            .consume_reservation_type.name == "UNSPECIFIED"  # not set: GKE renders none
        assert usage(regions) == 16.0  # the reservation holds its quota from the start
        set_size(cm, "a100-80gb-a", 3)
        settle(tl)
        assert len(sim.state.pools["a100-80gb-a"].nodes) == 2  # the third VM has no reserved slot
        assert in_use(rc, "team-res") == (2, 2)
        errors = list(igms.list_errors(project=PROJECT, zone=ZONE, instance_group_manager=igm("a100-80gb-a", ZONE)))
        assert errors and all(e.error.code == "RESOURCE_EXHAUSTED" for e in errors)
        assert 'specific reservation "team-res" is insufficient for node pool "a100-80gb-a"' in errors[-1].error.message
        assert usage(regions) == 16.0  # two VMs inside the reservation: max(reserved, used), not the sum


def test_a_freed_slot_is_taken_by_the_waiting_vm() -> None:
    with world(pools=pools(**{"a100-80gb-a": SPECIFIC}), reservations=TEAM_RES) as (sim, tl, backend):
        cm, rc, _, _ = clients(sim.url)
        set_size(cm, "a100-80gb-a", 3)
        settle(tl)
        first = sim.state.pools["a100-80gb-a"].nodes[0]
        sim.state.delete_instances(ZONE, igm("a100-80gb-a", ZONE), [first])
        settle(tl)
        assert first not in sim.state.pools["a100-80gb-a"].nodes
        assert len(sim.state.pools["a100-80gb-a"].nodes) == 2 and in_use(rc, "team-res") == (2, 2)


def test_any_pool_consumes_an_automatic_reservation_and_quota_is_counted_once() -> None:
    with world() as (sim, tl, backend):
        cm, rc, regions, _ = clients(sim.url)
        reserve(rc, "warm", 2, specific=False)
        assert usage(regions) == 16.0 and in_use(rc, "warm") == (2, 0)
        set_size(cm, "a100-80gb-a", 2)
        settle(tl)
        assert len(sim.state.pools["a100-80gb-a"].nodes) == 2
        assert in_use(rc, "warm") == (2, 2)
        assert usage(regions) == 16.0
        set_size(cm, "a100-80gb-a", 3)  # beyond the reservation: on-demand
        settle(tl)
        assert in_use(rc, "warm") == (2, 2) and usage(regions) == 24.0
        set_size(cm, "a100-80gb-a", 0)
        settle(tl)
        assert in_use(rc, "warm") == (2, 0) and usage(regions) == 16.0  # an unused reservation is still held


def test_a_reservation_that_requires_naming_is_not_consumed_automatically() -> None:
    with world() as (sim, tl, backend):
        cm, rc, regions, _ = clients(sim.url)
        reserve(rc, "named-only", 1, specific=True)
        set_size(cm, "a100-80gb-a", 1)
        set_size(cm, "a100-80gb-spot-a", 1)  # Spot VMs never consume reservations
        settle(tl)
        assert in_use(rc, "named-only") == (1, 0)
        assert usage(regions) == 16.0  # 8 reserved + 8 on-demand (the spot VM counts on its own metric)


def test_running_vms_adopt_a_new_automatic_reservation() -> None:
    with world(pools=pools(**{"a100-80gb-a": {"initial_size": 2}})) as (sim, tl, backend):
        _, rc, regions, _ = clients(sim.url)
        assert usage(regions) == 16.0
        reserve(rc, "late", 3, specific=False)
        assert in_use(rc, "late") == (3, 2) and usage(regions) == 24.0


def test_reservations_quota_is_enforced_on_insert() -> None:
    sc = scenario(regions={"us-central1": {"zones": [ZONE], "quotas": {METRIC: {"limit": 16}}}},
                  pools=[{"name": "a", "zone": ZONE, "accelerator": "a100-80gb", "gpus_per_node": 8}])
    with world(**{k: sc[k] for k in ("regions", "pools")}) as (sim, tl, backend):
        _, rc, _, _ = clients(sim.url)
        reserve(rc, "two", 2, specific=False)
        reserve(rc, "more", 1, specific=False)  # its operation fails with QUOTA_EXCEEDED
        with pytest.raises(gexc.NotFound):
            rc.get(project=PROJECT, zone=ZONE, reservation="more")
        assert in_use(rc, "two") == (2, 0)


@pytest.mark.parametrize("bad,field", [
    ({"reservation_affinity": {"consume": "specific"}}, "pools[0].reservation_affinity.values"),
    ({"reservation_affinity": {"consume": "some"}}, "pools[0].reservation_affinity.consume"),
])
def test_bad_affinity_names_the_field(bad: dict[str, Any], field: str) -> None:
    p = {"name": "a", "zone": ZONE, "accelerator": "a100-80gb", **bad}
    with pytest.raises(InvalidSpec, match=field.replace("[", r"\[").replace("]", r"\]")):
        from_dict(scenario(pools=[p]))


def test_bad_reservation_names_the_field() -> None:
    with pytest.raises(InvalidSpec, match=r"reservations\[0\]\.in_use"):
        from_dict(scenario(reservations=[{**TEAM_RES[0], "in_use": 3}]))
