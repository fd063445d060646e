"""The stand-in's API layer (rate quotas, seeded 5xx, requestId, listErrors), seen through the real clients."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import compute_v1, container_v1

from kfp_gpu.errors import InvalidSpec
from kfp_gpu_rehearsal.sim import api as sim_api
from kfp_gpu_rehearsal.sim import from_dict, load
from kfp_gpu_rehearsal.sim.eventspec import ApiSpec
from tests.sim._helpers import PARENT, PROJECT, REGION, client_kwargs, running, scenario
from tests.waiting import wait_until

ZONE = "us-central1-a"
IGM = "gke-kfp-gpu-local-a100-80gb-a-grp"


def _state(url: str) -> Any:
    with urllib.request.urlopen(f"{url}/sim/v1/state", timeout=10) as resp:
        return json.loads(resp.read())


def _requests(url: str) -> Any:
    with urllib.request.urlopen(f"{url}/sim/v1/requests", timeout=10) as resp:
        return json.loads(resp.read())


def _quiet(**api: Any) -> dict[str, Any]:
    """The default scenario with an ``api`` block (5xx off unless given)."""
    return scenario(api={"error_rate": 0, **api})


def test_default_scenario_has_a_request_budget_and_seeded_5xx() -> None:
    spec = load().api
    assert spec.requests_per_minute == 1500  # Compute's default per-project "Queries per minute"
    assert 0 < spec.error_rate <= 0.05 and 0 < spec.committed_5xx < 1
    gate = sim_api.ApiGate(spec)
    assert (gate.window_s, gate.budget) == (1.0, 25)  # 1500 per minute, enforced per wall second


def test_api_block_validates_with_named_errors() -> None:
    for bad, field in (({"error_rate": 1.5}, "api.error_rate"), ({"requests_per_minute": -1}, "api.requests_per_minute"),
                       ({"burst": 3}, "api.burst"), ({"committed_5xx": "x"}, "api.committed_5xx")):
        with pytest.raises(InvalidSpec, match=field.replace(".", r"\.")):
            from_dict(scenario(api=bad))


def test_budget_is_per_wall_second_in_fixed_intervals_whatever_the_time_compression() -> None:
    """The clients' requests are real requests in real time: 120 per minute is 2 per wall second (a budget per
    compressed minute, 0.5 s, would allow 240 per second and never bind)."""
    now = [0.0]
    gate = sim_api.ApiGate(ApiSpec(requests_per_minute=120, error_rate=0), now=lambda: now[0])
    path = f"/compute/v1/projects/{PROJECT}/regions/{REGION}"
    now[0] = 0.1
    assert gate.admit(path) is None and gate.admit(path) is None
    refused = gate.admit(path)
    assert refused is not None and refused.status == 403
    assert float(refused.headers["Retry-After"]) == pytest.approx(0.9)  # until the interval ends at 1 s
    now[0] = 0.6  # a compressed minute later: still the same wall second
    assert gate.admit(path) is not None  # refused requests do not refill anything
    now[0] = 1.0
    assert gate.admit(path) is None  # refilled at the start of the next synchronized interval


def test_below_sixty_per_minute_the_window_is_longer_than_a_second() -> None:
    assert sim_api.budget_window(2) == (30.0, 1) and sim_api.budget_window(90) == (1.0, 1)
    assert sim_api.budget_window(0) == (1.0, 0)  # unlimited
    now = [0.0]
    gate = sim_api.ApiGate(ApiSpec(requests_per_minute=2, error_rate=0), now=lambda: now[0])
    path = f"/v1/projects/{PROJECT}/locations/{REGION}/clusters/c/nodePools"
    assert gate.admit(path) is None
    now[0] = 29.9
    assert gate.admit(path) is not None
    now[0] = 30.0
    assert gate.admit(path) is None


def test_compute_over_budget_is_403_rate_limit_exceeded_with_retry_after() -> None:
    with running(_quiet(requests_per_minute=180)) as sim:  # 3 per wall second
        regions = compute_v1.RegionsClient(**client_kwargs(sim.url))
        for _ in range(3):
            regions.get(project=PROJECT, region=REGION, retry=None)
        with pytest.raises(gexc.Forbidden) as info:
            regions.get(project=PROJECT, region=REGION, retry=None)
        exc = info.value
        assert exc.errors[0]["reason"] == "rateLimitExceeded" and exc.errors[0]["domain"] == "usageLimits"
        assert exc.reason == "RATE_LIMIT_EXCEEDED" and "Queries per minute" in exc.message
        wait = float(exc.response.headers["Retry-After"])
        assert 0 < wait <= sim.gate.window_s
        time.sleep(wait)
        assert regions.get(project=PROJECT, region=REGION, retry=None).name == REGION
        assert _requests(sim.url)["api"]["rateLimited"] == 1


def test_gke_over_budget_is_429_resource_exhausted_and_budgets_are_per_service() -> None:
    with running(_quiet(requests_per_minute=120, retry_after_s=7)) as sim:  # 2 per wall second
        kw = client_kwargs(sim.url)
        cm = container_v1.ClusterManagerClient(**kw)
        cm.list_node_pools(parent=PARENT, retry=None)
        cm.list_node_pools(parent=PARENT, retry=None)
        with pytest.raises(gexc.TooManyRequests) as info:
            cm.list_node_pools(parent=PARENT, retry=None)
        body = info.value.response.json()["error"]
        assert body["code"] == 429 and body["status"] == "RESOURCE_EXHAUSTED"
        assert info.value.reason == "RATE_LIMIT_EXCEEDED" and body["errors"][0]["reason"] == "rateLimitExceeded"
        assert info.value.response.headers["Retry-After"] == "7.000"
        # Compute is another service with its own budget in the same project
        assert compute_v1.RegionsClient(**kw).get(project=PROJECT, region=REGION, retry=None).name == REGION


def _faults(url: str, n: int) -> list[str]:
    regions = compute_v1.RegionsClient(**client_kwargs(url))
    seen = []
    for _ in range(n):
        try:
            regions.get(project=PROJECT, region=REGION, retry=None)
            seen.append("ok")
        except (gexc.InternalServerError, gexc.ServiceUnavailable) as exc:
            assert exc.errors[0]["reason"] == "backendError"
            assert exc.response.json()["error"]["status"] in ("INTERNAL", "UNAVAILABLE")
            seen.append(str(exc.code))
    return seen


def test_seeded_5xx_are_the_same_on_every_run_and_change_with_the_seed() -> None:
    # 40 raw calls in a row with retry=None: the per-second budget (its own tests above) is off here, or it
    # would answer some of them 403 instead of showing which ones the seed fails
    api = {"error_rate": 0.3, "requests_per_minute": 0}
    with running(scenario(api={**api, "seed": 7})) as sim:
        first = _faults(sim.url, 40)
    with running(scenario(api={**api, "seed": 7})) as sim:
        again = _faults(sim.url, 40)
    with running(scenario(api={**api, "seed": 8})) as sim:
        other = _faults(sim.url, 40)
    assert first == again and first != other
    assert {"500", "503"} <= set(first) and 4 <= len([x for x in first if x != "ok"]) <= 20


def _set_size(url: str, n: int) -> None:
    container_v1.ClusterManagerClient(**client_kwargs(url)).set_node_pool_size(
        request=container_v1.SetNodePoolSizeRequest(name=f"{PARENT}/nodePools/a100-80gb-a", node_count=n), retry=None)


def test_mutation_5xx_before_effect_changes_nothing() -> None:
    with running(scenario(api={"error_rate": 1.0, "committed_5xx": 0.0})) as sim:
        with pytest.raises((gexc.InternalServerError, gexc.ServiceUnavailable)):
            _set_size(sim.url, 2)
        pool = _state(sim.url)["pools"]["a100-80gb-a"]
        assert pool["target"] == 0 and not pool["runningOp"]
        assert _requests(sim.url)["api"] == {"5xxBeforeEffect": 1}


def test_mutation_5xx_after_effect_is_visible_in_the_pool() -> None:
    with running(scenario(api={"error_rate": 1.0, "committed_5xx": 1.0})) as sim:
        with pytest.raises((gexc.InternalServerError, gexc.ServiceUnavailable)):
            _set_size(sim.url, 2)
        pool = _state(sim.url)["pools"]["a100-80gb-a"]
        assert pool["runningOp"]  # it happened; only the answer was lost
        wait_until("the pool's target to become 2", lambda: _state(sim.url)["pools"]["a100-80gb-a"]["target"] == 2,
                   timeout=10, every=0.05)
        assert _requests(sim.url)["api"] == {"5xxAfterEffect": 1}


def _reservation(name: str) -> compute_v1.Reservation:
    return compute_v1.Reservation(name=name, specific_reservation=compute_v1.AllocationSpecificSKUReservation(
        count=1, instance_properties=compute_v1.AllocationSpecificSKUAllocationReservedInstanceProperties(
            machine_type="g2-standard-4",
            guest_accelerators=[compute_v1.AcceleratorConfig(accelerator_count=1, accelerator_type="nvidia-l4")])))


def test_compute_mutation_retried_with_the_same_request_id_is_done_once() -> None:
    with running(_quiet()) as sim:
        res = compute_v1.ReservationsClient(**client_kwargs(sim.url))

        def insert(request_id: str) -> Any:
            return res.insert_unary(request=compute_v1.InsertReservationRequest(
                project=PROJECT, zone=ZONE, reservation_resource=_reservation("r1"), request_id=request_id), retry=None)

        first = insert("5f1b0c1e-0000-4000-8000-000000000001")
        again = insert("5f1b0c1e-0000-4000-8000-000000000001")
        assert again.name == first.name
        with pytest.raises(gexc.Conflict):  # a new requestId is a new request: the name is taken
            insert("5f1b0c1e-0000-4000-8000-000000000002")
        assert [r.name for r in res.list(project=PROJECT, zone=ZONE, retry=None)] == ["r1"]


def test_delete_instances_skips_non_members_only_when_asked() -> None:
    with running(_quiet()) as sim:
        igm = compute_v1.InstanceGroupManagersClient(**client_kwargs(sim.url))

        def delete(skip: bool) -> Any:
            body = compute_v1.InstanceGroupManagersDeleteInstancesRequest(
                instances=[f"zones/{ZONE}/instances/gke-gone-0001"], skip_instances_on_validation_error=skip)
            return igm.delete_instances_unary(project=PROJECT, zone=ZONE, instance_group_manager=IGM, retry=None,
                                              instance_group_managers_delete_instances_request_resource=body)

        with pytest.raises(gexc.BadRequest, match="gke-gone-0001"):
            delete(False)
        assert delete(True).name


def test_list_errors_has_the_real_shape_and_pages() -> None:
    # the stockout starts after setSize was accepted: the group's VM creations fail and are retried
    data = _quiet()
    data.update(operations={"set_size_s": 600}, stockouts=[{"zone": ZONE, "start_s": 240}])
    with running(data) as sim:
        _set_size(sim.url, 2)
        client = compute_v1.InstanceGroupManagersClient(**client_kwargs(sim.url))
        req = compute_v1.ListErrorsInstanceGroupManagersRequest(project=PROJECT, zone=ZONE,
                                                                instance_group_manager=IGM, max_results=2)

        def errors() -> list[Any]:
            items = list(client.list_errors(request=req, retry=None))
            return items if len(items) >= 3 else []

        got = wait_until("3 creation errors", errors, timeout=30, every=0.1)
        assert {e.error.code for e in got} == {"ZONE_RESOURCE_POOL_EXHAUSTED"}
        assert {e.instance_action_details.action for e in got} == {"CREATING"}
        assert all(e.instance_action_details.instance.startswith("https://www.googleapis.com/compute/v1/projects/")
                   and e.timestamp for e in got)
        first = client.list_errors(request=req, retry=None)
        assert len(first.items) == 2 and first.next_page_token  # paged by maxResults
        with pytest.raises(gexc.NotFound):
            list(client.list_errors(project=PROJECT, zone=ZONE, instance_group_manager="nope", retry=None))
