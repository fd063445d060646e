"""Admission through a Kueue queue and eviction by Kueue, over facts in virtual time (no cluster, no clock)."""

from __future__ import annotations

import pytest

from kfp_gpu.plan.admission import (
    NO_WORKLOAD_HINT,
    QueueState,
    WorkloadFact,
    admission,
    progress_due,
    waiting_reason,
)
from kfp_gpu.plan.recovery import (
    Action,
    Budget,
    Cause,
    NodeIncident,
    PodFact,
    Verdict,
    classify,
    decide,
)
from kfp_gpu.spec import Recovery

GANG = ("n0", "n1")
PENDING = WorkloadFact("pytorchjob-j-1a2b3", 5.0, "uid-1", pending="couldn't assign flavors to pod set master: "
                       "insufficient unused quota for nvidia.com/gpu in flavor a100, 16 more needed")
ADMITTED = WorkloadFact("pytorchjob-j-1a2b3", 200.0, "uid-1", quota_reserved=True, admitted=True, cluster_queue="cq")


def state(**kw: object) -> QueueState:
    args: dict[str, object] = dict(queue="lq", suspended=True, workload=None, admitted_at=None, running=False,
                                   waiting_since=0.0, now=10.0, timeout_s=3600.0)
    args.update(kw)
    return admission(**args).state  # type: ignore[arg-type]


# ---- waiting --------------------------------------------------------------------------------------

def test_suspended_job_without_pods_waits_past_the_old_watchdog_and_times_out_on_its_own_deadline() -> None:
    for now in (0.0, 121.0, 3599.9):  # the no-pods watchdog (120 s) has no say while queued
        a = admission(queue="lq", suspended=True, workload=PENDING, admitted_at=None, running=False,
                      waiting_since=0.0, now=now, timeout_s=3600.0)
        assert a.state is QueueState.WAITING and not a.expired and a.next_deadline == 3600.0
        assert "insufficient unused quota" in a.reason and PENDING.name in a.reason
    a = admission(queue="lq", suspended=True, workload=PENDING, admitted_at=None, running=False,
                  waiting_since=0.0, now=3600.0, timeout_s=3600.0)
    assert a.state is QueueState.WAITING
    assert a.expired.startswith("not admitted by Kueue LocalQueue lq within 3600s: workload pytorchjob-j-1a2b3 ")
    assert "\n" not in a.expired and "16 more needed" in a.expired


def test_the_deadline_counts_from_when_the_wait_began_not_from_a_re_attach() -> None:
    a = admission(queue="lq", suspended=True, workload=PENDING, admitted_at=None, running=False,
                  waiting_since=100.0, now=150.0, timeout_s=60.0)
    assert a.next_deadline == 160.0 and not a.expired
    assert admission(queue="lq", suspended=True, workload=PENDING, admitted_at=None, running=False,
                     waiting_since=100.0, now=160.0, timeout_s=60.0).expired


def test_no_workload_yet_says_what_to_check() -> None:
    a = admission(queue="lq", suspended=True, workload=None, admitted_at=None, running=False, waiting_since=0.0,
                  now=5.0, timeout_s=10.0)
    assert a.state is QueueState.WAITING and a.reason == NO_WORKLOAD_HINT


def test_quota_reserved_but_admission_checks_pending_still_waits() -> None:
    wl = WorkloadFact("w", 1.0, "u", quota_reserved=True, cluster_queue="cq",
                      pending="dws-prov: Pending (Waiting for resources)")
    assert state(workload=wl) is QueueState.WAITING
    assert waiting_reason("lq", wl) == ("workload w has quota (ClusterQueue cq), waiting for admission checks: "
                                        "dws-prov: Pending (Waiting for resources)")


def test_admitted_but_still_suspended_waits_for_the_unsuspend() -> None:
    assert state(workload=ADMITTED, suspended=True) is QueueState.WAITING
    assert state(workload=ADMITTED, suspended=False) is QueueState.ADMITTED


def test_not_queued_and_not_suspended_is_none_so_the_old_watchdog_applies() -> None:
    assert state(queue="", suspended=False) is QueueState.NONE


def test_a_deleted_workload_is_no_workload() -> None:
    gone = WorkloadFact("w", 1.0, "u", admitted=True, deleted=True)
    assert state(workload=gone, suspended=False) is QueueState.WAITING


# ---- eviction --------------------------------------------------------------------------------------

@pytest.mark.parametrize("reason", ["Preempted", "PodsReadyTimeout", "InactiveWorkload"])
def test_an_evicted_workload_is_an_eviction(reason: str) -> None:
    wl = WorkloadFact("w", 42.0, "u", quota_reserved=True, admitted=True, evicted=reason,
                      evicted_message="Preempted to accommodate a workload due to prioritization in the ClusterQueue")
    a = admission(queue="lq", suspended=False, workload=wl, admitted_at=30.0, running=True, waiting_since=0.0,
                  now=43.0, timeout_s=3600.0)
    assert a.state is QueueState.EVICTED and a.at == 42.0
    assert a.reason.startswith(f"workload w evicted: {reason}: Preempted to accommodate")


def test_suspended_again_after_admission_is_an_eviction_even_without_a_workload_condition() -> None:
    a = admission(queue="lq", suspended=True, workload=ADMITTED, admitted_at=200.0, running=True,
                  waiting_since=0.0, now=300.0, timeout_s=3600.0, suspended_at=290.0)
    assert a.state is QueueState.EVICTED and a.at == 290.0
    assert state(queue="", suspended=True, running=True) is QueueState.EVICTED


def test_queue_eviction_beats_the_pods_dying_with_143_but_a_lost_node_beats_the_eviction() -> None:
    dying = [PodFact("p0", "n0", 50.0, phase="Failed", exit_code=143), PodFact("p1", "n1", 50.0, phase="Failed",
                                                                                exit_code=143)]
    v = classify(GANG, {}, dying, now=60.0, queue_evicted="workload w evicted: Preempted", queue_evicted_at=49.0)
    assert v.cause is Cause.QUEUE_EVICTION and v.at == 49.0 and v.lost_nodes == () and v.final(60.0)
    lost = {"n1": NodeIncident("n1", 48.0, "deleted")}
    v = classify(GANG, lost, dying, now=60.0, queue_evicted="workload w evicted: Preempted")
    assert v.cause is Cause.PREEMPTION and v.lost_nodes == ("n1",)
    assert classify(GANG, {}, dying, now=60.0).cause is Cause.APP_FAILURE  # without the eviction: the app's fault


def test_queue_eviction_counts_against_the_preemption_budget_and_keeps_the_capacity_type() -> None:
    policy = Recovery(max_preemptions=2, on_demand_after=1)
    v = Verdict(Cause.QUEUE_EVICTION, 10.0, (), "workload w evicted: Preempted")
    d1 = decide(policy, spot=True, budget=Budget(), verdict=v)
    assert d1.action is Action.RESUME and d1.budget == Budget(1, 0, False) and not d1.on_demand
    assert d1.remaining == 1 and "queue eviction 1/2" in d1.message
    d2 = decide(policy, spot=True, budget=d1.budget, verdict=v)
    assert d2.action is Action.RESUME and d2.remaining == 0
    d3 = decide(policy, spot=True, budget=d2.budget, verdict=v)
    assert d3.action is Action.EXHAUSTED and d3.budget.preemptions == 3
    # mixed with node preemptions: one budget
    node = Verdict(Cause.PREEMPTION, 5.0, ("n0",), "node n0: deleted")
    b = decide(policy, spot=True, budget=Budget(), verdict=node).budget
    assert decide(policy, spot=True, budget=b, verdict=v).budget.preemptions == 2


def test_progress_lines_are_due_first_at_once_then_every_interval() -> None:
    assert progress_due(None, 0.0, 30.0)
    assert not progress_due(0.0, 29.9, 30.0)
    assert progress_due(0.0, 30.0, 30.0)
