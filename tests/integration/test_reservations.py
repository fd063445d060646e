"""Reservations are consumed, never duplicated (issue 13).

Real control plane + KWOK + the GKE stand-in (which models Compute reservations: docs/sim.md,
"Reservations"); the scale-up step runs as the controller's identity (``step_api``) through the node-pool
backend. A reservation made through the provider for the warm pool is consumed by the nodes the scale-up
adds (inUseCount == nodes, quota not doubled, the cost report bills once); ``capacity="reservation"`` grows
only the pool whose SPECIFIC affinity names the reservation and fails with one line naming it when exhausted.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.cloud import compute_v1
from kubernetes import client

from kfp_gpu.errors import CapacityUnavailable
from kfp_gpu.ownership import LABEL_RUN_ID, Owner, label_safe
from kfp_gpu.providers.base import ReservationRequest
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu.report.cost import RESERVATION_HELD, cost_report
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target
from kfp_gpu.steps import scale_up
from kfp_gpu.timeline import Timeline
from kfp_gpu_rehearsal.sim import scenario as scenario_mod
from kfp_gpu_rehearsal.sim.server import SimServer
from tests.sim._helpers import client_kwargs

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
ZONE, REGION, METRIC = "us-central1-a", "us-central1", "NVIDIA_A100_80GB_GPUS"
TEAM_POOL = "a100-team-a"


@pytest.fixture
def world(kube: Any) -> Iterator[Callable[..., tuple[SimServer, str]]]:
    """make(**changes) -> (sim, cluster): the bundled scenario renamed, fast boots, plus TEAM_POOL, an a100
    pool in zone a whose reservation affinity is SPECIFIC to reservation team-res (2 VMs)."""
    made: list[tuple[SimServer, str]] = []

    def make(team_res_in_use: int = 0) -> tuple[SimServer, str]:
        cluster = f"r{uuid.uuid4().hex[:6]}"
        data = yaml.safe_load((ROOT / "kfp_gpu_rehearsal/sim/scenarios/default.yaml").read_text())
        data["cluster"] = cluster
        data["pools"].append({"name": TEAM_POOL, "zone": ZONE, "accelerator": "a100-80gb", "max_nodes": 8,
                              "reservation_affinity": {"consume": "specific", "values": ["team-res"]}})
        for i, p in enumerate(data["pools"]):
            p["boot"] = {"dist": "lognormal", "median_s": 0.3, "sigma": 0.3, "seed": i}
        data["reservations"] = [{"name": "team-res", "zone": ZONE, "accelerator": "a100-80gb", "gpus_per_node": 8,
                                 "count": 2, "specific": True, "in_use": team_res_in_use}]
        sim = SimServer(scenario_mod.from_dict(data), kube.kubeconfig)
        sim.start()
        made.append((sim, cluster))
        return sim, cluster

    yield make
    core = client.CoreV1Api(kube.api)
    for sim, cluster in made:
        sim.stop()
        for n in core.list_node(label_selector=f"kfp-gpu.io/sim-cluster={cluster}").items:
            core.delete_node(n.metadata.name)


def _spec(sim: SimServer, cluster: str, ns: str, nodes: int, **kw: Any) -> ProvisioningSpec:
    return ProvisioningSpec(
        "a100-80gb", nodes, target=Target(kind="local", cluster=cluster, region=REGION, endpoint=sim.url,
                                          namespace=ns, provisioner="node-pool"),
        zones=(ZONE,), scale_up_deadline_s=30.0, **kw)


def _reservation(sim: SimServer, name: str) -> tuple[int, int]:
    r = compute_v1.ReservationsClient(**client_kwargs(sim.url)).get(
        project="local-project", zone=ZONE, reservation=name).specific_reservation
    return int(r.count), int(r.in_use_count)


def _usage(provider: GkeProvider) -> float | None:
    return next(q.usage for q in provider.quota("a100-80gb", REGION, spot=False) if q.metric == METRIC)


def _held(api: client.ApiClient, cluster: str, run: str) -> dict[str, str]:
    return {n.metadata.name: n.metadata.labels["cloud.google.com/gke-nodepool"]
            for n in client.CoreV1Api(api).list_node(label_selector=f"kfp-gpu.io/sim-cluster={cluster}").items
            if (n.metadata.labels or {}).get(LABEL_RUN_ID) == label_safe(run)}


def test_warm_pool_reservation_is_consumed_by_the_scale_up(kube, namespace, step_api, world) -> None:
    sim, cluster = world()
    spec = _spec(sim, cluster, namespace, 2)
    provider = GkeProvider.from_target(spec.target)
    run = f"run-{uuid.uuid4().hex[:6]}"
    name = f"kfp-gpu-{label_safe(run)}"
    base = _usage(provider)  # team-res's 16 GPUs
    held_at = time.time()
    provider.reserve(ReservationRequest(name, ZONE, "a100-80gb", 8, 2), Owner.for_step(run, "warm_pool", 600))
    assert _usage(provider) == base + 16.0 and _reservation(sim, name) == (2, 0)
    result = scale_up.run(spec, run, "", api=step_api, provider=provider)
    held = _held(kube.api, cluster, run)
    assert len(held) == 2 and set(held.values()) == {"a100-80gb-a"}
    assert _reservation(sim, name) == (2, 2)  # the scale-up's VMs are the reservation's VMs
    assert _usage(provider) == base + 16.0  # max(reserved, used), not reserved + used
    tl = Timeline.from_json(json.loads(result.output_json)["timeline"])
    tl.event(RESERVATION_HELD, held_at, name=name, gpus=16)
    cost = cost_report(spec, tl)
    assert cost.provisioned_gpu_hours > 0
    assert cost.billed_gpu_hours == pytest.approx(cost.reserved_gpu_hours, abs=1e-5)  # billed once, not + nodes
    assert cost.billed_gpu_hours < cost.reserved_gpu_hours + cost.provisioned_gpu_hours


def test_reservation_capacity_uses_only_the_specific_pool_and_fails_naming_it(kube, namespace, step_api, world):
    sim, cluster = world()
    spec = _spec(sim, cluster, namespace, 2, capacity=CapacityType.RESERVATION, reservation="team-res")
    provider = GkeProvider.from_target(spec.target)
    run = f"run-{uuid.uuid4().hex[:6]}"
    scale_up.run(spec, run, "", api=step_api, provider=provider)
    assert set(_held(kube.api, cluster, run).values()) == {TEAM_POOL}
    assert sim.state.pools["a100-80gb-a"].target == 0  # the ANY pool of the same shape was not touched
    assert _reservation(sim, "team-res") == (2, 2)
    before = sim.state.pools[TEAM_POOL].target
    other = f"run-{uuid.uuid4().hex[:6]}"
    with pytest.raises(CapacityUnavailable) as err:
        scale_up.run(_spec(sim, cluster, namespace, 1, capacity=CapacityType.RESERVATION, reservation="team-res"),
                     other, "", api=step_api, provider=GkeProvider.from_target(spec.target))
    text = str(err.value)
    assert "\n" not in text and "reservation team-res in us-central1-a has 0 VM(s) free" in text
    assert sim.state.pools[TEAM_POOL].target == before  # no setSize past the reservation
