"""Preflight's backend line, check-capacity answer and reservation-covered quota (pure, no I/O)."""

from __future__ import annotations

import dataclasses

import pytest

from kfp_gpu.plan.placement import Placement
from kfp_gpu.plan.preflight import (
    FOUND,
    NO_ANSWER,
    NOT_ASKED,
    NOT_FOUND,
    CapacityNow,
    PreflightResult,
    capacity_answer,
)
from kfp_gpu.plan.provreq import Observed, ReqState
from kfp_gpu.plan.quota import QuotaCheck, Verdict, needs, reservation_free, reserved_nodes
from kfp_gpu.providers.base import PoolRef, PoolState
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target, TargetKind

GKE = Target(kind=TargetKind.GKE, region="us-central1")


def answer(state: ReqState, reason: str = "") -> CapacityNow:
    return capacity_answer(Observed(state, reason, "m"), request="r", waited_s=20.0, elapsed_s=1.5)


def test_answers_map_from_conditions() -> None:
    assert answer(ReqState.PROVISIONED, "CapacityIsFound").answer == FOUND
    assert answer(ReqState.FAILED, "CapacityIsNotFound").answer == NOT_FOUND
    assert answer(ReqState.WAITING, "CapacityIsNotFound").answer == NOT_FOUND  # an autoscaler ignoring noRetry
    for st, reason in ((ReqState.PENDING, ""), (ReqState.ACCEPTED, "Accepted"), (ReqState.FAILED, "FailedToBook")):
        got = answer(st, reason)
        assert got.answer == NO_ANSWER and "20s" in got.detail, got
    assert "never scales up" in answer(ReqState.FAILED, "CapacityIsNotFound").detail


def result(capacity_now: CapacityNow | None) -> PreflightResult:
    check = QuotaCheck("NVIDIA_A100_80GB_GPUS", "us-central1", "gpus", 16, Verdict.FITS, 64, 0, 64)
    place = Placement("us-central1", "us-central1-a", Verdict.FITS, (check,), 4)
    return PreflightResult("a100-80gb", 2, 8, "on-demand", [place], [], 0.1,
                           {"name": "provisioning-request", "reason": "the cluster autoscaler serves them"},
                           capacity_now)


def test_no_answer_is_never_ok_but_not_found_is_only_a_warning() -> None:
    assert result(None).verdict is Verdict.FITS
    assert result(CapacityNow(FOUND, "d")).verdict is Verdict.FITS
    assert result(CapacityNow(NOT_FOUND, "d")).verdict is Verdict.FITS
    assert result(CapacityNow(NOT_ASKED, "d")).verdict is Verdict.FITS
    unknown = result(CapacityNow(NO_ANSWER, "no check-capacity answer in 20s"))
    assert unknown.verdict is Verdict.UNKNOWN and not unknown.ok
    assert any(u.startswith("check-capacity:") for u in unknown.unknowns)


def test_report_shows_backend_and_answer_and_round_trips() -> None:
    res = result(CapacityNow(NOT_FOUND, "the cluster's nodes cannot hold the gang now", "kfpgpu-x", 1.25))
    md = res.to_markdown()
    assert "Provisioner backend: **provisioning-request** (the cluster autoscaler serves them)" in md
    assert "**no capacity now (warning)** in 1.2s, request kfpgpu-x" in md
    assert md.index("## Quotas") < md.index("## Capacity now")
    back = PreflightResult.from_json(res.to_json())
    assert back.provisioner == res.provisioner and back.capacity_now == res.capacity_now
    d = res.to_dict()
    assert d["capacity_now"]["text"] == "no capacity now (warning)" and d["provisioner"]["name"] == "provisioning-request"


def pool(zone: str, free: int | None, names: tuple[str, ...] = ("team-res",), affinity: str = "specific") -> PoolState:
    return PoolState(PoolRef("team", zone, "us-central1"), 0, 8, "a100-80gb", 8, "a2-ultragpu-8g", False,
                     reservation_affinity=affinity, reservations=names, reservation_free=free)


def test_reservation_covers_quota() -> None:
    spec = ProvisioningSpec("a100-80gb", 3, capacity=CapacityType.RESERVATION, reservation="team-res", target=GKE)
    pools = [pool("us-central1-a", 2), dataclasses.replace(pool("us-central1-a", 2), ref=PoolRef("t2", "us-central1-a",
                                                                                                  "us-central1"))]
    assert reservation_free(spec, pools) == 2  # two pools of one zone share the reservation: counted once
    assert reserved_nodes(spec, pools) == 2
    assert [n.amount for n in needs(spec, "us-central1", reserved=2)] == [8.0, 8.0, 96.0]  # 1 node: 8 GPUs, 96 vCPUs
    assert reserved_nodes(spec, [pool("us-central1-a", 9)]) == 3  # never more than the gang
    assert reservation_free(spec, [pool("us-central1-a", None)]) is None
    assert reservation_free(spec, [pool("us-central1-a", 2, names=("other",))]) is None
    on_demand = ProvisioningSpec("a100-80gb", 3, target=GKE)
    assert reserved_nodes(on_demand, pools) == 0


@pytest.mark.parametrize("free,shown", [(2, "2 VM(s) free; 2 of the gang's 2 node(s)"), (None, "free count unknown")])
def test_report_shows_reservation_free_count(free: int | None, shown: str) -> None:
    res = result(None)
    res.reservation = {"name": "team-res", "free": free, "nodes": 2 if free else 0}
    assert f"Reservation team-res: {shown}" in res.to_markdown()
