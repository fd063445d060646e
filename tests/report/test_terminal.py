from __future__ import annotations

from kfp_gpu.report.terminal import eta_from_timeline, gantt, progress_from_timeline, progress_line
from kfp_gpu.timeline import NodeState, Timeline
from tests.report._timelines import T0, make_timeline


def test_gantt_small_one_row_per_node_and_width_bounded() -> None:
    tl = make_timeline(4, preempt=1)
    out = gantt(tl, width=90)
    lines = out.splitlines()
    assert all(len(line) <= 90 for line in lines)
    rows = [line for line in lines if line.startswith("gke-node-")]
    assert len(rows) == 4
    assert sum(r.count("X") for r in rows) == 1
    assert "\u2588" in out and "\u2592" in out


def test_gantt_summarises_many_nodes() -> None:
    out = gantt(make_timeline(128, preempt=3), width=100, max_rows=40)
    lines = out.splitlines()
    assert len(lines) < 20 and all(len(line) <= 100 for line in lines)
    assert "128 nodes in 6 groups" in lines[0]
    assert "Ready 128/128" in out and "preempted 3" in out


def test_gantt_empty() -> None:
    assert gantt(Timeline()) == "(no nodes recorded)"


def test_progress_line() -> None:
    assert progress_line(3, 8, elapsed_s=42) .startswith("nodes Ready 3/8 [")
    assert "ETA 70s" in progress_line(3, 8, elapsed_s=42)
    assert "ETA ?" in progress_line(0, 8, elapsed_s=5)
    assert progress_line(8, 8, elapsed_s=99).endswith("done")
    assert "ETA 12s" in progress_line(1, 2, elapsed_s=1, eta_s=12)


def test_progress_from_live_timeline() -> None:
    tl = Timeline()
    for i in range(3):
        n = tl.node(f"n{i}")
        n.advance(NodeState.REQUESTED, T0)
    tl.nodes["n0"].advance(NodeState.REGISTERED, T0 + 30)
    tl.nodes["n0"].advance(NodeState.READY, T0 + 60)
    assert eta_from_timeline(tl, 3, now=T0 + 70) == 0.0  # overdue by median, expected now
    assert eta_from_timeline(tl, 4, now=T0 + 70) == 60.0  # one node not even requested yet
    line = progress_from_timeline(tl, 3, now=T0 + 50)
    assert line.startswith("nodes Ready 1/3") and "50s elapsed" in line and "ETA 10s" in line


def test_progress_in_the_world_s_clock() -> None:
    tl = Timeline()
    tl.node("n0").advance(NodeState.REQUESTED, 1000.0)
    tl.node("n1").advance(NodeState.REQUESTED, 1002.5)  # expected Ready at 1002.5 + the 2 s median
    tl.nodes["n0"].advance(NodeState.REGISTERED, 1001.0)
    tl.nodes["n0"].advance(NodeState.READY, 1002.0)
    assert progress_from_timeline(tl, 2, now=1003.0).endswith("3s elapsed, ETA 2s")
    assert progress_from_timeline(tl, 2, now=1003.0, scale=120.0).endswith("360s elapsed, ETA 180s")
