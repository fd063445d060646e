"""The janitor's decision (kfp_gpu.plan.lease) in virtual time: expired? live owner? and the lock."""

from __future__ import annotations

import math

import pytest

from kfp_gpu.plan.lease import (
    LeaseRecord,
    OwnerRef,
    OwnerState,
    decide,
    label_expiry,
    local_state,
    lock_free,
    owners_to_check,
    pod_state,
    run_expiry,
    workflow_state,
)

POD = OwnerRef("pod", "kubeflow/train-pod-1", "uid-1")
WF = OwnerRef("workflow", "kubeflow/llm-run-abc")
LOCAL = OwnerRef("local", "local:laptop:4242")


def held(renew: float, ttl: float = 60.0, *owners: OwnerRef, name: str = "kfp-gpu-lease-r-train") -> LeaseRecord:
    return LeaseRecord(name, "train-pod-1/7", renew, ttl, owners or (POD,))


def released(renew: float, ttl: float = 60.0) -> LeaseRecord:
    return LeaseRecord("kfp-gpu-lease-r-warm-pool", "", renew, ttl, (POD,))


def test_lease_expiry_is_renew_time_plus_duration_and_missing_fields_hold_nothing():
    assert held(1000.0, 60.0).expires_at == 1060.0
    assert LeaseRecord("x", "h", None, 60.0).expires_at == -math.inf
    assert LeaseRecord("x", "h", 1000.0, None).expires_at == -math.inf


def test_label_values():
    assert label_expiry("1700000000") == 1700000000.0
    assert label_expiry(None) is None  # no label: the object holds no lease
    assert label_expiry("soon") == math.inf  # unreadable: never expires


def test_run_expiry_is_the_latest_of_leases_and_labels():
    assert run_expiry([held(1000.0), released(900.0)], [1010.0, 1100.0]) == 1100.0
    assert run_expiry([held(1000.0)], []) == 1060.0
    assert run_expiry([], []) == -math.inf


@pytest.mark.parametrize("now", [1000.0, 1059.0, 1060.0])
def test_a_lease_renewed_within_its_duration_keeps_the_run_whatever_the_owner(now):
    v = decide([held(1000.0)], [1060.0], {POD: OwnerState.GONE}, now)
    assert not v.release and "valid for" in v.reason


def test_a_heartbeat_that_keeps_renewing_never_lets_the_run_expire():
    """Virtual time: a 60 s lease renewed every 15 s stays valid over days of janitor passes."""
    ttl, beat, renew = 60.0, 15.0, 0.0
    for t in range(0, 3 * 86400, 7):
        while renew + beat <= t:
            renew += beat
        assert not decide([held(renew, ttl)], [renew + ttl], {POD: OwnerState.GONE}, float(t)).release


def test_expired_lease_with_live_owner_pod_is_kept():
    v = decide([held(1000.0)], [1060.0], {POD: OwnerState.LIVE}, 2000.0)
    assert not v.release
    assert "pod kubeflow/train-pod-1 is alive" in v.reason


def test_expired_lease_with_owner_that_cannot_be_checked_is_kept():
    assert not decide([held(1000.0)], [], {POD: OwnerState.UNKNOWN}, 2000.0).release
    assert not decide([held(1000.0)], [], {}, 2000.0).release  # never checked counts as unknown


def test_expired_lease_and_every_owner_gone_is_released():
    lease = held(1000.0, 60.0, POD, WF)
    v = decide([lease], [1060.0], {POD: OwnerState.GONE, WF: OwnerState.GONE}, 2000.0)
    assert v.release
    assert "expired 940s ago" in v.reason and "pod kubeflow/train-pod-1 gone" in v.reason


def test_one_live_owner_among_several_keeps_the_run():
    lease = held(1000.0, 60.0, POD, WF)
    assert not decide([lease], [], {POD: OwnerState.GONE, WF: OwnerState.LIVE}, 2000.0).release


def test_a_released_lease_is_judged_by_its_expiry_alone():
    """The step ended and cleared its holder: its pod (Succeeded or still there) is not asked."""
    assert owners_to_check([released(1000.0)]) == []
    assert not decide([released(1000.0)], [], {}, 1030.0).release  # the gap to the next step is covered
    assert decide([released(1000.0)], [], {}, 1061.0).release


def test_every_lease_of_the_run_must_have_expired():
    """warm_pool's lease ran out long ago, train's is still renewed: the run lives."""
    leases = [released(0.0), held(1990.0)]
    assert not decide(leases, [100.0], {POD: OwnerState.GONE}, 2000.0).release


def test_a_label_renewed_later_than_the_lease_object_keeps_the_run():
    assert not decide([held(1000.0)], [2100.0], {POD: OwnerState.GONE}, 2000.0).release


def test_runs_without_lease_objects_fall_back_to_labels():
    assert not decide([], [2100.0], {}, 2000.0).release
    assert decide([], [1900.0, 1950.0], {}, 2000.0).release
    assert not decide([], [1900.0, math.inf], {}, 2000.0).release  # an unreadable label never expires


def test_a_run_with_no_lease_at_all_is_kept():
    v = decide([], [], {}, 2000.0)
    assert not v.release and "no lease" in v.reason


def test_owners_to_check_deduplicates_across_leases():
    a = held(1.0, 60.0, POD, LOCAL, name="a")
    b = held(1.0, 60.0, POD, WF, name="b")
    assert owners_to_check([a, b]) == [POD, LOCAL, WF]


@pytest.mark.parametrize("exists,phase,uid,want,state", [
    (True, "Running", "uid-1", "uid-1", OwnerState.LIVE),
    (True, "Pending", "", "uid-1", OwnerState.LIVE),
    (True, None, "uid-1", "", OwnerState.LIVE),
    (True, "Succeeded", "uid-1", "uid-1", OwnerState.GONE),
    (True, "Failed", "uid-1", "uid-1", OwnerState.GONE),
    (True, "Running", "uid-2", "uid-1", OwnerState.GONE),  # same name, another pod
    (False, None, "", "uid-1", OwnerState.GONE),
])
def test_pod_state(exists, phase, uid, want, state):
    assert pod_state(exists, phase, uid, want) is state


@pytest.mark.parametrize("exists,phase,finished,completed,state", [
    (True, "Running", None, None, OwnerState.LIVE),
    (True, "", None, None, OwnerState.LIVE),  # just submitted
    (True, "Succeeded", "2026-01-01T00:00:00Z", "true", OwnerState.GONE),
    (True, "Failed", None, None, OwnerState.GONE),
    (True, "Error", None, None, OwnerState.GONE),
    (True, "Running", "2026-01-01T00:00:00Z", None, OwnerState.GONE),
    (True, "Running", None, "true", OwnerState.GONE),
    (False, None, None, None, OwnerState.GONE),
])
def test_workflow_state(exists, phase, finished, completed, state):
    assert workflow_state(exists, phase, finished, completed) is state


def test_local_state():
    alive = {4242}.__contains__
    assert local_state("local:laptop:4242", "laptop", alive) is OwnerState.LIVE
    assert local_state("local:laptop:4243", "laptop", alive) is OwnerState.GONE
    assert local_state("local:other-host:4242", "laptop", alive) is OwnerState.GONE  # cannot be checked here
    assert local_state("garbage", "laptop", alive) is OwnerState.GONE


def test_lock_is_taken_only_when_free_mine_or_expired():
    assert lock_free("", None, None, "me", 100.0)
    assert lock_free("me", 90.0, 60.0, "me", 100.0)
    assert not lock_free("other", 90.0, 60.0, "me", 100.0)
    assert not lock_free("other", 90.0, 60.0, "me", 150.0)
    assert lock_free("other", 90.0, 60.0, "me", 150.1)
