"""Failover scopes and jittered back-off, in virtual time."""

from __future__ import annotations

import json
import random

from kfp_gpu.errors import (
    CapacityUnavailable,
    KfpGpuError,
    PermissionDenied,
    QuotaExceeded,
    RateLimited,
)
from kfp_gpu.plan.backoff import Backoff
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


def test_region_quota_then_nothing_left_gives_up_with_the_quota_error() -> None:
    """A regional quota refusal (GCE reports it as a MIG instance error) that leaves no candidate is said as
    itself, the one-line QuotaExceeded with its metric, not as a generic 'no zone could provide'."""
    st = FailoverState()
    st.decide(CapacityUnavailable("stockout r2-a"), CANDS[2], CANDS, at=0.0)
    d = st.decide(QuotaExceeded("quota NVIDIA_L4_GPUS exceeded in r1", metric="NVIDIA_L4_GPUS",
                                remediation="request more"), CANDS[0], CANDS, at=1.0)
    assert d.action is Action.GIVE_UP
    err = FailoverState.from_dict(json.loads(json.dumps(st.to_dict()))).exhausted("2 x l4")
    assert isinstance(err, QuotaExceeded) and err.fields["metric"] == "NVIDIA_L4_GPUS"
    assert err.remediation == "request more" and [h["zone"] for h in err.fields["failover_history"]] == ["r2-a", "r1-a"]


def test_backoff_full_jitter_bounds() -> None:
    bo = Backoff(base=1, factor=2, cap=10, rng=random.Random(7))
    assert [bo.ceiling(i) for i in range(6)] == [1, 2, 4, 8, 10, 10]
    for i in range(50):
        assert 0 <= bo.delay(i) <= bo.ceiling(i)
