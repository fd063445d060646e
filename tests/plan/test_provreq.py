"""kfp_gpu.plan.provreq: when a Provisioned request's booking is spent, and the names of its fresh requests."""

from __future__ import annotations

import hashlib

import pytest

from kfp_gpu.plan import provreq as plan

FOUND = [{"type": "Accepted", "status": "True", "reason": "Accepted"},
         {"type": "Provisioned", "status": "True", "reason": "CapacityIsFound",
          "message": "Capacity is found in the cluster"}]
SCALED = [{"type": "Accepted", "status": "True", "reason": "Accepted"},
          {"type": "Provisioned", "status": "True", "reason": "CapacityIsProvisioned",
           "message": "Capacity is found in the cluster"}]


def test_a_booking_on_existing_nodes_that_went_away_is_spent_while_the_gang_is_short() -> None:
    obs = plan.read_state(FOUND)
    assert plan.booking_lost(obs, lost_nodes=1, have=1, count=2)


@pytest.mark.parametrize("lost,have,count", [(0, 0, 2), (2, 2, 2), (3, 4, 2)])
def test_a_booking_on_existing_nodes_stands_while_no_node_went_away_or_the_gang_is_whole(
        lost: int, have: int, count: int) -> None:
    assert not plan.booking_lost(plan.read_state(FOUND), lost_nodes=lost, have=have, count=count)


def test_a_scale_up_booking_is_never_spent_by_a_node_going_away() -> None:
    """CapacityIsProvisioned: the autoscaler made a scale-up for the request; its nodes are still coming (minutes
    on a real cloud), so another node leaving says nothing about them."""
    assert not plan.booking_lost(plan.read_state(SCALED), lost_nodes=5, have=0, count=2)


@pytest.mark.parametrize("state", [
    [{"type": "Provisioned", "status": "False", "reason": "CapacityIsNotFound"}],
    [*FOUND, {"type": "BookingExpired", "status": "True", "reason": "CapacityReservationTimeExpired"}],
    [*FOUND, {"type": "Failed", "status": "True", "reason": "Expired"}],
])
def test_only_a_provisioned_request_has_a_booking_to_lose(state: list[dict[str, str]]) -> None:
    assert not plan.booking_lost(plan.read_state(state), lost_nodes=2, have=0, count=2)


def test_a_rebooked_request_has_a_name_of_its_own_and_the_first_keeps_its_old_one() -> None:
    first = plan.request_name("run-1", "scale-up", 0)
    # a request made before fresh requests existed is found again under its name (a step restarted over an upgrade)
    assert first == "kfpgpu-run-1-scale-up-" + hashlib.sha256(b"run-1|scale-up|0").hexdigest()[:8]
    assert plan.request_name("run-1", "scale-up", 0, 0) == first
    again = {plan.request_name("run-1", "scale-up", 0, k) for k in range(1, plan.MAX_REBOOKS + 1)}
    assert first not in again and len(again) == plan.MAX_REBOOKS
    assert all(len(n) <= 63 for n in again)
