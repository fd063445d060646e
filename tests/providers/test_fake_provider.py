"""FakeProvider honours the CapacityProvider contract; assertions are on observable state."""

from __future__ import annotations

import threading

import pytest

from kfp_gpu.errors import (
    CapacityUnavailable,
    CloudError,
    InvalidSpec,
    NotFound,
    PermissionDenied,
    RateLimited,
    Scope,
)
from kfp_gpu.ownership import Owner
from kfp_gpu.providers.base import CapacityProvider, OpStatus, PoolRef, ReservationRequest
from kfp_gpu.providers.fake import FakeProvider
from kfp_gpu.providers.fake_state import region_of

OWNER = Owner("run-1", "scale-up", 2_000_000_000.0)


def make() -> FakeProvider:
    fp = FakeProvider(regions={"us-central1"})
    fp.add_pool("gpu", "us-central1-a", size=1, max_size=4)
    fp.add_pool("gpu", "us-central1-b", size=0, max_size=4)
    fp.set_quota("NVIDIA_A100_80GB_GPUS", "us-central1", 64, 8)
    fp.set_quota("GPUS_ALL_REGIONS", "global", 128, 8)
    fp.set_quota("NVIDIA_L4_GPUS", "us-central1", 8, 0)
    return fp


def test_is_a_capacity_provider() -> None:
    assert isinstance(FakeProvider(), CapacityProvider)


def test_region_of() -> None:
    assert region_of("us-central1-a") == "us-central1"
    assert region_of("us-east-1a") == "us-east-1"


def test_quota_returns_relevant_rows_only() -> None:
    fp = make()
    rows = fp.quota("a100-80gb", "us-central1", spot=False)
    assert {r.metric for r in rows} == {"NVIDIA_A100_80GB_GPUS", "GPUS_ALL_REGIONS"}
    assert {r.free for r in rows} == {56.0, 120.0}


def test_unknown_region_is_not_found() -> None:
    with pytest.raises(NotFound):
        make().quota("a100-80gb", "europe-west4", spot=False)


def test_resize_twice_is_one_change() -> None:
    fp = make()
    ref = PoolRef("gpu", "us-central1-a", "us-central1")
    op1 = fp.resize(ref, 3, OWNER)
    op2 = fp.resize(ref, 3, OWNER)
    assert op1.id == op2.id
    assert fp.pool("gpu", "us-central1-a").size == 3
    assert [(c.method, c.args["from"], c.args["to"]) for c in fp.calls] == [("resize", 1, 3)]
    assert fp.operation(op1).status is OpStatus.DONE


def test_resize_to_current_size_records_nothing() -> None:
    fp = make()
    op = fp.resize(PoolRef("gpu", "us-central1-a", "us-central1"), 1, OWNER)
    assert op.done and fp.calls == []


def test_resize_over_max_is_invalid() -> None:
    with pytest.raises(InvalidSpec):
        make().resize(PoolRef("gpu", "us-central1-a"), 5, OWNER)


def test_resize_missing_pool_is_not_found() -> None:
    with pytest.raises(NotFound):
        make().resize(PoolRef("nope", "us-central1-a"), 1, OWNER)


def test_stockout_sync_and_async() -> None:
    fp = make()
    fp.stockout_zones.add("us-central1-b")
    with pytest.raises(CapacityUnavailable) as ei:
        fp.resize(PoolRef("gpu", "us-central1-b"), 2, OWNER)
    assert ei.value.scope is Scope.ZONE
    assert fp.pool("gpu", "us-central1-b").size == 0
    fp.stockout_async = True
    op = fp.resize(PoolRef("gpu", "us-central1-b"), 2, OWNER)
    done = fp.operation(op)
    assert done.status is OpStatus.FAILED and isinstance(done.error, CapacityUnavailable)


def test_operations_finish_after_polls() -> None:
    fp = make()
    fp.op_polls = 3
    op = fp.resize(PoolRef("gpu", "us-central1-a"), 2, OWNER)
    assert [fp.operation(op).status for _ in range(3)] == [OpStatus.RUNNING, OpStatus.RUNNING, OpStatus.DONE]


def test_error_injection_per_call_and_zone() -> None:
    fp = make()
    fp.fail("resize", RateLimited("slow down"), times=1, zone="us-central1-b")
    fp.resize(PoolRef("gpu", "us-central1-a"), 2, OWNER)  # other zone unaffected
    with pytest.raises(RateLimited):
        fp.resize(PoolRef("gpu", "us-central1-b"), 2, OWNER)
    fp.resize(PoolRef("gpu", "us-central1-b"), 2, OWNER)  # injection used up
    fp.fail("pools", RuntimeError("boom"))
    with pytest.raises(CloudError, match="boom"):
        fp.pools("us-central1")
    fp.fail("quota", PermissionDenied("no creds"), times=-1)
    for _ in range(3):
        with pytest.raises(PermissionDenied):
            fp.quota("a100-80gb", "us-central1", spot=False)


def test_reservations_owned_idempotent_and_released() -> None:
    fp = make()
    req = ReservationRequest("kfp-gpu-run-1", "us-central1-a", "a100-80gb", 8, 2)
    op1 = fp.reserve(req, OWNER)
    op2 = fp.reserve(req, OWNER)
    assert op1.id == op2.id and len(fp.mutations("reserve")) == 1
    with pytest.raises(CloudError):
        fp.reserve(req, Owner("run-2", "warm-pool", 0))
    owned = fp.list_owned("run-1")
    assert [o.name for o in owned if o.kind == "reservation"] == ["kfp-gpu-run-1"]
    assert fp.release("run-1") == ["kfp-gpu-run-1"]
    assert fp.release("run-1") == []
    assert fp.list_owned("run-1") == []


def test_quota_request_is_idempotent_and_validated() -> None:
    fp = make()
    a = fp.request_quota_increase("NVIDIA_A100_80GB_GPUS", "us-central1", 128, "training")
    b = fp.request_quota_increase("NVIDIA_A100_80GB_GPUS", "us-central1", 128, "training")
    assert a == b and len(fp.mutations("request_quota_increase")) == 1
    with pytest.raises(InvalidSpec):
        fp.request_quota_increase("NVIDIA_A100_80GB_GPUS", "us-central1", 32, "less")


def test_on_call_hook_sees_concurrent_calls() -> None:
    barrier = threading.Barrier(2, timeout=5)
    fp = make()
    fp.on_call = lambda method: barrier.wait() and None
    out: list[int] = []
    threads = [threading.Thread(target=lambda: out.append(len(fp.pools("us-central1")))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [2, 2]


def test_spot_quota_includes_preemptible_and_standard_rows() -> None:
    fp = make()
    fp.set_quota("PREEMPTIBLE_NVIDIA_A100_80GB_GPUS", "us-central1", 16, 0)
    assert {r.metric for r in fp.quota("a100-80gb", "us-central1", spot=True)} == {
        "PREEMPTIBLE_NVIDIA_A100_80GB_GPUS", "NVIDIA_A100_80GB_GPUS", "GPUS_ALL_REGIONS",
    }
