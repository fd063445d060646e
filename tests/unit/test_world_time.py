"""Rehearsal reports in the world's clock: the local rehearsal compresses time (kfp_gpu_rehearsal.devcluster.worldtime.TIME_SCALE), and
every time and cost it reports is stretched back (Timeline.scaled, report._common.world), with the factor said
once; the steps' KFP metrics too (steps.result.WALL_CLOCK_METRICS, scaled in entry.run_step). On a real cluster (no
KFP_GPU_WORLD_TIME_SCALE) nothing changes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import pytest

from kfp_gpu.errors import InvalidSpec
from kfp_gpu.rehearsal_seam import TIME_SCALE_ENV
from kfp_gpu.report._common import duration, world
from kfp_gpu.report.cost import CostReport, cost_report
from kfp_gpu.report.terminal import gantt
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps import entry
from kfp_gpu.steps.result import WALL_CLOCK_METRICS, StepResult, in_world_time
from kfp_gpu.timeline import NodeState, Timeline


def _timeline() -> Timeline:
    """Two 8-GPU nodes: requested at 1000 s, Ready after 2 s and 3 s, released at 1032 s (compressed clock)."""
    tl = Timeline(run_id="r")
    for name, ready in (("a", 1002.0), ("b", 1003.0)):
        n = tl.node(name, pool="p", zone="z", gpus=8)
        n.advance(NodeState.REQUESTED, 1000.0)
        n.advance(NodeState.REGISTERED, ready - 0.5)
        n.advance(NodeState.READY, ready)
        n.advance(NodeState.RELEASED, 1032.0)
    tl.event("job-running", 1004.0)
    tl.event("job-finished", 1030.0)
    return tl


def test_scaling_stretches_every_time_around_the_first() -> None:
    tl = _timeline()
    big = tl.scaled(120.0)
    assert sorted(big.ready_latencies()) == [240.0, 360.0]
    assert big.nodes["a"].at(NodeState.REQUESTED) == 1000.0 and big.nodes["a"].at(NodeState.RELEASED) == 1000.0 + 32 * 120
    assert [e["t"] for e in big.events] == [1000.0 + 4 * 120, 1000.0 + 30 * 120]
    assert tl.nodes["a"].at(NodeState.RELEASED) == 1032.0  # the original is left as it was
    assert tl.scaled(1.0).to_json() == tl.to_json()


def test_a_rehearsal_s_cost_and_latencies_are_in_world_time(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ProvisioningSpec("a100-40gb", 2)
    monkeypatch.delenv(TIME_SCALE_ENV, raising=False)
    same, note = world(_timeline())
    real = cost_report(spec, same)
    assert note == "" and real.median_ready_s == 2.5
    monkeypatch.setenv(TIME_SCALE_ENV, "120")
    shown, note = world(_timeline())
    rep = cost_report(spec, shown)
    assert note.startswith("times and costs are in the rehearsal world's clock: one second here is 120 real-world")
    assert rep.median_ready_s == pytest.approx(300.0) and rep.max_ready_s == pytest.approx(360.0)
    assert rep.provisioned_gpu_hours == pytest.approx(real.provisioned_gpu_hours * 120)
    assert "2 nodes, 32s from first request" in gantt(same)
    assert "2 nodes, 64.0 min from first request" in gantt(shown)


@pytest.mark.parametrize("seconds,text", [(5.74, "5.7s"), (45.0, "45s"), (300.0, "5.0 min"), (7200.0, "2.0 h")])
def test_durations_read_as_people_read_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def _step_measuring(metrics: dict[str, float]) -> Callable[..., StepResult]:
    """A step that measured ``metrics`` on its own (compressed, in a rehearsal) clock."""
    return lambda spec, run_id, upstream_json: StepResult("{}", dict(metrics))


MEASURED = {  # what the steps emit (kfp_gpu/steps: scale_up, preflight_step, train_report, teardown)
    "scale_up_seconds": 2.5, "max_node_ready_seconds": 3.0, "check_capacity_seconds": 0.25, "gpu_hours": 0.01,
    "queue_wait_s": 1.5, "preemption_detect_latency_max_s": 0.5, "wall_s": 30.0,
    "nodes_ready": 4.0, "gpus_ready": 32.0, "attempts": 2.0, "final_step": 1200.0, "final_loss": 0.75,
    "capacity_now": 1.0, "steps_lost": 40.0,
    "provisioned_gpu_hours": 9.6, "billed_cost_usd": 31.5, "median_ready_s": 300.0,  # teardown: already world time
}


def test_a_rehearsal_s_step_metrics_are_world_seconds_and_counts_are_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(entry, "resolve", lambda step: _step_measuring(MEASURED))
    spec_json = ProvisioningSpec("a100-40gb", 4).to_json()
    monkeypatch.setenv(TIME_SCALE_ENV, "120")
    got = entry.run_step("scale_up", spec_json, "run-1", "").metrics
    assert got["scale_up_seconds"] == 300.0 and got["max_node_ready_seconds"] == 360.0  # 2.5 s here = 5 world minutes
    assert got["check_capacity_seconds"] == 30.0 and got["queue_wait_s"] == 180.0 and got["wall_s"] == 3600.0
    assert got["preemption_detect_latency_max_s"] == 60.0 and got["gpu_hours"] == pytest.approx(1.2)
    untouched = set(MEASURED) - WALL_CLOCK_METRICS
    assert len(untouched) == 10 and {k: got[k] for k in untouched} == {k: MEASURED[k] for k in untouched}
    monkeypatch.delenv(TIME_SCALE_ENV)  # a real cluster: every metric as measured
    assert entry.run_step("scale_up", spec_json, "run-1", "").metrics == MEASURED
    ran: list[str] = []
    monkeypatch.setattr(entry, "resolve", lambda step: lambda *a: ran.append(step) or StepResult("{}", {}))
    monkeypatch.setenv(TIME_SCALE_ENV, "0")  # malformed: named, after the step (teardown still releases)
    with pytest.raises(InvalidSpec, match="KFP_GPU_WORLD_TIME_SCALE='0'"):
        entry.run_step("teardown", spec_json, "run-1", "")
    assert ran == ["teardown"]


def test_teardown_s_cost_metrics_are_not_scaled_twice() -> None:
    """Teardown computes its cost from the timeline already in world time (report._common.world): none of the cost
    report's fields may be in the set entry.run_step scales."""
    assert not {f.name for f in fields(CostReport)} & WALL_CLOCK_METRICS


def test_every_declared_wall_clock_metric_is_one_a_step_emits() -> None:
    steps = Path(entry.__file__).parent
    source = "".join(p.read_text() for p in steps.glob("*.py") if p.name != "result.py")
    assert sorted(k for k in WALL_CLOCK_METRICS if f'"{k}"' not in source) == []


def test_the_component_reference_states_the_metrics_clock_and_the_rehearsal_s_factor() -> None:
    from kfp_gpu.component_docs import REHEARSAL_TIME_SCALE, metrics_section
    from kfp_gpu_rehearsal.devcluster.worldtime import TIME_SCALE

    assert REHEARSAL_TIME_SCALE == TIME_SCALE, "kfp_gpu/component_docs.py states another factor than the rehearsal's"
    doc = (Path(entry.__file__).parents[2] / "docs" / "components.md").read_text()
    assert metrics_section() in doc, "docs/components.md is stale: make components"


class _Books:
    """What the train report reads of a finished run (kfp_gpu.steps.train.TrainState's fields): one preemption
    detected 0.5 s after its notice and resumed in 2 s, one Kueue admission after 1.5 s, 0.01 GPU-hours."""

    def __init__(self) -> None:
        from types import SimpleNamespace

        self.job, self.namespace, self.queue, self.attempt = "j", "ns", "lq", 2
        self.kind = SimpleNamespace(NAME="pytorchjob")
        self.timeline = Timeline(run_id="r")
        self.usage = SimpleNamespace(gpu_hours=0.01)
        self.budget = SimpleNamespace(app_failures=0, on_demand=False)
        self.capacity = SimpleNamespace(to_json=lambda: "{}")
        self.ledger: dict[str, object] = {
            "preemptions": [{"lost_nodes": ["n1"], "reason": "spot", "checkpoint_step": 100, "steps_lost": 4,
                             "detect_latency_s": 0.5, "time_to_resume_s": 2.0}],
            "admissions": [{"wait_s": 1.5}]}

    def close_usage(self, at: float) -> None: ...

    def checkpoint(self) -> None:
        return None

    def save_ledger(self) -> None: ...


def test_the_train_step_s_output_and_summary_are_in_world_time_and_its_metrics_scaled_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from kfp_gpu.steps.train_report import result

    monkeypatch.setenv(TIME_SCALE_ENV, "120")
    res = result(_Books(), "Succeeded", 30.0)  # type: ignore[arg-type]
    out = json.loads(res.output_json)
    assert out["gpu_hours"] == pytest.approx(1.2) and out["detect_latency_s"] == [60.0]
    assert out["queue_wait_s"] == [180.0]
    assert "GPU-hours: 1.2000" in res.markdown and "| 60 | 240 |" in res.markdown  # detect, resume: world seconds
    assert "one second here is 120 real-world seconds" in res.markdown
    # the metrics leave this function on the process's clock: run_step scales them, once
    assert res.metrics["gpu_hours"] == 0.01 and res.metrics["queue_wait_s"] == 1.5 and res.metrics["wall_s"] == 30.0
    assert in_world_time(res, 120.0).metrics["preemption_detect_latency_max_s"] == 60.0
    monkeypatch.delenv(TIME_SCALE_ENV)  # a real cluster: as measured, no clock sentence
    real = result(_Books(), "Succeeded", 30.0)  # type: ignore[arg-type]
    assert json.loads(real.output_json)["detect_latency_s"] == [0.5] and "| 0.5 | 2 |" in real.markdown
    assert "real-world seconds" not in real.markdown


def test_the_world_has_one_time_scale_that_every_reader_follows(monkeypatch: pytest.MonkeyPatch) -> None:
    """One name for the factor: a test that sets it changes the world's compress/expand and the stand-in API's
    advertised factor together (a by-value re-export once kept the API at 120 while the world ran at 60)."""
    from kfp_gpu_rehearsal.devcluster import worldtime
    from kfp_gpu_rehearsal.sim import api, clock

    monkeypatch.setattr(worldtime, "TIME_SCALE", 60.0)
    assert (api.sim_time_scale(), clock.compress(120.0), clock.expand(2.0), clock.scale()) == (60.0, 2.0, 120.0, 60.0)
    assert not hasattr(clock, "TIME_SCALE")  # no second name to patch
