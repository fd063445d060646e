"""GkeProvider survives the stand-in's API layer: rate quotas with Retry-After, seeded 5xx, lost answers,
half-successful resizes. Real google-cloud-* clients against the stand-in; no mocks."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kfp_gpu.errors import CapacityUnavailable, NotFound, RateLimited, Scope, TransientCloudError
from kfp_gpu.ownership import Owner
from kfp_gpu.providers.base import Operation, OpStatus, PoolRef
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu.retry import RetryPolicy
from kfp_gpu_rehearsal.sim import SimServer
from kfp_gpu_rehearsal.sim import api as sim_api
from tests.sim._helpers import CLUSTER, PROJECT, REGION, running, scenario
from tests.waiting import wait_until

OWNER = Owner("run-9", "scale-up", 2_000_000_000.0)
# tiny back-off: a retry that ignored Retry-After would come back within ~10 ms
EAGER = RetryPolicy(attempts=10, budget_s=10.0, base_s=0.001, cap_s=0.01)


def _provider(sim: SimServer, policy: RetryPolicy = EAGER) -> GkeProvider:
    return GkeProvider(PROJECT, REGION, CLUSTER, endpoint=sim.url, retry=policy)


def _until_done(p: GkeProvider, op: Operation, timeout: float = 15.0) -> Operation:
    deadline = time.monotonic() + timeout
    while not op.done and time.monotonic() < deadline:
        time.sleep(0.02)
        op = p.operation(op)
    return op


def _limited(sim: SimServer) -> int:
    return sim.gate.snapshot().get("rateLimited", 0)


# The budget is per wall second (rpm / 60 per one-second window; below 60 rpm one request per 60/rpm s):
# calls in a quick row exhaust it, whichever interval they land in. Each test makes several calls so an
# interval boundary cannot hide the limit.

def test_rate_limited_call_waits_at_least_retry_after_then_succeeds() -> None:
    with running(scenario(api={"requests_per_minute": 120, "retry_after_s": 0.3, "error_rate": 0})) as sim:
        p = _provider(sim)
        waits = []
        for _ in range(6):
            before, t0 = _limited(sim), time.monotonic()
            assert len(p.pools(REGION, sizes=False)) == 24
            if _limited(sim) > before:
                waits.append(time.monotonic() - t0)
        assert waits and min(waits) >= 0.3


def _first_rate_limited(calls: int, fn: Any) -> tuple[RateLimited, float]:
    for _ in range(calls):
        t0 = time.monotonic()
        try:
            fn()
        except RateLimited as exc:
            return exc, time.monotonic() - t0
    raise AssertionError(f"{calls} calls in a row were never rate limited")


def test_rate_limit_that_outlasts_the_bound_is_a_classified_rate_limited() -> None:
    with running(scenario(api={"requests_per_minute": 1, "retry_after_s": 0.05, "error_rate": 0})) as sim:
        p = _provider(sim, RetryPolicy(attempts=3, budget_s=0.4, base_s=0.001, cap_s=0.01))
        err, took = _first_rate_limited(5, lambda: p.pools(REGION, sizes=False))
        assert took >= 2 * 0.05  # waited Retry-After before each of the 2 retries
        assert err.scope is Scope.NONE and err.fields["retry_after_s"] == pytest.approx(0.05)
        assert err.fields["attempts"] == 3 and "gave up after 3 attempts" in err.message


def test_compute_rate_limit_403_is_rate_limited_not_permission_denied() -> None:
    with running(scenario(api={"requests_per_minute": 1, "retry_after_s": 0.05, "error_rate": 0})) as sim:
        p = _provider(sim, RetryPolicy(attempts=1))
        pool = p.node_pool(PoolRef("l4-a", "us-central1-a"))
        err, _ = _first_rate_limited(5, lambda: p._target_size(pool, pool.instance_group_urls[0]))
        assert "rateLimitExceeded" in err.message and "compute.googleapis.com" in err.message  # Compute's 403
        assert err.fields["retry_after_s"] == pytest.approx(0.05)


def test_transient_5xx_on_reads_are_retried_away() -> None:
    faults = [{"path": "/nodePools$", "method": "GET", "status": 503, "count": 2},
              {"path": "/instanceGroupManagers/[^/]+$", "status": 500, "count": 1}]
    with running(scenario(faults=faults, api={"error_rate": 0})) as sim:
        assert len(_provider(sim).pools(REGION)) == 24
        assert sim.request_counts()["container.nodePools.list"] == 3


def test_persistent_5xx_gives_up_after_the_bound_as_transient() -> None:
    faults = [{"path": "/nodePools$", "method": "GET", "status": 503, "count": 1000}]
    with running(scenario(faults=faults, api={"error_rate": 0})) as sim:
        with pytest.raises(TransientCloudError, match="gave up after 4 attempts"):
            _provider(sim, RetryPolicy(attempts=4, budget_s=5.0, base_s=0.001, cap_s=0.01)).pools(REGION)
        assert sim.request_counts()["container.nodePools.list"] == 4


def test_seeded_5xx_default_world_is_survived() -> None:
    with running(scenario(api={"error_rate": 0.3, "seed": 11})) as sim:
        p = _provider(sim)
        for _ in range(12):  # 2 reads each (nodePools.list beside one instanceGroupManagers.aggregatedList)
            assert len(p.pools(REGION)) == 24
        assert sum(v for k, v in sim.gate.snapshot().items() if k.startswith("5xx")) >= 10


def _seed_losing_first_set_size_answer(rate: float) -> int:
    """A seed whose 1st setSize answers 5xx after taking effect and whose 2nd is answered."""
    route = "container.nodePools.setSize"
    return next(s for s in range(10_000) if sim_api._unit(s, route, 1, "fail") < rate
                and sim_api._unit(s, route, 2, "fail") >= rate)


def test_set_size_whose_answer_was_lost_adopts_its_own_operation() -> None:
    seed = _seed_losing_first_set_size_answer(0.3)
    with running(scenario(api={"error_rate": 0.3, "committed_5xx": 1.0, "seed": seed})) as sim:
        p, ref = _provider(sim), PoolRef("l4-c", "us-central1-c")
        op = p.resize(ref, 2, OWNER)
        ops = [name for name, o in sim.state.gke_ops.items() if o["targetLink"].endswith("/nodePools/l4-c")]
        assert len(ops) == 1 and op.id.endswith(ops[0])  # one setSize took effect; resize returned it
        assert sim.gate.snapshot()["5xxAfterEffect"] >= 1
        assert _until_done(p, op).status is OpStatus.DONE
        assert p.pool(ref).size == 2


def test_operation_reports_a_stockout_that_starts_mid_resize_as_partial_success() -> None:
    data = scenario(api={"error_rate": 0}, operations={"set_size_s": 480},
                    stockouts=[{"zone": "us-central1-a", "start_s": 240}])
    with running(data) as sim:
        p, ref = _provider(sim), PoolRef("l4-a", "us-central1-a", REGION)
        op = p.resize(ref, 4, OWNER)
        done = _until_done(p, op)
        assert done.status is OpStatus.DONE  # GKE finished the operation: the group's target is set
        err = done.error
        assert isinstance(err, CapacityUnavailable) and err.scope is Scope.ZONE
        assert err.fields["code"].startswith("ZONE_RESOURCE_POOL_EXHAUSTED") and err.fields["zone"] == "us-central1-a"
        assert err.fields["target"] == 4 and err.fields["running"] + err.fields["creating"] == 4
        assert err.fields["failed"] >= 2 and "of 4 instances running" in err.message
        act = p.pool_activity(ref)
        assert act.target == 4 and act.busy and any(e.stockout for e in act.errors)
        assert {e.action for e in act.errors} == {"CREATING"}


def test_pool_activity_shows_a_preempted_vm_being_recreated() -> None:
    with running(scenario(api={"error_rate": 0})) as sim:
        p, ref = _provider(sim), PoolRef("l4-spot-b", "us-central1-b", REGION)
        _until_done(p, p.resize(ref, 2, OWNER))
        wait_until("2 VMs up", lambda: p.pool_activity(ref).running == 2, timeout=30, every=0.05)
        sim.preempt(sim.nodes("l4-spot-b")[0])
        act: Any = wait_until("the VM recreated", lambda: (a := p.pool_activity(ref)).creating == 1 and a,
                              timeout=30, every=0.02)
        assert act.target == 2 and act.busy and act.errors == ()


def test_unknown_pool_is_one_not_found_listing_the_pools() -> None:
    with running(scenario(api={"error_rate": 0})) as sim:
        with pytest.raises(NotFound) as info:
            _provider(sim).pool_activity(PoolRef("l4-z", "us-central1-a"))
        msg = info.value.message
        assert "'l4-z' does not exist" in msg and "l4-a, l4-b" in msg and "\n" not in msg
        assert info.value.fields["pools"][0] == "a100-80gb-a"
        assert "node-pools create l4-z" in info.value.remediation
