"""kfp_gpu.retry: the one retry loop, in virtual time (no sleeping)."""

from __future__ import annotations

import random

import pytest

from kfp_gpu.errors import QuotaExceeded, RateLimited, TransientCloudError
from kfp_gpu.plan.backoff import VirtualClock
from kfp_gpu.retry import RetryPolicy, call, parse_retry_after
from kfp_gpu.steps.retry import retry_transient


def _failing(*errors: Exception) -> tuple[list[int], object]:
    calls: list[int] = []
    queue = list(errors)

    def fn() -> str:
        calls.append(1)
        if queue:
            raise queue.pop(0)
        return "ok"
    return calls, fn


def test_retry_after_is_a_floor_for_the_wait() -> None:
    clock = VirtualClock()
    calls, fn = _failing(RateLimited("429", retry_after_s=7.0), TransientCloudError("503"))
    out = call(fn, policy=RetryPolicy(base_s=0.1, cap_s=1.0, budget_s=60), clock=clock, sleep=clock.sleep,
               rng=random.Random(1))
    assert out == "ok" and len(calls) == 3
    assert 7.0 <= clock.sleeps[0] <= 7.1 and clock.sleeps[1] <= 0.2  # jittered back-off after a plain 503


def test_gives_up_after_attempts_saying_so() -> None:
    clock = VirtualClock()
    calls, fn = _failing(*[TransientCloudError("503") for _ in range(10)])
    with pytest.raises(TransientCloudError, match=r"gave up after 4 attempts") as info:
        call(fn, policy=RetryPolicy(attempts=4), clock=clock, sleep=clock.sleep)
    assert len(calls) == 4 and info.value.fields["attempts"] == 4


def test_never_sleeps_past_the_budget() -> None:
    clock = VirtualClock()
    calls, fn = _failing(*[RateLimited("429", retry_after_s=30.0) for _ in range(10)])
    with pytest.raises(RateLimited):
        call(fn, policy=RetryPolicy(attempts=10, budget_s=45.0), clock=clock, sleep=clock.sleep)
    assert len(calls) == 2 and clock.now < 45.0


def test_permanent_errors_are_not_retried() -> None:
    clock = VirtualClock()
    calls, fn = _failing(QuotaExceeded("no"))
    with pytest.raises(QuotaExceeded):
        call(fn, clock=clock, sleep=clock.sleep)
    assert calls == [1] and clock.sleeps == []


def test_parse_retry_after_seconds_decimals_and_http_date() -> None:
    assert parse_retry_after("120") == 120.0 and parse_retry_after("0.350") == 0.35
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == pytest.approx(10.0)
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_steps_retry_transient_keeps_its_report_interface() -> None:
    errors: list[str] = []
    calls, fn = _failing(TransientCloudError("503"))
    assert retry_transient(fn, errors, "roll back l4-a") and errors == [] and len(calls) == 2
    _, permanent = _failing(QuotaExceeded("no quota"))
    assert not retry_transient(permanent, errors, "roll back l4-b")
    assert errors == ["roll back l4-b: no quota"]
