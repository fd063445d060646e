"""The autoscaled-pool decision (kfp_gpu.plan.autoscaled): which claims protect, when scale-up refuses."""

from __future__ import annotations

from kfp_gpu.errors import InvalidSpec
from kfp_gpu.plan.autoscaled import protected_pools, refusal
from kfp_gpu.providers.base import PoolRef, PoolState


def _state(pool: str, zone: str = "us-central1-a", *, auto: bool) -> PoolState:
    return PoolState(PoolRef(pool, zone, "us-central1"), 0, 16, "a100-80gb", 8, "a2-ultragpu-8g", False,
                     autoscaling=auto, autoscaling_min=0, autoscaling_max=16 if auto else 0)


STATES = [_state("dedicated", auto=False), _state("shared", auto=True), _state("shared", "us-central1-b", auto=True)]


def test_protect_marks_only_the_autoscaled_pools():
    assert protected_pools(STATES, "protect") == frozenset({"shared"})
    assert protected_pools(STATES, "refuse") == frozenset()
    assert protected_pools([_state("dedicated", auto=False)], "protect") == frozenset()


def test_refuse_names_the_autoscaled_pool_a_plan_would_resize():
    err = refusal(STATES, [PoolRef("dedicated", "us-central1-a"), PoolRef("shared", "us-central1-b")], "refuse")
    assert isinstance(err, InvalidSpec)
    assert err.field == "target.autoscaled_pools"
    text = str(err)
    assert "node pool shared (us-central1-b) is autoscaled (0..16 nodes)" in text
    assert "ProvisioningRequest" in text and "autoscaled_pools='protect'" in text and "\n" not in text


def test_refuse_lets_plans_through_that_touch_no_autoscaled_pool():
    assert refusal(STATES, [PoolRef("dedicated", "us-central1-a")], "refuse") is None
    assert refusal(STATES, [], "refuse") is None
    assert refusal(STATES, [PoolRef("shared", "us-central1-a")], "protect") is None
