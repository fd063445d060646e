"""Recovery decisions over observed facts, in virtual time (no cluster, no clock, no mocks)."""

from __future__ import annotations

import pytest

from kfp_gpu.plan.recovery import (
    APP_FAILURE_SETTLE_S,
    Action,
    Budget,
    Cause,
    NodeFact,
    NodeIncident,
    Placement,
    PodFact,
    Usage,
    Verdict,
    classify,
    decide,
    gang_losses,
    gang_ready,
    loss_reason,
    node_shutdown_reason,
    steps_lost,
    unclaimed,
    watchdog,
)
from kfp_gpu.spec import Recovery

GANG = ("n0", "n1", "n2", "n3")


def running(i: int, at: float = 0.0, **kw: object) -> PodFact:
    return PodFact(name=f"p{i}", node=f"n{i}", at=at, phase="Running", **kw)  # type: ignore[arg-type]


# ---- node signals --------------------------------------------------------------------------------

@pytest.mark.parametrize("taint", [
    "cloud.google.com/impending-node-termination", "node.kubernetes.io/out-of-service",
    "ToBeDeletedByClusterAutoscaler",
])
def test_shutdown_taints_mean_the_node_is_going(taint: str) -> None:
    assert node_shutdown_reason(NodeFact("n0", 0.0, taints=("nvidia.com/gpu", taint))) == taint


def test_spot_notice_graceful_node_shutdown_is_a_loss_with_no_taint() -> None:
    """GKE >= 1.20: the kubelet's graceful node shutdown (Ready=False, "node is shutting down") is the first signal;
    a node that is merely NotReady (booting, a heartbeat gap) is waited for, not lost."""
    from kfp_gpu.cluster.facts import node_fact
    from kfp_gpu.cluster.nodes import is_going

    def obj(message: str) -> dict[str, object]:
        return {"metadata": {"name": "n1"}, "status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": message}]}}

    going, booting = node_fact(obj("node is shutting down"), 1.0), node_fact(obj("PLEG is not healthy"), 1.0)
    assert going.shutting_down and not booting.shutting_down
    assert is_going(obj("node is shutting down")) and not is_going(obj("PLEG is not healthy"))  # the controller's view
    assert node_shutdown_reason(going) == "node is shutting down" and node_shutdown_reason(booting) == ""
    assert gang_losses(("n1",), {"n1": going}, "") == ("n1",) and gang_losses(("n1",), {"n1": booting}, "") == ()
    inc = {"n1": NodeIncident("n1", 1.0, node_shutdown_reason(going))}
    v = classify(GANG, inc, [running(0), running(1)], now=1.0)
    assert v.cause is Cause.PREEMPTION and v.lost_nodes == ("n1",) and v.reason == "node n1: node is shutting down"


def test_spot_notice_pod_told_before_its_node_waits_for_the_node_signal() -> None:
    """TerminationByKubelet on a pod can reach us before the node's "shutting down": the verdict settles for
    KUBELET_SETTLE_S, so the node's signal makes it one preemption of that node instead of two."""
    from kfp_gpu.plan.recovery import KUBELET_SETTLE_S

    told = running(1, at=10.0, disruption="TerminationByKubelet")
    early = classify(GANG, {}, [running(0), told], now=10.1)
    assert early.cause is Cause.PREEMPTION and not early.final(10.1) and early.settle_until == 10.0 + KUBELET_SETTLE_S
    inc = {"n1": NodeIncident("n1", 10.2, "node is shutting down")}
    late = classify(GANG, inc, [running(0), told], now=10.3)
    assert late.final(10.3) and late.lost_nodes == ("n1",)
    alone = classify(GANG, {}, [running(0), told], now=11.0)  # node-pressure eviction: no node signal comes
    assert alone.final(11.0) and alone.lost_nodes == ()
    evicted = classify(GANG, {}, [running(1, at=10.0, disruption="EvictionByEvictionAPI")], now=10.0)
    assert evicted.final(10.0)  # other disruptions decide at once


def test_gpu_taint_and_healthy_node_are_not_shutdown() -> None:
    assert node_shutdown_reason(NodeFact("n0", 0.0, taints=("nvidia.com/gpu",))) == ""
    assert node_shutdown_reason(NodeFact("n0", 0.0, exists=False)) == "deleted"


def test_gang_ready_lists_every_unusable_node() -> None:
    nodes = {
        "n0": NodeFact("n0", 0, gpus=8),
        "n1": NodeFact("n1", 0, gpus=8, ready=False),
        "n2": NodeFact("n2", 0, gpus=4),
        "n3": NodeFact("n3", 0, gpus=8, unschedulable=True),
    }
    assert gang_ready(GANG + ("n4",), nodes, 8) == ("n1", "n2", "n3", "n4")
    assert gang_ready(("n0",), nodes, 8) == ()


def test_gang_losses_separates_lost_from_not_ready_yet() -> None:
    """Overlapping preemptions: the gang is re-derived from live nodes, whatever list was taken before."""
    nodes = {
        "n0": NodeFact("n0", 0, gpus=8, claimed_by="run-a"),
        "n1": NodeFact("n1", 0, gpus=0, ready=False, claimed_by="run-a"),  # booting: wait, not lost
        "n2": NodeFact("n2", 0, gpus=8, claimed_by="run-a",
                       taints=("cloud.google.com/impending-node-termination",)),  # notice: lost
        "n3": NodeFact("n3", 0, gpus=8, claimed_by="run-b"),  # someone else's now: lost
        "n5": NodeFact("n5", 0, gpus=8),  # recreated under its old name, unclaimed: claim it again
    }
    gang = ("n0", "n1", "n2", "n3", "n4", "n5")
    assert gang_losses(gang, nodes, "run-a") == ("n2", "n3", "n4")
    assert unclaimed(gang, nodes) == ("n5",)
    assert gang_ready(("n0", "n1"), nodes, 8) == ("n1",)
    assert loss_reason("n4", nodes, "run-a") == "missing"
    assert loss_reason("n2", nodes, "run-a") == "cloud.google.com/impending-node-termination"
    assert loss_reason("n3", nodes, "run-a") == "claimed by run run-b"
    assert gang_losses(("n0",), {"n0": NodeFact("n0", 0, exists=False, claimed_by="run-a")}, "run-a") == ("n0",)


# ---- classification ------------------------------------------------------------------------------

def test_node_deleted_is_preemption_of_that_node() -> None:
    inc = {"n2": NodeIncident("n2", 10.0, "deleted")}
    v = classify(GANG, inc, [running(i) for i in range(4)], now=10.1)
    assert v.cause is Cause.PREEMPTION and v.lost_nodes == ("n2",) and v.at == 10.0
    assert v.final(10.1)  # preemption decisions are immediate


def test_incident_on_a_foreign_node_is_ignored() -> None:
    v = classify(GANG, {"other": NodeIncident("other", 1.0, "deleted")}, [running(0)], now=2.0)
    assert v.cause is Cause.NONE


def test_disruption_target_pod_is_preemption() -> None:
    v = classify(GANG, {}, [running(0), running(1, at=5.0, disruption="EvictionByEvictionAPI")], now=5.0)
    assert v.cause is Cause.PREEMPTION and v.pods == ("p1",) and v.lost_nodes == ()


@pytest.mark.parametrize("reason", ["Evicted", "TerminationByKubelet", "DeletionByTaintManager",
                                    "PreemptionByScheduler"])
def test_eviction_reasons_are_preemption(reason: str) -> None:
    pod = PodFact("p1", "n1", 3.0, phase="Failed", reason=reason)
    assert classify(GANG, {}, [pod], now=3.0).cause is Cause.PREEMPTION


def test_exit_137_after_node_event_is_preemption() -> None:
    # the incident is on a node outside the gang (e.g. a peer service), the exit follows it
    inc = {"x": NodeIncident("x", 100.0, "cloud.google.com/impending-node-termination")}
    pod = PodFact("p0", "n0", 101.0, phase="Failed", exit_code=137)
    v = classify(GANG, inc, [pod], now=101.0)
    assert v.cause is Cause.PREEMPTION


def test_exit_137_without_node_event_is_app_failure() -> None:
    pod = PodFact("p0", "n0", 101.0, phase="Failed", exit_code=137, reason="OOMKilled")
    v = classify(GANG, {}, [pod], now=101.0)
    assert v.cause is Cause.APP_FAILURE and "OOMKilled" in v.reason


def test_exit_1_is_app_failure_only_after_settling() -> None:
    pod = PodFact("p0", "n0", 50.0, phase="Failed", exit_code=1)
    v = classify(GANG, {}, [pod], now=50.0)
    assert v.cause is Cause.APP_FAILURE and not v.final(50.0)
    assert v.final(50.0 + APP_FAILURE_SETTLE_S)


def test_preemption_evidence_beats_peer_app_failure() -> None:
    # worker p0 dies with an NCCL error (exit 1) first; the node deletion of n3 arrives a moment later
    pods = [PodFact("p0", "n0", 50.0, phase="Failed", exit_code=1), running(3)]
    assert classify(GANG, {}, pods, now=50.5).cause is Cause.APP_FAILURE
    v = classify(GANG, {"n3": NodeIncident("n3", 50.8, "deleted")}, pods, now=50.9)
    assert v.cause is Cause.PREEMPTION and v.lost_nodes == ("n3",)


def test_failed_job_condition_is_app_failure() -> None:
    v = classify(GANG, {}, [], now=7.0, job_failed="PyTorchJobFailed")
    assert v.cause is Cause.APP_FAILURE and "PyTorchJobFailed" in v.reason


def test_healthy_gang_is_none() -> None:
    assert classify(GANG, {}, [running(i) for i in range(4)], now=1.0).cause is Cause.NONE


# ---- budget --------------------------------------------------------------------------------------

PRE = Verdict(Cause.PREEMPTION, 1.0, ("n1",))
APP = Verdict(Cause.APP_FAILURE, 1.0)


def test_preemption_budget_counts_down_then_exhausts() -> None:
    policy = Recovery(max_preemptions=2)
    b = Budget()
    d1 = decide(policy, spot=True, budget=b, verdict=PRE)
    assert d1.action is Action.RESUME and d1.remaining == 1 and not d1.on_demand
    d2 = decide(policy, spot=True, budget=d1.budget, verdict=PRE)
    assert d2.action is Action.RESUME and d2.remaining == 0
    d3 = decide(policy, spot=True, budget=d2.budget, verdict=PRE)
    assert d3.action is Action.EXHAUSTED and d3.budget.preemptions == 3


def test_zero_budget_exhausts_on_first_preemption() -> None:
    assert decide(Recovery(max_preemptions=0), spot=False, budget=Budget(), verdict=PRE).action is Action.EXHAUSTED


def test_on_demand_after_n_preemptions_sticks() -> None:
    policy = Recovery(max_preemptions=5, on_demand_after=2)
    d1 = decide(policy, spot=True, budget=Budget(), verdict=PRE)
    d2 = decide(policy, spot=True, budget=d1.budget, verdict=PRE)
    d3 = decide(policy, spot=True, budget=d2.budget, verdict=PRE)
    assert (d1.on_demand, d2.on_demand, d3.on_demand) == (False, True, True)
    assert "on-demand" in d2.message and "on-demand" not in d3.message


def test_on_demand_never_for_non_spot() -> None:
    policy = Recovery(max_preemptions=5, on_demand_after=1)
    assert not decide(policy, spot=False, budget=Budget(), verdict=PRE).on_demand


def test_app_failures_have_their_own_budget() -> None:
    policy = Recovery(max_preemptions=0, app_failure_retries=1)
    d1 = decide(policy, spot=False, budget=Budget(), verdict=APP)
    assert d1.action is Action.RETRY and d1.budget.preemptions == 0
    assert decide(policy, spot=False, budget=d1.budget, verdict=APP).action is Action.FAIL


def test_nothing_to_decide_raises() -> None:
    with pytest.raises(ValueError):
        decide(Recovery(), spot=False, budget=Budget(), verdict=Verdict(Cause.NONE))


# ---- watchdog (virtual time) ---------------------------------------------------------------------

def test_watchdog_no_pods_after_admission_bound() -> None:
    p = Placement(created_at=100.0, gang=4)
    assert watchdog(p, now=110.0, admission_s=30, placement_s=60).next_deadline == 130.0
    assert "no pods" in watchdog(p, now=130.0, admission_s=30, placement_s=60).expired


def test_watchdog_partial_placement() -> None:
    p = Placement(created_at=0.0, gang=4, first_pod_at=1.0, first_bound_at=2.0, bound=3)
    assert watchdog(p, now=50.0, admission_s=30, placement_s=60).next_deadline == 62.0
    assert "3/4" in watchdog(p, now=62.0, admission_s=30, placement_s=60).expired


def test_watchdog_quiet_once_fully_placed_or_running() -> None:
    placed = Placement(created_at=0.0, gang=4, first_pod_at=1.0, first_bound_at=1.0, bound=4)
    assert watchdog(placed, now=1e6, admission_s=1, placement_s=1).expired == ""
    runs = Placement(created_at=0.0, gang=2, first_pod_at=1.0, first_bound_at=1.0, bound=2, running=2)
    assert watchdog(runs, now=1e6, admission_s=1, placement_s=1).next_deadline is None


# ---- accounting ----------------------------------------------------------------------------------

def test_steps_lost_from_rate_capped_by_interval() -> None:
    assert steps_lost(checkpoint_step=100, checkpoint_at=10.0, failed_at=13.0, steps_per_s=2.0,
                      checkpoint_every=10) == 6
    assert steps_lost(checkpoint_step=100, checkpoint_at=10.0, failed_at=100.0, steps_per_s=2.0,
                      checkpoint_every=10) == 10
    assert steps_lost(checkpoint_step=0, checkpoint_at=None, failed_at=5.0, steps_per_s=None,
                      checkpoint_every=10) == 5


def test_usage_gpu_hours() -> None:
    u = Usage(gpus=32)
    u.add(0.0, 1800.0)
    u.add(None, 10.0)  # never ran
    u.add(2000.0, 3800.0)
    assert u.seconds == 3600.0 and u.gpu_hours == pytest.approx(32.0)
