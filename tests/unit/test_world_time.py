"""Rehearsal reports in the world's clock: the local rehearsal compresses time (kfp_gpu_rehearsal.sim.clock.TIME_SCALE), and
every time and cost it reports is stretched back (Timeline.scaled, report._common.world), with the factor said
once. On a real cluster (no KFP_GPU_WORLD_TIME_SCALE) nothing changes."""

from __future__ import annotations

import pytest

from kfp_gpu.rehearsal_seam import TIME_SCALE_ENV
from kfp_gpu.report._common import duration, world
from kfp_gpu.report.cost import cost_report
from kfp_gpu.report.terminal import gantt
from kfp_gpu.spec import ProvisioningSpec
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
