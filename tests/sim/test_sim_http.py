"""The stand-in speaks the real REST paths: the real google-cloud-* REST clients work against it."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import cloudquotas_v1, compute_v1, container_v1

from kfp_gpu import iam
from kfp_gpu_rehearsal.sim import SimServer
from kfp_gpu_rehearsal.sim.gcp_iam import QUOTA_TOKEN
from kfp_gpu_rehearsal.sim.state import MemoryBackend
from tests.sim._helpers import CLUSTER, PARENT, PROJECT, REGION, client_kwargs, running, scenario


@pytest.fixture
def sim() -> Iterator[SimServer]:
    """Shape tests call the raw clients once per step: the default world minus its seeded 5xx, whose
    effects (and the provider's retries) are tested in test_sim_api.py and test_gke_resilience.py."""
    with running(scenario(api={"error_rate": 0})) as s:
        yield s


_AUTH = {"Authorization": f"Bearer {iam.SIM_GCP_TOKEN}"}  # the controller principal (deploy/gcp-role.yaml)


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json", **_AUTH})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _get(url: str) -> Any:
    with urllib.request.urlopen(urllib.request.Request(url, headers=_AUTH), timeout=10) as resp:
        return json.loads(resp.read())


def _wait_op(cm: Any, name: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        op = cm.get_operation(name=f"projects/{PROJECT}/locations/{REGION}/operations/{name}")
        if op.status == container_v1.Operation.Status.DONE or time.monotonic() > deadline:
            return op
        time.sleep(0.05)


def _set_size(cm: Any, pool: str, n: int) -> Any:
    return cm.set_node_pool_size(request=container_v1.SetNodePoolSizeRequest(
        name=f"{PARENT}/nodePools/{pool}", node_count=n))


def test_compute_regions_and_project_quotas(sim: SimServer) -> None:
    kw = client_kwargs(sim.url)
    r = compute_v1.RegionsClient(**kw).get(project=PROJECT, region=REGION)
    quotas = {q.metric: (q.limit, q.usage) for q in r.quotas}
    assert quotas["NVIDIA_A100_80GB_GPUS"] == (128.0, 0.0)
    assert "NVIDIA_H100_GPUS" not in quotas  # Compute omits the H100 family, like the real API
    assert r.zones[0].endswith(f"/projects/{PROJECT}/zones/us-central1-a")
    proj = compute_v1.ProjectsClient(**kw).get(project=PROJECT)
    assert [(q.metric, q.limit) for q in proj.quotas] == [("GPUS_ALL_REGIONS", 512.0)]
    with pytest.raises(gexc.NotFound, match="regions/mars1"):
        compute_v1.RegionsClient(**kw).get(project=PROJECT, region="mars1")
    with pytest.raises(gexc.Forbidden):
        compute_v1.ProjectsClient(**kw).get(project="someone-else")


def test_node_pools_list_get_and_set_size(sim: SimServer) -> None:
    kw = client_kwargs(sim.url)
    cm = container_v1.ClusterManagerClient(**kw)
    pools = cm.list_node_pools(parent=PARENT).node_pools
    assert len(pools) == 24
    np = cm.get_node_pool(name=f"{PARENT}/nodePools/h100-80gb-spot-c")
    assert np.config.machine_type == "a3-highgpu-8g" and np.config.spot
    assert np.config.accelerators[0].accelerator_type == "nvidia-h100-80gb"
    assert np.config.accelerators[0].accelerator_count == 8
    assert list(np.locations) == ["us-central1-c"] and np.autoscaling.max_node_count == 8
    assert np.status == container_v1.NodePool.Status.RUNNING
    op = _set_size(cm, "a100-80gb-a", 3)
    assert op.operation_type == container_v1.Operation.Type.SET_NODE_POOL_SIZE
    done = _wait_op(cm, op.name)
    assert done.status == container_v1.Operation.Status.DONE and not done.error.message
    # the operation is DONE once the resize is scheduled; the Nodes register as their VMs boot
    three = [f"gke-{CLUSTER}-a100-80gb-a-{i:04d}" for i in range(3)]
    assert sim.state.wait_until(lambda: sorted(sim.nodes("a100-80gb-a")) == three, 30.0), sim.nodes("a100-80gb-a")
    igm = compute_v1.InstanceGroupManagersClient(**kw).get(
        project=PROJECT, zone="us-central1-a", instance_group_manager=np.instance_group_urls[0].rsplit("/", 1)[1]
        .replace("h100-80gb-spot-c", "a100-80gb-a").replace("us-central1-c", "us-central1-a"))
    assert igm.target_size == 3
    r = compute_v1.RegionsClient(**kw).get(project=PROJECT, region=REGION)
    assert {q.metric: q.usage for q in r.quotas}["NVIDIA_A100_80GB_GPUS"] == 24.0
    _wait_op(cm, _set_size(cm, "a100-80gb-a", 1).name)
    assert sim.nodes("a100-80gb-a") == [f"gke-{CLUSTER}-a100-80gb-a-0000"]  # newest removed first
    with pytest.raises(gexc.NotFound):
        cm.get_node_pool(name=f"{PARENT}/nodePools/nope")
    with pytest.raises(gexc.BadRequest):
        _set_size(cm, "a100-80gb-a", 99)


def test_set_size_over_quota_succeeds_and_the_group_reports_quota_exceeded(sim: SimServer) -> None:
    """GCE checks quota per VM creation: the resize is DONE without error, the VM is never created, and
    listErrors carries QUOTA_EXCEEDED naming the metric (docs/sim.md rule 4b)."""
    kw = client_kwargs(sim.url)
    cm = container_v1.ClusterManagerClient(**kw)
    _wait_op(cm, _set_size(cm, "a100-80gb-a", 16).name)
    op = _wait_op(cm, _set_size(cm, "a100-80gb-b", 1).name)
    assert op.status == container_v1.Operation.Status.DONE and not op.error.message
    igm = f"gke-{CLUSTER}-a100-80gb-b-grp"
    errors = list(compute_v1.InstanceGroupManagersClient(**kw).list_errors(
        project=PROJECT, zone="us-central1-b", instance_group_manager=igm))
    assert errors and errors[0].error.code == "QUOTA_EXCEEDED"
    assert "'NVIDIA_A100_80GB_GPUS' exceeded" in errors[0].error.message
    assert errors[0].instance_action_details.instance.endswith(f"gke-{CLUSTER}-a100-80gb-b-0000")
    assert sim.nodes("a100-80gb-b") == []
    r = compute_v1.RegionsClient(**kw).get(project=PROJECT, region=REGION)
    assert {q.metric: q.usage for q in r.quotas}["NVIDIA_A100_80GB_GPUS"] == 128.0  # the VM never existed


def test_stockout_fails_the_operation_with_real_shapes() -> None:
    data = scenario(stockouts=[{"zone": "us-central1-b", "window": "always", "with_details": True}])
    with running(data) as sim:
        cm = container_v1.ClusterManagerClient(**client_kwargs(sim.url))
        op = _wait_op(cm, _set_size(cm, "l4-b", 2).name)
        assert op.status == container_v1.Operation.Status.DONE
        assert op.error.code == 8 and "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" in op.error.message
        assert "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" in op.status_message
        assert op.nodepool_conditions[0].code == container_v1.StatusCondition.Code.GCE_STOCKOUT
        assert sim.nodes("l4-b") == []
        raw = _get(f"{sim.url}/v1/projects/{PROJECT}/locations/{REGION}/operations/{op.name}")
        assert raw["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"
        assert _wait_op(cm, _set_size(cm, "l4-a", 2).name).error.code == 0  # other zones fine


def test_reservations_and_zone_operations(sim: SimServer) -> None:
    kw = client_kwargs(sim.url)
    rc = compute_v1.ReservationsClient(**kw)
    body = compute_v1.Reservation(
        name="r1", description="d",
        specific_reservation=compute_v1.AllocationSpecificSKUReservation(
            count=2, instance_properties=compute_v1.AllocationSpecificSKUAllocationReservedInstanceProperties(
                machine_type="a2-ultragpu-8g",
                guest_accelerators=[compute_v1.AcceleratorConfig(accelerator_count=8,
                                                                 accelerator_type="nvidia-a100-80gb")])))
    op = rc.insert_unary(project=PROJECT, zone="us-central1-a", reservation_resource=body)
    assert op.status == compute_v1.Operation.Status.DONE and not op.error.errors
    zo = compute_v1.ZoneOperationsClient(**kw)
    assert zo.get(project=PROJECT, zone="us-central1-a", operation=op.name).name == op.name
    assert zo.wait(project=PROJECT, zone="us-central1-a", operation=op.name).status == op.status
    got = rc.get(project=PROJECT, zone="us-central1-a", reservation="r1")
    assert got.specific_reservation.count == 2 and got.description == "d"
    assert [r.name for r in rc.list(project=PROJECT, zone="us-central1-a")] == ["r1"]
    assert [k for k, v in rc.aggregated_list(project=PROJECT) if v.reservations] == ["zones/us-central1-a"]
    usage = {q.metric: q.usage for q in compute_v1.RegionsClient(**kw).get(project=PROJECT, region=REGION).quotas}
    assert usage["NVIDIA_A100_80GB_GPUS"] == 16.0  # reserved VMs count against quota
    with pytest.raises(gexc.Conflict):
        rc.insert_unary(project=PROJECT, zone="us-central1-a", reservation_resource=body)
    rc.delete_unary(project=PROJECT, zone="us-central1-a", reservation="r1")
    with pytest.raises(gexc.NotFound):
        rc.get(project=PROJECT, zone="us-central1-a", reservation="r1")
    # quota refusal and stockout arrive inside the Operation, as error.errors[].code
    body.name = "too-big"
    body.specific_reservation.count = 17
    failed = rc.insert_unary(project=PROJECT, zone="us-central1-a", reservation_resource=body)
    assert failed.error.errors[0].code == "QUOTA_EXCEEDED" and failed.http_error_status_code == 403
    assert failed.error.errors[0].error_details[0].quota_info.metric_name.endswith("nvidia_a100_80gb_gpus")


def test_cloud_quotas_infos_and_preferences(sim: SimServer) -> None:
    cq = cloudquotas_v1.CloudQuotasClient(**client_kwargs(sim.url, QUOTA_TOKEN))  # the quota requester's role
    parent = f"projects/{PROJECT}/locations/global/services/compute.googleapis.com"
    infos = list(cq.list_quota_infos(parent=parent))
    assert [i.quota_id for i in infos] == ["GPUS-PER-GPU-FAMILY-per-project-region"]
    dims = [(dict(d.dimensions), d.details.value) for d in infos[0].dimensions_infos]
    assert dims == [({"region": REGION, "gpu_family": "NVIDIA_H100"}, 64)]
    assert cq.get_quota_info(name=f"{parent}/quotaInfos/{infos[0].quota_id}").quota_id == infos[0].quota_id
    pref = cloudquotas_v1.QuotaPreference(
        service="compute.googleapis.com", quota_id="NVIDIA-L4-GPUS-per-project-region",
        dimensions={"region": REGION}, justification="burst training", contact_email="ml@example.com",
        quota_config=cloudquotas_v1.QuotaConfig(preferred_value=512))
    made = cq.create_quota_preference(parent=f"projects/{PROJECT}/locations/global", quota_preference=pref,
                                      quota_preference_id="p1")
    assert made.name.endswith("/quotaPreferences/p1") and made.quota_config.preferred_value == 512
    assert made.justification == "burst training" and made.reconciling
    with pytest.raises(gexc.Conflict):
        cq.create_quota_preference(parent=f"projects/{PROJECT}/locations/global", quota_preference=pref,
                                   quota_preference_id="p1")


def test_injected_faults_then_recovery_and_request_log() -> None:
    data = scenario(faults=[{"path": "/regions/us-central1$", "status": 429, "count": 2},
                            {"path": ":setSize", "status": 503, "count": 1, "method": "POST"}])
    with running(data) as sim:
        rc = compute_v1.RegionsClient(**client_kwargs(sim.url))
        for _ in range(2):
            with pytest.raises(gexc.TooManyRequests) as info:
                rc.get(project=PROJECT, region=REGION, retry=None)
            assert info.value.errors[0]["reason"] == "rateLimitExceeded"
        assert rc.get(project=PROJECT, region=REGION).name == REGION
        cm = container_v1.ClusterManagerClient(**client_kwargs(sim.url))
        with pytest.raises(gexc.ServiceUnavailable):
            _set_size(cm, "l4-a", 1)
        log = _get(f"{sim.url}/sim/v1/requests")
        assert log["byRoute"]["compute.regions.get"] == 3
        assert log["byPath"][f"GET /compute/v1/projects/{PROJECT}/regions/{REGION}"] == 3
        _post(f"{sim.url}/sim/v1/reset", {"requestsOnly": True})
        assert _get(f"{sim.url}/sim/v1/requests")["total"] == 1  # the GET itself


def test_api_latency_is_applied_per_request() -> None:
    with running(scenario(api_latency_ms=200)) as sim:
        rc = compute_v1.RegionsClient(**client_kwargs(sim.url))
        t0 = time.monotonic()
        rc.get(project=PROJECT, region=REGION)
        assert 0.2 <= time.monotonic() - t0 < 2.0


def test_preempt_endpoint_and_scheduled_events() -> None:
    backend = MemoryBackend()
    pools = scenario()["pools"]
    for p in pools:
        if p["name"] == "l4-spot-a":
            p["initial_size"] = 3
    data = scenario(pools=pools, preemptions=[{"at_s": 0.3, "pool": "l4-spot-a", "count": 1}])
    with running(data, backend=backend) as sim:
        first = sim.nodes("l4-spot-a")[0]
        out = _post(f"{sim.url}/sim/v1/preempt", {"node": first})
        # returns at once with the notice; the MIG keeps its target size (it recreates the VM)
        assert (out["node"], out["pool"], out["poolSize"]) == (first, "l4-spot-a", 3) and out["noticeS"] > 0
        assert sim.state.wait_node_gone(first, 10.0)
        assert sim.state.wait_until(lambda: len(backend.preempted) == 2, 10.0)  # + the scheduled event
        assert sim.state.pools["l4-spot-a"].target == 3
        with pytest.raises(urllib.request.HTTPError):
            _post(f"{sim.url}/sim/v1/preempt", {"node": "nope"})
        _post(f"{sim.url}/sim/v1/reset", {})
        assert sim.nodes("l4-spot-a") == [f"gke-{CLUSTER}-l4-spot-a-{i:04d}" for i in range(3)]  # initial size


def test_unrouted_paths_are_404(sim: SimServer) -> None:
    with pytest.raises(urllib.request.HTTPError) as info:
        _get(f"{sim.url}/compute/v1/projects/{PROJECT}/global/networks")
    assert info.value.code == 404


def test_concurrent_resize_of_a_busy_pool_is_refused() -> None:
    with running() as sim:
        cm = container_v1.ClusterManagerClient(**client_kwargs(sim.url))
        op = _set_size(cm, "l4-a", 4)
        with pytest.raises(gexc.BadRequest, match="currently operating"):
            _set_size(cm, "l4-a", 5)
        assert _wait_op(cm, op.name).status == container_v1.Operation.Status.DONE
        assert sim.state.pools["l4-a"].target == 4  # the VMs boot after the operation


def test_preflight_fan_out_six_regions_three_accelerators_with_200ms_rtt() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from kfp_gpu.providers.gke import GkeProvider
    from kfp_gpu_rehearsal.sim import load

    sc = load("six-regions")
    assert sc.api_latency_ms == 200 and len(sc.regions) == 6
    sim = SimServer(sc)
    sim.start()
    try:
        p = GkeProvider(PROJECT, REGION, CLUSTER, endpoint=sim.url)
        jobs = [(a, r) for r in sc.regions for a in ("a100-80gb", "h100-80gb", "l4")]
        t0 = time.monotonic()
        with ThreadPoolExecutor(len(jobs)) as ex:
            results = list(ex.map(lambda j: p.quota(j[0], j[1], spot=False), jobs))
        elapsed = time.monotonic() - t0
        assert all(q.status == "ok" for rows in results for q in rows), results
        h100_west = {q.metric: q for q in results[jobs.index(("h100-80gb", "us-east4"))]}["NVIDIA_H100"]
        assert h100_west.limit == 0 and h100_west.free == 0
        assert elapsed < 3.0, f"18 quota reads took {elapsed:.2f}s at 200 ms RTT"
    finally:
        sim.stop()
