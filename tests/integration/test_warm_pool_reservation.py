"""The warm pool's cloud reservation is made where its resize grows and consumed by the scale-up (issue 13).

Real control plane + KWOK + the GKE stand-in (Compute reservations modelled: docs/sim.md "Reservations"); the
steps run as the controller's identity. warm_pool reserves after its resize is submitted, in that pool's zone,
for the nodes it adds, with that pool's machine type; the scale-up's nodes are the reservation's VMs
(inUseCount == nodes); teardown releases it and the cost report bills the reserved GPUs once.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu.report.cost import RESERVATION_HELD, RESERVATION_RELEASED
from kfp_gpu.spec import ProvisioningSpec, Target, WarmPool
from kfp_gpu.steps import scale_up, teardown, warm_pool
from kfp_gpu.timeline import Timeline
from tests.integration.test_reservations import REGION, _held, world  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration
ZONE_B = "us-central1-b"


def test_warm_pool_reservation_follows_the_resize_and_is_billed_once(kube, namespace, step_api, world):  # noqa: F811
    sim, cluster = world()
    # zone b only: the reservation must follow the resize there, not the region's first zone
    spec = ProvisioningSpec("a100-80gb", 2, zones=(ZONE_B,), scale_up_deadline_s=30.0,
                            warm_pool=WarmPool(2, ttl_s=600, cloud_reservation=True),
                            target=Target(kind="local", cluster=cluster, region=REGION, endpoint=sim.url,
                                          namespace=namespace, provisioner="node-pool"))
    provider = GkeProvider.from_target(spec.target)
    run = f"run-{uuid.uuid4().hex[:6]}"
    out = json.loads(warm_pool.run(spec, run, "", api=step_api, provider=provider).output_json)
    (res,) = out["reservations"]
    pool_b = next(p for p in provider.pools(REGION) if p.ref.zone == ZONE_B and p.accelerator == "a100-80gb"
                  and not p.spot)
    assert (res["zone"], res["count"], res["machine_type"]) == (ZONE_B, 2, pool_b.machine_type), res
    held = scale_up.run(spec, run, "", api=step_api, provider=provider)
    nodes = _held(kube.api, cluster, run)
    assert len(nodes) == 2 and set(nodes.values()) == {pool_b.ref.pool}
    sim_count = _reservation_in(sim, res["name"], ZONE_B)
    assert sim_count == (2, 2)  # the warm pool's VMs are the reservation's VMs
    assert held.metrics  # scale-up finished
    down = teardown.run(spec, run, "", api=step_api, provider=provider)
    rep = json.loads(down.output_json)
    assert rep["reservations"] == [res["name"]] and rep["errors"] == []
    tl = Timeline.from_json(rep["timeline"])
    kinds = [(e["kind"], e["name"]) for e in tl.events if e["kind"] in (RESERVATION_HELD, RESERVATION_RELEASED)]
    assert kinds == [(RESERVATION_HELD, res["name"]), (RESERVATION_RELEASED, res["name"])]
    m = down.metrics
    assert m["reserved_gpu_hours"] > 0 and m["provisioned_gpu_hours"] > 0
    assert m["billed_gpu_hours"] == pytest.approx(m["reserved_gpu_hours"], rel=0.05)  # once, not reserved + nodes
    assert m["billed_gpu_hours"] < m["reserved_gpu_hours"] + m["provisioned_gpu_hours"]


def _reservation_in(sim: Any, name: str, zone: str) -> tuple[int, int]:
    from google.cloud import compute_v1

    from tests.sim._helpers import client_kwargs

    r = compute_v1.ReservationsClient(**client_kwargs(sim.url)).get(
        project="local-project", zone=zone, reservation=name).specific_reservation
    return int(r.count), int(r.in_use_count)
