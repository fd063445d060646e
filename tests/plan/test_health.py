"""The GPU health gate and the mid-run boundary rule (kfp_gpu/plan/health.py), in virtual time."""

from __future__ import annotations

import pytest

from kfp_gpu.errors import InvalidSpec
from kfp_gpu.plan.health import (
    EXIT_DCGM_DIAG,
    EXIT_DEVICE_COUNT,
    GateAction,
    ProbeResult,
    boundary_due,
    gate,
    unhealthy,
)
from kfp_gpu.spec import Health, ProvisioningSpec

NODES = ("n0", "n1", "n2")


def _gate(results: dict[str, ProbeResult], *, now: float, conditions: dict[str, str] | None = None,
          round_no: int = 1, round_started: float = 0.0, max_rounds: int = 3, timeout_s: float = 300.0,
          nodes: tuple[str, ...] = NODES):  # type: ignore[no-untyped-def]
    return gate(nodes, results, conditions or {}, now=now, gate_started=0.0, round_started=round_started,
                round_no=round_no, probe_timeout_s=60.0, timeout_s=timeout_s, max_rounds=max_rounds)


def _ok(*names: str, at: float = 5.0) -> dict[str, ProbeResult]:
    return {n: ProbeResult(n, 0, at) for n in names}


def test_all_healthy_passes_only_once_every_probe_answered() -> None:
    assert _gate(_ok("n0", "n1"), now=6.0).action is GateAction.WAIT
    v = _gate(_ok(*NODES), now=6.0)
    assert v.action is GateAction.PASS and v.bad == ()


def test_waits_for_stragglers_until_the_round_deadline_then_counts_them_bad() -> None:
    results = {**_ok("n0", "n1"), "n2": ProbeResult("n2", None)}
    v = _gate(results, now=59.9)
    assert v.action is GateAction.WAIT and v.next_deadline == 60.0
    v = _gate(results, now=60.0)
    assert v.action is GateAction.REPLACE and v.bad == (("n2", "no probe result within 60s"),)


def test_bad_probe_is_replaced_with_its_reason_but_only_after_the_others_answered() -> None:
    results = {**_ok("n0"), "n1": ProbeResult("n1", EXIT_DCGM_DIAG, 4.0)}
    assert _gate(results, now=6.0).action is GateAction.WAIT  # n2 may be bad too: one replacement round for both
    results["n2"] = ProbeResult("n2", EXIT_DEVICE_COUNT, 7.0)
    v = _gate(results, now=7.0)
    assert v.action is GateAction.REPLACE
    assert dict(v.bad) == {"n1": "dcgmi diag failed",
                           "n2": "nvidia-smi lists fewer GPUs than the node's allocatable nvidia.com/gpu"}


def test_a_node_condition_is_bad_without_a_probe_answer() -> None:
    v = _gate(_ok("n0", "n2"), now=6.0, conditions={"n1": "GPUXIDErrors=True"})
    assert v.action is GateAction.REPLACE and v.bad == (("n1", "node condition GPUXIDErrors=True"),)


def test_gives_up_after_the_last_round() -> None:
    results = {**_ok("n0", "n1"), "n2": ProbeResult("n2", 1, 3.0)}
    assert _gate(results, now=3.0, round_no=2).action is GateAction.REPLACE
    v = _gate(results, now=3.0, round_no=3)
    assert v.action is GateAction.GIVE_UP and "health.max_rounds=3" in v.message and "n2" in v.message


def test_time_bound_caps_the_round_and_gives_up() -> None:
    # round 2 started at 280 s: its probes get until 300 s (the gate's bound), not 340 s
    results = {"r0": ProbeResult("r0", None)}
    v = _gate(results, now=290.0, round_no=2, round_started=280.0, nodes=("r0",))
    assert v.action is GateAction.WAIT and v.next_deadline == 300.0
    v = _gate(results, now=300.0, round_no=2, round_started=280.0, nodes=("r0",))
    assert v.action is GateAction.GIVE_UP and "health.timeout_s" in v.message


def test_unhealthy_reads_the_published_condition_types() -> None:
    assert unhealthy({"Ready": "True", "GPUXIDErrors": "False"}) == ""
    assert unhealthy({"GPUXIDErrors": "True"}) == "GPUXIDErrors=True"
    assert unhealthy({"AcceleratedHardwareReady": "True"}) == ""
    assert unhealthy({"AcceleratedHardwareReady": "False"}) == "AcceleratedHardwareReady=False"
    assert unhealthy({"MyGpuBad": "True"}) == ""
    assert unhealthy({"MyGpuBad": "True"}, extra=("MyGpuBad",)) == "MyGpuBad=True"


def test_boundary_waits_for_a_newer_checkpoint_or_the_bound() -> None:
    assert not boundary_due(flagged_at_step=20, newest_checkpoint_step=20, flagged_at=100.0, now=150.0,
                            max_wait_s=600.0)
    assert boundary_due(flagged_at_step=20, newest_checkpoint_step=30, flagged_at=100.0, now=150.0, max_wait_s=600.0)
    assert boundary_due(flagged_at_step=20, newest_checkpoint_step=20, flagged_at=100.0, now=700.0, max_wait_s=600.0)


def test_health_spec_round_trips_and_names_bad_fields() -> None:
    spec = ProvisioningSpec(accelerator="h100-80gb", nodes=2,
                            health=Health(probe=True, nccl=True, conditions=("MyGpuBad",)))
    back = ProvisioningSpec.from_json(spec.to_json())
    assert back.health == spec.health and back.health.conditions == ("MyGpuBad",)
    with pytest.raises(InvalidSpec, match="health.max_rounds"):
        Health(max_rounds=0)
    with pytest.raises(InvalidSpec, match="health.midrun"):
        Health(midrun="ignore")
    with pytest.raises(InvalidSpec, match="health.probe"):
        Health(probe="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidSpec, match="health.nope"):
        ProvisioningSpec.from_dict({"accelerator": "h100-80gb", "nodes": 1, "health": {"nope": 1}})
