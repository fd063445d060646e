"""Karpenter decisions (kfp_gpu.plan.karpenter): NodeClaim conditions -> state, evidence -> verdict, failover
order, the NodePool's shape, the errors. Virtual time, no sleeps."""

from __future__ import annotations

import pytest

from kfp_gpu.errors import CapacityUnavailable, InvalidSpec, ProvisioningTimeout
from kfp_gpu.plan import karpenter as k
from kfp_gpu.plan.recovery import SHUTDOWN_TAINTS


def claim(name: str = "c1", *, launched: str | None = None, reason: str = "", message: str = "",
          registered: bool = False, deleting: bool = False, zone: str = "us-east-1a") -> dict:
    conds = []
    if launched is not None:
        conds.append({"type": "Launched", "status": launched, "reason": reason, "message": message})
    if registered:
        conds.append({"type": "Registered", "status": "True", "reason": "Registered"})
    meta: dict = {"name": name, "labels": {k.ZONE_LABEL: zone, k.CAPACITY_TYPE_LABEL: "spot"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"metadata": meta, "status": {"conditions": conds, "nodeName": "n1" if registered else ""}}


# ---- NodeClaim conditions -------------------------------------------------------------------------------

def test_claim_states_follow_karpenters_conditions() -> None:
    assert k.read_claim(claim()).state is k.ClaimState.PENDING
    assert k.read_claim(claim(launched="Unknown", reason="AwaitingReconciliation")).state is k.ClaimState.PENDING
    launching = k.read_claim(claim(launched="Unknown", reason="LaunchFailed", message="boom"))
    assert (launching.state, launching.reason, launching.message) == (k.ClaimState.LAUNCHING, "LaunchFailed", "boom")
    assert k.read_claim(claim(launched="False", reason="X")).state is k.ClaimState.FAILED
    up = k.read_claim(claim(launched="True", registered=True))
    assert (up.state, up.node, up.launched, up.zone) == (k.ClaimState.REGISTERED, "n1", True, "us-east-1a")
    assert k.read_claim(claim(launched="True", deleting=True)).state is k.ClaimState.DELETING
    assert k.read_claim(claim(), launched_before=True).launched


# ---- evidence -> verdict --------------------------------------------------------------------------------

def view(state: k.ClaimState, since: float = 0.0, reason: str = "") -> k.ClaimView:
    return k.ClaimView("c", state, reason=reason, since=since)


def assess(**kw: object) -> k.Assessment:
    args: dict = {"ready": 0, "wanted": 2, "claims": [], "signals": [], "asked_at": 100.0, "now": 101.0,
                  "deadline": 1000.0}
    args.update(kw)
    return k.assess(**args)


def test_ready_when_the_gang_is_whole() -> None:
    assert assess(ready=2).verdict is k.Verdict.READY
    assert assess(ready=1).verdict is k.Verdict.WAIT


def test_a_nodeclaim_deleted_before_launch_blocks_the_candidate_at_once() -> None:
    ice = k.Signal("ice", 100.5, k.ICE_REASON, "NodeClaim c was deleted before it launched", "c")
    got = assess(signals=[ice])
    assert (got.verdict, got.reason) == (k.Verdict.BLOCKED, "InsufficientCapacityError")
    # evidence from before this candidate was asked for does not count
    assert assess(signals=[k.Signal("ice", 99.0, k.ICE_REASON)]).verdict is k.Verdict.WAIT


def test_an_unpinned_candidate_lets_karpenter_route_around_a_few_ices() -> None:
    ices = [k.Signal("ice", 100.0 + i, k.ICE_REASON, f"claim {i}") for i in range(k.ICE_RETRIES_ANY_ZONE)]
    assert assess(signals=ices[:-1], pinned=False).verdict is k.Verdict.WAIT
    got = assess(signals=ices, pinned=False)
    assert (got.verdict, got.message) == (k.Verdict.BLOCKED, f"claim {k.ICE_RETRIES_ANY_ZONE - 1}")
    assert assess(signals=ices[:1], pinned=True).verdict is k.Verdict.BLOCKED


def test_launched_false_blocks_and_a_retried_launch_blocks_only_after_it_stuck() -> None:
    assert assess(claims=[view(k.ClaimState.FAILED, reason="X")]).reason == "X"
    stuck = view(k.ClaimState.LAUNCHING, since=100.0, reason="LaunchFailed")
    assert assess(claims=[stuck], now=100.0 + k.LAUNCH_STUCK_S - 1).verdict is k.Verdict.WAIT
    assert assess(claims=[stuck], now=100.0 + k.LAUNCH_STUCK_S).verdict is k.Verdict.BLOCKED


def test_no_offering_blocks_after_the_grace_unless_a_nodeclaim_is_on_its_way() -> None:
    msg = "Failed to schedule pod, no instance type which had enough resources and the required offering met ..."
    sig = [k.Signal("no-offering", 101.0, k.short_reason(msg), msg)]
    assert sig[0].reason == "NoOfferingAvailable"
    assert assess(signals=sig, now=101.0 + k.NO_OFFERING_GRACE_S - 0.1).verdict is k.Verdict.WAIT
    got = assess(signals=sig, now=101.0 + k.NO_OFFERING_GRACE_S)
    assert (got.verdict, got.message) == (k.Verdict.BLOCKED, msg)
    coming = [view(k.ClaimState.LAUNCHED)]
    assert assess(signals=sig, claims=coming, now=500.0).verdict is k.Verdict.WAIT
    registered = [view(k.ClaimState.REGISTERED)]  # launched and up: nothing more is coming
    assert assess(signals=sig, claims=registered, now=500.0).verdict is k.Verdict.BLOCKED


def test_the_deadline_times_out() -> None:
    got = assess(ready=1, now=1000.0)
    assert (got.verdict, got.message) == (k.Verdict.TIMEOUT, "1/2 nodes Ready")


def test_only_karpenters_scheduling_events_count() -> None:
    ours = {"reason": "FailedScheduling", "message": "Failed to schedule pod, all available instance types exceed "
            "limits for nodepool", "source": {"component": "karpenter"}}
    assert k.short_reason(k.karpenter_scheduling_message(ours)) == "NodePoolLimitReached"
    scheduler = {"reason": "FailedScheduling", "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                 "source": {"component": "default-scheduler"}}
    assert k.karpenter_scheduling_message(scheduler) == ""
    assert k.karpenter_scheduling_message({"reason": "Nominated", "message": "Pod should schedule on: x",
                                           "reportingComponent": "karpenter"}) == ""


# ---- failover order and the NodePool ------------------------------------------------------------------

def test_failover_goes_zone_by_zone_then_on_demand_only_when_allowed() -> None:
    zs = ("us-east-1a", "us-east-1b")
    assert [c.label for c in k.candidates(zs, "spot", on_demand_fallback=False)] == \
        ["us-east-1a/spot", "us-east-1b/spot"]
    assert [c.label for c in k.candidates(zs, "spot", on_demand_fallback=True)] == \
        ["us-east-1a/spot", "us-east-1b/spot", "us-east-1a/on-demand", "us-east-1b/on-demand"]
    assert [c.label for c in k.candidates((), "on-demand", on_demand_fallback=True)] == ["any zone/on-demand"]
    assert k.candidates(zs, "reservation", on_demand_fallback=False)[0].capacity_type == "reserved"
    with pytest.raises(InvalidSpec, match="flex-start"):
        k.candidates(zs, "flex-start", on_demand_fallback=False)


def test_the_nodepool_is_scoped_capped_and_never_disrupted() -> None:
    cand = k.Candidate("us-east-1b", "spot")
    body = k.nodepool_body("np", labels={"kfp-gpu.io/run-id": "r1"}, annotations={}, instance_types=["p4d.24xlarge"],
                           cand=cand, limit_nodes=2, gpus_per_node=8, run_label="r1", namespace="team-a",
                           node_class={"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"})
    spec = body["spec"]
    assert spec["limits"] == {"nvidia.com/gpu": "16"}
    assert spec["disruption"]["budgets"] == [{"nodes": "0"}]
    reqs = {r["key"]: r["values"] for r in spec["template"]["spec"]["requirements"]}
    assert reqs == {"node.kubernetes.io/instance-type": ["p4d.24xlarge"], "karpenter.sh/capacity-type": ["spot"],
                    "topology.kubernetes.io/zone": ["us-east-1b"]}
    assert spec["template"]["spec"]["taints"] == [{"key": "team-a.nodepools.kfp-gpu.io/run", "value": "r1",
                                                   "effect": "NoSchedule"}]
    assert k.pool_toleration("r1", "team-a") == "team-a.nodepools.kfp-gpu.io/run=r1:NoSchedule"
    assert k.candidate_of(body) == cand


def test_nodepool_names_are_stable_dns_labels() -> None:
    a = k.nodepool_name("Run_ID.with/odd chars" * 5)
    assert a == k.nodepool_name("Run_ID.with/odd chars" * 5) and len(a) <= 63
    assert a.replace("-", "").isalnum() and a == a.lower()
    assert k.nodepool_name("r1") != k.nodepool_name("r2")


def test_recovery_raises_the_limit_by_the_nodes_still_draining() -> None:
    assert k.limit_for_replace(gang=2, still_listed=1, gpus_per_node=8) == {"nvidia.com/gpu": "24"}
    assert k.limit_for_replace(gang=2, still_listed=0, gpus_per_node=8) == {"nvidia.com/gpu": "16"}


def test_karpenters_disruption_taint_is_a_preemption_notice() -> None:
    assert k.DISRUPTED_TAINT in SHUTDOWN_TAINTS


# ---- errors --------------------------------------------------------------------------------------------

def test_exhausted_names_every_zone_and_reason() -> None:
    hist = [{"zone": "us-east-1a", "capacity_type": "spot", "reason": "InsufficientCapacityError", "message": "ICE"},
            {"zone": "us-east-1b", "capacity_type": "spot", "reason": "NoOfferingAvailable", "message": ""}]
    err = k.exhausted(hist, nodes=2, gpus_per_node=8, accelerator="a100-40gb", nodepool="np")
    assert isinstance(err, CapacityUnavailable)
    assert "us-east-1a/spot: InsufficientCapacityError (ICE)" in err.message
    assert "us-east-1b/spot: NoOfferingAvailable" in err.message
    assert err.fields["zones"] == ["us-east-1a", "us-east-1b"] and err.remediation
    t = k.timed_out(ready=1, wanted=2, nodepool="np", cand=k.Candidate("z", "spot"), deadline_s=60, history=hist)
    assert isinstance(t, ProvisioningTimeout) and "1/2 nodes Ready in z/spot" in t.message


def test_a_blocked_leader_zone_is_excluded_and_the_gang_led_again() -> None:
    base = k.Candidate("", "spot")
    again = k.lead_again(base, k.Candidate("us-east-1a", "spot"), recovering=False)
    assert again == k.Candidate("", "spot", avoid=("us-east-1a",))
    reqs = {r["key"]: r for r in k.requirements(["p4d.24xlarge"], again)}
    assert reqs[k.ZONE_LABEL] == {"key": k.ZONE_LABEL, "operator": "NotIn", "values": ["us-east-1a"]}
    third = k.lead_again(again, k.Candidate("us-east-1b", "spot", avoid=again.avoid), recovering=False)
    assert third is not None and third.avoid == ("us-east-1a", "us-east-1b")
    # ICE_RETRIES_ANY_ZONE zones tried: the candidate is given up, as an unpinned one is after that many ICEs
    assert k.lead_again(third, k.Candidate("us-east-1c", "spot", avoid=third.avoid), recovering=False) is None


def test_a_named_zone_a_recovery_or_an_unled_candidate_moves_on() -> None:
    pinned = k.Candidate("us-east-1a", "spot")
    assert k.lead_again(pinned, pinned, recovering=False) is None  # the user named the zone
    base = k.Candidate("", "spot")
    assert k.lead_again(base, k.Candidate("us-east-1a", "spot"), recovering=True) is None  # survivors' zone
    assert k.lead_again(base, base, recovering=False) is None  # no leader zone: Karpenter's ICEs blocked it
    assert "any zone but us-east-1a" in k.Candidate("", "spot", avoid=("us-east-1a",)).label


def test_a_deleted_claim_that_launched_is_never_read_as_an_ice() -> None:
    gone = {"metadata": {"name": "c", "deletionTimestamp": "2026-12-01T00:00:00Z"},
            "status": {"providerID": "kwok://n", "conditions": [{"type": "Launched", "status": "True"}]}}
    view = k.read_claim(gone)
    assert view.state is k.ClaimState.DELETING and view.launched
    bare = {"metadata": {"name": "c", "deletionTimestamp": "2026-12-01T00:00:00Z"}, "status": {}}
    assert not k.read_claim(bare).launched  # deleted before any launch: the ICE shape


def test_a_required_topology_is_refused_in_one_line_naming_the_node_group_fix() -> None:
    with pytest.raises(InvalidSpec) as ei:
        k.check_topology("required")
    assert ei.value.message == ("invalid topology='required': the karpenter provisioner cannot keep a gang in one "
                                "network domain (its NodePool places no EC2 placement group)")
    assert "placement group of strategy 'cluster'" in ei.value.remediation and "\n" not in ei.value.message
    k.check_topology("preferred")  # may span domains: runs
    k.check_topology("none")
