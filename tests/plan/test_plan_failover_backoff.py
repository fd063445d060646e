"""Failover scopes and jittered back-off, in virtual time."""

from __future__ import annotations

import json
import random

import pytest

from kfp_gpu.errors import (
    CapacityUnavailable,
    KfpGpuError,
    PermissionDenied,
    QuotaExceeded,
    RateLimited,
    TransientCloudError,
)
from kfp_gpu.plan.backoff import Backoff, VirtualClock, retry
from kfp_gpu.plan.failover import Action, Candidate, FailoverState

CANDS = [Candidate("r1", "r1-a"), Candidate("r1", "r1-b"), Candidate("r2", "r2-a")]


def test_zone_error_fails_over_to_next_zone() -> None:
    st = FailoverState()
    d = st.decide(CapacityUnavailable("stockout"), CANDS[0], CANDS)
    assert d.action is Action.FAILOVER and d.candidate == CANDS[1]


def test_region_error_skips_whole_region() -> None:
    st = FailoverState()
    d = st.decide(QuotaExceeded("quota"), CANDS[0], CANDS)
    assert d.candidate == CANDS[2] and st.blocked_regions == {"r1"}


def test_transient_retries_same_zone_without_blocking() -> None:
    st = FailoverState()
    d = st.decide(RateLimited("429"), CANDS[0], CANDS)
    assert d.action is Action.RETRY and d.candidate == CANDS[0] and not st.blocked_zones


def test_unclassified_error_blocks_narrowest_scope() -> None:
    st = FailoverState()
    d = st.decide(RuntimeError("weird"), CANDS[0], CANDS)
    assert d.candidate == CANDS[1] and st.history[0]["error"] == "CloudError"


def test_exhausted_carries_history_and_round_trips() -> None:
    st = FailoverState()
    for i, c in enumerate(CANDS):
        d = st.decide(CapacityUnavailable(f"stockout {c.zone}"), c, CANDS, at=float(i))
    assert d.action is Action.GIVE_UP
    err = st.exhausted("16 x a100-80gb")
    assert isinstance(err, CapacityUnavailable)
    assert [h["zone"] for h in err.fields["failover_history"]] == ["r1-a", "r1-b", "r2-a"]
    assert "r1-a, r1-b, r2-a" in err.message
    back = KfpGpuError.from_dict(json.loads(json.dumps(err.to_dict())))
    assert isinstance(back, CapacityUnavailable) and len(back.fields["failover_history"]) == 3
    assert FailoverState.from_dict(json.loads(json.dumps(st.to_dict()))).to_dict() == st.to_dict()


def test_provider_block_gives_up_with_original_error() -> None:
    st = FailoverState()
    d = st.decide(PermissionDenied("no creds", remediation="grant x"), CANDS[0], CANDS)
    assert d.action is Action.GIVE_UP
    err = st.exhausted()
    assert isinstance(err, PermissionDenied) and err.remediation == "grant x"


def test_backoff_full_jitter_bounds() -> None:
    bo = Backoff(base=1, factor=2, cap=10, rng=random.Random(7))
    assert [bo.ceiling(i) for i in range(6)] == [1, 2, 4, 8, 10, 10]
    for i in range(50):
        assert 0 <= bo.delay(i) <= bo.ceiling(i)


def test_retry_transient_until_success_in_virtual_time() -> None:
    clock = VirtualClock()
    attempts = iter([TransientCloudError("503"), RateLimited("429"), None])

    def call() -> str:
        e = next(attempts)
        if e:
            raise e
        return "ok"

    out = retry(call, deadline=100, clock=clock, sleep=clock.sleep, backoff=Backoff(rng=random.Random(1)))
    assert out == "ok" and len(clock.sleeps) == 2 and clock.now == sum(clock.sleeps)


def test_retry_never_retries_permanent_errors() -> None:
    clock = VirtualClock()
    calls = []

    def call() -> None:
        calls.append(1)
        raise QuotaExceeded("no")

    with pytest.raises(QuotaExceeded):
        retry(call, deadline=100, clock=clock, sleep=clock.sleep)
    assert calls == [1] and clock.sleeps == []


def test_retry_never_sleeps_past_deadline() -> None:
    clock = VirtualClock()

    def call() -> None:
        raise RateLimited("429")

    with pytest.raises(RateLimited):
        retry(call, deadline=30, clock=clock, sleep=clock.sleep, backoff=Backoff(base=2, cap=8, rng=random.Random(3)))
    assert clock.now < 30 and clock.sleeps


def test_retry_max_attempts() -> None:
    clock = VirtualClock()
    n = []

    def call() -> None:
        n.append(1)
        raise RateLimited("429")

    with pytest.raises(RateLimited):
        retry(call, deadline=1e9, clock=clock, sleep=clock.sleep, max_attempts=3)
    assert len(n) == 3
