"""Preflight names the provisioner backend and why, and counts reservation-covered nodes out of the quota."""

from __future__ import annotations

import dataclasses
from typing import Any

from kfp_gpu.plan.preflight import NOT_ASKED
from kfp_gpu.providers.base import PoolRef
from kfp_gpu.spec import CapacityType
from kfp_gpu.steps import preflight_step
from kfp_gpu.steps.preflight import run_preflight
from tests.steps.test_preflight import KubeState, fake, fake_kube, spec  # noqa: F401  (fake_kube is a fixture)


def test_backend_and_reason_in_every_report(fake_kube: tuple[Any, KubeState]) -> None:  # noqa: F811
    api, _ = fake_kube
    res = run_preflight(spec(), fake(), api)  # the fake API server serves no ProvisioningRequest CRD
    assert res.provisioner["name"] == "node-pool"
    assert "no ProvisioningRequest API" in res.provisioner["reason"]
    assert res.capacity_now is not None and res.capacity_now.answer == NOT_ASKED
    assert "Provisioner backend: **node-pool** (no ProvisioningRequest API" in res.to_markdown()
    out = preflight_step.run(spec(), "run-1", "", api=api, provider=fake())
    assert out.metrics["provisioner_provisioning_request"] == 0.0 and out.metrics["capacity_now"] == -1.0
    assert '"provisioner": {"name": "node-pool"' in out.output_json


def test_without_a_cluster_the_backend_is_the_specs_or_unknown() -> None:
    res = run_preflight(spec(), fake())
    assert res.provisioner["name"] == "unknown" and "no cluster credentials" in res.provisioner["reason"]


def test_reservation_nodes_need_no_new_quota() -> None:
    fp = fake(limit=16)  # 16 GPUs of quota; the gang of 3 x 8 = 24
    ref = PoolRef("gpu", "us-central1-a", "us-central1")
    fp.pool_states[ref] = dataclasses.replace(fp.pool_states[ref], reservation_affinity="specific",
                                              reservations=("team-res",), reservation_free=2)
    s = spec(nodes=3, capacity=CapacityType.RESERVATION, reservation="team-res")
    res = run_preflight(s, fp)
    regional = next(c for c in res.placements[0].checks if c.metric == "NVIDIA_A100_80GB_GPUS")
    assert regional.needed == 8.0  # 2 of 3 nodes in the reservation: 8 GPUs of new quota
    assert res.reservation == {"name": "team-res", "free": 2, "nodes": 2}
    assert "Reservation team-res: 2 VM(s) free; 2 of the gang's 3 node(s)" in res.to_markdown()
    fp.pool_states[ref] = dataclasses.replace(fp.pool_states[ref], reservation_free=0)
    short = run_preflight(s, fp)
    assert next(c for c in short.placements[0].checks if c.metric == "NVIDIA_A100_80GB_GPUS").needed == 24.0
