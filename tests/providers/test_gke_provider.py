"""GkeProvider against the stand-in, through the real google-cloud-* REST clients."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from kfp_gpu.errors import (
    CapacityUnavailable,
    InvalidSpec,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    Scope,
)
from kfp_gpu.ownership import Owner
from kfp_gpu.providers.base import CapacityProvider, OpStatus, PoolRef, ReservationRequest
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu.retry import RetryPolicy
from kfp_gpu.spec import Target, TargetKind
from kfp_gpu_rehearsal.sim import SimServer
from tests.sim._helpers import CLUSTER, PROJECT, REGION, running, scenario
from tests.waiting import wait_until

OWNER = Owner("run-42", "scale-up", 2_000_000_000.0)
FAST = RetryPolicy(attempts=3, budget_s=5.0, base_s=0.01, cap_s=0.05)


@pytest.fixture
def sim() -> Iterator[SimServer]:
    with running() as s:
        yield s


def _provider(sim: SimServer) -> GkeProvider:
    return GkeProvider(PROJECT, REGION, CLUSTER, endpoint=sim.url)


def _until_done(p: GkeProvider, op: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while not op.done and time.monotonic() < deadline:
        time.sleep(0.05)
        op = p.operation(op)
    return op


def test_is_a_capacity_provider(sim: SimServer) -> None:
    assert isinstance(_provider(sim), CapacityProvider)
    t = Target(kind=TargetKind.LOCAL, cluster=CLUSTER, project=PROJECT, region=REGION, endpoint=sim.url)
    p = GkeProvider.from_target(t)
    assert (p.project, p.location, p.cluster, p.endpoint) == (PROJECT, REGION, CLUSTER, sim.url)


def test_quota_amounts_regional_preemptible_and_global(sim: SimServer) -> None:
    rows = {q.metric: q for q in _provider(sim).quota("a100-80gb", REGION, spot=True)}
    assert set(rows) == {"NVIDIA_A100_80GB_GPUS", "PREEMPTIBLE_NVIDIA_A100_80GB_GPUS", "GPUS_ALL_REGIONS", "CPUS"}
    cpus = rows["CPUS"]  # the region lists no PREEMPTIBLE_CPUS: Spot VMs use CPUS
    assert (cpus.limit, cpus.usage, cpus.unit) == (24000, 8, "vcpus")
    a100 = rows["NVIDIA_A100_80GB_GPUS"]
    assert (a100.limit, a100.usage, a100.free, a100.status, a100.location) == (128, 0, 128, "ok", REGION)
    assert "console.cloud.google.com/iam-admin/quotas" in a100.raise_path and a100.lead_time_days > 0
    assert rows["GPUS_ALL_REGIONS"].location == "global" and rows["GPUS_ALL_REGIONS"].free == 512
    on_demand = {q.metric for q in _provider(sim).quota("l4", REGION, spot=False)}
    assert on_demand == {"NVIDIA_L4_GPUS", "GPUS_ALL_REGIONS", "CPUS"}


def test_quota_h100_family_comes_from_cloud_quotas(sim: SimServer) -> None:
    p = _provider(sim)
    _until_done(p, p.resize(PoolRef("h100-80gb-b", "us-central1-b"), 2, OWNER))
    sim.reset(requests_only=True)
    rows = {q.metric: q for q in p.quota("h100-80gb", REGION, spot=False)}
    fam = rows["NVIDIA_H100"]
    assert (fam.limit, fam.usage, fam.free, fam.status) == (64, 16, 48, "ok")
    assert "GPUS-PER-GPU-FAMILY" in fam.raise_path and "Cloud Quotas" in fam.reason
    assert rows["GPUS_ALL_REGIONS"].usage == 16
    counts = sim.request_counts()
    assert counts["cloudquotas.quotaInfos.get"] == 1
    # the pools' sizes: one aggregatedList beside nodePools.list, never a get per group after it
    assert counts["compute.instanceGroupManagers.aggregatedList"] == 1
    assert "compute.instanceGroupManagers.get" not in counts


def test_igm_aggregated_list_pages_through_every_group(sim: SimServer) -> None:
    from google.cloud import compute_v1

    p = _provider(sim)
    groups = [(str(scope).rsplit("/", 1)[-1], g.name) for scope, listed in p.client("igm").aggregated_list(
        request=compute_v1.AggregatedListInstanceGroupManagersRequest(project=PROJECT, max_results=1))
        for g in listed.instance_group_managers]
    pools = {(s.ref.zone, s.ref.pool) for r in (REGION, "us-east1") for s in p.pools(r, sizes=False)}
    assert len(groups) == len(set(groups)) >= len(pools) > 1
    assert {(z, n) for z, n in groups if n.startswith(f"gke-{CLUSTER}-")} == {
        (z, f"gke-{CLUSTER}-{pool}-grp") for z, pool in pools}


def test_failed_quota_read_is_unknown_never_ok() -> None:
    # the 503 persists past the provider's retry bound (a single 503 is retried away)
    data = scenario(faults=[{"path": "/regions/us-central1$", "status": 403, "count": 1},
                            {"path": "/compute/v1/projects/[^/]+$", "status": 503, "count": 1000}])
    with running(data) as sim:
        p = GkeProvider(PROJECT, REGION, CLUSTER, endpoint=sim.url, retry=FAST)
        rows = {q.metric: q for q in p.quota("a100-80gb", REGION, spot=False)}
        a100, glob = rows["NVIDIA_A100_80GB_GPUS"], rows["GPUS_ALL_REGIONS"]
        assert a100.status == "unknown" and a100.free is None and "compute.regions.get" in a100.reason
        assert glob.status == "unknown" and "TransientCloudError" in glob.reason


def test_quota_unknown_region_is_not_found(sim: SimServer) -> None:
    with pytest.raises(NotFound, match="europe-west4"):
        _provider(sim).quota("l4", "europe-west4", spot=False)


def test_pools(sim: SimServer) -> None:
    pools = {s.ref.pool: s for s in _provider(sim).pools(REGION)}
    assert len(pools) == 24
    s = pools["l4-spot-f"]
    assert (s.ref.zone, s.ref.region, s.size, s.max_size, s.accelerator, s.gpus_per_node, s.spot) == (
        "us-central1-f", REGION, 0, 128, "l4", 1, True)
    assert s.machine_type == "g2-standard-4"
    assert _provider(sim).pools("us-east1") == []


def test_resize_right_after_pools_reads_nothing_again(sim: SimServer) -> None:
    p, ref = _provider(sim), PoolRef("a100-80gb-c", "us-central1-c")
    p.pools(REGION)
    sim.reset(requests_only=True)
    op = p.resize(ref, 2, OWNER)  # planned from that read: straight to setSize
    assert sim.request_counts() == {"container.nodePools.setSize": 1}
    _until_done(p, op)
    sim.reset(requests_only=True)
    p.resize(ref, 0, OWNER)  # the read was used once: this one reads the pool again
    counts = sim.request_counts()
    assert counts["container.nodePools.get"] == 1 and counts["compute.instanceGroupManagers.get"] == 1
    wait_until("the VMs gone", lambda: sim.nodes("a100-80gb-c") == [], timeout=30, every=0.05)


def test_concurrent_identical_reads_share_one_request() -> None:
    from concurrent.futures import ThreadPoolExecutor

    with running(scenario(api_latency_ms=300)) as sim:  # slow answers: the 8 asks overlap for sure
        p, other = _provider(sim), _provider(sim)  # same endpoint and (anonymous) credentials
        sim.reset(requests_only=True)
        with ThreadPoolExecutor(8) as ex:
            lists = list(ex.map(lambda i: (p if i % 2 else other).pools(REGION, sizes=False), range(8)))
        assert all(len(x) == 24 for x in lists)
        assert sim.request_counts() == {"container.nodePools.list": 1}
        with ThreadPoolExecutor(4) as ex:
            quotas = list(ex.map(lambda i: p.quota("h100-80gb", REGION, spot=False), range(4)))
        assert all(q == quotas[0] for q in quotas)
        counts = sim.request_counts()
        assert (counts["compute.regions.get"], counts["cloudquotas.quotaInfos.get"]) == (1, 1), counts
        p.pools(REGION, sizes=False)  # a read after the shared one finished is a request of its own
        assert sim.request_counts()["container.nodePools.list"] == counts["container.nodePools.list"] + 1


def test_resize_is_idempotent_and_async(sim: SimServer) -> None:
    p, ref = _provider(sim), PoolRef("a100-80gb-c", "us-central1-c")
    op = p.resize(ref, 3, OWNER)
    assert op.kind == "resize" and op.target == "a100-80gb-c/us-central1-c"
    assert p.resize(ref, 3, OWNER) is op  # the same absolute size twice is one change
    done = _until_done(p, op)
    assert done.status is OpStatus.DONE and done.error is None
    assert p.resize(ref, 3, OWNER).status is OpStatus.DONE
    fresh = _provider(sim)  # a retried pod: no memory, the pool is already at 3
    assert fresh.resize(ref, 3, OWNER).id.startswith("noop:")
    assert sim.request_counts()["container.nodePools.setSize"] == 1
    wait_until("3 VMs booted", lambda: len(sim.nodes("a100-80gb-c")) == 3, timeout=30, every=0.05)
    _until_done(p, p.resize(ref, 0, OWNER))
    wait_until("the VMs gone", lambda: sim.nodes("a100-80gb-c") == [], timeout=30, every=0.05)


def test_resize_errors(sim: SimServer) -> None:
    p = _provider(sim)
    with pytest.raises(InvalidSpec, match="0, 16"):
        p.resize(PoolRef("a100-80gb-a", "us-central1-a"), 17, OWNER)
    with pytest.raises(NotFound, match="'nope' does not exist .*its pools: a100-80gb-a, a100-80gb-b") as nf:
        p.resize(PoolRef("nope", "us-central1-a"), 1, OWNER)
    assert "gcloud container node-pools create nope" in nf.value.remediation
    with pytest.raises(NotFound, match="us-central1-b"):
        p.resize(PoolRef("a100-80gb-a", "us-central1-b"), 1, OWNER)
    _until_done(p, p.resize(PoolRef("a100-80gb-a", "us-central1-a"), 16, OWNER))
    # GCE accepts the resize and refuses each VM creation: the DONE Operation carries the QuotaExceeded
    done = _until_done(p, p.resize(PoolRef("a100-80gb-b", "us-central1-b"), 1, OWNER))
    assert done.status is OpStatus.DONE and isinstance(done.error, QuotaExceeded)
    assert done.error.scope is Scope.REGION and done.error.fields["metric"] == "NVIDIA_A100_80GB_GPUS"
    assert done.error.fields["running"] == 0 and done.error.fields["target"] == 1
    assert "\n" not in str(done.error) and "request more NVIDIA_A100_80GB_GPUS quota" in done.error.remediation


def test_a_partial_stockout_is_a_done_operation_with_capacity_unavailable() -> None:
    """Room for 2 of 4 VMs in the zone: 2 are created, the others fail as MIG instance errors."""
    data = scenario(api={"error_rate": 0},
                    stockouts=[{"zone": "us-central1-c", "accelerator": "l4", "window": "always", "capacity": 2}])
    with running(data) as sim:
        p = _provider(sim)
        done = _until_done(p, p.resize(PoolRef("l4-c", "us-central1-c"), 4, OWNER))
        assert done.status is OpStatus.DONE and isinstance(done.error, CapacityUnavailable)
        assert done.error.scope is Scope.ZONE and done.error.fields["target"] == 4
        assert done.error.fields["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
        wait_until("2 VMs booted", lambda: len(sim.nodes("l4-c")) == 2, timeout=30, every=0.05)


def test_resize_into_a_stockout_raises_capacity_unavailable() -> None:
    with running(scenario(stockouts=[{"zone": "us-central1-f", "window": "always"}])) as sim:
        p = _provider(sim)
        with pytest.raises(CapacityUnavailable) as info:
            p.resize(PoolRef("l4-f", "us-central1-f"), 2, OWNER)
        assert info.value.scope is Scope.ZONE and info.value.fields["zone"] == "us-central1-f"
        assert info.value.fields["code"] in ("GCE_STOCKOUT", "ZONE_RESOURCE_POOL_EXHAUSTED")


def test_operation_that_fails_later_is_classified() -> None:
    with running(scenario(stockouts=[{"zone": "us-central1-a", "start_s": 0.0, "end_s": 3600}])) as sim:
        p = _provider(sim)
        # the stockout starts immediately: the Operation is born failed and resize() raises it
        with pytest.raises(CapacityUnavailable):
            p.resize(PoolRef("l4-a", "us-central1-a"), 1, OWNER)
        # operation() on the same id returns FAILED with the classified error (checks error, not status)
        op_name = next(iter(sim.state.gke_ops))
        from kfp_gpu.providers.base import Operation

        polled = p.operation(Operation(f"gke:{REGION}:{op_name}", "resize", "l4-a/us-central1-a", OpStatus.RUNNING))
        assert polled.status is OpStatus.FAILED and isinstance(polled.error, CapacityUnavailable)


def test_reservations_reserve_reattach_list_release(sim: SimServer) -> None:
    p = _provider(sim)
    req = ReservationRequest("", "us-central1-b", "a100-80gb", 8, 2)
    op = p.reserve(req, OWNER)
    assert op.status is OpStatus.DONE and op.kind == "reserve"
    name = op.target.split("/", 1)[1]
    assert name.startswith("kfpgpu-run-42-scale-up-b-")
    assert p.reserve(req, OWNER).id.startswith("reattach:")  # same owner -> same name, re-attached
    assert sim.request_counts()["compute.reservations.insert"] == 1
    owned = p.list_owned("run-42")
    res = [o for o in owned if o.kind == "reservation"]
    assert [(o.name, o.location) for o in res] == [(name, "us-central1-b")]
    assert res[0].labels == OWNER.cloud_labels()
    other = Owner("run-7", "warm-pool", 2_000_000_000.0)
    with pytest.raises(InvalidSpec, match="owned by run"):
        p.reserve(ReservationRequest(name, "us-central1-b", "a100-80gb", 8, 1), other)
    assert p.list_owned("run-7") == []
    assert p.release("run-7") == []
    assert p.release("run-42") == [name]
    assert p.release("run-42") == []  # already gone: no-op
    assert [o for o in p.list_owned() if o.kind == "reservation"] == []


def test_reserve_over_quota_and_in_stockout() -> None:
    with running(scenario(stockouts=[{"zone": "us-central1-c", "window": "always"}])) as sim:
        p = _provider(sim)
        with pytest.raises(QuotaExceeded) as q:
            p.reserve(ReservationRequest("big", "us-central1-a", "a100-80gb", 8, 17), OWNER)
        assert q.value.scope is Scope.REGION and q.value.fields["metric"] == "NVIDIA_A100_80GB_GPUS"
        with pytest.raises(CapacityUnavailable) as c:
            p.reserve(ReservationRequest("r", "us-central1-c", "l4", 1, 1), OWNER)
        assert c.value.scope is Scope.ZONE and c.value.fields["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"


def test_request_quota_increase(sim: SimServer) -> None:
    from google.oauth2.credentials import Credentials

    from kfp_gpu_rehearsal.sim.gcp_iam import QUOTA_TOKEN

    p = GkeProvider(PROJECT, REGION, CLUSTER, endpoint=sim.url, contact_email="ml@example.com",
                    credentials=Credentials(token=QUOTA_TOKEN))  # deploy/gcp-quota-requester-role.yaml
    name = p.request_quota_increase("NVIDIA_A100_80GB_GPUS", REGION, 256, "burst training for run-42")
    assert name.startswith(f"projects/{PROJECT}/locations/global/quotaPreferences/kfpgpu-")
    assert p.request_quota_increase("NVIDIA_A100_80GB_GPUS", REGION, 256, "again") == name  # idempotent
    pref = sim.state.quota_prefs[name]
    assert pref["quotaId"] == "NVIDIA-A100-80GB-GPUS-per-project-region" and pref["contactEmail"] == "ml@example.com"
    assert pref["dimensions"] == {"region": REGION} and pref["justification"] == "burst training for run-42"
    fam = sim.state.quota_prefs[p.request_quota_increase("NVIDIA_H100", REGION, 128, "x")]
    assert fam["quotaId"] == "GPUS-PER-GPU-FAMILY-per-project-region"
    assert fam["dimensions"] == {"region": REGION, "gpu_family": "NVIDIA_H100"}
    glob = sim.state.quota_prefs[p.request_quota_increase("GPUS_ALL_REGIONS", REGION, 1024, "x")]
    assert glob["quotaId"] == "GPUS-ALL-REGIONS-per-project" and not glob.get("dimensions")
    assert len(sim.state.quota_prefs) == 3
    with pytest.raises(InvalidSpec, match="above the current"):
        p.request_quota_increase("NVIDIA_A100_80GB_GPUS", REGION, 64, "less")


def test_missing_credentials_is_permission_denied(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    p = GkeProvider(PROJECT, REGION, CLUSTER)  # real endpoint, ADC
    with pytest.raises(PermissionDenied) as info:
        p.quota("l4", REGION, spot=False)
    assert "gcloud auth application-default login" in info.value.remediation
    with pytest.raises(PermissionDenied):
        p.pools(REGION)


def test_no_google_import_at_kfp_gpu_import() -> None:
    import subprocess
    import sys

    code = ("import sys, kfp_gpu, kfp_gpu.providers.gke, kfp_gpu_rehearsal.sim; "
            "bad=[m for m in sys.modules if m.startswith(('google.cloud.', 'google.api_core', 'google.auth'))]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_delete_specific_nodes(sim: SimServer) -> None:
    p, ref = _provider(sim), PoolRef("l4-b", "us-central1-b")
    _until_done(p, p.resize(ref, 4, OWNER))
    wait_until("4 VMs booted", lambda: len(sim.nodes("l4-b")) == 4, timeout=30, every=0.05)
    victims = sim.nodes("l4-b")[1:3]
    op = p.delete_nodes(ref, victims)
    assert op.kind == "delete-nodes" and op.error is None
    assert _until_done(p, op).status is OpStatus.DONE  # deleteInstances is an asynchronous operation
    wait_until("the victims gone", lambda: sim.nodes("l4-b") == [
        n for n in [f"gke-{CLUSTER}-l4-b-{i:04d}" for i in range(4)] if n not in victims], timeout=30, every=0.05)
    assert p.pool(ref).size == 2
    # idempotent: instances already gone (a retry, a preemption) are skipped, nothing else is deleted
    assert _until_done(p, p.delete_nodes(ref, [*victims, "gke-nope"])).status is OpStatus.DONE
    assert p.pool(ref).size == 2 and len(sim.nodes("l4-b")) == 2
    assert p.resize(ref, 4, OWNER).status in (OpStatus.PENDING, OpStatus.RUNNING)  # not a stale cached op
